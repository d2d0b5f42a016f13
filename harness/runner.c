/* runner.c: the runner: per case, generate inputs, run each impl once on the full batch, run the
 * declared checks, write the receipt; then the bundle's reports and the exit code. From the CLI the
 * cases run in a worker process (kp_worker.h) that another supervises (supervise.c), so a crash is recorded. */
#define _GNU_SOURCE
#include "kp_exec.h"
#include "kp_runner.h"

#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cases/kp_rng.h"
#include "../receipts/kp_json.h"
#include "../receipts/kp_verdict.h"
#include "kp_checks.h"
#include "kp_device.h"
#include "kp_progress.h"
#include "kp_run_shared.h"
#include "kp_worker.h"


/* Seconds since process `pid` started (from /proc/PID/stat; a worker asks about its supervisor, which
 * the command started), so the gate's cost on a startup path includes loading, config parsing and
 * device initialisation. */
static double kp_process_seconds(pid_t pid) {
    char stat_path[64];
    snprintf(stat_path, sizeof stat_path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(stat_path, "r");
    if (!f) return 0;
    char buf[2048];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    unsigned long long start = 0;
    for (int field = 2; p && *p && field < 22; p++)
        if (*p == ' ' && ++field == 22) start = strtoull(p + 1, NULL, 10);
    FILE *u = fopen("/proc/uptime", "r");
    double up = 0;
    if (u) {
        if (fscanf(u, "%lf", &up) != 1) up = 0;
        fclose(u);
    }
    long hz = sysconf(_SC_CLK_TCK);
    return up > 0 && hz > 0 ? up - (double)start / (double)hz : 0;
}

static kp_result worse(kp_result a, kp_result b) { return a > b ? a : b; }

void kp_run_progress(const kp_run_options *opt, int i, int n, const char *name, kp_result r, double case_s,
                     double elapsed) {
    if (!opt->quiet) kp_progress(opt->json, i, n, name, kp_result_name(r), case_s, elapsed);
}

typedef struct summary_row {
    char case_name[KP_CASE_NAME_MAX];
    char label[200];
    kp_result result;
    char figure[256];
} summary_row;

static void print_summary(const kp_run_options *opt, const summary_row *rows, int n, const char *verdict, int code,
                          const char *dir) {
    if (opt->json) {
        for (int i = 0; i < n; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "event", "check");
            cJSON_AddStringToObject(o, "case", rows[i].case_name);
            cJSON_AddStringToObject(o, "check", rows[i].label);
            cJSON_AddStringToObject(o, "result", kp_result_name(rows[i].result));
            cJSON_AddStringToObject(o, "figure", rows[i].figure);
            char *text = cJSON_PrintUnformatted(o);
            printf("%s\n", text);
            cJSON_free(text);
            cJSON_Delete(o);
        }
        printf("{\"event\":\"verdict\",\"verdict\":\"%s\",\"exit_code\":%d,\"bundle\":\"%s\"}\n", verdict, code, dir);
        return;
    }
    printf("%-13s  %-60s  %s\n", "RESULT", "CHECK", "KEY FIGURE");
    const char *last = "";
    for (int i = 0; i < n; i++) {
        if (strcmp(last, rows[i].case_name)) printf("%s\n", rows[i].case_name);
        last = rows[i].case_name;
        printf("  %-13s %-60s  %s\n", kp_result_name(rows[i].result), rows[i].label, rows[i].figure);
    }
    printf("verdict: %s (exit %d); bundle: %s\n", verdict, code, dir);
}

/* Whether config case i is in this run's share (every case without --shard). */
static int in_share(const kp_run_options *opt, int i) {
    return opt->shard_count < 1 || i % opt->shard_count == opt->shard_index - 1;
}

