/* kp_topp_rows.h: seeded top-p rows shared by tests/test_kernels_host_topp.c and
 * tests/test_gpu_topp_kernels.c (a splitmix64 stream, not cuRAND: independent of cases/). */
#ifndef KP_TOPP_ROWS_H
#define KP_TOPP_ROWS_H

#include <stdint.h>

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

/* f32 kernels summing ~1e5 terms reach ~1e-6 of mass error; 1e-5 leaves room and still catches a
 * missing boundary token of 2*N(0,1) logits at p = 0.95 only when it is larger than that. */
#define MASS_BAND 1e-5

row_verdict judge_row(const float *x, const float *y, int64_t vocab);
/* The rule's properties for one row; returns a reason or NULL (see kp_topp_rows.c). */
const char *rule_violation(const float *x, const float *y, int64_t vocab, float top_p, int minimal, int prob_ties,
                           row_verdict *out_v);

#endif
