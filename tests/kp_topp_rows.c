/* kp_topp_rows.c: seeded top-p rows for the kernel tests (host ports and CUDA kernels), made
 * independently of cases/ on purpose, so a defect in the generator cannot hide one in a kernel. */
#define _GNU_SOURCE
#include "kp_topp_rows.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kp_registry.h"

const float mixed_ps[8] = {0.95f, 1e-8f, 1.0f, 0.5f, 0.99f, 0.8f, 0.1f, 0.9f}; /* cases/'s top_p=mixed */

uint64_t splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double uniform01(uint64_t *state) { return ((double)(splitmix(state) >> 11) + 0.5) * 0x1p-53; }

/* 2 * N(0, 1), the seed's ordinary logits. */
void fill_ordinary(float *row, int64_t vocab, uint64_t seed) {
    uint64_t st = seed * 0x2545f4914f6cdd1dull + 1;
    for (int64_t i = 0; i < vocab; i++) {
        double u = uniform01(&st), v = uniform01(&st);
        row[i] = (float)(2.0 * sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
    }
}

/* spread * N(0, 1): near-uniform rows whose f32 prob levels each hold many distinct logits. */
void fill_flat(float *row, int64_t vocab, uint64_t seed, double spread) {
    fill_ordinary(row, vocab, seed);
    for (int64_t i = 0; i < vocab; i++) row[i] = (float)(row[i] * 0.5 * spread);
}

const forced_shape forced_shapes[2] = {{131072, 13}, {154856, 154842}};
const float forced_values[2] = {1e9f, (float)(1e9 / 0.6)};
const int64_t forced_batches[2] = {4, 64};

void make_forced_batch(float *x, float *p, int64_t batch, forced_shape sh, float value) {
    for (int64_t r = 0; r < batch; r++) {
        fill_ordinary(x + r * sh.vocab, sh.vocab, 58231 + (uint64_t)r);
        if (r != 1) x[r * sh.vocab + sh.token] = value;
        p[r] = 0.95f;
    }
}

void rotate_rows(float *x, float *p, const float *pool, const float *ppool, int64_t pool_rows, int64_t batch,
                 int64_t shift, int64_t vocab) {
    for (int64_t r = 0; r < batch; r++) {
        const int64_t src = (r + shift) % pool_rows;
        memcpy(x + r * vocab, pool + src * vocab, (size_t)vocab * sizeof *x);
        p[r] = ppool[src];
    }
}

/* n distinct logits i * 2^-40 at shuffled indices (n < 2^15), the rest -inf: one f32 prob level
 * (expf of every x - max is 1.0) whose rule order is not its index order. */
int64_t make_level_row(float *x, int64_t vocab, uint64_t seed, int64_t N) {
    for (int64_t i = 0; i < vocab; i++) x[i] = -INFINITY;
    int64_t *slot = malloc(sizeof(int64_t) * (size_t)vocab);
    cr_assert(slot);
    for (int64_t i = 0; i < vocab; i++) slot[i] = i;
    uint64_t st = seed;
    for (int64_t i = vocab - 1; i > 0; i--) {
        int64_t j = (int64_t)(splitmix(&st) % (uint64_t)(i + 1)), t = slot[i];
        slot[i] = slot[j];
        slot[j] = t;
    }
    for (int64_t i = 0; i < N; i++) x[slot[i]] = (float)ldexp((double)i, -40);
    free(slot);
    return N;
}

uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

float *alloc_floats(int64_t n) {
    float *p = malloc((size_t)n * sizeof *p);
    cr_assert(p, "out of host memory for %lld floats", (long long)n);
    return p;
}

row_verdict judge_row(const float *x, const float *y, int64_t vocab) {
    row_verdict v = {0, 0, 0, 0.0, INFINITY, INFINITY, -INFINITY, 0};
    float m32 = -INFINITY;
    for (int64_t i = 0; i < vocab; i++)
        if (isfinite(x[i]) && x[i] > m32) m32 = x[i];
    double m = m32, z = 0.0;
    for (int64_t i = 0; i < vocab; i++)
        if (isfinite(x[i])) z += exp((double)x[i] - m);
    for (int64_t i = 0; i < vocab; i++) {
        int finite = isfinite(x[i]) != 0;
        v.finite += finite;
        int kept = finite && bits_of(y[i]) == bits_of(x[i]);
        if (kept) {
            double prob = exp((double)x[i] - m) / z;
            v.kept++;
            v.mass += prob;
            if (prob < v.min_kept_prob) v.min_kept_prob = prob;
            if (x[i] < v.min_kept) v.min_kept = x[i];
        } else if (bits_of(y[i]) != bits_of(-INFINITY)) {
            v.altered++;
        } else if (finite && x[i] > v.max_dropped) {
            v.max_dropped = x[i];
        }
    }
    if (v.min_kept < v.max_dropped) {
        /* exp(x - max) sees x only through the f32 difference: equal differences are equal probs on
         * every device, and split_logit groups ties by that prob, not by the logit */
        float kept_diff = v.min_kept - m32, dropped_diff = v.max_dropped - m32;
        v.prob_tie_inversion = kept_diff == dropped_diff;
    }
    return v;
}

/* The rule's properties for one row; returns a reason or NULL. split_prob is held to all of them;
 * split_logit's ties are tokens of equal f32 prob, so it may keep a lower logit and drop a higher one
 * when both round to the same f32 x - max (seen at 154856 tokens): with `prob_ties` that inversion
 * is allowed and flagged in out_v, any other is not. */
const char *rule_violation(const float *x, const float *y, int64_t vocab, float top_p, int minimal,
                                  int prob_ties, row_verdict *out_v) {
    row_verdict v = judge_row(x, y, vocab);
    if (out_v) *out_v = v;
    if (v.altered) return "an output is neither -inf nor the input's bits";
    if (v.finite && v.kept == 0) return "every token dropped although the row has finite logits";
    if (top_p >= 1.0f && v.kept != v.finite) return "top_p >= 1 dropped a finite token";
    if (v.mass < (double)top_p - GATE_BAND && v.kept != v.finite) return "kept mass below top_p";
    if (v.min_kept < v.max_dropped && !(prob_ties && v.prob_tie_inversion))
        return "not monotone: a dropped logit exceeds a kept one";
    if (minimal && v.mass - v.min_kept_prob >= (double)top_p + GATE_BAND) return "not minimal";
    return NULL;
}

void gate_ref_make(gate_ref *g, const float *x, const float *p, int64_t batch, int64_t vocab, int64_t stride) {
    memset(g, 0, sizeof *g);
    kp_error err = {0};
    cr_assert_eq(kp_topp_reference(x, batch, vocab, stride, p, GATE_BAND, &g->ref, &err), 0, "reference: %s", err.msg);
    g->x = x, g->p = p, g->batch = batch, g->vocab = vocab, g->stride = stride;
}

void gate_ref_free(gate_ref *g) { kp_topp_ref_free(&g->ref); }

/* Whether token i of row r is one the rule leaves open: band-ambiguous or in the boundary tie group. */
static int rule_leaves_open(const gate_ref *g, int64_t r, int64_t i) {
    const int64_t at = r * g->vocab + i;
    return g->ref.in_group[at] || fabs(g->ref.mass_before[at] - (double)g->p[r]) <= GATE_BAND;
}

/* The first reason row r of y fails, or NULL. */
static const char *row_failure(const gate_ref *g, const kp_topp_judgement *j, int64_t r, const float *y, int incumbent,
                               const float *y_host, char *why, size_t why_len) {
    const kp_topp_row_judgement *rj = &j->rows[r];
    const float *xr = g->x + r * g->stride, *yr = y + r * g->stride;
    const kp_topp_ref_row *rr = &g->ref.rows[r];
    if (!incumbent && !rj->rule_ok) {
        snprintf(why, why_len, "breaks the gate's rule (band %g, %s): %lld strict, %lld tie, %lld band differences; "
                 "mass %s, minimal %s, monotone %s, no NaN %s, nonempty %s; kept %lld (mass %.9f), the rule keeps %lld "
                 "(mass %.9f)", GATE_BAND, kp_tie_policy_name(GATE_TIES), (long long)rj->strict_count,
                 (long long)rj->tie_count, (long long)rj->band_count, rj->mass_ok ? "ok" : "LOW",
                 rj->minimal_ok ? "ok" : "NO", rj->monotone_ok ? "ok" : "NO", rj->no_nan_ok ? "ok" : "NO",
                 rj->nonempty_ok ? "ok" : "NO", (long long)rj->kept_count, rj->kept_mass, (long long)rr->kept_count,
                 rr->kept_mass);
        return why;
    }
    if (incumbent) {
        row_verdict v = judge_row(xr, yr, g->vocab);
        const char *flag = rj->altered_count ? "an output is neither -inf nor the input's bits"
                           : !rj->no_nan_ok  ? "NaN in the output"
                           : !rj->nonempty_ok ? "every token dropped although the row has finite logits"
                           : !rj->mass_ok     ? "kept mass below top_p - band"
                           : !rj->monotone_ok && !v.prob_tie_inversion ? "not monotone: a dropped logit exceeds a kept one "
                                                                          "of another f32 prob"
                                              : NULL;
        if (flag) {
            snprintf(why, why_len, "%s (kept %lld, mass %.9f; the rule keeps %lld)", flag, (long long)rj->kept_count,
                     rj->kept_mass, (long long)rr->kept_count);
            return why;
        }
        /* strict differences: extra tokens kept are the ladder's known defect; a token the rule keeps may be dropped
         * only for a kept one of the same f32 x - max */
        const float m32 = (float)rr->max_logit;
        for (int64_t k = j->strict_off[r]; k < j->strict_off[r + 1]; k++) {
            const int64_t i = j->strict_idx[k];
            const int kept = bits_of(yr[i]) == bits_of(xr[i]);
            if (kept || (v.prob_tie_inversion && xr[i] - m32 == v.min_kept - m32)) continue;
            snprintf(why, why_len, "drops token %lld (logit %.9g), which the rule keeps, outside any tie or band",
                     (long long)i, (double)xr[i]);
            return why;
        }
    }
    if (y_host && !incumbent) {
        const float *hr = y_host + r * g->stride;
        for (int64_t i = 0; i < g->vocab; i++)
            if (bits_of(yr[i]) != bits_of(hr[i]) && !rule_leaves_open(g, r, i)) {
                snprintf(why, why_len, "token %lld (logit %.9g, mass before %.9f, top_p %.9g) is %s here and %s in the "
                         "host port, and the rule does not leave it open (not within band %g, not in the tie group)",
                         (long long)i, (double)xr[i], g->ref.mass_before[r * g->vocab + i], (double)g->p[r],
                         bits_of(yr[i]) == bits_of(xr[i]) ? "kept" : "dropped",
                         bits_of(hr[i]) == bits_of(xr[i]) ? "kept" : "dropped", GATE_BAND);
                return why;
            }
    }
    return NULL;
}

int64_t gate_rows_failing(const gate_ref *g, const float *y, int incumbent, int64_t skip_row, const float *y_host,
                          int64_t *first_row, char *why, size_t why_len) {
    kp_topp_judgement j;
    kp_error err = {0};
    cr_assert_eq(kp_topp_judge(&g->ref, g->x, y, g->stride, GATE_TIES, GATE_BAND, &j, &err), 0, "judge: %s", err.msg);
    int64_t failing = 0;
    *first_row = -1;
    why[0] = '\0';
    char row_why[512];
    for (int64_t r = 0; r < g->batch; r++) {
        if (r == skip_row) continue;
        if (!row_failure(g, &j, r, y, incumbent, y_host, row_why, sizeof row_why)) continue;
        if (!failing++) {
            *first_row = r;
            snprintf(why, why_len, "%s", row_why);
        }
    }
    kp_topp_judgement_free(&j);
    return failing;
}

int64_t plant_extra_boundary_token(const float *x, float *y, int64_t vocab) {
    int64_t first = -1;
    for (int64_t i = 0; i < vocab; i++)
        if (isfinite(x[i]) && bits_of(y[i]) != bits_of(x[i]) && (first < 0 || x[i] > x[first])) first = i;
    if (first >= 0) y[first] = x[first];
    return first;
}