static cJSON *case_json(const kp_config *cfg, const kp_case_spec *cs) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "name", cs->name);
    kp_json_add_int(c, "config_index", cs - cfg->cases); /* where it sits in the config: merge orders parts by it */
    cJSON_AddStringToObject(c, "family", cs->c.family);
    cJSON *params = cJSON_AddObjectToObject(c, "params");
    for (int i = 0; i < cs->c.nparams; i++) cJSON_AddStringToObject(params, cs->c.params[i].key, cs->c.params[i].value);
    const char *seed = kp_case_get(&cs->c, "seed");
    cJSON_AddStringToObject(c, "seed", seed ? seed : "");
    cJSON *gen = cJSON_AddObjectToObject(c, "generator");
    cJSON_AddStringToObject(gen, "name", KP_GENERATOR_NAME);
    cJSON_AddStringToObject(gen, "version", cs->fam->cases->generator_version);
    return c;
}

/* What the runner and its watchdog share. Bundle writes happen under `lock`; once the watchdog
 * has taken over, the runner writes nothing more. */
typedef struct run_state {
    const kp_config *cfg;
    const kp_run_options *opt;
    run_shared *shared;        /* in a worker: the block the supervisor reads; NULL in-process */
    kp_bundle *bundle;
    pthread_mutex_t lock;
    int taken_over;
    int current;          /* index of the case in progress, -1 between cases */
    double t_start, timeout;
    int done, selected;
    cJSON *env;
    pthread_t watchdog;
    int have_watchdog;
    volatile int stop_watchdog;
} run_state;

static cJSON *meta_json(run_state *st) {
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "command", st->opt->command ? st->opt->command : "run");
    cJSON *c = cJSON_AddObjectToObject(meta, "config");
    cJSON_AddStringToObject(c, "path", st->cfg->path);
    cJSON_AddStringToObject(c, "name", st->cfg->name);
    cJSON_AddStringToObject(c, "sha256", st->cfg->sha256);
    kp_json_add_int(c, "cases", st->cfg->ncases);
    cJSON *roles = cJSON_AddObjectToObject(c, "impls");
    for (int i = 0; i < st->cfg->nroles; i++) {
        cJSON *r = cJSON_AddObjectToObject(roles, st->cfg->roles[i].role);
        cJSON_AddStringToObject(r, "declared", st->cfg->roles[i].declared);
        cJSON_AddStringToObject(r, "resolved", st->cfg->roles[i].impl->name);
    }
    if (st->opt->filter) cJSON_AddStringToObject(meta, "filter", st->opt->filter);
    if (st->opt->shard_count > 0) {
        cJSON *sh = cJSON_AddObjectToObject(meta, "shard");
        kp_json_add_int(sh, "index", st->opt->shard_index);
        kp_json_add_int(sh, "count", st->opt->shard_count);
    }
    kp_json_add_int(meta, "host_budget_bytes", (int64_t)st->cfg->host_budget);
    kp_json_add_int(meta, "device_budget_bytes", (int64_t)st->cfg->device_budget);
    kp_json_add_double(meta, "timeout_s", st->timeout);
    /* 1 for a run no case crashed; each crash or hang a worker died of adds one (kp_run_supervise) */
    if (st->shared) kp_json_add_int(meta, "worker_processes", st->shared->workers);
    kp_json_add_double(meta, "wall_s", kp_now() - st->t_start);
    cJSON *stages = cJSON_AddObjectToObject(meta, "stages_s");
    for (int s = 0; s < KP_STAGE_COUNT; s++) kp_json_add_double(stages, kp_stage_name((kp_stage)s), kp_stage_seconds((kp_stage)s));
    kp_json_add_double(stages, "other", kp_now() - st->t_start - kp_stage_total());
    cJSON_AddStringToObject(meta, "stages_note", "other: the run's wall time outside the named stages (case setup, "
                                                 "check bookkeeping, the device's first use); receipts excludes "
                                                 "writing bundle.json and the manifest themselves");
    cJSON *parts = cJSON_AddObjectToObject(meta, "kernels_parts_s");
    kp_json_add_int(parts, "runs", kp_run_count());
    for (int k = 0; k < KP_RUN_PARTS; k++) kp_json_add_double(parts, kp_run_part_name((kp_run_part)k), kp_run_part_seconds((kp_run_part)k));
    cJSON_AddStringToObject(meta, "kernels_parts_note", "the kernels stage's runs taken apart (kp_launch.h, kp_run_part); "
                                                        "the rest of the stage is the checks' own bookkeeping around them");
    cJSON_AddItemToObject(meta, "environment", cJSON_Duplicate(st->env, 1));
    return meta;
}

