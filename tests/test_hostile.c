/* test_hostile.c: hostile plugins (issue 20, part 4), through the kparity binary: an impl that segfaults, aborts,
 * exits or stops its own process is contained (its case FAILED saying how, the cases after it run in a fresh worker
 * process, the bundle verifies as the record of that), so is one that loses the device to a (simulated) sticky
 * CUDA error, and a plugin whose SHA-256 is not the config's pin is refused before any of its code runs. Plugins:
 * tests/fixtures/plugin_hostile.c, built here with cc. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../cases/kp_sha256.h"
#include "kp_test_util.h"

TestSuite(hostile, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 300);

/* Build plugin_hostile.c as topp.<name>@host with the -D flags given (NULL-terminated, at most 4; none: a tame
 * plugin) and KPT_BATCH=3 unless one of them sets it. */
static char *plugin_with(const char *name, const char *const *flags) {
    char *so, *src, *inc, *def;
    cr_assert(asprintf(&so, "%s/%s.so", kpt_dir, name) > 0);
    cr_assert(asprintf(&src, "%s/tests/fixtures/plugin_hostile.c", kpt_source_dir()) > 0);
    cr_assert(asprintf(&inc, "-I%s/kernels", kpt_source_dir()) > 0);
    cr_assert(asprintf(&def, "-DKPT_NAME=\"topp.%s@host\"", name) > 0);
    char *argv[20] = {"/usr/bin/cc", "-shared", "-fPIC", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", inc, def};
    int n = 10, batch = 0;
    for (int i = 0; flags && flags[i]; i++) {
        cr_assert_lt(i, 4);
        argv[n++] = (char *)flags[i];
        batch |= strncmp(flags[i], "-DKPT_BATCH=", 12) == 0;
    }
    if (!batch) argv[n++] = "-DKPT_BATCH=3";
    argv[n++] = "-o", argv[n++] = so, argv[n++] = src, argv[n++] = "-lm", argv[n] = NULL;
    char *out, *err;
    cr_assert_eq(kpt_run(argv, &out, &err), 0, "building the plugin failed: %s", err);
    free(out), free(err), free(src), free(inc), free(def);
    return so;
}

/* With one -D flag (NULL: none) and extra (NULL: KPT_BATCH=3). */
static char *plugin(const char *name, const char *flag, const char *extra) {
    const char *flags[] = {flag ? flag : extra, flag ? extra : NULL, NULL};
    return plugin_with(name, flags);
}

/* How many lines a marker file holds (0: none). */
static int lines_of(const char *path) {
    char *text = kpt_read(path, NULL);
    int n = 0;
    for (const char *c = text; c && *c; c++) n += *c == '\n';
    free(text);
    return n;
}

/* Four cases: the plugin (candidate) on 2 rows, on 3 rows (where it turns hostile, in its case's second check),
 * on 4 rows, then a built-in impl on 3 rows. top_p = 1: the plugin keeps every token, the rule's answer. */
static char *config(const char *tag, const char *so, const char *name, const char *pin, double timeout) {
    char *body, *path, *pin_field = NULL, *timeout_field = NULL;
    if (pin) cr_assert(asprintf(&pin_field, ",\"sha256\":\"%s\"", pin) > 0);
    if (timeout > 0) cr_assert(asprintf(&timeout_field, "\"timeout_s\":%g,", timeout) > 0);
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"hostile\",\"plugins\":[{\"path\":\"%s\"%s}],"
                       "\"impls\":{\"incumbent\":\"topp.split_logit@host\",\"candidate\":\"topp.%s@host\"},"
                       "\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6},%s\"cases\":["
                       "{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=1,vocab=500)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
                       "{\"case\":\"topp(batch=3,profile=ordinary,seed=2,top_p=1,vocab=500)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"incumbent\"},"
                       "{\"check\":\"rule\",\"impl\":\"candidate\"},{\"check\":\"exact\",\"impls\":[\"incumbent\",\"candidate\"]}]},"
                       "{\"case\":\"topp(batch=4,profile=ordinary,seed=3,top_p=1,vocab=500)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
                       "{\"case\":\"topp(batch=3,profile=ordinary,seed=4,top_p=0.9,vocab=500)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"incumbent\"}]}]}",
                       so, pin_field ? pin_field : "", name, timeout_field ? timeout_field : "") > 0);
    cr_assert(asprintf(&path, "%s/%s.json", kpt_dir, tag) > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    free(body), free(pin_field), free(timeout_field);
    return path;
}

/* kparity gate ... -- /bin/echo serving-started; the exit status, what it printed. */
static int gate(const char *cfg, const char *out, char **o, char **e) {
    char *argv[] = {kpt_binary(), "gate", "--config", (char *)cfg, "--out", (char *)out, "--quiet", "--", "/bin/echo",
                    "serving-started", NULL};
    return kpt_run(argv, o, e);
}

/* gate(), and how long it took in seconds. */
static int timed_gate(const char *cfg, const char *out, char **o, char **e, double *took) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int rc = gate(cfg, out, o, e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return rc;
}

