/* kp_verdict.h: a run's verdict and exit code from its results (kp_verdict.c: the one copy of the rule the runner,
 * merge, finish and verify share), and whether a bundle's recorded verdict is one its receipts allow. */
#ifndef KP_VERDICT_H
#define KP_VERDICT_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "../cases/kp_common.h"

/* A run's verdict and its exit code (DESIGN.md "The gate"), in precedence: TIMEOUT (4) when the gate's time ran
 * out; FAILED (3) when a case failed or the device was lost; INCORRECT (1); NOT_RUN (77) when no check ran; PASSED
 * (0); else the worst result's name (77: some checks could not run). */
const char *kp_bundle_verdict(kp_result worst, int any_ran, int timed_out, int device_lost, int *exit_code);
/* The same from receipt rows: the worst receipt result (one outside the vocabulary counts as FAILED) and whether
 * any check's result is other than NOT_RUN. */
const char *kp_bundle_rows_verdict(const cJSON *rows, int timed_out, int device_lost, int *exit_code);
/* Whether a bundle of these rows may record `verdict` with `exit_code`: the exit code is the verdict's, and the
 * verdict is what the rows give, or TIMEOUT or FAILED, which the receipts cannot always show (a timeout, a lost
 * device). 0 with `why` filled when not. finish refuses what this refuses, verify checks bundle.json with it. */
int kp_bundle_verdict_fits(const cJSON *rows, const char *verdict, int64_t exit_code, char *why, size_t why_size);

#endif
