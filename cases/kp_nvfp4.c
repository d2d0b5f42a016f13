/* kp_nvfp4.c: the NVFP4 codec (kp_nvfp4.h). Quantizers pick the nearest representable value from the
 * format's own table, ties to the even code, so they are correct by construction and need no bit
 * tricks; built with -ffp-contract=off like the rest of cases/. */
#include "kp_nvfp4.h"

#include <math.h>
#include <string.h>

static const float e2m1_magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float kp_e2m1_value(uint8_t code) {
    const float v = e2m1_magnitude[code & 7u];
    return (code & 8u) ? -v : v;
}

float kp_e4m3_value(uint8_t bits) {
    const uint32_t e = (bits >> 3) & 0xfu, m = bits & 7u;
    if (e == 15 && m == 7) return NAN;
    float v;
    if (e) { /* (1 + m / 8) * 2^(e - 7), built from its f32 bits (exact) */
        const uint32_t f = ((e + 120u) << 23) | (m << 20);
        memcpy(&v, &f, sizeof v);
    } else {
        v = (float)m / 512.0f; /* m / 8 * 2^-6, exact */
    }
    return (bits & 0x80u) ? -v : v;
}

/* The code (in [0, n)) of the nearest of n ascending magnitudes to x >= 0, ties to the even code,
 * past the last one saturating to it. */
static uint8_t nearest(float x, int n, float (*value)(uint8_t)) {
    int lo = 0, hi = n - 1; /* the largest code whose value is <= x */
    if (x >= value((uint8_t)hi)) return (uint8_t)hi;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (value((uint8_t)mid) <= x) lo = mid;
        else hi = mid - 1;
    }
    const double below = value((uint8_t)lo), above = value((uint8_t)(lo + 1)), half = (below + above) / 2.0;
    if ((double)x < half) return (uint8_t)lo;
    if ((double)x > half) return (uint8_t)(lo + 1);
    return (uint8_t)(lo % 2 == 0 ? lo : lo + 1);
}

uint8_t kp_e2m1_quantize(float x) {
    if (isnan(x)) return 0;
    /* nearest() over the 8 magnitudes, unrolled without branches: the code is the number of midpoints
       (0.25, 0.75, ..., 5, exact in f32) below |x|, a midpoint itself going to the even code (counted
       with > where the code below it is even, >= where it is odd) */
    const float a = fabsf(x);
    const uint8_t code = (uint8_t)((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f));
    return (uint8_t)((signbit(x) ? 8u : 0u) | code);
}

uint8_t kp_e4m3_quantize(float x) {
    if (isnan(x)) return 0x7f;
    return (uint8_t)((signbit(x) ? 0x80u : 0u) | nearest(fabsf(x), 0x7f, kp_e4m3_value)); /* 0x7e: 448 */
}

int kp_nvfp4_quantize(const float *x, int64_t rows, int64_t k, kp_nvfp4_scale_dir dir, uint8_t *packed, uint8_t *scales,
                      float *global, kp_error *err) {
    if (rows < 1 || k < KP_NVFP4_BLOCK || k % KP_NVFP4_BLOCK)
        return kp_fail(err, KP_EXIT_USAGE, "nvfp4: a [%lld, %lld] tensor: K must be a positive multiple of 16",
                       (long long)rows, (long long)k);
    float amax = 0.0f;
    for (int64_t i = 0; i < rows * k; i++) {
        if (!isfinite(x[i])) return kp_fail(err, KP_EXIT_USAGE, "nvfp4: element %lld is not finite", (long long)i);
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    }
    const float gs = amax > 0.0f ? 2688.0f / amax : 1.0f; /* 448 * 6 / amax */
    *global = dir == KP_NVFP4_DIVIDE ? gs : (amax > 0.0f ? amax / 2688.0f : 1.0f);
    memset(packed, 0, (size_t)(rows * k / 2));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < k / KP_NVFP4_BLOCK; b++) {
            const float *blk = x + r * k + b * KP_NVFP4_BLOCK;
            float bamax = 0.0f;
            for (int i = 0; i < KP_NVFP4_BLOCK; i++)
                if (fabsf(blk[i]) > bamax) bamax = fabsf(blk[i]);
            const uint8_t sf = kp_e4m3_quantize(gs * bamax / 6.0f);
            const float sfv = kp_e4m3_value(sf);
            scales[r * (k / KP_NVFP4_BLOCK) + b] = sf;
            for (int i = 0; i < KP_NVFP4_BLOCK; i++) {
                const int64_t at = r * k + b * KP_NVFP4_BLOCK + i;
                const uint8_t code = sfv > 0.0f ? kp_e2m1_quantize(blk[i] * gs / sfv) : 0;
                packed[at / 2] |= (uint8_t)(code << (4 * (at % 2)));
            }
        }
    return 0;
}

void kp_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales, int64_t rows, int64_t k, float global,
                         kp_nvfp4_scale_dir dir, double *out) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < k; i++) {
            const int64_t at = r * k + i;
            const double v = (double)kp_e2m1_value(kp_nvfp4_code_at(packed, at)) *
                             (double)kp_e4m3_value(scales[r * (k / KP_NVFP4_BLOCK) + i / KP_NVFP4_BLOCK]); /* exact */
            out[at] = dir == KP_NVFP4_DIVIDE ? v / (double)global : v * (double)global;
        }
}

static int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

size_t kp_nvfp4_swizzled_bytes(int64_t rows, int64_t kb) { return (size_t)(up(rows, 128) * up(kb, 4)); }

int64_t kp_nvfp4_swizzle_offset(int64_t r, int64_t c, int64_t kb) {
    return ((r / 128) * (up(kb, 4) / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}

void kp_nvfp4_swizzle(const uint8_t *linear, int64_t rows, int64_t kb, uint8_t *swizzled) {
    memset(swizzled, 0, kp_nvfp4_swizzled_bytes(rows, kb));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < kb; c++) swizzled[kp_nvfp4_swizzle_offset(r, c, kb)] = linear[r * kb + c];
}

void kp_nvfp4_unswizzle(const uint8_t *swizzled, int64_t rows, int64_t kb, uint8_t *linear) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < kb; c++) linear[r * kb + c] = swizzled[kp_nvfp4_swizzle_offset(r, c, kb)];
}
