/* supervise.c: the process a gate, run or judge command keeps while a worker process (kp_worker.h) runs the cases:
 * it records a worker's death as that case's receipt and starts a fresh worker for the rest (kp_runner.h). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_json.h"
#include "kp_run_shared.h"
#include "kp_worker.h"

/* A worker died in case sh->case_index: record it FAILED (the signal, or the timeout, and the check it was in)
 * unless its receipt was written before it died, and set the run up for the next worker. All it knows of the
 * case is the skeleton the worker published (nothing of the config is loaded here). */
static int record_death(const kp_run_options *opt, run_shared *sh, const kp_worker_end *end, kp_error *err) {
    cJSON *skel = cJSON_Parse(sh->skeleton);
    const cJSON *heads = cJSON_GetObjectItemCaseSensitive(skel, "checks");
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(skel, "case"), "name"));
    if (!name || !cJSON_IsArray(heads)) {
        cJSON_Delete(skel);
        return kp_fail(err, KP_EXIT_ENV, "the run's worker process died in config case %d, and the record it kept of that "
                       "case is unreadable; the bundle %s is unfinished", sh->case_index + 1, opt->out_dir);
    }
    kp_bundle *bundle;
    if (kp_bundle_resume(&bundle, opt->out_dir, err)) {
        cJSON_Delete(skel);
        return err->code;
    }
    int rc = 0;
    if (kp_bundle_count(bundle) == sh->position) {
        const int k = sh->check_index < cJSON_GetArraySize(heads) ? sh->check_index : -1;
        const char *what = k >= 0 ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(heads, k), "label")) : NULL;
        char how[200], reason[900], earlier[600], later[600];
        kp_worker_describe(end, how, sizeof how);
        snprintf(reason, sizeof reason, "%s: the case's process %s %s%s%s; the cases after it run in a fresh process",
                 end->deadline ? "timeout" : "crash", how, what ? "in check '" : "while preparing or releasing the case",
                 what ? what : "", what ? "'" : "");
        snprintf(earlier, sizeof earlier, "%s: this check ran, but what it found died with the case's process, which %s "
                 "in check '%s'", end->deadline ? "timeout" : "crash", how, what ? what : "");
        snprintf(later, sizeof later, "not reached: the case's process %s in check '%s'", how, what ? what : "");
        cJSON *receipt = kp_run_stub_receipt(skel, KP_FAILED, reason, k, earlier, later);
        cJSON *death = cJSON_AddObjectToObject(receipt, "process");
        cJSON_AddStringToObject(death, "ended", end->deadline ? "killed at the timeout" : end->signal ? "signal" : "exit");
        if (end->signal && !end->deadline) kp_json_add_int(death, "signal", end->signal);
        if (end->exited) kp_json_add_int(death, "status", end->status);
        if (what) cJSON_AddStringToObject(death, "check", what);
        fprintf(stderr, "kparity: %s: %s\n", name, reason);
        rc = kp_bundle_add_receipt(bundle, receipt, err);
        if (!rc) kp_run_progress(opt, sh->position, sh->selected, name, KP_FAILED, 0.0, kp_now() - sh->t_start);
    }
    cJSON_Delete(skel);
    kp_bundle_free(bundle);
    if (sh->worst < KP_FAILED) sh->worst = KP_FAILED;
    sh->timed_out |= end->deadline;
    sh->resume_at = sh->case_index + 1;
    sh->case_index = sh->check_index = -1;
    return rc;
}

int kp_run_supervises(const kp_run_options *opt) {
    const char *in_process = getenv("KPARITY_IN_PROCESS");
    return opt->isolate && !kp_worker_is_one() && !(in_process && !strcmp(in_process, "1"));
}

