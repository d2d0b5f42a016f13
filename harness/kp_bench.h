/* kp_bench.h: `kparity bench`: time impls on cases and print impl, shape, median us, GB/s and the
 * share of the device's measured copy bandwidth. Numbers, never assertions. */
#ifndef KP_BENCH_H
#define KP_BENCH_H

#include "../cases/kp_common.h"

typedef struct kp_bench_options {
    const char **impls; /* --impl: only these, on their families' cases; none: every impl that can run here */
    int nimpl;
    const char **cases; /* --case: these (each of a family some --impl is of); none: each selected family's
                           default shapes for this machine, bench_cases with a CUDA device, else bench_cases_host */
    int ncase;
    int reps;  /* timed reps per impl and case; 0: 50 */
    int json;  /* JSON lines on stdout: a "bench" line first, a "row" per impl and reference, a "case" (progress)
                  after each case, and an "end" line once every case has run */
    int quiet; /* no progress lines */
    int no_reference; /* --no-reference: no reference row (else the float64 reference is timed once a case) */
} kp_bench_options;

/* Each row is printed (and flushed) as it finishes, and each case ends with a progress line and an estimate of the
 * time left (kp_progress), so a bench stopped part way has printed what it measured. Only the selected cases' inputs
 * and references are made. Returns the exit class, with err's message for the caller to print: 2 for an unknown
 * impl, a bad case or a case no selected impl is of, 77 for a CUDA impl without a CUDA device (each before anything
 * runs), 3 when an impl could not be timed. */
int kp_bench(const kp_bench_options *opt, kp_error *err);

#endif
