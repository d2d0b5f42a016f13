/* runner.c: the runner: per case, generate inputs, run each impl once on the full batch, run the
 * declared checks, write the receipt; then the bundle's reports and the exit code. */
#define _GNU_SOURCE
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
#include "kp_checks.h"
#include "kp_device.h"

/* Seconds since this process started (from /proc/self/stat), so the gate's cost on a startup path
 * includes loading, config parsing and device initialisation. */
static double kp_process_seconds(void) {
    FILE *f = fopen("/proc/self/stat", "r");
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

static void progress(const kp_run_options *opt, int i, int n, const char *name, kp_result r, double case_s,
                     double elapsed) {
    if (opt->quiet) return;
    double left = i + 1 < n ? elapsed / (i + 1) * (n - i - 1) : 0.0;
    if (opt->json) {
        printf("{\"event\":\"case\",\"index\":%d,\"of\":%d,\"case\":\"%s\",\"result\":\"%s\",\"seconds\":%.3f,"
               "\"elapsed\":%.3f,\"eta\":%.3f}\n", i + 1, n, name, kp_result_name(r), case_s, elapsed, left);
        fflush(stdout);
    } else {
        fprintf(stderr, "[%d/%d] %-13s %6.2fs  elapsed %6.1fs  left ~%5.1fs  %s\n", i + 1, n, kp_result_name(r), case_s,
                elapsed, left, name);
    }
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
    kp_json_add_double(meta, "wall_s", kp_now() - st->t_start);
    cJSON *stages = cJSON_AddObjectToObject(meta, "stages_s");
    for (int s = 0; s < KP_STAGE_COUNT; s++) kp_json_add_double(stages, kp_stage_name((kp_stage)s), kp_stage_seconds((kp_stage)s));
    kp_json_add_double(stages, "other", kp_now() - st->t_start - kp_stage_total());
    cJSON_AddStringToObject(meta, "stages_note", "other: the run's wall time outside the named stages (case setup, "
                                                 "check bookkeeping, the device's first use); receipts excludes "
                                                 "writing bundle.json and the manifest themselves");
    cJSON_AddItemToObject(meta, "environment", cJSON_Duplicate(st->env, 1));
    return meta;
}

/* A receipt for a case that did not get to run its checks. */
static cJSON *stub_receipt(run_state *st, const kp_case_spec *cs, kp_result result, const char *reason) {
    cJSON *receipt = cJSON_CreateObject();
    cJSON_AddStringToObject(receipt, "schema", "kparity.receipt/v1");
    cJSON_AddItemToObject(receipt, "case", case_json(st->cfg, cs));
    cJSON *checks = cJSON_AddArrayToObject(receipt, "checks");
    for (int k = 0; k < cs->nchecks; k++) {
        cJSON *chk = cJSON_CreateObject();
        kp_check_stub(&cs->checks[k], result, reason, chk);
        cJSON_AddItemToArray(checks, chk);
    }
    cJSON_AddStringToObject(receipt, "result", kp_result_name(result));
    cJSON *reasons = cJSON_AddArrayToObject(receipt, "reasons");
    char msg[600];
    snprintf(msg, sizeof msg, "%s: %s", kp_result_name(result), reason);
    cJSON_AddItemToArray(reasons, cJSON_CreateString(msg));
    cJSON_AddArrayToObject(receipt, "artifacts");
    kp_json_add_double(receipt, "duration_s", 0.0);
    cJSON_AddItemToObject(receipt, "environment", cJSON_Duplicate(st->env, 1));
    return receipt;
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
        kp_error err = {0};
        char reason[300];
        snprintf(reason, sizeof reason, "timeout: the case was still running %.1f s after the gate's timeout of %.1f s "
                 "(a hung kernel?)", grace, st->timeout);
        fprintf(stderr, "kparity: %s: %s\n", st->cfg->cases[st->current].name, reason);
        kp_bundle_add_receipt(st->bundle, stub_receipt(st, &st->cfg->cases[st->current], KP_FAILED, reason), &err);
        for (int i = st->current + 1; i < st->cfg->ncases; i++) {
            const kp_case_spec *cs = &st->cfg->cases[i];
            if (st->opt->filter && !strstr(cs->name, st->opt->filter)) continue;
            kp_bundle_add_receipt(st->bundle, stub_receipt(st, cs, KP_NOT_RUN, "the gate's timeout passed"), &err);
        }
        if (kp_bundle_finish(st->bundle, "TIMEOUT", KP_EXIT_TIMEOUT, meta_json(st), &err))
            fprintf(stderr, "kparity: could not finish the bundle: %s\n", err.msg);
        fprintf(stderr, "kparity: verdict: TIMEOUT (exit 4); bundle: %s\n", st->opt->out_dir);
        fflush(NULL);
        _exit(KP_EXIT_TIMEOUT);
    }
    return NULL;
}

