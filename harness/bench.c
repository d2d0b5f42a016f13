/* bench.c: the bench command. Each impl runs on each case with inputs uploaded once; figures come
 * from the family's bench hook and are printed side by side so two impls compare directly. */
#define _GNU_SOURCE
#include "kp_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_json.h"
#include "kp_device.h"
#include "kp_harness.h"

static const char *const default_cases[] = {
    "topp(batch=64,profile=ordinary,seed=58231,top_p=0.95,vocab=154856)",
    "topp(batch=4,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)",
};

static int cmp_seconds(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail_with(const kp_error *err) {
    fprintf(stderr, "kparity: %s\n", err->msg);
    return err->code ? err->code : KP_EXIT_ENV;
}

int kp_bench(const char **impl_names, int nimpl, const char **cases, int ncase, int reps) {
    kp_error err = {0};
    if (reps <= 0) reps = 50;
    if (ncase == 0) {
        cases = (const char **)default_cases;
        ncase = 2;
    }
    const kp_impl *impls[32];
    int n = 0;
    for (int i = 0; i < nimpl; i++) {
        if (!(impls[n++] = kp_impl_find(impl_names[i]))) {
            fprintf(stderr, "kparity: --impl %s: unknown impl\n", impl_names[i]);
            return KP_EXIT_USAGE;
        }
    }
    if (nimpl == 0)
        for (int i = 0; i < kp_impl_count() && n < 32; i++)
            if (kp_impl_at(i)->memory == KP_MEMORY_HOST || kp_device_count() > 0) impls[n++] = kp_impl_at(i);
    double copy_bw = kp_device_count() > 0 ? kp_device_copy_bandwidth() : 0;
    if (copy_bw > 0) printf("device copy bandwidth (1 GiB D2D, median of 5): %.1f GB/s\n", copy_bw / 1e9);
    printf("%-26s %-70s %12s %19s %10s %8s\n", "IMPL", "CASE", "MEDIAN us", "P10-P90 us", "GB/s", "% copy");
    int rc = 0;
    for (int c = 0; c < ncase; c++) {
        kp_case kc;
        if (kp_case_parse(cases[c], &kc, &err) || kp_case_normalize(&kc, &err)) {
            fprintf(stderr, "kparity: --case: %s\n", err.msg);
            return KP_EXIT_USAGE;
        }
        const kp_family *fam = kp_family_find(kc.family);
        void *data = NULL;
        if (fam->prepare(&kc, 0, &data, &err)) {
            fprintf(stderr, "kparity: %s\n", err.msg);
            return err.code;
        }
        char name[KP_CASE_NAME_MAX];
        kp_case_format(&kc, name, sizeof name);
        for (int i = 0; i < n; i++) {
            if (strcmp(impls[i]->family, kc.family)) continue;
            cJSON *t = cJSON_CreateObject();
            if (fam->bench(data, impls[i], reps, t, &err)) {
                printf("%-26s %-70s  %s\n", impls[i]->name, name, err.msg);
                rc = KP_EXIT_ENV;
            } else {
                double med = 0, p10 = 0, p90 = 0, gbs = 0;
                kp_json_get_double(t, "median_us", &med);
                kp_json_get_double(t, "p10_us", &p10);
                kp_json_get_double(t, "p90_us", &p90);
                kp_json_get_double(t, "gb_per_s", &gbs);
                char share[16] = "-";
                if (impls[i]->memory == KP_MEMORY_CUDA && copy_bw > 0)
                    snprintf(share, sizeof share, "%.1f", 100.0 * gbs * 1e9 / copy_bw);
                char spread[40];
                snprintf(spread, sizeof spread, "%.1f-%.1f", p10, p90);
                printf("%-26s %-70s %12.1f %19s %10.1f %8s\n", impls[i]->name, name, med, spread, gbs, share);
            }
            cJSON_Delete(t);
        }
        fam->release(data);
        /* the float64 reference too: it is on the gate's startup path */
        double ref_s[3];
        for (int k = 0; k < 3; k++) {
            if (fam->prepare(&kc, 0, &data, &err)) return fail_with(&err);
            double t0 = kp_now();
            int bad = fam->reference(data, NULL, NULL, &err);
            ref_s[k] = kp_now() - t0;
            int64_t rows = fam->batch(data);
            fam->release(data);
            if (bad) return fail_with(&err);
            if (k == 2) {
                qsort(ref_s, 3, sizeof *ref_s, cmp_seconds);
                char spread[40];
                snprintf(spread, sizeof spread, "%.1f-%.1f", ref_s[0] * 1e6, ref_s[2] * 1e6);
                printf("%-26s %-70s %12.1f %19s %10s %8s  (%.2f ms per row, %d threads; 3 runs, min-max)\n",
                       "reference.topp@host-f64", name, ref_s[1] * 1e6, spread, "-", "-", ref_s[1] * 1e3 / (double)rows,
                       kp_thread_count());
            }
        }
    }
    printf("(%d timed reps each; host impls by wall clock, CUDA impls by events with L2 flushed)\n", reps);
    return rc;
}