static const char *str(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static const cJSON *check_of(const cJSON *rec, int k) { return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(rec, "checks"), k); }

static cJSON *bundle_json(const char *out) {
    char *p;
    cr_assert(asprintf(&p, "%s/bundle.json", out) > 0);
    char *text = kpt_read(p, NULL);
    cr_assert_not_null(text, "no %s", p);
    cJSON *doc = cJSON_Parse(text);
    cr_assert_not_null(doc);
    free(text), free(p);
    return doc;
}

/* An expected defect whose check could not run is no defect reproduced: an expect of a rule check on an impl that
 * fails (KP_RUN_FAILED) is FAILED, saying the expected check could not run, never PASSED or INCORRECT, and the gate
 * exits 3 without starting the command. */
Test(hostile, an_expect_whose_check_fails_is_failed_not_a_reproduced_defect) {
    const char *flags[] = {"-DKPT_FAIL", NULL};
    char *so = plugin_with("fails", flags), *cfg, *body, *out, *o, *e;
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"expect-failed\",\"plugins\":[{\"path\":\"%s\"}],"
                       "\"impls\":{\"incumbent\":\"topp.fails@host\"},\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6},"
                       "\"cases\":[{\"case\":\"topp(batch=3,profile=ordinary,seed=2,top_p=0.9,vocab=500)\",\"checks\":"
                       "[{\"check\":\"expect\",\"impl\":\"incumbent\",\"of\":\"rule\",\"result\":\"INCORRECT\"}]}]}", so) > 0);
    cr_assert(asprintf(&cfg, "%s/expect-failed.json", kpt_dir) > 0);
    cr_assert_eq(kpt_write(cfg, body, strlen(body)), 0);
    cr_assert(asprintf(&out, "%s/b-expect-failed", kpt_dir) > 0);
    cr_assert_eq(gate(cfg, out, &o, &e), 3, "%s%s", o, e);
    cr_assert_null(strstr(o, "serving-started"), "the command started: %s", o);
    cJSON *r = kpt_receipt(out, 1);
    cr_assert_str_eq(str(check_of(r, 0), "result"), "FAILED", "%s", str(check_of(r, 0), "summary"));
    cr_assert(strstr(str(check_of(r, 0), "summary"), "could not run (FAILED)"), "%s", str(check_of(r, 0), "summary"));
    cr_assert_str_eq(str(r, "result"), "FAILED");
    cJSON_Delete(r);
    free(so), free(cfg), free(body), free(out), free(o), free(e);
}

/* The gate with an impl that dies in case 2's second check: exit 3, the command not started; case 2 FAILED saying
 * how, in which check, the first check's findings lost with it and the third not reached; cases 3 and 4 PASSED in
 * a second worker process; and verify (with --replay) accepts the bundle, listing case 2 (no inputs) as not replayed. */
static void contained(const char *name, const char *flag, const char *how, int signal, int status) {
    char *so = plugin(name, flag, NULL), *cfg = config(name, so, name, NULL, 0), *out, *o, *e;
    cr_assert(asprintf(&out, "%s/b-%s", kpt_dir, name) > 0);
    cr_assert_eq(gate(cfg, out, &o, &e), 3, "%s: %s%s", name, o, e);
    cr_assert_null(strstr(o, "serving-started"), "%s: the command started although a case crashed", name);
    cr_assert(strstr(e, how), "%s: stderr does not say '%s': %s", name, how, e);
    char label[64];
    snprintf(label, sizeof label, "rule topp.%s@host", name);

    cJSON *r1 = kpt_receipt(out, 1), *r2 = kpt_receipt(out, 2), *r3 = kpt_receipt(out, 3), *r4 = kpt_receipt(out, 4);
    cr_assert_str_eq(str(r1, "result"), "PASSED");
    cr_assert_str_eq(str(r2, "result"), "FAILED");
    const char *reason = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r2, "reasons"), 0)->valuestring;
    cr_assert(strstr(reason, how) && strstr(reason, label), "%s: the reason does not say how and where: %s", name, reason);
    const cJSON *proc = cJSON_GetObjectItemCaseSensitive(r2, "process");
    cr_assert_not_null(proc, "%s: no process record", name);
    cr_assert_str_eq(str(proc, "check"), label);
    if (signal) cr_assert_eq(cJSON_GetObjectItemCaseSensitive(proc, "signal")->valueint, signal);
    else cr_assert_eq(cJSON_GetObjectItemCaseSensitive(proc, "status")->valueint, status);
    cr_assert_str_eq(str(check_of(r2, 0), "result"), "FAILED"); /* ran, but its findings died with the process */
    cr_assert(strstr(str(check_of(r2, 0), "summary"), "died with"), "%s", str(check_of(r2, 0), "summary"));
    cr_assert_str_eq(str(check_of(r2, 1), "result"), "FAILED");
    cr_assert_str_eq(str(check_of(r2, 2), "result"), "NOT_RUN");
    cr_assert_str_eq(str(r3, "result"), "PASSED", "%s: the case after the crash did not run", name);
    cr_assert_str_eq(str(r4, "result"), "PASSED");
    cJSON *doc = bundle_json(out);
    cr_assert_str_eq(str(doc, "verdict"), "FAILED");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(doc, "exit_code")->valueint, 3);
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(doc, "worker_processes")->valueint, 2, "%s: one crash, two workers", name);
    free(o), free(e);
    char *vargv[] = {kpt_binary(), "verify", out, "--replay", NULL};
    cr_assert_eq(kpt_run(vargv, &o, &e), 0, "%s: verify refuses the bundle: %s%s", name, o, e);
    /* case 2's receipt, written by the supervisor, has no inputs to replay: it is listed as not replayed, not skipped */
    cr_assert(strstr(o, "in every receipt that records them (3)") && strstr(o, "not replayed, 1 receipt with no inputs"),
              "%s: %s", name, o);
    cr_assert(strstr(o, "\nreceipts/0002.json (topp(") && strstr(o, "): FAILED\n"), "%s: %s", name, o);
    cJSON_Delete(r1), cJSON_Delete(r2), cJSON_Delete(r3), cJSON_Delete(r4), cJSON_Delete(doc);
    free(o), free(e), free(so), free(cfg), free(out);
}