/* The cases this run writes receipts for: with a receipt's index, how far an unfinished bundle got. */
static cJSON *run_json(const run_state *st) {
    cJSON *run = cJSON_CreateObject();
    kp_json_add_int(run, "cases", st->selected);
    return run;
}

/* What the receipt of a case that never finished is made of: the case, the run, each check's head (what it is, its
 * label, its impls) and the environment. A worker publishes it as each case starts (run_shared.skeleton), so the
 * supervisor can write that case's receipt without loading the config, and so the config's plugins, itself. */
static cJSON *skeleton_json(const run_state *st, const kp_case_spec *cs) {
    cJSON *skel = cJSON_CreateObject();
    cJSON_AddItemToObject(skel, "case", case_json(st->cfg, cs));
    cJSON_AddItemToObject(skel, "run", run_json(st));
    cJSON *heads = cJSON_AddArrayToObject(skel, "checks");
    for (int k = 0; k < cs->nchecks; k++) {
        cJSON *head = cJSON_CreateObject();
        kp_check_head(&cs->checks[k], head);
        cJSON_AddItemToArray(heads, head);
    }
    cJSON_AddItemToObject(skel, "environment", cJSON_Duplicate(st->env, 1));
    return skel;
}

static cJSON *copied(const cJSON *skel, const char *key) {
    return cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(skel, key), 1);
}

cJSON *kp_run_stub_receipt(const cJSON *skel, kp_result result, const char *reason, int at, const char *earlier,
                              const char *later) {
    cJSON *receipt = cJSON_CreateObject();
    cJSON_AddStringToObject(receipt, "schema", "kparity.receipt/v1");
    cJSON_AddItemToObject(receipt, "case", copied(skel, "case"));
    cJSON_AddItemToObject(receipt, "run", copied(skel, "run"));
    cJSON *checks = cJSON_AddArrayToObject(receipt, "checks");
    int k = 0;
    for (const cJSON *head = cJSON_GetObjectItemCaseSensitive(skel, "checks")->child; head; head = head->next, k++) {
        cJSON *chk = cJSON_Duplicate(head, 1);
        const int mine = at < 0 || k == at, before = k < at;
        cJSON_AddStringToObject(chk, "result", kp_result_name(mine || before ? result : KP_NOT_RUN));
        cJSON_AddStringToObject(chk, "summary", mine ? reason : before ? earlier : later);
        cJSON_AddItemToArray(checks, chk);
    }
    cJSON_AddStringToObject(receipt, "result", kp_result_name(result));
    cJSON *reasons = cJSON_AddArrayToObject(receipt, "reasons");
    char msg[1200];
    snprintf(msg, sizeof msg, "%s: %s", kp_result_name(result), reason);
    cJSON_AddItemToArray(reasons, cJSON_CreateString(msg));
    cJSON_AddArrayToObject(receipt, "artifacts");
    kp_json_add_double(receipt, "duration_s", 0.0);
    cJSON_AddItemToObject(receipt, "environment", copied(skel, "environment"));
    return receipt;
}

static cJSON *stub_receipt(run_state *st, const kp_case_spec *cs, kp_result result, const char *reason) {
    cJSON *skel = skeleton_json(st, cs), *receipt = kp_run_stub_receipt(skel, result, reason, -1, NULL, NULL);
    cJSON_Delete(skel);
    return receipt;
}

