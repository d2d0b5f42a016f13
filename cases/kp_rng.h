/* kp_rng.h: raw 32-bit draws from cuRAND's host Philox4_32_10 generator, LEGACY ordering (the
 * only ordering promised stable across releases), at any offset. No GPU or driver is needed. */
#ifndef KP_RNG_H
#define KP_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "kp_common.h"

#define KP_GENERATOR_NAME "curand.philox4_32_10.legacy.host"

typedef struct kp_rng {
    void *gen; /* curandGenerator_t */
    uint64_t seed;
} kp_rng;

int kp_rng_open(kp_rng *rng, uint64_t seed, kp_error *err);
/* Position the stream `offset` draws in. Seeking is slow in cuRAND's host generator (about 8 ms),
 * so callers seek once per row range and then read on with kp_rng_next. */
int kp_rng_seek(kp_rng *rng, uint64_t offset, kp_error *err);
/* The next n draws after the previous read or seek. */
int kp_rng_next(kp_rng *rng, uint32_t *dst, size_t n, kp_error *err);
/* Seek, then read n draws. */
int kp_rng_draw(kp_rng *rng, uint64_t offset, uint32_t *dst, size_t n, kp_error *err);
void kp_rng_close(kp_rng *rng);
/* curandGetVersion(), e.g. 10400; -1 when it cannot be read. */
int kp_curand_version(void);

/* Uniform in [0, 1) from one draw: draw * 2^-32, exact in double. */
static inline double kp_unit(uint32_t draw) { return (double)draw * (1.0 / 4294967296.0); }
/* An index in [0, n) from one draw (multiply-shift, no division). */
static inline int64_t kp_index(uint32_t draw, int64_t n) { return (int64_t)(((uint64_t)draw * (uint64_t)n) >> 32); }

#endif