Test(hostile, a_segfaulting_impl_fails_its_case_and_the_rest_run_in_a_fresh_process) {
    contained("segv", "-DKPT_SEGV", "killed by signal 11 (SIGSEGV", 11, 0);
}

Test(hostile, an_aborting_impl_is_contained_the_same_way) {
    contained("abort", "-DKPT_ABORT", "killed by signal 6 (SIGABRT", 6, 0);
}

/* exit(0) from inside an impl: a clean status, but the run had not finished, so it is a crash like any other. */
Test(hostile, an_impl_that_exits_the_process_is_a_crash_not_a_pass) {
    contained("exit", "-DKPT_EXIT", "exited with status 0 before it had finished", 0, 0);
}

/* The gate with an impl that loses the device in case 2's second check; its exit status, stdout and stderr. */
static int lost_device_gate(const char *tag, char **out, char **o, char **e) {
    char *so = plugin(tag, "-DKPT_LOSE_DEVICE", NULL), *cfg = config(tag, so, tag, NULL, 0);
    cr_assert(asprintf(out, "%s/b-%s", kpt_dir, tag) > 0);
    const int rc = gate(cfg, *out, o, e);
    cr_assert_null(strstr(*o, "serving-started"), "%s: the command started although a case FAILED", tag);
    free(so), free(cfg);
    return rc;
}

/* Case 2, whose second check lost the device: that check FAILED with the impl's CUDA error, the first PASSED, the
 * third NOT_RUN for the lost device; a receipt the worker wrote whole (no process record: nothing crashed). */
static void lost_in_case_2(const cJSON *r2, const char *tag) {
    cr_assert_str_eq(str(r2, "result"), "FAILED");
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(r2, "process"), "%s: a lost device recorded as a crash", tag);
    cr_assert_str_eq(str(check_of(r2, 0), "result"), "PASSED");
    cr_assert_str_eq(str(check_of(r2, 1), "result"), "FAILED");
    cr_assert(strstr(str(check_of(r2, 1), "summary"), "illegal memory access"), "%s", str(check_of(r2, 1), "summary"));
    cr_assert_str_eq(str(check_of(r2, 2), "result"), "NOT_RUN");
    cr_assert(strstr(str(check_of(r2, 2), "summary"), "device was lost to a sticky CUDA error"), "%s",
              str(check_of(r2, 2), "summary"));
}

/* A CUDA fault costs one case, not the gate (issue 27, item 6), on the CPU: the plugin's run in case 2's second check
 * marks the device lost as a sticky CUDA error does (kparity's test hook kp_device_simulate_loss) and fails. Case 2
 * records it, then its worker ends itself and cases 3 and 4 PASS in a fresh worker process (worker_processes 2); the
 * verdict stays FAILED (exit 3, the command not started) and verify --replay replays all four receipts. Before,
 * cases 3 and 4 were NOT_RUN ('the device was lost to a sticky CUDA error in an earlier case'). */
