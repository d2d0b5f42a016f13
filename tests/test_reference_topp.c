/* test_reference_topp.c: the topp float64 reference against an independent brute-force oracle,
 * hand-built rule cases, the judge against planted defects, kp_exp_det against libm. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* setenv */
#endif
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/kp_launch.h"
#include "../reference/topp_ref.h"
#include "kp_test_util.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* Irwin-Hall of four uniforms: bell-shaped enough for logits, no libm needed. */
static float rng_normalish(uint64_t *s) {
    return (float)(1.7 * (kpt_unit(s) + kpt_unit(s) + kpt_unit(s) + kpt_unit(s) - 2.0));
}

static void must_reference(const float *x, int64_t b, int64_t v, int64_t stride, const float *p, double band,
                           kp_topp_ref *ref) {
    kp_error err = {0};
    int rc = kp_topp_reference(x, b, v, stride, p, band, ref, &err);
    cr_assert_eq(rc, 0, "kp_topp_reference failed: %s", err.msg);
}

static void must_judge(const kp_topp_ref *ref, const float *in, const float *out, int64_t stride, kp_tie_policy pol,
                       double band, kp_topp_judgement *j) {
    kp_error err = {0};
    int rc = kp_topp_judge(ref, in, out, stride, pol, band, j, &err);
    cr_assert_eq(rc, 0, "kp_topp_judge failed: %s", err.msg);
}

/* The output a conforming impl would write for the reference mask. */
static float *apply_mask(const kp_topp_ref *ref, const float *in, int64_t stride) {
    float *out = malloc((size_t)(ref->batch * stride) * sizeof *out);
    for (int64_t r = 0; r < ref->batch; r++)
        for (int64_t i = 0; i < stride; i++) {
            int64_t at = r * stride + i;
            out[at] = (i < ref->vocab && !ref->keep[r * ref->vocab + i]) ? -INFINITY : in[at];
        }
    return out;
}

static void assert_row_clean(const kp_topp_judgement *j, int64_t r, const char *what) {
    const kp_topp_row_judgement *w = &j->rows[r];
    cr_assert(w->rule_ok && w->strict_count == 0 && w->tie_count == 0 && w->band_count == 0 &&
                  w->altered_count == 0,
              "%s row %lld: rule_ok %d strict %lld tie %lld band %lld mass %d min %d mono %d nan %d nonempty %d",
              what, (long long)r, w->rule_ok, (long long)w->strict_count, (long long)w->tie_count,
              (long long)w->band_count, w->mass_ok, w->minimal_ok, w->monotone_ok, w->no_nan_ok, w->nonempty_ok);
}

/* ---- the brute-force oracle: the rule by its definition, O(V^2), long double, libm expl ---- */

#define BRUTE_MAX 64
typedef struct brute_row {
    long double prob[BRUTE_MAX], mass_above[BRUTE_MAX];
    bool keep[BRUTE_MAX], ambiguous[BRUTE_MAX], in_group[BRUTE_MAX];
    int kept_count, boundary, group_size, needed, n_ambiguous;
} brute_row;

/* Finite tokens only (the random rows carry no +inf). A token's mass above is the mass of every
 * token before it in (p desc, index asc); it is kept iff that is below top_p, or it is first,
 * or top_p >= 1. Decisions within 1e-12 of top_p are ambiguous between long double and double. */
static void brute(const float *x, int V, float top_p_f, brute_row *b) {
    memset(b, 0, sizeof *b);
    b->boundary = -1;
    long double top_p = top_p_f, z = 0;
    float m = -INFINITY;
    for (int i = 0; i < V; i++)
        if (isfinite(x[i]) && x[i] > m) m = x[i];
    for (int i = 0; i < V; i++)
        if (isfinite(x[i])) z += expl((long double)x[i] - m);
    for (int i = 0; i < V; i++) b->prob[i] = isfinite(x[i]) ? expl((long double)x[i] - m) / z : 0;
    int most_above = -1;
    for (int i = 0; i < V; i++) {
        if (!isfinite(x[i])) continue;
        int above = 0;
        long double mass = 0;
        for (int j = 0; j < V; j++)
            if (isfinite(x[j]) && (b->prob[j] > b->prob[i] || (b->prob[j] == b->prob[i] && j < i))) {
                mass += b->prob[j];
                above++;
            }
        b->mass_above[i] = mass;
        b->keep[i] = above == 0 || mass < top_p || top_p >= 1;
        b->ambiguous[i] = fabsl(mass - top_p) <= 1e-12L;
        b->n_ambiguous += b->ambiguous[i];
        if (b->keep[i]) {
            b->kept_count++;
            if (above > most_above) {
                most_above = above;
                b->boundary = i;
            }
        }
    }
    if (b->boundary < 0) return;
    for (int i = 0; i < V; i++) {
        b->in_group[i] = isfinite(x[i]) && x[i] == x[b->boundary];
        b->group_size += b->in_group[i];
        b->needed += b->in_group[i] && b->keep[i];
    }
}

