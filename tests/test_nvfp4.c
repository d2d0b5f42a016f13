/* test_nvfp4.c: the NVFP4 codec's known answers: all 16 E2M1 codes, all 256 E4M3 codes against a formula
 * written here, round trips of every finite code, ties to even and saturation, the nibble order, the
 * global scale's two directions (and the wrong one caught), and the 128x4 swizzle. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_nvfp4.h"
#include "kp_test_util.h"

Test(nvfp4, e2m1_codes_are_the_published_table) {
    const float want[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; c++) {
        cr_assert_eq(kp_e2m1_value((uint8_t)c), want[c], "code %x", c);
        cr_assert_eq(!!signbit(kp_e2m1_value((uint8_t)c)), c >= 8, "code %x's sign", c);
        cr_assert_eq(kp_e2m1_quantize(want[c]), c, "code %x round trip", c);
    }
}

Test(nvfp4, e4m3_codes_match_the_formula_and_round_trip) {
    for (int b = 0; b < 256; b++) {
        const int e = (b >> 3) & 15, m = b & 7;
        const float v = kp_e4m3_value((uint8_t)b);
        if (e == 15 && m == 7) {
            cr_assert(isnan(v), "0x%02x is NaN", b);
            continue;
        }
        double want = e ? (8.0 + m) * pow(2.0, e - 10) : m * pow(2.0, -9); /* (1 + m/8) 2^(e-7), m/8 2^-6 */
        if (b & 0x80) want = -want;
        cr_assert_eq((double)v, want, "0x%02x", b);
        cr_assert_eq(kp_e4m3_quantize(v), b, "0x%02x round trip", b);
    }
    cr_assert_eq(kp_e4m3_value(0x7e), 448.0f);
}

Test(nvfp4, quantizers_round_ties_to_even_and_saturate) {
    struct {
        float x;
        uint8_t code;
    } e2m1[] = {{0.25f, 0}, {0.2500001f, 1}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6},
                {5.0f, 6},  {5.0001f, 7},    {7.0f, 7},  {1e30f, 7}, {-5.0f, 14}, {-1e30f, 15}, {-0.0f, 8}};
    for (size_t i = 0; i < sizeof e2m1 / sizeof *e2m1; i++)
        cr_assert_eq(kp_e2m1_quantize(e2m1[i].x), e2m1[i].code, "e2m1(%g)", (double)e2m1[i].x);
    struct {
        float x;
        uint8_t code;
    } e4m3[] = {{432.0f, 0x7e}, {431.9f, 0x7d}, {470.0f, 0x7e}, {1e9f, 0x7e}, {-1e9f, 0xfe},
                {0x1p-10f, 0x00}, {0x1.0001p-10f, 0x01}, {0x1.8p-9f, 0x02}, {NAN, 0x7f}};
    for (size_t i = 0; i < sizeof e4m3 / sizeof *e4m3; i++)
        cr_assert_eq(kp_e4m3_quantize(e4m3[i].x), e4m3[i].code, "e4m3(%a)", (double)e4m3[i].x);
}

/* One row of 32: a block whose amax is the tensor's (so its scale is exactly 448 and codes are the
 * values themselves), and a block of zeros. */
Test(nvfp4, quantize_packs_low_nibble_first_and_dequantizes_in_the_declared_direction) {
    float x[32] = {0.5f, 6.0f, -1.0f, 3.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4.0f};
    uint8_t packed[16], scales[2];
    float gs, g;
    kp_error err = {0};
    cr_assert_eq(kp_nvfp4_quantize(x, 1, 32, KP_NVFP4_DIVIDE, packed, scales, &gs, &err), 0, "%s", err.msg);
    cr_assert_eq(gs, 448.0f, "2688 / amax");
    cr_assert_eq(scales[0], 0x7e, "block amax 6 -> scale 448");
    cr_assert_eq(scales[1], 0x00, "a zero block's scale");
    cr_assert_eq(packed[0], 0x71, "element 0 (0.5, code 1) low, element 1 (6, code 7) high");
    cr_assert_eq(packed[1], 0x5a, "element 2 (-1, code a) low, element 3 (3, code 5) high");
    cr_assert_eq(kp_nvfp4_code_at(packed, 15), 6);
    double y[32];
    kp_nvfp4_dequantize(packed, scales, 1, 32, gs, KP_NVFP4_DIVIDE, y);
    for (int i = 0; i < 32; i++) cr_assert_eq(y[i], (double)x[i], "element %d", i);
    cr_assert_eq(kp_nvfp4_quantize(x, 1, 32, KP_NVFP4_MULTIPLY, packed, scales, &g, &err), 0);
    cr_assert_eq(g, 6.0f / 2688.0f, "amax / 2688");
    kp_nvfp4_dequantize(packed, scales, 1, 32, g, KP_NVFP4_MULTIPLY, y);
    for (int i = 0; i < 32; i++) cr_assert(fabs(y[i] - x[i]) <= 1e-6 * fabs(x[i]), "element %d: %g", i, y[i]);
    /* the planted defect: the global scale applied the other way round is off by orders of magnitude */
    kp_nvfp4_dequantize(packed, scales, 1, 32, g, KP_NVFP4_DIVIDE, y);
    cr_assert(fabs(y[1] - 6.0) > 1e3, "the wrong direction gave %g", y[1]);
    float bad[16] = {NAN};
    cr_assert_eq(kp_nvfp4_quantize(bad, 1, 16, KP_NVFP4_DIVIDE, packed, scales, &gs, &err), KP_EXIT_USAGE);
    cr_assert_eq(kp_nvfp4_quantize(x, 1, 24, KP_NVFP4_DIVIDE, packed, scales, &gs, &err), KP_EXIT_USAGE, "K = 24");
}

