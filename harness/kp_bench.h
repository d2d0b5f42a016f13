/* kp_bench.h: `kparity bench`: time impls on cases and print impl, shape, median us, GB/s and the
 * share of the device's measured copy bandwidth. Numbers, never assertions. */
#ifndef KP_BENCH_H
#define KP_BENCH_H

#include "../cases/kp_common.h"

/* impls/cases may be empty: every impl that can run here, and every family's default shapes. The exit
 * class, with err's message for the caller to print. */
int kp_bench(const char **impls, int nimpl, const char **cases, int ncase, int reps, kp_error *err);

#endif