/* ---- reference vs brute force --------------------------------------------------------------- */

Test(reference_topp, matches_brute_force_on_small_tied_rows) {
    static const float values[] = {-6.0f, -2.5f, -1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 2.0f, 4.0f};
    static const float top_ps[] = {1e-8f, 0.1f, 0.25f, 0.5f, 0.9f, 0.95f, 0.999f, 1.0f, 1.5f, 0.0f};
    const int64_t B = 24;
    uint64_t seed = 58231;
    long long compared = 0, ambiguous = 0, rows_with_ties_straddling = 0;
    for (int64_t V = 1; V <= BRUTE_MAX; V++) {
        const int64_t stride = V + V % 3; /* padded rows must be ignored */
        float *x = malloc((size_t)(B * stride) * sizeof *x), p[24];
        for (int64_t r = 0; r < B; r++) {
            int narrow = r % 4 == 0; /* two values only: huge tie groups */
            for (int64_t i = 0; i < stride; i++) {
                uint64_t u = kpt_splitmix(&seed) % 100;
                float v = narrow ? values[5 + u % 2] : values[u % 9];
                if (u < 6) v = -INFINITY;
                else if (u < 11) v = NAN;
                x[r * stride + i] = i < V ? v : 1e30f;
            }
            p[r] = top_ps[kpt_splitmix(&seed) % 10];
        }
        kp_topp_ref ref;
        must_reference(x, B, V, stride, p, 0.0, &ref);
        for (int64_t r = 0; r < B; r++) {
            const float *row = x + r * stride;
            const kp_topp_ref_row *rr = &ref.rows[r];
            brute_row b;
            brute(row, (int)V, p[r], &b);
            int64_t nan = 0, fin = 0, keep_sum = 0;
            for (int64_t i = 0; i < V; i++) {
                const int64_t c = r * V + i;
                nan += isnan(row[i]);
                fin += isfinite(row[i]);
                keep_sum += ref.keep[c];
                cr_assert(fabsl((long double)ref.prob[c] - b.prob[i]) <= 1e-14L, "V %lld row %lld tok %lld prob",
                          (long long)V, (long long)r, (long long)i);
                if (!isfinite(row[i])) {
                    cr_assert(isnan(ref.mass_before[c]) && !ref.keep[c] && !ref.in_group[c]);
                    continue;
                }
                cr_assert(fabsl((long double)ref.mass_before[c] - b.mass_above[i]) <= 1e-13L,
                          "V %lld row %lld tok %lld: C_t %.17g, brute %.17Lg", (long long)V, (long long)r,
                          (long long)i, ref.mass_before[c], b.mass_above[i]);
                compared++;
                if (b.ambiguous[i]) {
                    ambiguous++;
                    continue;
                }
                cr_assert_eq(ref.keep[c], b.keep[i], "V %lld row %lld tok %lld (x %g, top_p %g): keep %d, brute %d",
                             (long long)V, (long long)r, (long long)i, row[i], p[r], ref.keep[c], b.keep[i]);
            }
            cr_assert_eq(rr->nan_count, nan);
            cr_assert_eq(rr->finite_count, fin);
            cr_assert_eq(rr->kept_count, keep_sum);
            cr_assert_eq(rr->top_p, (double)p[r]);
            if (b.n_ambiguous) continue;
            cr_assert_eq(rr->kept_count, b.kept_count, "V %lld row %lld kept", (long long)V, (long long)r);
            cr_assert_eq(rr->boundary_token, b.boundary, "V %lld row %lld boundary", (long long)V, (long long)r);
            cr_assert_eq(rr->tie_group_size, b.group_size, "V %lld row %lld group", (long long)V, (long long)r);
            cr_assert_eq(rr->tie_needed, b.needed, "V %lld row %lld needed", (long long)V, (long long)r);
            for (int64_t i = 0; i < V; i++) cr_assert_eq(ref.in_group[r * V + i], b.in_group[i]);
            rows_with_ties_straddling += b.needed < b.group_size;
        }
        /* The reference's own mask must pass its judge cleanly, under both policies, at band 0. */
        float *out = apply_mask(&ref, x, stride);
        for (int pol = 0; pol < 2; pol++) {
            kp_topp_judgement j;
            must_judge(&ref, x, out, stride, (kp_tie_policy)pol, 0.0, &j);
            for (int64_t r = 0; r < B; r++) assert_row_clean(&j, r, "reference mask");
            cr_assert_eq(j.rows_rule_ok, B);
            kp_topp_judgement_free(&j);
        }
        free(out);
        kp_topp_ref_free(&ref);
        free(x);
    }
    /* Guards against a vacuous pass: most decisions were compared, and straddling ties occurred. */
    cr_assert(compared > 30000 && ambiguous * 20 < compared, "compared %lld, ambiguous %lld", compared, ambiguous);
    cr_assert(rows_with_ties_straddling > 50, "only %lld rows had a straddling tie group", rows_with_ties_straddling);
}

