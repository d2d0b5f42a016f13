/* topk_case.h: the topk family's case fields, windows, profiles and seeded score generation.
 *
 * Fields: rows, width, k, seed, profile; optional stride (row stride, default width), window (`full`,
 * `prefill` or `decode`; decode takes next_n, default 1, and ctx, default width), base (`row` or
 * `window`: what output indices are relative to) and fill (`-1` or `int32_max`: the index of an unused
 * entry when a window is shorter than k).
 * Every value comes from raw Philox draws (kp_rng) with + - * / only; row r draws at its own offset, so
 * row r is the same whatever the number of rows. Four draws per score (slot 0):
 *   t(r, i) = (u0 + u1 + u2 + u3 - 2) * 2*sqrt(3), u = draw * 2^-32: Irwin-Hall(4), sd 2.
 * Profiles:
 *   randn   t.
 *   narrow  1 + 0.245 u0: every score in [1.0, 1.245), one coarse fp16 bin (vllm#51782).
 *   relu    u1 * 4 + 2^-10 with probability min(1/2, k / (2 width)) (from u0), else +0: fewer positive
 *           scores than k, so the boundary lies in a +0 plateau (sglang PR #31115).
 *   bf16    t rounded to bf16 (nearest even): many exact ties at the boundary.
 *   same    1.0 everywhere.
 *   bits    by draw 0 mod 8: +0, -0, a positive or negative subnormal, +inf, -inf, else t.
 *   nan     t, NaN with probability 1/64 (declared policy: NaN is below every number).
 * Windows, row r (all within [0, width)):
 *   full     [0, width).
 *   prefill  [ks, ke) with ks = 1 + (131 r mod q), ke = width - (97 r mod q), q = max(1, width / 8): ks != 0.
 *   decode   [0, ctx - next_n + (r mod next_n) + 1): row r is draft position r mod next_n of a request.
 * Scores outside a row's window and in its padding hold the NaN 0x7fc0dead, so a read there is caught. */
#ifndef KP_TOPK_CASE_H
#define KP_TOPK_CASE_H

#include <stdint.h>

#include "kp_case.h"

typedef enum kp_topk_profile {
    KP_TOPK_RANDN = 0,
    KP_TOPK_NARROW,
    KP_TOPK_RELU,
    KP_TOPK_BF16,
    KP_TOPK_SAME,
    KP_TOPK_BITS,
    KP_TOPK_NAN,
    KP_TOPK_PROFILE_COUNT
} kp_topk_profile;

typedef enum kp_topk_window { KP_TOPK_FULL = 0, KP_TOPK_PREFILL, KP_TOPK_DECODE } kp_topk_window;

typedef struct kp_topk_case {
    int64_t rows, width, stride;
    int32_t k;
    uint64_t seed;
    kp_topk_profile profile;
    kp_topk_window window;
    int64_t next_n, ctx;
    int32_t index_base; /* KP_TOPK_BASE_ROW or KP_TOPK_BASE_WINDOW (kernels/kparity_kernel.h's values) */
    int32_t fill;       /* -1 or INT32_MAX */
} kp_topk_case;

#define KP_TOPK_GENERATOR_VERSION "topk/v1"
#define KP_TOPK_PAD_BITS 0x7fc0deadu

/* topk's row of the case-family table (cases/case_families.c). */
extern const kp_case_family kp_topk_case_family;
/* Decode a case (normalized or not) from topk's field table (kp_case_decode): errors name the field. */
static inline int kp_topk_case_read(const kp_case *c, kp_topk_case *out, kp_error *err) {
    return kp_case_decode(c, &kp_topk_case_family, out, err);
}
/* A normalized topk case's typed fields, decoded once by kp_case_normalize. */
static inline const kp_topk_case *kp_topk_case_of(const kp_case *c) { return kp_case_fields(c, &kp_topk_case_family); }
/* Rows [first, first + n): scores [n, stride] (outside each window and in the padding: the NaN
 * sentinel), and each row's window into starts and ends. Rows past tc->rows are valid too. */
int kp_topk_case_rows(const kp_topk_case *tc, int64_t first, int64_t n, float *scores, int32_t *starts, int32_t *ends,
                      kp_error *err);

#endif