Test(nvfp4, quantization_error_stays_within_half_the_largest_code_step) {
    enum { R = 8, K = 256 };
    float *x = malloc(sizeof *x * R * K);
    uint8_t packed[R * K / 2], scales[R * K / 16];
    double *y = malloc(sizeof *y * R * K);
    uint64_t seed = 3;
    for (int i = 0; i < R * K; i++) x[i] = (float)((kpt_unit(&seed) - 0.5) * 20.0 * (1 + i % 7));
    float gs;
    kp_error err = {0};
    cr_assert_eq(kp_nvfp4_quantize(x, R, K, KP_NVFP4_DIVIDE, packed, scales, &gs, &err), 0);
    kp_nvfp4_dequantize(packed, scales, R, K, gs, KP_NVFP4_DIVIDE, y);
    for (int i = 0; i < R * K; i++) {
        const double unit = kp_e4m3_value(scales[i / 16]) / gs; /* one e2m1 unit of this block */
        cr_assert(fabs(y[i] - x[i]) <= 1.0 * unit * 1.0000001 + 1e-30, "element %d: %g vs %g (unit %g)", i, y[i], x[i], unit);
    }
    free(x), free(y);
}

Test(nvfp4, the_128x4_swizzle_has_the_published_offsets_and_round_trips) {
    cr_assert_eq(kp_nvfp4_swizzle_offset(0, 0, 10), 0);
    cr_assert_eq(kp_nvfp4_swizzle_offset(0, 1, 10), 1);
    cr_assert_eq(kp_nvfp4_swizzle_offset(1, 0, 10), 16);
    cr_assert_eq(kp_nvfp4_swizzle_offset(32, 0, 10), 4);
    cr_assert_eq(kp_nvfp4_swizzle_offset(0, 4, 10), 512);
    cr_assert_eq(kp_nvfp4_swizzle_offset(128, 0, 10), 3 * 512, "ceil(10 / 4) tiles a row of tiles");
    enum { R = 200, KB = 10 };
    const size_t bytes = kp_nvfp4_swizzled_bytes(R, KB);
    cr_assert_eq(bytes, 256 * 12);
    uint8_t *lin = malloc(R * KB), *sw = malloc(bytes), *back = malloc(R * KB), *seen = calloc(bytes, 1);
    uint64_t seed = 1;
    for (int i = 0; i < R * KB; i++) lin[i] = (uint8_t)(1 + kpt_splitmix(&seed) % 255);
    kp_nvfp4_swizzle(lin, R, KB, sw);
    kp_nvfp4_unswizzle(sw, R, KB, back);
    cr_assert(!memcmp(lin, back, R * KB), "round trip");
    for (int r = 0; r < R; r++)
        for (int c = 0; c < KB; c++) {
            const int64_t o = kp_nvfp4_swizzle_offset(r, c, KB);
            cr_assert(o >= 0 && (size_t)o < bytes && !seen[o], "(%d, %d) -> %lld twice or out of range", r, c, (long long)o);
            seen[o] = 1;
        }
    size_t zeros = 0;
    for (size_t i = 0; i < bytes; i++) zeros += sw[i] == 0;
    cr_assert_eq(zeros, bytes - R * KB, "the padding is zero");
    free(lin), free(sw), free(back), free(seen);
}