/* ---- hand-built rows -------------------------------------------------------------------------- */

Test(reference_topp, forced_1e9_logit_keeps_exactly_that_token) {
    /* The seed's shapes: 4 x 131,072 forcing token 13, and 154,856 forcing token 154,842. */
    static const struct { int64_t batch, vocab, force; float value; } shapes[] = {
        {4, 131072, 13, 1e9f}, {1, 154856, 154842, 1e9f}, {1, 154856, 154842, 1e9f / 0.6f}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t B = shapes[s].batch, V = shapes[s].vocab, f = shapes[s].force;
        float *x = malloc((size_t)(B * V) * sizeof *x), p[4] = {0.95f, 0.95f, 0.95f, 0.95f};
        uint64_t seed = 58231 + s;
        for (int64_t i = 0; i < B * V; i++) x[i] = rng_normalish(&seed);
        for (int64_t r = 0; r < B; r++) x[r * V + f] = shapes[s].value;
        kp_topp_ref ref;
        must_reference(x, B, V, V, p, 1e-6, &ref);
        for (int64_t r = 0; r < B; r++) {
            cr_assert_eq(ref.rows[r].kept_count, 1);
            cr_assert_eq(ref.rows[r].boundary_token, f);
            cr_assert(ref.keep[r * V + f] && ref.prob[r * V + f] == 1.0 && ref.rows[r].kept_mass == 1.0);
            cr_assert_eq(ref.rows[r].tie_group_size, 1);
        }
        /* The seed's defect: every output -inf. */
        float *out = malloc((size_t)(B * V) * sizeof *out);
        for (int64_t i = 0; i < B * V; i++) out[i] = -INFINITY;
        kp_topp_judgement j;
        must_judge(&ref, x, out, V, KP_TIE_MINIMAL_INDEX, 1e-6, &j);
        for (int64_t r = 0; r < B; r++) {
            cr_assert(j.rows[r].all_neginf && !j.rows[r].nonempty_ok && !j.rows[r].rule_ok);
            cr_assert(!j.rows[r].mass_ok && j.rows[r].kept_count == 0);
            cr_assert_eq(j.strict_off[r + 1] - j.strict_off[r], 1);
            cr_assert_eq(j.strict_idx[j.strict_off[r]], f);
        }
        cr_assert_eq(j.rows_rule_ok, 0);
        kp_topp_judgement_free(&j);
        kp_topp_ref_free(&ref);
        free(out);
        free(x);
    }
}

/* Logits 1, 0 x4, -1 spread over indices; p(1) = e/Z, p(0) = 1/Z, Z = e + 4 + 1/e. Rule order
 * 3,0,2,4,5,1 with C = 0, .3836, .5247, .6659, .8070, .9481: top_p .6 keeps 3, 0, 2. */
static const float straddle_x[6] = {0.0f, -1.0f, 0.0f, 1.0f, 0.0f, 0.0f};
static const float straddle_p[1] = {0.6f};

