/* kp_bench.h: `kparity bench`: time impls on cases and print impl, shape, median us, GB/s and the
 * share of the device's measured copy bandwidth. Numbers, never assertions. */
#ifndef KP_BENCH_H
#define KP_BENCH_H

/* impls/cases may be empty: every impl of the family that can run here, and the default shapes. */
int kp_bench(const char **impls, int nimpl, const char **cases, int ncase, int reps);

#endif