#ifdef KP_COVERAGE
void __gcov_dump(void); /* libgcov's (gcc 11 on): writes this process's counts to the .gcda files now */
#endif
/* A worker's counts, written before _exit: gcov writes them from an atexit handler, which _exit skips, so without this
 * scripts/coverage.sh would miss all a gate ran in its workers. Nothing in a build without KP_COVERAGE. */
static void coverage_dump(void) {
#ifdef KP_COVERAGE
    __gcov_dump();
#endif
}

/* A worker leaves through here: what it returned goes to the supervisor, and nothing of the process runs
 * after (no atexit handler, no plugin destructor: the record is already made). */
_Noreturn static void worker_exit(run_shared *shared, int code, const kp_error *err) {
    if (err) shared->err = *err;
    shared->code = code;
    coverage_dump(); /* before the supervisor is told: it may stop waiting for this process */
    fflush(NULL);    /* so is what this process printed */
    __atomic_store_n(&shared->returned, 1, __ATOMIC_SEQ_CST);
    kp_worker_say_done();
    _exit(code);
}

/* The watchdog: a case that outlives the gate's timeout (a hung kernel never returns to the
 * runner's own checks) is recorded as FAILED (timeout), the rest as NOT_RUN, the bundle is
 * finished so it verifies, and the process exits 4. */
static void *watchdog_main(void *arg) {
    run_state *st = arg;
    const double grace = 2.0;
    while (!st->stop_watchdog) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (kp_now() - st->t_start < st->timeout + grace) continue;
        pthread_mutex_lock(&st->lock);
        if (st->stop_watchdog || st->current < 0) { /* between cases the runner handles the timeout itself */
            pthread_mutex_unlock(&st->lock);
            continue;
        }
        st->taken_over = 1;
        if (st->shared) __atomic_store_n(&st->shared->finishing, 1, __ATOMIC_SEQ_CST);
        kp_error err = {0};
        char reason[300];
        snprintf(reason, sizeof reason, "timeout: the case was still running %.1f s after the gate's timeout of %.1f s "
                 "(a hung kernel?)", grace, st->timeout);
        fprintf(stderr, "kparity: %s: %s\n", st->cfg->cases[st->current].name, reason);
        kp_bundle_add_receipt(st->bundle, stub_receipt(st, &st->cfg->cases[st->current], KP_FAILED, reason), &err);
        for (int i = st->current + 1; i < st->cfg->ncases; i++) {
            const kp_case_spec *cs = &st->cfg->cases[i];
            if (!in_share(st->opt, i) || (st->opt->filter && !strstr(cs->name, st->opt->filter))) continue;
            kp_bundle_add_receipt(st->bundle, stub_receipt(st, cs, KP_NOT_RUN, "the gate's timeout passed"), &err);
        }
        if (kp_bundle_finish(st->bundle, "TIMEOUT", KP_EXIT_TIMEOUT, meta_json(st), &err))
            fprintf(stderr, "kparity: could not finish the bundle: %s\n", err.msg);
        fprintf(stderr, "kparity: verdict: TIMEOUT (exit 4); bundle: %s\n", st->opt->out_dir);
        fflush(NULL);
        if (st->shared) worker_exit(st->shared, KP_EXIT_TIMEOUT, NULL);
        _exit(KP_EXIT_TIMEOUT);
    }
    return NULL;
}

static int selected(const kp_run_options *opt, const kp_config *cfg, int ci) {
    return in_share(opt, ci) && (!opt->filter || strstr(cfg->cases[ci].name, opt->filter));
}

/* Whether this run has a case after config case ci. */
static int cases_after(const kp_run_options *opt, const kp_config *cfg, int ci) {
    for (int i = ci + 1; i < cfg->ncases; i++)
        if (selected(opt, cfg, i)) return 1;
    return 0;
}