Test(reference_topp, straddling_tie_group) {
    kp_topp_ref ref;
    must_reference(straddle_x, 1, 6, 6, straddle_p, 0.0, &ref);
    const kp_topp_ref_row *rr = &ref.rows[0];
    static const uint8_t keep[6] = {1, 0, 1, 1, 0, 0}, group[6] = {1, 0, 1, 0, 1, 1};
    cr_assert(memcmp(ref.keep, keep, 6) == 0 && memcmp(ref.in_group, group, 6) == 0);
    cr_assert_eq(rr->boundary_token, 2);
    cr_assert_eq(rr->boundary_logit, 0.0f);
    cr_assert_eq(rr->tie_group_size, 4);
    cr_assert_eq(rr->tie_needed, 2);
    cr_assert_eq(rr->tie_group_mass_before, ref.mass_before[3] + ref.prob[3]);
    cr_assert(fabs(rr->tie_group_mass_before - 0.38360) < 1e-4 && fabs(ref.mass_before[4] - 0.66585) < 1e-4);
    cr_assert_eq(rr->band_count, 0);
    kp_topp_ref wide;
    must_reference(straddle_x, 1, 6, 6, straddle_p, 0.2, &wide); /* C = .5247 and .6659 lie within .2 */
    cr_assert_eq(wide.rows[0].band_count, 2);
    kp_topp_ref_free(&wide);

    /* Keep the whole group: allowed under inclusive, strict under minimal_index. */
    float whole[6] = {0.0f, -INFINITY, 0.0f, 1.0f, 0.0f, 0.0f};
    kp_topp_judgement j;
    must_judge(&ref, straddle_x, whole, 6, KP_TIE_INCLUSIVE, 0.0, &j);
    cr_assert(j.rows[0].rule_ok && j.rows[0].tie_count == 2 && j.rows[0].strict_count == 0);
    cr_assert(j.tie_idx[0] == 4 && j.tie_idx[1] == 5);
    cr_assert(j.rows[0].group_kept == 4 && j.rows[0].group_lowest_first);
    kp_topp_judgement_free(&j);
    must_judge(&ref, straddle_x, whole, 6, KP_TIE_MINIMAL_INDEX, 0.0, &j);
    cr_assert(!j.rows[0].rule_ok && j.rows[0].strict_count == 2 && j.rows[0].tie_count == 0);
    cr_assert(j.strict_idx[0] == 4 && j.strict_idx[1] == 5 && !j.rows[0].minimal_ok);
    kp_topp_judgement_free(&j);

    /* Keep the right count of copies but not the lowest-index ones: dropping a required copy is
     * strict under either policy; the extra copy is a tie only under inclusive. */
    float wrong[6] = {-INFINITY, -INFINITY, 0.0f, 1.0f, 0.0f, -INFINITY};
    must_judge(&ref, straddle_x, wrong, 6, KP_TIE_INCLUSIVE, 0.0, &j);
    cr_assert(!j.rows[0].rule_ok && j.rows[0].strict_count == 1 && j.strict_idx[0] == 0);
    cr_assert(j.rows[0].tie_count == 1 && j.tie_idx[0] == 4 && !j.rows[0].group_lowest_first);
    kp_topp_judgement_free(&j);
    kp_topp_ref_free(&ref);
}

Test(reference_topp, rows_without_finite_tokens_keep_nothing) {
    const float x[2 * 5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                            NAN,       -INFINITY, NAN,       -INFINITY, -INFINITY};
    const float p[2] = {0.9f, 1.0f};
    kp_topp_ref ref;
    must_reference(x, 2, 5, 5, p, 0.0, &ref);
    for (int r = 0; r < 2; r++) {
        const kp_topp_ref_row *rr = &ref.rows[r];
        cr_assert(rr->kept_count == 0 && rr->boundary_token == -1 && rr->finite_count == 0);
        cr_assert(rr->max_logit == -INFINITY && rr->tie_group_size == 0 && rr->kept_mass == 0.0);
        for (int i = 0; i < 5; i++) cr_assert(!ref.keep[r * 5 + i] && ref.prob[r * 5 + i] == 0.0);
    }
    cr_assert_eq(ref.rows[1].nan_count, 2);
    /* Unchanged -inf and NaN turned to -inf pass; a NaN passed through is altered. */
    float out[10];
    for (int i = 0; i < 10; i++) out[i] = -INFINITY;
    kp_topp_judgement j;
    must_judge(&ref, x, out, 5, KP_TIE_MINIMAL_INDEX, 0.0, &j);
    cr_assert(j.rows_rule_ok == 2 && !j.rows[0].all_neginf);
    kp_topp_judgement_free(&j);
    out[7] = NAN;
    must_judge(&ref, x, out, 5, KP_TIE_MINIMAL_INDEX, 0.0, &j);
    cr_assert(!j.rows[1].rule_ok && !j.rows[1].no_nan_ok && j.rows[1].altered_count == 1);
    cr_assert(j.rows[1].strict_count == 1 && j.strict_idx[j.strict_off[1]] == 2 && j.rows[0].rule_ok);
    kp_topp_judgement_free(&j);
    kp_topp_ref_free(&ref);
}

Test(reference_topp, top_p_at_least_one_keeps_every_finite_token) {
    /* -200 has p ~ 1e-87 and its C_t is ~1, so only the p >= 1 clause keeps it. */
    const float x[8] = {3.0f, -INFINITY, 1.0f, NAN, -200.0f, 3.0f, 0.5f, -INFINITY};
    const float p[2] = {1.0f, 1.5f};
    float xx[16];
    memcpy(xx, x, sizeof x);
    memcpy(xx + 8, x, sizeof x);
    kp_topp_ref ref;
    must_reference(xx, 2, 8, 8, p, 0.0, &ref);
    static const uint8_t keep[8] = {1, 0, 1, 0, 1, 1, 1, 0};
    for (int r = 0; r < 2; r++) {
        cr_assert(memcmp(ref.keep + r * 8, keep, 8) == 0);
        cr_assert(ref.rows[r].kept_count == 5 && ref.rows[r].boundary_token == 4);
        cr_assert(fabs(ref.rows[r].kept_mass - 1.0) < 1e-15);
    }
    kp_topp_ref_free(&ref);
}

