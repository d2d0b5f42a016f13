/* kp_rates.h: rates with intervals, for repeat's flip rates and `kparity rates` (issue 19): whether two
 * observed rates can be told apart, and how many trials would tell them apart.
 *   Wilson score interval (Wilson 1927): the interval for one proportion k/n that stays inside [0, 1] and
 *   behaves at k = 0 and small n (Newcombe 1998, method 3).
 *   Newcombe's hybrid score interval for p1 - p2 (Newcombe 1998, method 10), built from the two Wilson
 *   intervals: two rates are distinguishable at level 1 - alpha when it excludes 0.
 *   The pooled two-proportion z test's two-sided p value, reported beside it.
 *   Trials per arm for a two-sided test at alpha with the given power to detect p1 vs p2 (the normal
 *   approximation with the pooled variance under H0: Fleiss; JMP's two-sample proportions calculator gives
 *   2554 for 0.08 vs 0.06).
 * Counts may be fractional (a rate quoted as 22.5% of 40 is 9/40; 13% of 40 is 5.2/40). */
#ifndef KP_RATES_H
#define KP_RATES_H

#include <stdint.h>

/* The standard normal quantile: x with Phi(x) = p, p in (0, 1), to about 1e-15 (Newton steps on erfc). */
double kp_normal_quantile(double p);
/* Wilson's score interval for k successes of n at confidence conf (0.95): [*lo, *hi]. n > 0, 0 <= k <= n. */
void kp_wilson(double k, double n, double conf, double *lo, double *hi);
/* Newcombe's hybrid score interval for k1/n1 - k2/n2 at confidence conf. */
void kp_newcombe_difference(double k1, double n1, double k2, double n2, double conf, double *lo, double *hi);
/* The pooled two-proportion z test's two-sided p value (1 when both rates are 0 or both 1). */
double kp_two_proportion_p(double k1, double n1, double k2, double n2);
/* Trials per arm so that a two-sided test at alpha has `power` to tell p1 from p2; -1 when p1 == p2. */
int64_t kp_trials_per_arm(double p1, double p2, double alpha, double power);
/* `kparity rates --a K/N --b K/N [--alpha A] [--power P] [--json]`: argv after the command. Exit 0, or 2 with the
 * field and the reason for bad input. */
int kp_cmd_rates(int argc, char **argv);

#endif
