/* kp_topp_rows.c: seeded top-p rows for the kernel tests (host ports and CUDA kernels), made
 * independently of cases/ on purpose, so a defect in the generator cannot hide one in a kernel. */
#define _GNU_SOURCE
#include "kp_topp_rows.h"

#include <criterion/criterion.h>
#include <math.h>
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
    if (v.mass < (double)top_p - MASS_BAND && v.kept != v.finite) return "kept mass below top_p";
    if (v.min_kept < v.max_dropped && !(prob_ties && v.prob_tie_inversion))
        return "not monotone: a dropped logit exceeds a kept one";
    if (minimal && v.mass - v.min_kept_prob >= (double)top_p + MASS_BAND) return "not minimal";
    return NULL;
}