Test(reference_topp, posinf_tokens_share_all_mass) {
    const float x[6] = {1.0f, INFINITY, 0.0f, INFINITY, NAN, -INFINITY};
    const float p[3] = {0.5f, 0.9f, 1.0f};
    float xx[18];
    for (int r = 0; r < 3; r++) memcpy(xx + 6 * r, x, sizeof x);
    kp_topp_ref ref;
    must_reference(xx, 3, 6, 6, p, 0.0, &ref);
    static const uint8_t keep[3][6] = {{0, 1, 0, 0, 0, 0}, {0, 1, 0, 1, 0, 0}, {1, 1, 1, 1, 0, 0}};
    for (int r = 0; r < 3; r++) {
        cr_assert(memcmp(ref.keep + 6 * r, keep[r], 6) == 0, "row %d", r);
        cr_assert(ref.prob[6 * r + 1] == 0.5 && ref.prob[6 * r + 3] == 0.5 && ref.prob[6 * r] == 0.0);
        cr_assert(ref.rows[r].posinf_count == 2 && ref.rows[r].finite_count == 2);
    }
    cr_assert(ref.rows[0].tie_group_size == 2 && ref.rows[0].tie_needed == 1 && ref.rows[0].boundary_token == 1);
    cr_assert(ref.rows[1].tie_needed == 2 && ref.rows[1].kept_mass == 1.0);
    /* The rule's mask passes; dropping a required +inf is strict. */
    float *out = apply_mask(&ref, xx, 6);
    kp_topp_judgement j;
    must_judge(&ref, xx, out, 6, KP_TIE_MINIMAL_INDEX, 0.0, &j);
    cr_assert_eq(j.rows_rule_ok, 3);
    kp_topp_judgement_free(&j);
    out[6 + 3] = -INFINITY;
    must_judge(&ref, xx, out, 6, KP_TIE_MINIMAL_INDEX, 0.0, &j);
    cr_assert(!j.rows[1].rule_ok && j.rows[1].strict_count == 1 && j.strict_idx[j.strict_off[1]] == 3);
    kp_topp_judgement_free(&j);
    free(out);
    kp_topp_ref_free(&ref);
}

Test(reference_topp, tiny_top_p_keeps_lowest_index_of_top_tie) {
    const float x[5] = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
    const float p[1] = {1e-8f};
    kp_topp_ref ref;
    must_reference(x, 1, 5, 5, p, 0.0, &ref);
    cr_assert(ref.rows[0].kept_count == 1 && ref.keep[1] && ref.rows[0].boundary_token == 1);
    cr_assert(ref.rows[0].tie_group_size == 3 && ref.rows[0].tie_needed == 1);
    kp_topp_ref_free(&ref);
}

Test(reference_topp, compensated_mass_stays_accurate_over_a_long_row) {
    /* 100,000 equal logits: p = 1/100000 rounded, so C_t is t * p exactly up to the final rounding;
     * a plain running sum drifts by ~1e-12 here. The whole row is one tie group straddling top_p. */
    const int64_t V = 100000;
    float *x = calloc((size_t)V, sizeof *x), p[1] = {0.95f};
    kp_topp_ref ref;
    must_reference(x, 1, V, V, p, 0.0, &ref);
    long double worst = 0;
    for (int64_t t = 0; t < V; t++) {
        long double d = fabsl((long double)ref.mass_before[t] - (long double)t * ref.prob[0]);
        if (d > worst) worst = d;
    }
    cr_assert(worst <= 2e-16L, "C_t drifted by %Lg", worst);
    cr_assert(ref.rows[0].kept_count == 95000 && ref.rows[0].tie_needed == 95000);
    cr_assert(ref.rows[0].tie_group_size == V && ref.rows[0].boundary_token == 94999);
    kp_topp_ref_free(&ref);
    free(x);
}

/* ---- the judge against planted defects ------------------------------------------------------ */

#define JB 8
#define JV 4096
static float *judge_x;
static float judge_p[JB];
static kp_topp_ref judge_ref;

static void judge_setup(void) {
    judge_x = malloc(JB * JV * sizeof *judge_x);
    uint64_t seed = 7;
    for (int i = 0; i < JB * JV; i++) judge_x[i] = rng_normalish(&seed);
    for (int r = 0; r < JB; r++) judge_p[r] = 0.9f;
    must_reference(judge_x, JB, JV, JV, judge_p, 0.0, &judge_ref);
}
static void judge_teardown(void) {
    kp_topp_ref_free(&judge_ref);
    free(judge_x);
}

