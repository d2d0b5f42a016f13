/* bench.c: the bench command. Each impl runs on each case with inputs uploaded once; figures come
 * from the harness's bench loop (kp_bench_impl) and are printed side by side so two impls compare. */
#define _GNU_SOURCE
#include "kp_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_json.h"
#include "kp_device.h"
#include "kp_exec.h"
#include "kp_launch.h"
#include "kp_progress.h"

#define BENCH_IMPLS_MAX 32

/* A "row" event: the impl, the case and its figures (timing, copied) or why it has none. */
static void print_json_row(const char *impl, const char *name, const cJSON *timing, const char *error) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", "row");
    cJSON_AddStringToObject(o, "impl", impl);
    cJSON_AddStringToObject(o, "case", name);
    if (timing) cJSON_AddItemToObject(o, "timing", cJSON_Duplicate(timing, 1));
    if (error) cJSON_AddStringToObject(o, "error", error);
    char *text = cJSON_PrintUnformatted(o);
    printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(o);
}

/* The float64 reference too: it is on the gate's startup path. One run, on the case the impls were timed on (their
 * runs read its inputs through copies, never write them): a gate computes it once a case, and on the large cases one
 * run is seconds, most of a bench's wall time when it was timed three times. */
static int bench_reference(kp_prepared *p, const char *name, int json, kp_error *err) {
    p->cache_reference = false; /* timed: computed here, neither read from the cache nor written to it */
    const double t0 = kp_now();
    if (kp_reference_run(p, NULL, NULL, err)) return err->code;
    const double s = kp_now() - t0;
    const kp_family *fam = p->fam;
    if (json) {
        cJSON *t = cJSON_CreateObject();
        kp_json_add_int(t, "runs", 1);
        kp_json_add_double(t, "median_us", s * 1e6);
        kp_json_add_double(t, "min_us", s * 1e6);
        kp_json_add_double(t, "max_us", s * 1e6);
        kp_json_add_int(t, "rows", p->v.batch);
        kp_json_add_int(t, "threads", kp_thread_count());
        cJSON_AddStringToObject(t, "method", "wall clock around one run on the case's inputs");
        print_json_row(fam->reference_provider, name, t, NULL);
        cJSON_Delete(t);
    } else {
        printf("%-26s %-70s %12.1f %19s %10s %8s %9s  (%.2f ms per row, %d threads; one run)\n", fam->reference_provider,
               name, s * 1e6, "-", "-", "-", "-", s * 1e3 / (double)p->v.batch, kp_thread_count());
    }
    fflush(stdout);
    return 0;
}

/* One impl on one prepared case: its row, printed and flushed. Nonzero when it could not be timed (its row says
 * why). */
static int bench_row(kp_prepared *p, const kp_impl *impl, const char *name, int reps, double copy_bw, int json) {
    cJSON *t = cJSON_CreateObject();
    kp_error e = {0};
    const int bad = kp_bench_impl(p, impl, reps, t, &e);
    if (bad) {
        if (json) print_json_row(impl->name, name, NULL, e.msg);
        else printf("%-26s %-70s  %s\n", impl->name, name, e.msg);
    } else {
        double med = 0, p10 = 0, p90 = 0, wall = 0, bytes = 0, flops = 0;
        kp_json_get_double(t, "median_us", &med);
        kp_json_get_double(t, "p10_us", &p10);
        kp_json_get_double(t, "p90_us", &p90);
        const int self = !kp_json_get_double(t, "self_median_us", &wall); /* the program timed itself */
        if (self) {
            double swap = med;
            med = wall, wall = swap;
            kp_json_get_double(t, "self_p10_us", &p10);
            kp_json_get_double(t, "self_p90_us", &p90);
        }
        /* the rates from the median this row shows (the program's own when it timed itself) */
        const int has_bytes = !kp_json_get_double(t, "bytes", &bytes) && bytes > 0 && med > 0;
        const int has_flops = !kp_json_get_double(t, "flops", &flops) && flops > 0 && med > 0;
        const double gbs = has_bytes ? bytes / (med * 1e-6) / 1e9 : 0, tfs = has_flops ? flops / (med * 1e-6) / 1e12 : 0;
        if (self && has_bytes) cJSON_AddNumberToObject(t, "self_gb", gbs);
        if (self && has_flops) cJSON_AddNumberToObject(t, "self_tflop_per_s", tfs);
        char share[16] = "-", gb[16] = "-", tf[16] = "-";
        if (has_bytes) {
            snprintf(gb, sizeof gb, "%.1f", gbs);
            if ((impl->memory == KP_MEMORY_CUDA || self) && copy_bw > 0)
                snprintf(share, sizeof share, "%.1f", 100.0 * gbs * 1e9 / copy_bw);
        }
        if (has_flops) snprintf(tf, sizeof tf, "%.4g", tfs);
        char spread[40];
        snprintf(spread, sizeof spread, "%.1f-%.1f", p10, p90);
        if (json) {
            print_json_row(impl->name, name, t, NULL);
        } else if (self) {
            printf("%-26s %-70s %12.1f %19s %10s %8s %9s  (its own CUDA events; %.1f us a call through the protocol)\n",
                   impl->name, name, med, spread, gb, share, tf, wall);
        } else {
            printf("%-26s %-70s %12.1f %19s %10s %8s %9s\n", impl->name, name, med, spread, gb, share, tf);
        }
    }
    fflush(stdout);
    cJSON_Delete(t);
    return bad;
}