Test(hostile, a_lost_device_costs_one_case_and_the_rest_run_in_a_fresh_worker) {
    char *out, *o, *e;
    cr_assert_eq(lost_device_gate("lost", &out, &o, &e), 3, "%s%s", o, e);
    cJSON *r2 = kpt_receipt(out, 2), *r3 = kpt_receipt(out, 3), *r4 = kpt_receipt(out, 4), *doc = bundle_json(out);
    lost_in_case_2(r2, "lost");
    const cJSON *why3 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r3, "reasons"), 0);
    cr_assert_str_eq(str(r3, "result"), "PASSED", "the case after the lost device did not run: %s",
                     cJSON_IsString(why3) ? why3->valuestring : "");
    cr_assert_str_eq(str(r4, "result"), "PASSED");
    const cJSON *reasons = cJSON_GetObjectItemCaseSensitive(r2, "reasons");
    const char *last = cJSON_GetArrayItem(reasons, cJSON_GetArraySize(reasons) - 1)->valuestring;
    cr_assert(strstr(last, "the cases after it run in a fresh worker process"), "%s", last);
    cr_assert(strstr(e, "the device was lost to a sticky CUDA error; the cases after it run in a fresh worker"), "%s", e);
    cr_assert_str_eq(str(doc, "verdict"), "FAILED");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(doc, "exit_code")->valueint, 3);
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(doc, "worker_processes")->valueint, 2, "one lost device, two workers");
    free(o), free(e);
    char *vargv[] = {kpt_binary(), "verify", out, "--replay", NULL};
    cr_assert_eq(kpt_run(vargv, &o, &e), 0, "verify refuses the bundle: %s%s", o, e);
    cr_assert(strstr(o, "in every receipt that records them (4)") && !strstr(o, "not replayed"), "%s", o);
    cJSON_Delete(r2), cJSON_Delete(r3), cJSON_Delete(r4), cJSON_Delete(doc);
    free(o), free(e), free(out);
}

/* Outside programs alike: an exec impl (tests/fixtures/exec_topk.py, NumPy) serves cases 1 and 3, the plugin loses
 * the device in case 2. Case 3 PASSES in the fresh worker, served by a fresh program (its receipt: 1 request, 1
 * start; in the first worker's program it would have been request 2). Before, case 3 was NOT_RUN. */
Test(hostile, after_a_lost_device_outside_programs_start_afresh_too) {
    char *so = plugin("lostx", "-DKPT_LOSE_DEVICE", NULL), *cfg, *body, *out, *o, *e;
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"lost-exec\",\"plugins\":[{\"path\":\"%s\"}],"
                       "\"impls\":{\"candidate\":\"topp.lostx@host\",\"topk.np\":{\"exec\":[\"%s\",\"%s/tests/fixtures/exec_topk.py\","
                       "\"clean\"],\"impl\":\"numpy.topk\",\"timeout_s\":60}},\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6,"
                       "\"ties\":\"lowest_index\",\"order\":\"index\"},\"cases\":["
                       "{\"case\":\"topk(k=512,profile=randn,rows=5,seed=3,width=4000)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"np\"}]},"
                       "{\"case\":\"topp(batch=3,profile=ordinary,seed=2,top_p=1,vocab=500)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
                       "{\"case\":\"topk(k=512,profile=randn,rows=5,seed=4,width=4000)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"np\"}]}]}",
                       so, kpt_python(), kpt_source_dir()) > 0);
    cr_assert(asprintf(&cfg, "%s/lost-exec.json", kpt_dir) > 0);
    cr_assert_eq(kpt_write(cfg, body, strlen(body)), 0);
    cr_assert(asprintf(&out, "%s/b-lost-exec", kpt_dir) > 0);
    cr_assert_eq(gate(cfg, out, &o, &e), 3, "%s%s", o, e);
    cJSON *r1 = kpt_receipt(out, 1), *r2 = kpt_receipt(out, 2), *r3 = kpt_receipt(out, 3), *doc = bundle_json(out);
    cr_assert_str_eq(str(r1, "result"), "PASSED");
    cr_assert_str_eq(str(r2, "result"), "FAILED");
    const cJSON *why3 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r3, "reasons"), 0);
    cr_assert_str_eq(str(r3, "result"), "PASSED", "the exec impl's case after the lost device: %s",
                     cJSON_IsString(why3) ? why3->valuestring : "");
    const cJSON *prog = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r3, "impls"), 0), "exec");
    cr_assert_not_null(prog, "case 3 records no outside program");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(prog, "requests")->valueint, 1, "not a fresh program");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(prog, "starts")->valueint, 1);
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(doc, "worker_processes")->valueint, 2);
    cJSON_Delete(r1), cJSON_Delete(r2), cJSON_Delete(r3), cJSON_Delete(doc);
    free(o), free(e), free(so), free(cfg), free(body), free(out);
}

/* KPARITY_IN_PROCESS=1 keeps the old behaviour, there being no worker to end: case 2 records the lost device as
 * above, and cases 3 and 4 are NOT_RUN saying why; the bundle verifies, listing them as not replayed. (This passes
 * on the code before the fresh worker too: in one process nothing changed.) */