int kp_run_config(const kp_config *cfg, const kp_run_options *opt, kp_error *err) {
    run_state st = {.cfg = cfg, .opt = opt, .current = -1};
    for (int i = 0; i < cfg->ncases; i++) st.selected += in_share(opt, i) && (!opt->filter || strstr(cfg->cases[i].name, opt->filter));
    if (st.selected == 0) /* before the bundle exists: an empty bundle would read as a run */
        return kp_fail(err, KP_EXIT_USAGE, "%s matches no case", opt->filter ? "--filter" : "--shard");
    if (kp_bundle_open(&st.bundle, opt->out_dir, err)) return err->code;
    pthread_mutex_init(&st.lock, NULL);
    st.timeout = opt->timeout_s > 0 ? opt->timeout_s : cfg->timeout_s;
    st.t_start = kp_now();
    kp_stages_reset();
    st.env = kp_environment_json();
    if (st.timeout > 0) st.have_watchdog = pthread_create(&st.watchdog, NULL, watchdog_main, &st) == 0;
    summary_row *rows = NULL;
    int nrows = 0, timed_out = 0, any_ran = 0, device_lost = 0;
    kp_result worst = KP_PASSED;
    for (int ci = 0; ci < cfg->ncases; ci++) {
        const kp_case_spec *cs = &cfg->cases[ci];
        if (!in_share(opt, ci) || (opt->filter && !strstr(cs->name, opt->filter))) continue;
        double t_case = kp_now();
        kp_result case_result = KP_PASSED;
        cJSON *receipt;
        if (st.timeout > 0 && kp_now() - st.t_start > st.timeout) {
            timed_out = 1;
            case_result = KP_NOT_RUN;
            receipt = stub_receipt(&st, cs, KP_NOT_RUN, "the gate's timeout passed before this case started");
        } else if (device_lost) {
            case_result = KP_NOT_RUN;
            receipt = stub_receipt(&st, cs, KP_NOT_RUN, "the device was lost to a sticky CUDA error in an earlier case");
        } else {
            pthread_mutex_lock(&st.lock);
            st.current = ci;
            pthread_mutex_unlock(&st.lock);
            receipt = cJSON_CreateObject();
            cJSON_AddStringToObject(receipt, "schema", "kparity.receipt/v1");
            cJSON_AddItemToObject(receipt, "case", case_json(cfg, cs));
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
                double t_close = kp_now();
                kp_case_ctx_close(&ctx);
                kp_json_add_double(receipt, "release_s", kp_now() - t_close);
            }
            device_lost = kp_device_lost();
            cJSON_AddItemToObject(receipt, "checks", checks);
            cJSON_AddStringToObject(receipt, "result", kp_result_name(case_result));
            cJSON_AddItemToObject(receipt, "reasons", reasons);
            cJSON_AddItemToObject(receipt, "artifacts", artifacts);
            kp_json_add_double(receipt, "duration_s", kp_now() - t_case);
            cJSON_AddItemToObject(receipt, "environment", cJSON_Duplicate(st.env, 1));
        }
        /* the summary table, from the checks as recorded */
        const cJSON *checks = cJSON_GetObjectItemCaseSensitive(receipt, "checks");
        for (const cJSON *chk = checks ? checks->child : NULL; chk; chk = chk->next) {
            summary_row *grown = realloc(rows, sizeof *rows * (size_t)(nrows + 1));
            if (!grown) break;
            rows = grown;
            summary_row *row = &rows[nrows++];
            snprintf(row->case_name, sizeof row->case_name, "%s", cs->name);
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(chk, "label");
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(chk, "summary");
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(chk, "result");
            snprintf(row->label, sizeof row->label, "%s", cJSON_IsString(l) ? l->valuestring : "?");
            snprintf(row->figure, sizeof row->figure, "%s", cJSON_IsString(s) ? s->valuestring : "");
            const int parsed = kp_result_parse(cJSON_IsString(r) ? r->valuestring : NULL);
            row->result = parsed < 0 ? KP_FAILED : (kp_result)parsed;
        }
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
        pthread_mutex_unlock(&st.lock);
        if (rc) {
            st.stop_watchdog = 1;
            if (st.have_watchdog) pthread_join(st.watchdog, NULL);
            cJSON_Delete(st.env);
            free(rows);
            kp_bundle_free(st.bundle);
            return err->code;
        }
        worst = worse(worst, case_result);
        progress(opt, st.done++, st.selected, cs->name, case_result, kp_now() - t_case, kp_now() - st.t_start);
    }
    pthread_mutex_lock(&st.lock);
    st.stop_watchdog = 1;
    pthread_mutex_unlock(&st.lock);
    if (st.have_watchdog) pthread_join(st.watchdog, NULL);
    int code;
    const char *verdict;
    if (timed_out) {
        code = KP_EXIT_TIMEOUT, verdict = "TIMEOUT";
    } else if (worst == KP_FAILED || device_lost) {
        code = KP_EXIT_ENV, verdict = "FAILED";
    } else if (worst == KP_INCORRECT) {
        code = KP_EXIT_INCORRECT, verdict = "INCORRECT";
    } else if (!any_ran) {
        code = KP_EXIT_SKIP, verdict = "NOT_RUN";
    } else if (worst == KP_PASSED) {
        code = KP_EXIT_OK, verdict = "PASSED";
    } else { /* some checks could not run (no device, refused shape): not a pass */
        code = KP_EXIT_SKIP, verdict = kp_result_name(worst);
    }
    double t_finish = kp_now();
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
                kp_process_seconds());
    }
    cJSON_Delete(st.env);
    free(rows);
    kp_bundle_free(st.bundle);
    pthread_mutex_destroy(&st.lock);
    return rc ? err->code : code;
}