/* Judge `out` (a copy of the rule's output with one row changed) and check row 3 alone broke. */
static kp_topp_judgement judge_planted(const float *out, kp_tie_policy pol, double band) {
    kp_topp_judgement j;
    must_judge(&judge_ref, judge_x, out, JV, pol, band, &j);
    for (int r = 0; r < JB; r++)
        if (r != 3) assert_row_clean(&j, r, "untouched");
    return j;
}

/* A token of row 3 whose decision is far from the band and outside the tie group. */
static int64_t far_token(int want_kept) {
    for (int64_t i = 0; i < JV; i++) {
        int64_t c = 3 * JV + i;
        if (judge_ref.keep[c] == want_kept && !judge_ref.in_group[c] &&
            fabs(judge_ref.mass_before[c] - judge_p[3]) > 0.05)
            return i;
    }
    cr_assert_fail("no far token");
    return -1;
}

Test(judge_topp, flips_are_strict_at_their_index, .init = judge_setup, .fini = judge_teardown) {
    for (int want_kept = 0; want_kept < 2; want_kept++) {
        float *out = apply_mask(&judge_ref, judge_x, JV);
        int64_t i = far_token(want_kept);
        out[3 * JV + i] = want_kept ? -INFINITY : judge_x[3 * JV + i];
        kp_topp_judgement j = judge_planted(out, KP_TIE_INCLUSIVE, 1e-6);
        const kp_topp_row_judgement *w = &j.rows[3];
        cr_assert(!w->rule_ok && w->strict_count == 1 && j.strict_idx[j.strict_off[3]] == i);
        cr_assert(w->tie_count == 0 && w->band_count == 0 && j.rows_rule_ok == JB - 1);
        if (want_kept) cr_assert(!w->monotone_ok, "dropping a far kept token makes the mask non-monotone");
        else cr_assert(!w->minimal_ok && !w->monotone_ok, "keeping a far dropped token breaks minimality");
        kp_topp_judgement_free(&j);
        free(out);
    }
}

Test(judge_topp, extra_token_within_band_is_band, .init = judge_setup, .fini = judge_teardown) {
    /* The first dropped token in rule order has the smallest C_t at or above top_p. */
    int64_t next = -1;
    for (int64_t i = 0; i < JV; i++) {
        int64_t c = 3 * JV + i;
        if (!judge_ref.keep[c] && (next < 0 || judge_ref.mass_before[c] < judge_ref.mass_before[3 * JV + next]))
            next = i;
    }
    double gap = judge_ref.mass_before[3 * JV + next] - judge_p[3];
    cr_assert(gap >= 0 && !judge_ref.in_group[3 * JV + next]);
    float *out = apply_mask(&judge_ref, judge_x, JV);
    out[3 * JV + next] = judge_x[3 * JV + next];
    kp_topp_judgement j = judge_planted(out, KP_TIE_MINIMAL_INDEX, 2 * gap + 1e-12);
    cr_assert(j.rows[3].rule_ok && j.rows[3].band_count == 1 && j.rows[3].strict_count == 0);
    cr_assert_eq(j.band_idx[j.band_off[3]], next);
    kp_topp_judgement_free(&j);
    /* The band is inclusive: a token exactly `band` away is still band-ambiguous. */
    j = judge_planted(out, KP_TIE_MINIMAL_INDEX, gap);
    cr_assert(j.rows[3].band_count == 1 && j.rows[3].strict_count == 0);
    kp_topp_judgement_free(&j);
    /* Positive control: with a band too narrow for it, the same mask is strict. */
    j = judge_planted(out, KP_TIE_MINIMAL_INDEX, gap / 2);
    cr_assert(!j.rows[3].rule_ok && j.rows[3].strict_count == 1 && j.rows[3].band_count == 0);
    kp_topp_judgement_free(&j);
    free(out);
}

Test(judge_topp, altered_kept_value_is_strict, .init = judge_setup, .fini = judge_teardown) {
    float *out = apply_mask(&judge_ref, judge_x, JV);
    int64_t i = far_token(1);
    out[3 * JV + i] = nextafterf(judge_x[3 * JV + i], INFINITY);
    kp_topp_judgement j = judge_planted(out, KP_TIE_INCLUSIVE, 1e-6);
    cr_assert(!j.rows[3].rule_ok && j.rows[3].altered_count == 1 && j.rows[3].strict_count == 1);
    cr_assert_eq(j.strict_idx[j.strict_off[3]], i);
    kp_topp_judgement_free(&j);
    free(out);
}