Test(hostile, in_process_a_lost_device_leaves_the_later_cases_not_run) {
    cr_assert_eq(setenv("KPARITY_IN_PROCESS", "1", 1), 0);
    char *out, *o, *e;
    cr_assert_eq(lost_device_gate("lost1", &out, &o, &e), 3, "%s%s", o, e);
    cJSON *r2 = kpt_receipt(out, 2), *r3 = kpt_receipt(out, 3), *r4 = kpt_receipt(out, 4), *doc = bundle_json(out);
    lost_in_case_2(r2, "lost1");
    for (const cJSON *r = r3; r; r = r == r3 ? r4 : NULL) {
        cr_assert_str_eq(str(r, "result"), "NOT_RUN");
        const char *why = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "reasons"), 0)->valuestring;
        cr_assert(strstr(why, "lost to a sticky CUDA error in an earlier case"), "%s", why);
    }
    cr_assert_str_eq(str(doc, "verdict"), "FAILED");
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(doc, "worker_processes"), "a worker in a run in one process");
    free(o), free(e);
    char *vargv[] = {kpt_binary(), "verify", out, "--replay", NULL};
    cr_assert_eq(kpt_run(vargv, &o, &e), 0, "verify refuses the bundle: %s%s", o, e);
    cr_assert(strstr(o, "not replayed, 2 receipts with no inputs"), "%s", o);
    cJSON_Delete(r2), cJSON_Delete(r3), cJSON_Delete(r4), cJSON_Delete(doc);
    free(o), free(e), free(out);
}

/* A gate whose worker died before any case: the command not started, stderr saying how (`how`) and that it was before
 * the bundle, and no bundle folder. */
static void ended_before_any_case(const char *o, const char *e, const char *out, const char *how) {
    cr_assert_null(strstr(o, "serving-started"));
    cr_assert(strstr(e, how) && strstr(e, "before it made the bundle"), "%s", e);
    struct stat st;
    cr_assert_neq(stat(out, &st), 0, "a bundle folder for a run that never started");
}

/* A plugin that crashes as it is loaded (in a constructor): the config's plugins are loaded in the worker, so the
 * gate still ends with exit 3 saying so, and the command is not started. No case ran: there is no bundle. */
Test(hostile, a_plugin_that_crashes_while_loading_ends_the_gate_with_exit_3) {
    char *so = plugin("ctor", "-DKPT_CTOR_SEGV", NULL), *cfg = config("ctor", so, "ctor", NULL, 0), *out, *o, *e;
    cr_assert(asprintf(&out, "%s/b-ctor", kpt_dir) > 0);
    cr_assert_eq(gate(cfg, out, &o, &e), 3, "%s%s", o, e);
    ended_before_any_case(o, e, out, "SIGSEGV");
    free(o), free(e), free(so), free(cfg), free(out);
}

/* The supervisor loads nothing of the config: when a worker dies in a case, it writes that case's receipt from what
 * the worker published as the case began, so a plugin's code (here a constructor that leaves a line in a marker file
 * each time the library is loaded) runs only in the two workers, never in the process that keeps the record. */
Test(hostile, the_supervisor_never_loads_a_plugin_even_to_record_a_crash) {
    char *marker, *mflag;
    cr_assert(asprintf(&marker, "%s/loads", kpt_dir) > 0);
    cr_assert(asprintf(&mflag, "-DKPT_MARKER=\"%s\"", marker) > 0);
    const char *flags[] = {"-DKPT_SEGV", mflag, NULL};
    char *so = plugin_with("counted", flags), *cfg = config("counted", so, "counted", NULL, 0), *out, *o, *e;
    cr_assert(asprintf(&out, "%s/b-counted", kpt_dir) > 0);
    cr_assert_eq(gate(cfg, out, &o, &e), 3, "%s%s", o, e);
    cJSON *r2 = kpt_receipt(out, 2), *doc = bundle_json(out);
    cr_assert_str_eq(str(r2, "result"), "FAILED");
    cr_assert_str_eq(str(check_of(r2, 1), "label"), "rule topp.counted@host");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(doc, "worker_processes")->valueint, 2);
    cr_assert_eq(lines_of(marker), 2, "the plugin was loaded %d times for two workers (the supervisor loaded it?)",
                 lines_of(marker));
    cJSON_Delete(r2), cJSON_Delete(doc);
    free(o), free(e), free(so), free(cfg), free(out), free(marker), free(mflag);
}

/* A plugin named with --plugin (not in the config) that crashes as it loads: the worker loads it, so the gate ends
 * with exit 3 saying so (before the fix the supervisor loaded it first and died of the SIGSEGV itself, exit 139). */
Test(hostile, a_plugin_given_with_the_plugin_option_is_loaded_in_the_worker) {
    char *so = plugin("cliload", "-DKPT_CTOR_SEGV", NULL), *cfg = config("cliload", so, "cliload", NULL, 0), *out, *o, *e;
    /* the config without its "plugins" entry: the library comes only from the command line */
    char *text = kpt_read(cfg, NULL), *cut = strstr(text, "\"plugins\""), *end = cut ? strstr(cut, "}],") : NULL;
    cr_assert(cut && end);
    memmove(cut, end + 3, strlen(end + 3) + 1);
    cr_assert_eq(kpt_write(cfg, text, strlen(text)), 0);
    cr_assert(asprintf(&out, "%s/b-cliload", kpt_dir) > 0);
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--plugin", so, "--out", out, "--quiet", "--", "/bin/echo",
                    "serving-started", NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 3, "%s%s", o, e);
    cr_assert_null(strstr(o, "serving-started"));
    cr_assert(strstr(e, "SIGSEGV") && strstr(e, "before it made the bundle"), "%s", e);
    free(o), free(e), free(text), free(so), free(cfg), free(out);
}

