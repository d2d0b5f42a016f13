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

/* The float64 reference too: it is on the gate's startup path. Three fresh preparations, min-max. */
static int bench_reference(const kp_family *fam, const kp_case *kc, const char *name, kp_error *err) {
    double ref_s[3];
    int64_t rows = 0;
    for (int k = 0; k < 3; k++) {
        kp_prepared p;
        if (kp_prepare(fam, kc, 0, &p, err)) return err->code;
        const double t0 = kp_now();
        int bad = kp_reference_run(&p, NULL, NULL, err);
        ref_s[k] = kp_now() - t0;
        rows = p.v.batch;
        kp_prepared_release(&p);
        if (bad) return err->code;
    }
    qsort(ref_s, 3, sizeof *ref_s, kp_cmp_double);
    char spread[40];
    snprintf(spread, sizeof spread, "%.1f-%.1f", ref_s[0] * 1e6, ref_s[2] * 1e6);
    printf("%-26s %-70s %12.1f %19s %10s %8s  (%.2f ms per row, %d threads; 3 runs, min-max)\n", fam->reference_provider,
           name, ref_s[1] * 1e6, spread, "-", "-", ref_s[1] * 1e3 / (double)rows, kp_thread_count());
    return 0;
}

int kp_bench(const char **impl_names, int nimpl, const char **cases, int ncase, int reps, kp_error *err) {
    if (reps <= 0) reps = 50;
    const char *defaults[64];
    if (ncase == 0) { /* every family's default shapes */
        for (int f = 0; f < kp_family_count(); f++)
            for (int i = 0; kp_family_at(f)->bench_cases && kp_family_at(f)->bench_cases[i] && ncase < 64; i++)
                defaults[ncase++] = kp_family_at(f)->bench_cases[i];
        cases = defaults;
    }
    const kp_impl *impls[32];
    int n = 0;
    for (int i = 0; i < nimpl; i++)
        if (!(impls[n++] = kp_impl_find(impl_names[i])))
            return kp_fail(err, KP_EXIT_USAGE, "--impl %s: unknown impl", impl_names[i]);
    if (nimpl == 0)
        for (int i = 0; i < kp_impl_count() && n < 32; i++)
            if (kp_impl_at(i)->memory == KP_MEMORY_HOST || kp_device_count() > 0) impls[n++] = kp_impl_at(i);
    double copy_bw = kp_device_count() > 0 ? kp_device_copy_bandwidth() : 0;
    if (copy_bw > 0) printf("device copy bandwidth (1 GiB D2D, median of 5): %.1f GB/s\n", copy_bw / 1e9);
    printf("%-26s %-70s %12s %19s %10s %8s\n", "IMPL", "CASE", "MEDIAN us", "P10-P90 us", "GB/s", "% copy");
    int rc = 0;
    for (int c = 0; c < ncase; c++) {
        kp_case kc;
        if (kp_case_parse(cases[c], &kc, err) || kp_case_normalize(&kc, err)) {
            kp_error_prefix(err, "--case: ");
            return KP_EXIT_USAGE;
        }
        const kp_family *fam = kp_family_find(kc.family);
        if (!fam) return kp_fail(err, KP_EXIT_USAGE, "--case %s: family %s has no harness family", cases[c], kc.family);
        kp_prepared p;
        if (kp_prepare(fam, &kc, 0, &p, err)) return err->code;
        char name[KP_CASE_NAME_MAX];
        kp_case_format(&kc, name, sizeof name);
        for (int i = 0; i < n; i++) {
            if (strcmp(impls[i]->family, kc.family)) continue;
            cJSON *t = cJSON_CreateObject();
            kp_error e = {0};
            if (kp_bench_impl(&p, impls[i], reps, t, &e)) {
                printf("%-26s %-70s  %s\n", impls[i]->name, name, e.msg);
                rc = KP_EXIT_ENV;
            } else {
                double med = 0, p10 = 0, p90 = 0, gbs = 0, wall = 0;
                kp_json_get_double(t, "median_us", &med);
                kp_json_get_double(t, "p10_us", &p10);
                kp_json_get_double(t, "p90_us", &p90);
                const int self = !kp_json_get_double(t, "self_median_us", &wall); /* the program timed itself */
                if (self) {
                    double swap = med;
                    med = wall, wall = swap;
                    kp_json_get_double(t, "self_p10_us", &p10);
                    kp_json_get_double(t, "self_p90_us", &p90);
                    if (!kp_json_get_double(t, "bytes", &gbs)) gbs = gbs / (med * 1e-6) / 1e9, cJSON_AddNumberToObject(t, "self_gb", gbs);
                }
                char share[16] = "-", gb[16] = "-";
                if (!kp_json_get_double(t, "gb_per_s", &gbs)) {
                    snprintf(gb, sizeof gb, "%.1f", gbs);
                    if (impls[i]->memory == KP_MEMORY_CUDA && copy_bw > 0)
                        snprintf(share, sizeof share, "%.1f", 100.0 * gbs * 1e9 / copy_bw);
                }
                char spread[40];
                snprintf(spread, sizeof spread, "%.1f-%.1f", p10, p90);
                if (self) {
                    if (copy_bw > 0 && gbs > 0) snprintf(share, sizeof share, "%.1f", 100.0 * gbs * 1e9 / copy_bw);
                    printf("%-26s %-70s %12.1f %19s %10s %8s  (its own CUDA events; %.1f us a call through the protocol)\n",
                           impls[i]->name, name, med, spread, gb, share, wall);
                } else {
                    printf("%-26s %-70s %12.1f %19s %10s %8s\n", impls[i]->name, name, med, spread, gb, share);
                }
            }
            cJSON_Delete(t);
        }
        kp_prepared_release(&p);
        if (bench_reference(fam, &kc, name, err)) return err->code;
    }
    kp_exec_stop_all();
    printf("(%d timed reps each; host impls by wall clock, CUDA impls by events with L2 flushed; an outside program by its\n"
           " own events when it times itself, else by wall clock around the whole request)\n", reps);
    if (rc) kp_fail(err, rc, "an impl could not be timed (its row above says why)");
    return rc;
}
