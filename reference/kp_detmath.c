/* kp_detmath.c: exp from + - * / only (kp_detmath.h). Built with -ffp-contract=off like the rest of
 * reference/, so no fused multiply-add changes a bit between machines. */
#include "kp_detmath.h"

#include <stdint.h>
#include <string.h>

/* fdlibm's e_exp.c scheme (< 1 ulp): x = k ln2 + r, |r| <= ln2/2, with ln2_hi's low bits zero so
 * k * ln2_hi is exact; a rational form of exp(r); then an exact scale by 2^k. */
static const double ln2_hi = 0x1.62e42feep-1, ln2_lo = 0x1.a39ef35793c76p-33;
static const double inv_ln2 = 0x1.71547652b82fep+0;
static const double exp_p1 = 0x1.555555555553ep-3, exp_p2 = -0x1.6c16c16bebd93p-9,
                    exp_p3 = 0x1.1566aaf25de2cp-14, exp_p4 = -0x1.bbd41c5d26bf1p-20,
                    exp_p5 = 0x1.6376972bea4dp-25;
static const double exp_overflow = 0x1.62e42fefa39efp+9;    /* ~709.78: above, exp is +inf */
static const double exp_underflow = -0x1.74910d52d3051p+9;  /* ~-745.13: below, exp rounds to 0 */

static double pow2_exact(int k) { /* 2^k, k in [-1022, 1023], built from the exponent bits */
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

double kp_exp_det(double x) {
    if (isnan(x)) return x;
    if (x > exp_overflow) return INFINITY;
    if (x < exp_underflow) return 0.0; /* includes -inf */
    double ax = fabs(x);
    if (ax < 0x1p-28) return 1.0 + x;
    int k = 0;
    double hi = x, lo = 0.0, r = x;
    if (ax > 0.5 * ln2_hi) {
        k = (int)(inv_ln2 * x + (x < 0 ? -0.5 : 0.5));
        hi = x - k * ln2_hi;
        lo = k * ln2_lo;
        r = hi - lo;
    }
    double t = r * r;
    double c = r - t * (exp_p1 + t * (exp_p2 + t * (exp_p3 + t * (exp_p4 + t * exp_p5))));
    if (k == 0) return 1.0 - ((r * c) / (c - 2.0) - r);
    double y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
    if (k == 1024) return y * 2.0 * 0x1p1023;
    if (k >= -1021) return y * pow2_exact(k); /* y >= 0.5, so the product stays normal and exact */
    return y * pow2_exact(k + 1000) * 0x1p-1000; /* one rounding, into the subnormal range */
}

double kp_log_det(double x) {
    if (isnan(x) || x < 0.0) return NAN;
    if (x == 0.0) return -INFINITY;
    if (isinf(x)) return x;
    int k = 0;
    if (x < 0x1p-1022) x *= 0x1p54, k = -54; /* subnormal: scale into the normal range first */
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    k += (int)(bits >> 52) - 1023;
    bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull; /* m in [1, 2) */
    double m;
    memcpy(&m, &bits, sizeof m);
    if (m > 0x1.6a09e667f3bcdp+0) m *= 0.5, k++; /* m in [sqrt(1/2), sqrt(2)) */
    /* ln m = 2 atanh(s) = 2 (s + s^3 / 3 + s^5 / 5 + ...), s = f / (2 + f), f = m - 1 exact; |s| < 0.1716,
       so s^2 < 0.0295 and 13 terms leave under 2^-60 of the sum */
    const double f = m - 1.0, s = f / (2.0 + f), z = s * s;
    double r = 2.0 / 27.0;
    for (int n = 12; n >= 1; n--) r = 2.0 / (double)(2 * n + 1) + z * r;
    const double ln_m = 2.0 * s + s * (z * r);
    const double dk = (double)k;
    return dk * ln2_hi + (ln_m + dk * ln2_lo);
}