/* A plugin whose constructor never returns: the supervisor knows the config's timeout without loading the config
 * (it reads timeout_s as JSON alone), so it kills the worker there: exit 4 saying so, the command not started. */
Test(hostile, a_plugin_that_hangs_while_loading_is_killed_at_the_timeout) {
    char *so = plugin("ctorhang", "-DKPT_CTOR_HANG", NULL), *cfg = config("ctorhang", so, "ctorhang", NULL, 1.0), *out, *o, *e;
    cr_assert(asprintf(&out, "%s/b-ctorhang", kpt_dir) > 0);
    double took;
    cr_assert_eq(timed_gate(cfg, out, &o, &e, &took), 4, "%s%s", o, e);
    cr_assert_lt(took, 30.0, "the supervisor took %.1f s to end a worker hung loading a plugin", took);
    ended_before_any_case(o, e, out, "past the gate's timeout");
    free(o), free(e), free(so), free(cfg), free(out);
}

/* kparity judge runs its checks in a worker too: an outside output judged next to a plugin impl that segfaults
 * (in the case's second check) leaves the case FAILED saying so, exit 3, and a bundle that verifies; the outside
 * output's own check ran, its findings lost with the process. (Before, the crash ended judge itself.) */
Test(hostile, judge_contains_a_plugin_that_crashes) {
    char *so = plugin("jsegv", "-DKPT_SEGV", "-DKPT_BATCH=2"), *cfg, *body, *ex, *out, *impl, *o, *e;
    const char *name = "topp(batch=2,profile=ordinary,seed=1,top_p=1,vocab=500)";
    cr_assert(asprintf(&ex, "%s/ex", kpt_dir) > 0);
    char *eargv[] = {kpt_binary(), "export", (char *)name, "--out", ex, "--impl", "topp.split_prob@host", NULL};
    cr_assert_eq(kpt_run(eargv, &o, &e), 0, "export: %s", e);
    free(o), free(e);
    cr_assert(asprintf(&body, "{\"schema\":\"kparity.gate/v1\",\"name\":\"judge-hostile\",\"plugins\":[{\"path\":\"%s\"}],"
                       "\"impls\":{\"candidate\":\"topp.jsegv@host\"},\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6},"
                       "\"check_sets\":{\"judge\":[{\"check\":\"rule\",\"impl\":\"outside\"},{\"check\":\"rule\",\"impl\":\"candidate\"},"
                       "{\"check\":\"exact\",\"impls\":[\"outside\",\"candidate\"]}]},\"cases\":[{\"case\":\"%s\",\"checks\":\"judge\"}]}",
                       so, name) > 0);
    cr_assert(asprintf(&cfg, "%s/judge-hostile.json", kpt_dir) > 0);
    cr_assert_eq(kpt_write(cfg, body, strlen(body)), 0);
    cr_assert(asprintf(&out, "%s/b-judge", kpt_dir) > 0);
    cr_assert(asprintf(&impl, "outside=%s/topp.split_prob@host.npy", ex) > 0);
    char *argv[] = {kpt_binary(), "judge", (char *)name, "--impl", impl, "--config", cfg, "--out", out, "--quiet", NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 3, "%s%s", o, e);
    cr_assert(strstr(e, "killed by signal 11 (SIGSEGV"), "%s", e);
    cJSON *r1 = kpt_receipt(out, 1);
    cr_assert_str_eq(str(r1, "result"), "FAILED");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r1, "process"), "signal")->valueint, 11);
    cr_assert(strstr(str(check_of(r1, 0), "summary"), "died with"), "%s", str(check_of(r1, 0), "summary"));
    cr_assert_str_eq(str(check_of(r1, 1), "label"), "rule topp.jsegv@host");
    cr_assert_str_eq(str(check_of(r1, 2), "result"), "NOT_RUN");
    cJSON *doc = bundle_json(out);
    cr_assert_str_eq(str(doc, "verdict"), "FAILED");
    free(o), free(e);
    char *vargv[] = {kpt_binary(), "verify", out, NULL};
    cr_assert_eq(kpt_run(vargv, &o, &e), 0, "%s%s", o, e);
    cJSON_Delete(r1), cJSON_Delete(doc);
    free(o), free(e), free(so), free(cfg), free(body), free(ex), free(out), free(impl);
}

/* The positive control: the same plugin, never hostile (no case of KPT_BATCH rows), passes in one worker. */
Test(hostile, the_same_plugin_tame_passes_in_one_worker) {
    char *so = plugin("tame", NULL, "-DKPT_BATCH=99"), *cfg = config("tame", so, "tame", NULL, 0), *out, *o, *e;
    cr_assert(asprintf(&out, "%s/b-tame", kpt_dir) > 0);
    cr_assert_eq(gate(cfg, out, &o, &e), 0, "%s%s", o, e);
    cr_assert(strstr(o, "serving-started"));
    cJSON *doc = bundle_json(out);
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(doc, "worker_processes")->valueint, 1);
    cJSON_Delete(doc);
    free(o), free(e), free(so), free(cfg), free(out);
}