/* In a worker whose device was lost to a sticky CUDA error in config case ci, that case's receipt written: end this
 * process, whose CUDA context no call can use again, so that the supervisor starts a fresh worker, with a fresh
 * context, for the cases after it (as after a crash, but nothing is lost: the record of the case is whole). Outside
 * programs end with it; the next worker starts them afresh, and loads the config's plugins again. */
_Noreturn static void hand_off(run_state *st, int ci) {
    pthread_mutex_lock(&st->lock);
    st->stop_watchdog = 1; /* between cases it takes nothing over; this keeps it so */
    pthread_mutex_unlock(&st->lock);
    kp_exec_stop_all();
    run_shared *sh = st->shared;
    sh->resume_at = ci + 1;
    sh->device_lost = 0;
    fprintf(stderr, "kparity: %s: the device was lost to a sticky CUDA error; the cases after it run in a fresh worker "
            "process, with a fresh CUDA context\n", st->cfg->cases[ci].name);
    coverage_dump();
    __atomic_store_n(&sh->handed_off, 1, __ATOMIC_SEQ_CST);
    fflush(NULL);
    _exit(KP_EXIT_ENV);
}

/* The summary table's rows of one case, from its checks as recorded. */
static void summary_rows_add(summary_row **rows, int *nrows, const char *case_name, const cJSON *checks) {
    for (const cJSON *chk = checks ? checks->child : NULL; chk; chk = chk->next) {
        summary_row *grown = realloc(*rows, sizeof **rows * (size_t)(*nrows + 1));
        if (!grown) break;
        *rows = grown;
        summary_row *row = &(*rows)[(*nrows)++];
        snprintf(row->case_name, sizeof row->case_name, "%s", case_name);
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(chk, "label");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(chk, "summary");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(chk, "result");
        snprintf(row->label, sizeof row->label, "%s", cJSON_IsString(l) ? l->valuestring : "?");
        snprintf(row->figure, sizeof row->figure, "%s", cJSON_IsString(s) ? s->valuestring : "");
        const int parsed = kp_result_parse(cJSON_IsString(r) ? r->valuestring : NULL);
        row->result = parsed < 0 ? KP_FAILED : (kp_result)parsed;
    }
}

/* In a worker, before case cs starts: what the supervisor needs to write its receipt should the process die in it. */
static int publish_case(const run_state *st, const kp_case_spec *cs, kp_error *err) {
    cJSON *skel = skeleton_json(st, cs);
    char *text = skel ? cJSON_PrintUnformatted(skel) : NULL;
    cJSON_Delete(skel);
    run_shared *sh = st->shared;
    const size_t len = text ? strlen(text) : 0;
    if (!text || len >= sizeof sh->skeleton) {
        cJSON_free(text);
        return kp_fail(err, KP_EXIT_ENV, "%s: the record kept for the case should its process die is %s (%zu bytes of "
                       "at most %zu)", cs->name, text ? "too long" : "out of memory", len, sizeof sh->skeleton - 1);
    }
    memcpy(sh->skeleton, text, len + 1);
    cJSON_free(text);
    sh->check_index = -1;
    sh->position = st->done;
    sh->selected = st->selected;
    return 0;
}

/* The run cannot go on (err says why): stop the watchdog, free what the run holds, leave the bundle unfinished. */
static int run_abandon(run_state *st, summary_row *rows, const kp_error *err) {
    pthread_mutex_lock(&st->lock);
    st->stop_watchdog = 1;
    pthread_mutex_unlock(&st->lock);
    if (st->have_watchdog) pthread_join(st->watchdog, NULL);
    cJSON_Delete(st->env);
    free(rows);
    kp_bundle_free(st->bundle);
    return err->code;
}