static int impl_of_family(const kp_impl *const *impls, int n, const char *family) {
    for (int i = 0; i < n; i++)
        if (!strcmp(impls[i]->family, family)) return 1;
    return 0;
}

/* Parse and normalize one case name into *kc; `source` says where it came from, for the error. */
static int take_case(const char *text, const char *source, kp_case *kc, kp_error *err) {
    if (kp_case_parse(text, kc, err) || kp_case_normalize(kc, err)) {
        kp_error_prefix(err, "%s: ", source);
        return err->code ? err->code : KP_EXIT_USAGE;
    }
    if (!kp_family_find(kc->family))
        return kp_fail(err, KP_EXIT_USAGE, "%s %s: family %s has no harness family", source, text, kc->family);
    return 0;
}

/* The cases to bench, every one parsed before anything is made: --case's, else the default shapes of each family
 * some selected impl is of. *none_here lists the families that have no default shapes for this machine. */
static int select_cases(const kp_bench_options *opt, const kp_impl *const *impls, int nimpl, int gpu, kp_case **out,
                        int *ncase, char *none_here, size_t none_len, kp_error *err) {
    int cap = opt->ncase;
    for (int f = 0; f < kp_family_count(); f++) {
        const char *const *list = gpu ? kp_family_at(f)->bench_cases : kp_family_at(f)->bench_cases_host;
        for (int i = 0; list && list[i]; i++) cap++;
    }
    kp_case *cases = *out = calloc((size_t)(cap ? cap : 1), sizeof *cases);
    if (!cases) return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    *ncase = 0;
    none_here[0] = '\0';
    for (int c = 0; c < opt->ncase; c++) {
        kp_case *kc = &cases[(*ncase)++];
        if (take_case(opt->cases[c], "--case", kc, err)) return err->code;
        if (opt->nimpl && !impl_of_family(impls, nimpl, kc->family))
            return kp_fail(err, KP_EXIT_USAGE, "--case %s: no --impl given is of family %s (add one, or leave --impl out "
                           "to bench every impl of it)", opt->cases[c], kc->family);
    }
    if (opt->ncase) return 0;
    for (int f = 0; f < kp_family_count(); f++) {
        const kp_family *fam = kp_family_at(f);
        if (opt->nimpl && !impl_of_family(impls, nimpl, fam->name)) continue; /* its inputs are never made */
        const char *const *list = gpu ? fam->bench_cases : fam->bench_cases_host;
        if (!list || !list[0]) {
            size_t used = strlen(none_here);
            snprintf(none_here + used, none_len - used, "%s%s", used ? ", " : "", fam->name);
        }
        for (int i = 0; list && list[i]; i++)
            if (take_case(list[i], gpu ? "bench_cases" : "bench_cases_host", &cases[(*ncase)++], err)) {
                kp_error_prefix(err, "family %s: ", fam->name);
                return err->code;
            }
    }
    if (*ncase == 0)
        return kp_fail(err, KP_EXIT_USAGE, "no cases to bench: %s declares no %s bench shapes; name cases with --case",
                       none_here, gpu ? "GPU" : "host");
    return 0;
}

