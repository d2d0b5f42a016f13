/* test_rates.c: rates with intervals (harness/kp_rates.h) against published values, and `kparity rates`:
 *   Wilson score intervals: Newcombe (1998), "Two-sided confidence intervals for the single proportion: comparison of
 *   seven methods", Stat Med 17:857, method 3: 81/263 -> 0.2553-0.3662, 15/148 -> 0.0624-0.1605, 0/20 -> 0-0.1611,
 *   1/29 -> 0.0061-0.1718.
 *   Newcombe's hybrid score interval for a difference: Newcombe (1998), "Interval estimation for the difference between
 *   independent proportions", Stat Med 17:873, method 10: 56/70 - 48/80 -> 0.0524 to 0.3339.
 *   Trials per arm: JMP's two-sample proportions calculator (docs, "Two Sample Proportions"): 0.08 vs 0.06, two-sided
 *   alpha 0.05, power 0.8 -> 2554.
 * And the seed's night (topk-corruption-greedy-nondeterminism.txt): flip rates of 13% and 22.5% at n = 40 cannot be
 * told apart. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/kp_rates.h"
#include "kp_test_util.h"

static void wilson_is(double k, double n, double lo4, double hi4) {
    double lo, hi;
    kp_wilson(k, n, 0.95, &lo, &hi);
    cr_assert(fabs(lo - lo4) < 5e-5 && fabs(hi - hi4) < 5e-5, "%g/%g: [%.5f, %.5f], published [%.4f, %.4f]", k, n, lo, hi,
              lo4, hi4);
}

Test(rates, wilson_matches_newcombes_table) {
    wilson_is(81, 263, 0.2553, 0.3662);
    wilson_is(15, 148, 0.0624, 0.1605);
    wilson_is(0, 20, 0.0, 0.1611);
    wilson_is(1, 29, 0.0061, 0.1718);
}

Test(rates, normal_quantile_is_accurate_in_the_tails) {
    cr_assert(fabs(kp_normal_quantile(0.975) - 1.959963984540054) < 1e-13);
    cr_assert(fabs(kp_normal_quantile(0.8) - 0.8416212335729143) < 1e-13);
    cr_assert(fabs(kp_normal_quantile(1e-10) + 6.361340902404056) < 1e-11);
    cr_assert(fabs(kp_normal_quantile(0.5)) < 1e-15);
}

Test(rates, newcombe_difference_matches_the_published_example) {
    double lo, hi;
    kp_newcombe_difference(56, 70, 48, 80, 0.95, &lo, &hi);
    cr_assert(fabs(lo - 0.0524) < 5e-5 && fabs(hi - 0.3339) < 5e-5, "[%.5f, %.5f]", lo, hi);
}

Test(rates, trials_per_arm_matches_jmp) {
    cr_assert_eq(kp_trials_per_arm(0.08, 0.06, 0.05, 0.8), 2554);
    cr_assert_eq(kp_trials_per_arm(0.3, 0.3, 0.05, 0.8), -1, "equal rates: no number of trials");
}

Test(rates, the_seeds_thirteen_and_twenty_two_and_a_half_percent_at_forty_are_not_distinguishable) {
    double lo, hi;
    kp_newcombe_difference(0.13 * 40, 40, 0.225 * 40, 40, 0.95, &lo, &hi);
    cr_assert(lo < 0 && hi > 0, "[%g, %g] must include 0", lo, hi);
    cr_assert_gt(kp_two_proportion_p(0.13 * 40, 40, 0.225 * 40, 40), 0.05);
    const int64_t n = kp_trials_per_arm(0.13, 0.225, 0.05, 0.8);
    cr_assert(n > 200 && n < 300, "%lld trials per arm", (long long)n);
    /* at that many trials the same rates are told apart */
    kp_newcombe_difference(0.13 * (double)n, (double)n, 0.225 * (double)n, (double)n, 0.95, &lo, &hi);
    cr_assert(hi < 0, "[%g, %g] at n = %lld", lo, hi, (long long)n);
}

static int rates_cli(const char *a, const char *b, char **out, char **err) {
    char *argv[] = {kpt_binary(), "rates", "--a", (char *)a, (char *)(b ? "--b" : NULL), (char *)b, NULL};
    return kpt_run(argv, out, err);
}

Test(rates, the_command_says_whether_and_how_many) {
    char *out, *err;
    cr_assert_eq(rates_cli("13/100", "22.5/100", &out, &err), 0, "%s", err);
    cr_assert(strstr(out, "[0.0776, 0.2098]"), "%s", out);
    cr_assert(strstr(out, "distinguishable: no"), "%s", out);
    cr_assert(strstr(out, "power 0.8): 253"), "%s", out);
    free(out), free(err);
    cr_assert_eq(rates_cli("56/70", "48/80", &out, &err), 0, "%s", err);
    cr_assert(strstr(out, "[+0.0524, +0.3339]") && strstr(out, "distinguishable: yes"), "%s", out);
    free(out), free(err);
    const struct {
        const char *a, *b, *needle;
    } bad[] = {
        {"3/2", NULL, "--a: '3/2': K must lie in [0, N]"},
        {"5", NULL, "--a: expected K/N"},
        {"5/0", NULL, "N must be above 0"},
        {"1/10", "x/10", "--b: 'x/10': K is not a number"},
        {"1/10", "1/", "--b: '1/': N is not a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(rates_cli(bad[i].a, bad[i].b, &out, &err), 2, "case %zu", i);
        cr_assert(strstr(err, bad[i].needle), "case %zu: %s", i, err);
        free(out), free(err);
    }
}