Test(judge_topp, nan_output_is_strict_and_flagged, .init = judge_setup, .fini = judge_teardown) {
    float *out = apply_mask(&judge_ref, judge_x, JV);
    int64_t i = far_token(0);
    out[3 * JV + i] = NAN;
    kp_topp_judgement j = judge_planted(out, KP_TIE_INCLUSIVE, 1e-6);
    cr_assert(!j.rows[3].rule_ok && !j.rows[3].no_nan_ok && j.rows[3].nan_out_count == 1);
    cr_assert(j.rows[3].strict_count == 1 && j.strict_idx[j.strict_off[3]] == i);
    kp_topp_judgement_free(&j);
    free(out);
}

Test(judge_topp, all_neginf_row_is_flagged, .init = judge_setup, .fini = judge_teardown) {
    float *out = apply_mask(&judge_ref, judge_x, JV);
    for (int64_t i = 0; i < JV; i++) out[3 * JV + i] = -INFINITY;
    kp_topp_judgement j = judge_planted(out, KP_TIE_INCLUSIVE, 1e-6);
    const kp_topp_row_judgement *w = &j.rows[3];
    cr_assert(w->all_neginf && !w->nonempty_ok && !w->mass_ok && !w->rule_ok);
    cr_assert(w->strict_count == judge_ref.rows[3].kept_count && judge_ref.rows[3].kept_count > 100);
    kp_topp_judgement_free(&j);
    free(out);
}

Test(judge_topp, mass_below_top_p_fails_mass, .init = judge_setup, .fini = judge_teardown) {
    float *out = apply_mask(&judge_ref, judge_x, JV);
    int64_t b = judge_ref.rows[3].boundary_token;
    cr_assert(judge_ref.rows[3].tie_group_size == 1);
    out[3 * JV + b] = -INFINITY;
    kp_topp_judgement j = judge_planted(out, KP_TIE_MINIMAL_INDEX, 0.0);
    cr_assert(!j.rows[3].mass_ok && !j.rows[3].rule_ok && j.rows[3].monotone_ok && j.rows[3].minimal_ok);
    cr_assert(j.rows[3].kept_mass < judge_p[3] && j.strict_idx[j.strict_off[3]] == b);
    kp_topp_judgement_free(&j);
    free(out);
}

Test(judge_topp, non_monotone_mask_fails_monotone, .init = judge_setup, .fini = judge_teardown) {
    /* Swap the boundary token for the first dropped one: same count, near the same mass, but a
     * dropped logit now exceeds a kept one. Band wide enough that only monotonicity can fail. */
    float *out = apply_mask(&judge_ref, judge_x, JV);
    int64_t b = judge_ref.rows[3].boundary_token, next = -1;
    for (int64_t i = 0; i < JV; i++)
        if (!judge_ref.keep[3 * JV + i] && (next < 0 || judge_x[3 * JV + i] > judge_x[3 * JV + next])) next = i;
    out[3 * JV + b] = -INFINITY;
    out[3 * JV + next] = judge_x[3 * JV + next];
    kp_topp_judgement j = judge_planted(out, KP_TIE_MINIMAL_INDEX, 0.01);
    cr_assert(!j.rows[3].monotone_ok && !j.rows[3].rule_ok && j.rows[3].mass_ok && j.rows[3].strict_count == 0);
    kp_topp_judgement_free(&j);
    free(out);
}