/* The supervisor: start a worker, wait for it, and when it dies in a case record that case FAILED and start a
 * fresh worker for the rest; a worker whose device was lost to a sticky CUDA error ends itself after that case's
 * receipt (handed_off), and a fresh one, with a fresh CUDA context, carries on (each worker after the first starts
 * past one case, so this ends). It loads nothing of the config, and so none of its plugins: the worker starts at
 * once, the supervisor's own start costs no device initialisation, and what a plugin does as it loads happens only
 * in a worker. Past the gate's timeout (--timeout, else the config's
 * timeout_s, read here without loading anything) and the worker's own watchdog's grace, the worker is killed: a
 * stopped or wedged process, or one hung loading a plugin, cannot hold the gate. */
int kp_run_supervise(const char *config_path, const kp_run_options *opt, kp_error *err) {
    run_shared *sh;
    int fd;
    if (kp_worker_share((void **)&sh, &fd, sizeof *sh, err)) return err->code;
    sh->magic = RUN_SHARED_MAGIC;
    sh->t_start = kp_now();
    sh->case_index = sh->check_index = -1;
    sh->worst = KP_PASSED;
    sh->timeout = opt->timeout_s > 0 ? opt->timeout_s : kp_config_timeout_peek(config_path);
    if (snprintf(sh->out_dir, sizeof sh->out_dir, "%s", opt->out_dir) >= (int)sizeof sh->out_dir) {
        kp_worker_unshare(sh, fd, sizeof *sh);
        return kp_fail(err, KP_EXIT_USAGE, "--out: the path is longer than %zu bytes", sizeof sh->out_dir - 1);
    }
    int code;
    for (;;) {
        pid_t pid;
        sh->workers++;
        if (kp_worker_start(fd, &pid, err)) {
            code = err->code;
            break;
        }
        kp_worker_end end;
        const double started = kp_now();
        for (;;) {
            /* Past the worker's own watchdog (2 s after the timeout) and then some; a worker started after the
             * timeout (to record the cases left as NOT_RUN) gets 10 s; one finishing the bundle, a minute more.
             * Without a timeout, look again every quarter second (the worker may yet publish one). */
            const double timeout = sh->timeout;
            double deadline = sh->t_start + timeout + 2.0 + 3.0;
            if (sh->workers > 1 && deadline < started + 10.0) deadline = started + 10.0;
            if (__atomic_load_n(&sh->finishing, __ATOMIC_SEQ_CST)) deadline += 60.0;
            /* returning once the worker said its result is in: its teardown (a CUDA context's release) goes on
               while the caller carries on */
            kp_worker_wait(pid, &sh->returned, timeout > 0 ? deadline : kp_now() + 0.25, &end);
            if (!end.running) break;
            if (timeout > 0 && kp_now() > deadline) {
                kp_worker_kill(pid, &end);
                break;
            }
        }
        if (__atomic_load_n(&sh->handed_off, __ATOMIC_SEQ_CST)) { /* its device was lost, its cases all recorded */
            sh->handed_off = 0;
            sh->timed_out |= end.deadline;
            continue;
        }
        if (__atomic_load_n(&sh->returned, __ATOMIC_SEQ_CST) && !end.deadline) {
            *err = sh->err;
            code = sh->code;
            if (end.said_done && opt->await_worker_end) kp_worker_reap(pid);
            break;
        }
        if (end.exited && !sh->opened && end.status != 127) { /* it stopped before the run: a config error it reported */
            code = end.status;
            break;
        }
        char how[200];
        kp_worker_describe(&end, how, sizeof how);
        if (!sh->opened || __atomic_load_n(&sh->case_index, __ATOMIC_SEQ_CST) < 0) {
            code = kp_fail(err, end.deadline ? KP_EXIT_TIMEOUT : KP_EXIT_ENV, "the run's worker process %s %s%s%s", how,
                           !sh->opened ? "before it made the bundle (while loading the config and its plugins?)"
                                       : "outside any case (starting, between cases or finishing the bundle); the bundle ",
                           sh->opened ? opt->out_dir : "", sh->opened ? " is unfinished (kparity verify says what is missing)" : "");
            break;
        }
        kp_run_options resumed = *opt;
        resumed.out_dir = sh->out_dir;
        if ((code = record_death(&resumed, sh, &end, err))) break;
    }
    kp_worker_unshare(sh, fd, sizeof *sh);
    return code;
}
