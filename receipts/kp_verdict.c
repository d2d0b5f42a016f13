/* kp_verdict.c: a run's verdict and exit code from its results (the one copy of the rule the runner, merge,
 * finish and verify share), and whether a bundle's recorded verdict is one its receipts allow. */
#include "kp_verdict.h"

#include <stdio.h>
#include <string.h>


const char *kp_bundle_verdict(kp_result worst, int any_ran, int timed_out, int device_lost, int *exit_code) {
    if (timed_out) return *exit_code = KP_EXIT_TIMEOUT, "TIMEOUT";
    if (worst == KP_FAILED || device_lost) return *exit_code = KP_EXIT_ENV, "FAILED";
    if (worst == KP_INCORRECT) return *exit_code = KP_EXIT_INCORRECT, "INCORRECT";
    if (!any_ran) return *exit_code = KP_EXIT_SKIP, "NOT_RUN";
    if (worst == KP_PASSED) return *exit_code = KP_EXIT_OK, "PASSED";
    /* some checks could not run (no device, refused shape): not a pass */
    return *exit_code = KP_EXIT_SKIP, kp_result_name(worst);
}

/* A result as the verdict counts it: one outside the vocabulary as FAILED, never as a pass (finish refuses such a
 * receipt; only a changed file can hold one). */
static kp_result counted(const cJSON *obj) {
    const int r = kp_result_parse(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, "result")));
    return r < 0 ? KP_FAILED : (kp_result)r;
}

const char *kp_bundle_rows_verdict(const cJSON *rows, int timed_out, int device_lost, int *exit_code) {
    kp_result worst = KP_PASSED;
    int any_ran = 0;
    const cJSON *row, *check;
    cJSON_ArrayForEach(row, rows) {
        const kp_result r = counted(row);
        if (r > worst) worst = r;
        cJSON_ArrayForEach(check, cJSON_GetObjectItemCaseSensitive(row, "checks")) any_ran |= counted(check) != KP_NOT_RUN;
    }
    return kp_bundle_verdict(worst, any_ran, timed_out, device_lost, exit_code);
}

int kp_bundle_verdict_fits(const cJSON *rows, const char *verdict, int64_t exit_code, char *why, size_t why_size) {
    int derived_code, code = -1;
    const char *derived = kp_bundle_rows_verdict(rows, 0, 0, &derived_code);
    static const char *const names[] = {"PASSED", "INCORRECT", "FAILED", "TIMEOUT", "NOT_RUN", "NOT_SUPPORTED"};
    static const int codes[] = {KP_EXIT_OK, KP_EXIT_INCORRECT, KP_EXIT_ENV, KP_EXIT_TIMEOUT, KP_EXIT_SKIP, KP_EXIT_SKIP};
    for (size_t i = 0; verdict && i < sizeof names / sizeof *names; i++)
        if (!strcmp(verdict, names[i])) code = codes[i];
    if (code < 0) {
        snprintf(why, why_size, "verdict '%s' is none of PASSED, INCORRECT, FAILED, TIMEOUT, NOT_RUN, NOT_SUPPORTED",
                 verdict ? verdict : "(missing)");
        return 0;
    }
    if (exit_code != code) {
        snprintf(why, why_size, "exit code %lld does not go with verdict %s (exit %d)", (long long)exit_code, verdict, code);
        return 0;
    }
    /* The receipts give every verdict but two: TIMEOUT (the gate's clock ran out; a receipt may say so, but a
     * timeout between a receipt and the finish, or in a worker that dies after its last receipt, leaves none) and
     * FAILED for a device lost to a sticky CUDA error (noticed after a case, so its receipts may all have passed).
     * Either outranks what the receipts give, so a bundle may say one of them whatever its receipts; never less. */
    if (strcmp(verdict, derived) && strcmp(verdict, "TIMEOUT") && strcmp(verdict, "FAILED")) {
        snprintf(why, why_size, "verdict %s (exit %d) is not what the receipts give: %s (exit %d)", verdict, code, derived,
                 derived_code);
        return 0;
    }
    return 1;
}