Test(judge_topp, usage_errors_name_the_field) {
    const float x[4] = {0, 1, 2, 3}, p[1] = {0.5f};
    static const struct { int64_t b, v, stride; double band; const char *field; } bad[] = {
        {0, 4, 4, 0.0, "batch"}, {1, 0, 4, 0.0, "vocab"}, {1, 4, 3, 0.0, "row_stride"},
        {1, 4, 4, -1e-9, "band"}, {1, 4, 4, NAN, "band"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        kp_topp_ref ref;
        kp_error err = {0};
        int rc = kp_topp_reference(x, bad[k].b, bad[k].v, bad[k].stride, p, bad[k].band, &ref, &err);
        cr_assert(rc == KP_EXIT_USAGE && err.code == KP_EXIT_USAGE && strstr(err.msg, bad[k].field), "%s", err.msg);
    }
    kp_topp_ref ref;
    kp_error err = {0};
    const float nan_p[1] = {NAN};
    cr_assert_eq(kp_topp_reference(x, 1, 4, 4, nan_p, 0.0, &ref, &err), KP_EXIT_USAGE);
    must_reference(x, 1, 4, 4, p, 0.0, &ref);
    kp_topp_judgement j;
    cr_assert_eq(kp_topp_judge(&ref, x, x, 3, KP_TIE_INCLUSIVE, 0.0, &j, &err), KP_EXIT_USAGE);
    cr_assert(strstr(err.msg, "row_stride"));
    cr_assert_eq(kp_topp_judge(&ref, x, x, 4, KP_TIE_INCLUSIVE, -1.0, &j, &err), KP_EXIT_USAGE);
    cr_assert_eq(kp_topp_judge(&ref, x, x, 4, (kp_tie_policy)7, 0.0, &j, &err), KP_EXIT_USAGE);
    kp_topp_ref_free(&ref);
}

Test(judge_topp, tie_policy_names_round_trip) {
    kp_tie_policy p = KP_TIE_INCLUSIVE;
    cr_assert(kp_tie_policy_parse("minimal_index", &p) == 0 && p == KP_TIE_MINIMAL_INDEX);
    cr_assert(kp_tie_policy_parse("inclusive", &p) == 0 && p == KP_TIE_INCLUSIVE);
    cr_assert(kp_tie_policy_parse("Inclusive", &p) != 0 && kp_tie_policy_parse("", &p) != 0);
    cr_assert_str_eq(kp_tie_policy_name(KP_TIE_MINIMAL_INDEX), "minimal_index");
    cr_assert_str_eq(kp_tie_policy_name(KP_TIE_INCLUSIVE), "inclusive");
}

/* ---- determinism ---------------------------------------------------------------------------- */

static void run_big(int threads, kp_topp_ref *ref, const float *x, const float *p) {
    char n[8];
    snprintf(n, sizeof n, "%d", threads);
    setenv("KPARITY_THREADS", n, 1);
    must_reference(x, 4, 131072, 131072, p, 1e-6, ref);
}

Test(reference_topp, deterministic_across_runs_and_threads) {
    const int64_t B = 4, V = 131072;
    float *x = malloc((size_t)(B * V) * sizeof *x), p[4] = {0.95f, 0.5f, 0.999f, 1e-8f};
    uint64_t seed = 58231;
    for (int64_t i = 0; i < B * V; i++) x[i] = (float)((int)(64 * rng_normalish(&seed))) / 64.0f; /* ties */
    kp_topp_ref a, b;
    run_big(1, &a, x, p);
    cr_assert(a.rows[0].kept_count > 1000 && a.rows[0].tie_group_size > 1, "rows must exercise sort and ties");
    for (int round = 0; round < 2; round++) {
        run_big(round ? 2 : 4, &b, x, p);
        const size_t cells = (size_t)(B * V);
        cr_assert(memcmp(a.rows, b.rows, (size_t)B * sizeof *a.rows) == 0, "row summaries differ");
        cr_assert(memcmp(a.keep, b.keep, cells) == 0 && memcmp(a.in_group, b.in_group, cells) == 0);
        cr_assert(memcmp(a.prob, b.prob, cells * sizeof(double)) == 0, "probabilities differ");
        cr_assert(memcmp(a.mass_before, b.mass_before, cells * sizeof(double)) == 0, "C_t differs");
        kp_topp_ref_free(&b);
    }
    kp_topp_ref_free(&a);
    free(x);
}

/* Pinned reference digests (keep mask, float64 probabilities and masses before): computed once on
 * x86-64 glibc 2.36; the reference uses + - * / only, so any IEEE-754 machine must agree. */
Test(reference_topp, pinned_reference_digests_through_the_harness) {
    struct { const char *name, *hex; } pins[] = {
        {"topp(batch=4,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)",
         "1a919eed8a9c996878986ba96f0e0189689654207f5ac3ee5cb2a29b34c3cc81"},
        {"topp(batch=2,profile=ties,seed=7,top_p=0.5,vocab=32000)", "4acb19509cef3fb092b72540248ac86e35da0a1638a2ef8b0ce41b12bb1312bd"},
        {"topp(batch=8,profile=nan,seed=7,top_p=mixed,vocab=3000)", "ee2110c3bcecca89d55e1ab7b8fc9bab4feb271484cdb7480d0802d3adcf33a2"},
    };
    for (size_t i = 0; i < sizeof pins / sizeof *pins; i++) {
        kp_case c;
        kp_error err = {0};
        kp_prepared p;
        cr_assert_eq(kp_case_parse(pins[i].name, &c, &err) || kp_case_normalize(&c, &err) ||
                         kp_prepare(kp_family_find("topp"), &c, 0, &p, &err), 0, "%s", err.msg);
        cJSON *desc = cJSON_CreateObject();
        cr_assert_eq(kp_reference_run(&p, NULL, desc, &err), 0, "%s", err.msg);
        kp_digests_settle(); /* the digest is hashed on a worker thread */
        cr_expect_str_eq(cJSON_GetObjectItemCaseSensitive(desc, "sha256")->valuestring, pins[i].hex, "%s", pins[i].name);
        cJSON_Delete(desc);
        kp_prepared_release(&p);
    }
}
