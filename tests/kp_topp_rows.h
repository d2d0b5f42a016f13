/* kp_topp_rows.h: seeded top-p rows shared by tests/test_kernels_host_topp.c and
 * tests/test_gpu_topp_kernels.c (a splitmix64 stream, not cuRAND: independent of cases/). */
#ifndef KP_TOPP_ROWS_H
#define KP_TOPP_ROWS_H

#include <stdint.h>

#include "../reference/topp_ref.h"

extern const float mixed_ps[8];
uint64_t splitmix(uint64_t *state);
double uniform01(uint64_t *state);
/* 2 * N(0, 1), the seed's ordinary logits. */
void fill_ordinary(float *row, int64_t vocab, uint64_t seed);
/* spread * N(0, 1): near-uniform rows whose f32 prob levels each hold many distinct logits. */
void fill_flat(float *row, int64_t vocab, uint64_t seed, double spread);
/* N distinct logits i * 2^-40 at shuffled indices, the rest -inf: one f32 prob level whose rule
 * order is not its index order. Returns N. */
int64_t make_level_row(float *x, int64_t vocab, uint64_t seed, int64_t N);
uint32_t bits_of(float x);

/* The seed's forced-logit cases: two shapes (vocab, forced token), two forced values, two batch
 * sizes (split count 16 and 1 at 132 SMs). */
typedef struct forced_shape {
    int64_t vocab, token;
} forced_shape;
extern const forced_shape forced_shapes[2];
extern const float forced_values[2];
extern const int64_t forced_batches[2];
/* Every row forced except row 1, an ordinary control row; top_p 0.95 everywhere. */
void make_forced_batch(float *x, float *p, int64_t batch, forced_shape sh, float value);

/* x, p = rows (r + shift) mod pool_rows of pool, ppool, r = 0 .. batch - 1: a batch rotated through
 * a pool, so each row sits at a new position. */
void rotate_rows(float *x, float *p, const float *pool, const float *ppool, int64_t pool_rows, int64_t batch,
                 int64_t shift, int64_t vocab);
/* Allocation that fails the test instead of returning NULL (impl_named is kp_test_util.h's). */
float *alloc_floats(int64_t n);

/* What a float64 look at one output row finds: the kernel tests' own judge, independent of
 * reference/. */
typedef struct row_verdict {
    int64_t kept, finite, altered; /* altered: neither -inf nor the input's bits */
    double mass;                   /* float64 mass of the kept set */
    double min_kept_prob;
    float min_kept, max_dropped;   /* logits */
    int prob_tie_inversion;        /* min_kept < max_dropped, but both round to the same f32 x - max */
} row_verdict;

/* The gates' declared ambiguity band and tie policy (every ci/gates config's "defaults": band 1e-6, minimal_index; the
 * family's defaults too). No kernel test judges with a wider band than a gate does. */
#define GATE_BAND 1e-6
#define GATE_TIES KP_TIE_MINIMAL_INDEX

row_verdict judge_row(const float *x, const float *y, int64_t vocab);
/* The rule's properties for one row, mass and minimality within GATE_BAND; returns a reason or NULL (see
 * kp_topp_rows.c). A quick judge for the host ports' tests; the kernel tests use the gates' own below. */
const char *rule_violation(const float *x, const float *y, int64_t vocab, float top_p, int minimal, int prob_ties,
                           row_verdict *out_v);

/* The gates' judge, as the `rule` check runs it: reference/topp_ref's float64 reference of x ([batch, stride],
 * top_p p) and kp_topp_judge of an output against it, band GATE_BAND, policy GATE_TIES. */
typedef struct gate_ref {
    kp_topp_ref ref;
    const float *x, *p;
    int64_t batch, vocab, stride;
} gate_ref;
void gate_ref_make(gate_ref *g, const float *x, const float *p, int64_t batch, int64_t vocab, int64_t stride);
void gate_ref_free(gate_ref *g);

/* Rows of y (an impl's output for g's input) that fail, skipping skip_row (-1: none); the first one's row and
 * reason go to *first_row and why. incumbent = 0 (split_prob): every row must meet the rule as the gate's `rule`
 * check requires (rule_ok: no strict difference from the reference, mass, minimality, monotonicity, no NaN, not
 * empty). incumbent = 1 (split_logit, whose rule check the gates expect to fail on ordinary rows): the same judgement
 * less its two known defects only: strict differences where it keeps a token the rule drops (its ladder stops
 * before the pivot is exact) and, where a lower logit is kept and a higher one dropped, only when both round to the
 * same f32 x - max (its prob-equality ties; judge_row's prob_tie_inversion). y_host (may be NULL): the host port's
 * output, which split_prob must equal except on tokens the rule itself leaves open (band-ambiguous or in the
 * boundary tie group): host and CUDA differ only where expf does in a last bit, which can move only such a token. */
int64_t gate_rows_failing(const gate_ref *g, const float *y, int incumbent, int64_t skip_row, const float *y_host,
                          int64_t *first_row, char *why, size_t why_len);

/* The positive control's defect: un-mask the first token y drops in rule order (highest finite logit, lowest index
 * among equals), as a split_prob that keeps one extra boundary token would. Returns its index, -1 if none. */
int64_t plant_extra_boundary_token(const float *x, float *y, int64_t vocab);

#endif