/* Run the selected cases (in a worker: from shared->resume_at, into the bundle an earlier worker began). */
static int run_cases(const kp_config *cfg, const kp_run_options *opt, run_shared *shared, kp_error *err) {
    run_state st = {.cfg = cfg, .opt = opt, .shared = shared, .current = -1};
    for (int i = 0; i < cfg->ncases; i++) st.selected += selected(opt, cfg, i);
    if (st.selected == 0) /* before the bundle exists: an empty bundle would read as a run */
        return kp_fail(err, KP_EXIT_USAGE, "%s matches no case", opt->filter ? "--filter" : "--shard");
    if (shared && shared->opened) {
        if (kp_bundle_resume(&st.bundle, opt->out_dir, err)) return err->code;
    } else {
        if (kp_bundle_open(&st.bundle, opt->out_dir, err)) return err->code;
        if (shared) shared->opened = 1;
    }
    pthread_mutex_init(&st.lock, NULL);
    st.timeout = opt->timeout_s > 0 ? opt->timeout_s : cfg->timeout_s;
    if (shared) shared->timeout = st.timeout;
    st.t_start = shared ? shared->t_start : kp_now();
    kp_stages_reset();
    kp_run_parts_reset();
    for (int i = 0; i < cfg->ncases; i++) /* a case with CUDA impls: their context is made while the first case is */
        if (cfg->cases[i].device_bytes > 0 && selected(opt, cfg, i)) {
            kp_device_warm_start();
            break;
        }
    st.env = kp_environment_json();
    summary_row *rows = NULL;
    int nrows = 0, timed_out = 0, any_ran = 0, device_lost = 0;
    kp_result worst = KP_PASSED;
    if (shared) { /* carry on from the workers before this one */
        for (int s = 0; s < KP_STAGE_COUNT; s++) kp_stage_add((kp_stage)s, shared->stages[s]);
        timed_out = shared->timed_out, any_ran = shared->any_ran, device_lost = shared->device_lost;
        worst = (kp_result)shared->worst;
        const cJSON *row;
        cJSON_ArrayForEach(row, kp_bundle_rows(st.bundle))
            summary_rows_add(&rows, &nrows, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(row, "case")),
                             cJSON_GetObjectItemCaseSensitive(row, "checks"));
        st.done = (int)kp_bundle_count(st.bundle);
    }
    if (st.timeout > 0) st.have_watchdog = pthread_create(&st.watchdog, NULL, watchdog_main, &st) == 0;
    for (int ci = shared ? shared->resume_at : 0; ci < cfg->ncases; ci++) {
        const kp_case_spec *cs = &cfg->cases[ci];
        if (!selected(opt, cfg, ci)) continue;
        double t_case = kp_now();
        kp_result case_result = KP_PASSED;
        cJSON *receipt;
        if (st.timeout > 0 && kp_now() - st.t_start > st.timeout) {
            timed_out = 1;
            case_result = KP_NOT_RUN;
            receipt = stub_receipt(&st, cs, KP_NOT_RUN, "the gate's timeout passed before this case started");
        } else if (device_lost) {
            case_result = KP_NOT_RUN;
            /* only in one process (KPARITY_IN_PROCESS=1): a worker hands the rest to a fresh one instead */
            receipt = stub_receipt(&st, cs, KP_NOT_RUN, "the device was lost to a sticky CUDA error in an earlier case "
                                   "(a run in one process, KPARITY_IN_PROCESS=1, has no fresh worker to carry on in)");
        } else {
            if (shared && publish_case(&st, cs, err)) return run_abandon(&st, rows, err);
            pthread_mutex_lock(&st.lock);
            st.current = ci;
            if (shared) __atomic_store_n(&shared->case_index, ci, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&st.lock);
            receipt = cJSON_CreateObject();
            cJSON_AddStringToObject(receipt, "schema", "kparity.receipt/v1");
            cJSON_AddItemToObject(receipt, "case", case_json(cfg, cs));
            cJSON_AddItemToObject(receipt, "run", run_json(&st));
            cJSON *reasons = cJSON_CreateArray(), *checks = cJSON_CreateArray(), *artifacts = cJSON_CreateArray();
            kp_evidence ev = {.bundle = st.bundle, .artifacts = artifacts, .inline_limit = 16};
            kp_case_ctx ctx;
            kp_error cerr = {0};
            double t_open = kp_now();
            int open_rc = kp_case_ctx_open(&ctx, cs, &ev, receipt, &cerr);
            kp_json_add_double(receipt, "prepare_s", kp_now() - t_open);
            if (open_rc) {
                case_result = KP_FAILED;
                char msg[1200];
                snprintf(msg, sizeof msg, "FAILED: preparing the case: %s", cerr.msg);
                cJSON_AddItemToArray(reasons, cJSON_CreateString(msg));
            } else {
                for (int k = 0; k < cs->nchecks; k++) {
                    cJSON *chk = cJSON_CreateObject();
                    kp_result r;
                    if (shared) shared->check_index = k;
                    if (st.timeout > 0 && kp_now() - st.t_start > st.timeout) {
                        timed_out = 1;
                        kp_check_stub(&cs->checks[k], r = KP_NOT_RUN, "the gate's timeout passed", chk);
                    } else if (kp_device_lost()) {
                        kp_check_stub(&cs->checks[k], r = KP_NOT_RUN, "the device was lost to a sticky CUDA error", chk);
                    } else {
                        r = kp_check_run(&ctx, &cs->checks[k], chk);
                        any_ran |= r != KP_NOT_RUN;
                    }
                    cJSON_AddItemToArray(checks, chk);
                    case_result = worse(case_result, r);
                    if (r != KP_PASSED) {
                        const cJSON *s = cJSON_GetObjectItemCaseSensitive(chk, "summary");
                        char msg[1200];
                        snprintf(msg, sizeof msg, "%s: %s: %s", kp_result_name(r), cs->checks[k].label,
                                 cJSON_IsString(s) ? s->valuestring : "");
                        cJSON_AddItemToArray(reasons, cJSON_CreateString(msg));
                    }
                }
                if (shared) shared->check_index = -1;
                double t_close = kp_now();
                kp_case_ctx_close(&ctx);
                kp_json_add_double(receipt, "release_s", kp_now() - t_close);
            }
            device_lost = kp_device_lost();
            if (device_lost) { /* whichever step saw it (a check, preparing, releasing), the case did not pass */
                case_result = worse(case_result, KP_FAILED);
                char msg[300];
                snprintf(msg, sizeof msg, "FAILED: the device was lost to a sticky CUDA error in this case; %s",
                         !cases_after(opt, cfg, ci) ? "it was the run's last case"
                         : shared ? "the cases after it run in a fresh worker process, with a fresh CUDA context"
                                  : "the cases after it are NOT_RUN (a run in one process, KPARITY_IN_PROCESS=1, "
                                    "has no fresh worker to carry on in)");
                cJSON_AddItemToArray(reasons, cJSON_CreateString(msg));
            }
            cJSON_AddItemToObject(receipt, "checks", checks);
            cJSON_AddStringToObject(receipt, "result", kp_result_name(case_result));
            cJSON_AddItemToObject(receipt, "reasons", reasons);
            cJSON_AddItemToObject(receipt, "artifacts", artifacts);
            kp_json_add_double(receipt, "duration_s", kp_now() - t_case);
            cJSON_AddItemToObject(receipt, "environment", cJSON_Duplicate(st.env, 1));
        }
        summary_rows_add(&rows, &nrows, cs->name, cJSON_GetObjectItemCaseSensitive(receipt, "checks"));
        kp_digests_settle(); /* none is pending past kp_case_ctx_close; a receipt never holds a placeholder */
        pthread_mutex_lock(&st.lock);
        if (st.taken_over) { /* the watchdog is finishing the bundle; it will exit the process */
            pthread_mutex_unlock(&st.lock);
            for (;;) pause();
        }
        double t_write = kp_now();
        int rc = kp_bundle_add_receipt(st.bundle, receipt, err);
        kp_stage_add(KP_STAGE_RECEIPTS, kp_now() - t_write);
        st.current = -1;
        worst = worse(worst, case_result);
        if (shared) { /* after the receipt: a worker that dies from here on has nothing of this case unrecorded */
            shared->case_index = -1;
            shared->worst = worst, shared->any_ran = any_ran, shared->device_lost = device_lost;
            shared->timed_out = timed_out;
            for (int s = 0; s < KP_STAGE_COUNT; s++) shared->stages[s] = kp_stage_seconds((kp_stage)s);
        }
        pthread_mutex_unlock(&st.lock);
        if (rc) return run_abandon(&st, rows, err);
        kp_run_progress(opt, st.done++, st.selected, cs->name, case_result, kp_now() - t_case, kp_now() - st.t_start);
        if (shared && device_lost && cases_after(opt, cfg, ci)) hand_off(&st, ci);
    }
    kp_prepared_flush(); /* the last case's cache entries, before the run's stages are recorded */
    kp_exec_stop_all(); /* outside programs end with the run */
    pthread_mutex_lock(&st.lock);
    st.stop_watchdog = 1;
    pthread_mutex_unlock(&st.lock);
    if (st.have_watchdog) pthread_join(st.watchdog, NULL);
    int code;
    const char *verdict = kp_bundle_verdict(worst, any_ran, timed_out, device_lost, &code);
    double t_finish = kp_now();
    if (shared) __atomic_store_n(&shared->finishing, 1, __ATOMIC_SEQ_CST);
    cJSON *meta = meta_json(&st);
    int rc = kp_bundle_finish(st.bundle, verdict, code, meta, err);
    kp_stage_add(KP_STAGE_RECEIPTS, kp_now() - t_finish);
    if (!rc) print_summary(opt, rows, nrows, verdict, code, opt->out_dir);
    if (!rc && !opt->quiet && !opt->json) {
        fprintf(stderr, "stages:");
        const double run_s = kp_now() - st.t_start;
        for (int s = 0; s < KP_STAGE_COUNT; s++)
            fprintf(stderr, " %s %.2fs,", kp_stage_name((kp_stage)s), kp_stage_seconds((kp_stage)s));
        fprintf(stderr, " other %.2fs; run %.2fs (process start to here %.2fs)\n", run_s - kp_stage_total(), run_s,
                kp_process_seconds(shared ? getppid() : getpid()));
        fprintf(stderr, "kernels: %lld runs;", (long long)kp_run_count());
        for (int k = 0; k < KP_RUN_PARTS; k++)
            fprintf(stderr, " %s %.2fs%s", kp_run_part_name((kp_run_part)k), kp_run_part_seconds((kp_run_part)k),
                    k + 1 < KP_RUN_PARTS ? "," : "\n");
    }
    cJSON_Delete(st.env);
    free(rows);
    kp_bundle_free(st.bundle);
    pthread_mutex_destroy(&st.lock);
    return rc ? err->code : code;
}

int kp_run_config(const kp_config *cfg, const kp_run_options *opt, kp_error *err) {
    run_shared *shared = NULL;
    const int worker = kp_worker_attach((void **)&shared, sizeof *shared, err);
    if (worker < 0) return err->code;
    if (worker && shared->magic != RUN_SHARED_MAGIC)
        return kp_fail(err, KP_EXIT_ENV, "the block shared with the supervisor is not a run's");
    if (!worker) return run_cases(cfg, opt, NULL, err);
    /* the supervisor's --out (a default one is named from the clock, which may have moved on since) */
    kp_run_options own = *opt;
    own.out_dir = shared->out_dir;
    worker_exit(shared, run_cases(cfg, &own, shared, err), err);
}