/* An impl that stops its own process (SIGSTOP): every thread halts, the worker's watchdog too, so only the
 * supervisor can end it, at the timeout: the case FAILED (timeout), the rest NOT_RUN, exit 4, and the bundle
 * verifies. (A hang the watchdog can end, pause() in the impl, is tests/test_harness.c's.) */
Test(hostile, an_impl_that_stops_its_process_is_killed_at_the_timeout) {
    char *so = plugin("stop", "-DKPT_STOP", NULL), *cfg = config("stop", so, "stop", NULL, 1.0), *out, *o, *e;
    cr_assert(asprintf(&out, "%s/b-stop", kpt_dir) > 0);
    double took;
    cr_assert_eq(timed_gate(cfg, out, &o, &e, &took), 4, "%s%s", o, e);
    cr_assert_lt(took, 30.0, "the supervisor took %.1f s to end a stopped worker", took);
    cr_assert_null(strstr(o, "serving-started"));
    cJSON *r2 = kpt_receipt(out, 2), *r3 = kpt_receipt(out, 3), *r4 = kpt_receipt(out, 4);
    cr_assert_str_eq(str(r2, "result"), "FAILED");
    const char *reason = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r2, "reasons"), 0)->valuestring;
    cr_assert(strstr(reason, "timeout") && strstr(reason, "rule topp.stop@host"), "%s", reason);
    cr_assert_str_eq(str(r3, "result"), "NOT_RUN");
    cr_assert_str_eq(str(r4, "result"), "NOT_RUN");
    cJSON *doc = bundle_json(out);
    cr_assert_str_eq(str(doc, "verdict"), "TIMEOUT");
    free(o), free(e);
    char *vargv[] = {kpt_binary(), "verify", out, NULL};
    cr_assert_eq(kpt_run(vargv, &o, &e), 0, "%s%s", o, e);
    cJSON_Delete(r2), cJSON_Delete(r3), cJSON_Delete(r4), cJSON_Delete(doc);
    free(o), free(e), free(so), free(cfg), free(out);
}

/* A plugin whose SHA-256 is not the pin is refused before dlopen: its constructor, which appends to a marker file
 * when the library is loaded, never runs, and no bundle is made. The control: the right pin loads it (the
 * marker appears) and the gate passes. */
Test(hostile, a_plugin_off_its_pin_is_refused_before_any_of_its_code_runs) {
    char *marker, *flag;
    cr_assert(asprintf(&marker, "%s/constructor-ran", kpt_dir) > 0);
    cr_assert(asprintf(&flag, "-DKPT_MARKER=\"%s\"", marker) > 0);
    char *so = plugin("marked", flag, "-DKPT_BATCH=99");
    char right[KP_SHA256_HEX_LEN], wrong[KP_SHA256_HEX_LEN];
    kp_error err = {0};
    cr_assert_eq(kp_sha256_file_hex(so, right, &err), 0, "%s", err.msg);
    memcpy(wrong, right, sizeof wrong);
    wrong[0] = wrong[0] == '0' ? '1' : '0';
    struct stat st;

    char *cfg = config("wrong-pin", so, "marked", wrong, 0), *out, *o, *e;
    cr_assert(asprintf(&out, "%s/b-wrong", kpt_dir) > 0);
    cr_assert_eq(gate(cfg, out, &o, &e), 2, "%s%s", o, e);
    cr_assert(strstr(e, "plugins[0].sha256") && strstr(e, right) && strstr(e, wrong) && strstr(e, "not loaded"),
              "the refusal does not name the pin and the digest: %s", e);
    cr_assert_neq(stat(marker, &st), 0, "the plugin's constructor ran although its digest is not the pin");
    cr_assert_neq(stat(out, &st), 0, "a bundle was made for a refused config");
    cr_assert_null(strstr(o, "serving-started"));
    free(o), free(e);
    char *largv[] = {kpt_binary(), "list", "--config", cfg, NULL};
    cr_assert_eq(kpt_run(largv, &o, &e), 2, "list: %s", e);
    cr_assert_neq(stat(marker, &st), 0, "list loaded the plugin off its pin");
    free(o), free(e), free(cfg), free(out);

    cfg = config("right-pin", so, "marked", right, 0);
    cr_assert(asprintf(&out, "%s/b-right", kpt_dir) > 0);
    cr_assert_eq(gate(cfg, out, &o, &e), 0, "%s%s", o, e);
    cr_assert_eq(stat(marker, &st), 0, "the control: with the right pin the constructor must run");
    free(o), free(e), free(cfg), free(out), free(so), free(marker), free(flag);
}

/* A tame plugin's gate whose worker ends slowly: tests/fixtures/linger_exit.c, built here and preloaded, makes a
 * kparity worker's _exit (as a CUDA context's release makes it slow) mark `entered`, wait up to wait_s seconds for
 * `never` (nobody makes it), then mark `ended`. */