int kp_bench(const kp_bench_options *opt, kp_error *err) {
    const int reps = opt->reps > 0 ? opt->reps : 50;
    const kp_impl *impls[BENCH_IMPLS_MAX];
    int n = 0;
    if (opt->nimpl > BENCH_IMPLS_MAX) return kp_fail(err, KP_EXIT_USAGE, "--impl: at most %d impls", BENCH_IMPLS_MAX);
    for (int i = 0; i < opt->nimpl; i++)
        if (!(impls[n++] = kp_impl_find(opt->impls[i])))
            return kp_fail(err, KP_EXIT_USAGE, "--impl %s: unknown impl (kparity list names them)", opt->impls[i]);
    const int gpu = kp_device_count() > 0;
    for (int i = 0; i < n; i++) /* before any case is made for it */
        if (impls[i]->memory == KP_MEMORY_CUDA && !gpu)
            return kp_fail(err, KP_EXIT_SKIP, "--impl %s: a CUDA impl, and no CUDA device is usable here (kparity list "
                           "says how many it sees)", impls[i]->name);
    /* By default the impls this machine's shapes are for: with a device the CUDA impls (the host ports on the GPU
     * shapes take minutes a case and time nothing that serves), else the host ports; --impl names any. */
    const kp_memory want = gpu ? KP_MEMORY_CUDA : KP_MEMORY_HOST;
    if (opt->nimpl == 0)
        for (int i = 0; i < kp_impl_count() && n < BENCH_IMPLS_MAX; i++)
            if (kp_impl_at(i)->memory == want) impls[n++] = kp_impl_at(i);
    kp_case *cases = NULL;
    int ncase = 0;
    char none_here[256];
    if (select_cases(opt, impls, n, gpu, &cases, &ncase, none_here, sizeof none_here, err)) {
        free(cases);
        return err->code;
    }
    /* the header counts the impls that will run: those of a family some case is of (--case may name one family) */
    int used = 0;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < ncase; c++)
            if (!strcmp(impls[i]->family, cases[c].family)) {
                used++;
                break;
            }
    const char *shapes = opt->ncase ? "the cases given" : gpu ? "each family's GPU shapes (a CUDA device is here)"
                                                              : "each family's host shapes (no CUDA device here)";
    const double copy_bw = gpu ? kp_device_copy_bandwidth() : 0;
    if (opt->json) {
        printf("{\"event\":\"bench\",\"cases\":%d,\"impls\":%d,\"reps\":%d,\"shapes\":\"%s\",\"gpu\":%s", ncase,
               used, reps, opt->ncase ? "given" : gpu ? "gpu" : "host", gpu ? "true" : "false");
        if (copy_bw > 0) printf(",\"copy_gb_per_s\":%.17g", copy_bw / 1e9);
        printf("}\n");
    } else {
        printf("%d case%s: %s%s%s%s; %d impl%s, %d timed reps each\n", ncase, ncase == 1 ? "" : "s", shapes,
               none_here[0] ? "; none for " : "", none_here, none_here[0] ? " (--case names some)" : "", used,
               used == 1 ? "" : "s", reps);
        if (copy_bw > 0) printf("device copy bandwidth (1 GiB D2D, median of 5): %.1f GB/s\n", copy_bw / 1e9);
        printf("%-26s %-70s %12s %19s %10s %8s %9s\n", "IMPL", "CASE", "MEDIAN us", "P10-P90 us", "GB/s", "% copy", "TFLOP/s");
    }
    fflush(stdout);
    int rc = 0, stop = 0;
    const double t_start = kp_now();
    for (int c = 0; c < ncase; c++) {
        const double t_case = kp_now();
        const kp_family *fam = kp_family_find(cases[c].family);
        char name[KP_CASE_NAME_MAX];
        kp_case_format(&cases[c], name, sizeof name);
        kp_prepared p;
        if ((stop = kp_prepare(fam, &cases[c], 0, &p, err))) break;
        int failed = 0;
        for (int i = 0; i < n; i++)
            if (!strcmp(impls[i]->family, fam->name)) failed |= bench_row(&p, impls[i], name, reps, copy_bw, opt->json);
        if (failed) rc = KP_EXIT_ENV;
        stop = opt->no_reference ? 0 : bench_reference(&p, name, opt->json, err);
        kp_prepared_release(&p);
        if (stop) break;
        if (!opt->quiet)
            kp_progress(opt->json, c, ncase, name, failed ? "FAILED" : "timed", kp_now() - t_case, kp_now() - t_start);
    }
    free(cases);
    kp_exec_stop_all();
    if (stop) return err->code ? err->code : KP_EXIT_ENV;
    if (opt->json) {
        printf("{\"event\":\"end\",\"cases\":%d,\"exit_code\":%d,\"seconds\":%.3f}\n", ncase, rc, kp_now() - t_start);
        fflush(stdout);
    } else {
        printf("(%d timed reps each; host impls by wall clock, CUDA impls by events with L2 flushed; an outside program by "
               "its\n own events when it times itself, else by wall clock around the whole request)\n", reps);
        fflush(stdout);
    }
    if (rc) kp_fail(err, rc, "an impl could not be timed (its row above says why)");
    return rc;
}
