/* topp_case.h: the topp family's case fields, profiles and seeded input generation.
 *
 * Fields: batch, vocab, seed, top_p (a number in (0, 1], or `mixed`), profile; optional stride
 * (row stride in elements, default vocab) and the profile's own fields below.
 * Every value comes from raw Philox draws (kp_rng) with + - * / only. Tensor slots draw from
 * their own offsets (slot << 56), and each row from its own span inside the slot, so row r of a
 * case is the same whatever the batch: a batch of 4 is the first 4 rows of the batch of 64.
 *   tail(r, i)  = (u0 + u1 + u2 + u3 - 2) * 2*sqrt(3), u = draw * 2^-32, four draws per token
 *                 (slot 0): a bell-shaped Irwin-Hall(4) logit with standard deviation 2.
 * Profiles:
 *   ordinary  LLM-like: tail everywhere, plus a head of H = min(16, vocab / 8) dominant tokens
 *             at distinct positions (slot 1, partial Fisher-Yates) with logit 14 - 0.75 j + tail.
 *             At vocab 154,856 the head holds 55-95% of the mass (its own tail noise varies),
 *             so a 0.95 boundary falls in the long tail, hundreds to tens of thousands of tokens
 *             in, where a 1e-6 change in mass moves it.
 *   forced    ordinary, then token `force_token` set to (float)`force_value` in every row
 *             (the thinking-budget processor's 1e9, or 1e9/0.6 after temperature 0.6).
 *   ties      tail - 12 everywhere, then `tie_count` tokens (default 1000) at logit 1.0 and
 *             `tie_count` at 0.0 (slot 2 positions): a tie group straddles the boundary for top_p
 *             in roughly (0.05, 0.7) (the 1.0 group) and (0.75, 0.99) (the 0.0 group).
 *   flat      u0 * `spread` (default 1e-6): a near-uniform row. At 1e-6 neighbouring logits differ by
 *             less than f32 resolves in exp(x - max), so only the logits order the tokens.
 *   neginf    ordinary, then each token is -inf with probability `neginf_frac` (default 0.9; slot 3).
 *   nan       ordinary, then `nan_count` tokens (default 1) are NaN (slot 4 positions).
 * Row padding [vocab, stride) holds the NaN 0x7fc0dead, so an impl that reads it is caught.
 * top_p=mixed cycles rows through 0.95, 1e-8, 1, 0.5, 0.99, 0.8, 0.1, 0.9. */
#ifndef KP_TOPP_CASE_H
#define KP_TOPP_CASE_H

#include <stdint.h>

#include "kp_case.h"

typedef enum kp_topp_profile {
    KP_TOPP_ORDINARY = 0,
    KP_TOPP_FORCED,
    KP_TOPP_TIES,
    KP_TOPP_FLAT,
    KP_TOPP_NEGINF,
    KP_TOPP_NAN,
    KP_TOPP_PROFILE_COUNT
} kp_topp_profile;

typedef struct kp_topp_case {
    int64_t batch, vocab, stride;
    uint64_t seed;
    kp_topp_profile profile;
    double top_p;      /* when not mixed */
    int top_p_mixed;
    int64_t force_token;
    double force_value;
    int64_t tie_count;
    double neginf_frac;
    int64_t nan_count;
    double spread;
} kp_topp_case;

#define KP_TOPP_MAX_BATCH (1 << 24)
#define KP_TOPP_MAX_VOCAB ((int64_t)1 << 31)
#define KP_TOPP_PAD_BITS 0x7fc0deadu
#define KP_TOPP_GENERATOR_VERSION "topp/v1"

/* topp's row of the case-family table (cases/case_families.c). */
extern const kp_case_family kp_topp_case_family;

/* Decode a case (normalized or not) from topp's field table (kp_case_decode): errors name the field. */
static inline int kp_topp_case_read(const kp_case *c, kp_topp_case *out, kp_error *err) {
    return kp_case_decode(c, &kp_topp_case_family, out, err);
}
/* A normalized topp case's typed fields, decoded once by kp_case_normalize. */
static inline const kp_topp_case *kp_topp_case_of(const kp_case *c) { return kp_case_fields(c, &kp_topp_case_family); }
/* The f32 top_p of a row. */
float kp_topp_case_row_top_p(const kp_topp_case *tc, int64_t row);
/* Rows [first_row, first_row + nrows) into logits ([nrows, stride], padding included) and, when
 * top_p is not NULL, their top_p ([nrows]). Rows past tc->batch are valid too (filler rows). Where
 * borrowed_s is not NULL it gets the seconds an earlier call spent drawing the ordinary rows these
 * reuse (0 when they were drawn here): what a process without that call would spend on them too. */
int kp_topp_case_rows(const kp_topp_case *tc, int64_t first_row, int64_t nrows, float *logits, float *top_p,
                      double *borrowed_s, kp_error *err);

/* Forget the cached ordinary rows (tests use it to show a cache hit gives the same bytes). */
void kp_topp_case_cache_clear(void);

#endif