typedef struct linger {
    char *so, *cfg, *out, *never, *entered, *ended, *asan; /* asan: ASAN_OPTIONS before, to restore */
} linger;

static void linger_start(linger *L, const char *wait_s) {
    L->so = plugin("tame", NULL, "-DKPT_BATCH=99");
    L->cfg = config("linger", L->so, "tame", NULL, 0);
    char *shim, *src, *asan;
    cr_assert(asprintf(&L->out, "%s/b-linger", kpt_dir) > 0);
    cr_assert(asprintf(&L->never, "%s/never", kpt_dir) > 0);
    cr_assert(asprintf(&L->entered, "%s/entered", kpt_dir) > 0);
    cr_assert(asprintf(&L->ended, "%s/ended", kpt_dir) > 0);
    cr_assert(asprintf(&shim, "%s/linger_exit.so", kpt_dir) > 0);
    cr_assert(asprintf(&src, "%s/tests/fixtures/linger_exit.c", kpt_source_dir()) > 0);
    char *argv[] = {"/usr/bin/cc", "-shared", "-fPIC", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-o", shim, src, NULL};
    char *out, *err;
    cr_assert_eq(kpt_run(argv, &out, &err), 0, "building the shim failed: %s", err);
    const char *had = getenv("ASAN_OPTIONS"); /* a sanitizer build's kparity: its runtime need not come first */
    L->asan = had ? strdup(had) : NULL;
    cr_assert(asprintf(&asan, "%s%sverify_asan_link_order=0", had ? had : "", had && had[0] ? ":" : "") > 0);
    setenv("ASAN_OPTIONS", asan, 1);
    setenv("LD_PRELOAD", shim, 1);
    setenv("KPT_EXIT_ENTERED", L->entered, 1);
    setenv("KPT_EXIT_WAIT_FOR", L->never, 1);
    setenv("KPT_EXIT_WAIT_S", wait_s, 1);
    setenv("KPT_EXIT_MARK", L->ended, 1);
    free(out), free(err), free(shim), free(src), free(asan);
}

/* The environment as before linger_start; the strings freed. */
static void linger_stop(linger *L) {
    unsetenv("LD_PRELOAD"), unsetenv("KPT_EXIT_ENTERED"), unsetenv("KPT_EXIT_WAIT_FOR"), unsetenv("KPT_EXIT_WAIT_S");
    unsetenv("KPT_EXIT_MARK");
    if (L->asan) setenv("ASAN_OPTIONS", L->asan, 1);
    else unsetenv("ASAN_OPTIONS");
    free(L->so), free(L->cfg), free(L->out), free(L->never), free(L->entered), free(L->ended), free(L->asan);
}

/* A gate returns its verdict once the worker has said its result is in, not after the worker's process has ended
 * (a CUDA worker's context release is about 0.1 s of every gate): here the worker's end, once entered, waits for a
 * file nobody makes, and the gate has returned, its bundle whole, while the worker is still in it. (The worker is then
 * killed with its supervisor, PR_SET_PDEATHSIG: a real one is past its last step by then.) */
Test(hostile, a_gate_returns_once_its_worker_said_its_result_is_in) {
    linger L;
    linger_start(&L, "60");
    char *argv[] = {kpt_binary(), "gate", "--config", L.cfg, "--out", L.out, "--quiet", NULL}, *o, *e;
    const int rc = kpt_run(argv, &o, &e);
    const int was_entered = access(L.entered, F_OK) == 0, had_ended = access(L.ended, F_OK) == 0;
    cr_assert_eq(rc, 0, "%s%s", o, e);
    cr_assert(was_entered, "the shim never ran in the worker");
    cr_assert(!had_ended, "the gate returned only after its worker had ended");
    free(o), free(e);
    char *vargv[] = {kpt_binary(), "verify", L.out, NULL};
    cr_assert_eq(kpt_run(vargv, &o, &e), 0, "%s%s", o, e);
    free(o), free(e);
    linger_stop(&L);
}

/* A gate that starts a command starts it only once the worker's process has ended, so the command (a model server)
 * meets a device whose memory the gate has given back: the command finds the mark the worker's last step makes. */
Test(hostile, a_gate_starts_its_command_once_its_worker_has_ended) {
    linger L;
    linger_start(&L, "1"); /* the worker's end takes a second */
    char *test, *o, *e;
    cr_assert(asprintf(&test, "test -e '%s' && echo serving-started", L.ended) > 0);
    char *argv[] = {kpt_binary(), "gate", "--config", L.cfg, "--out", L.out, "--quiet", "--", "/bin/sh", "-c", test, NULL};
    const int rc = kpt_run(argv, &o, &e);
    cr_assert_eq(rc, 0, "the command ran before the worker had ended: %s%s", o, e);
    cr_assert(strstr(o, "serving-started"), "%s%s", o, e);
    free(o), free(e), free(test);
    linger_stop(&L);
}
