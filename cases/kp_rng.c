/* kp_rng.c: the cuRAND host generator behind kp_rng. Only raw draws are used: cuRAND's own
 * distributions differ between host and device in the last bits (measured on an H200). */
#include "kp_rng.h"

#include <curand.h>

int kp_rng_open(kp_rng *rng, uint64_t seed, kp_error *err) {
    curandGenerator_t gen;
    curandStatus_t st = curandCreateGeneratorHost(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10);
    if (st != CURAND_STATUS_SUCCESS)
        return kp_fail(err, KP_EXIT_ENV, "curandCreateGeneratorHost failed (status %d); is libcurand installed?", (int)st);
    if ((st = curandSetGeneratorOrdering(gen, CURAND_ORDERING_PSEUDO_LEGACY)) != CURAND_STATUS_SUCCESS ||
        (st = curandSetPseudoRandomGeneratorSeed(gen, seed)) != CURAND_STATUS_SUCCESS) {
        curandDestroyGenerator(gen);
        return kp_fail(err, KP_EXIT_ENV, "cuRAND generator setup failed (status %d)", (int)st);
    }
    rng->gen = gen;
    rng->seed = seed;
    return 0;
}

int kp_rng_seek(kp_rng *rng, uint64_t offset, kp_error *err) {
    curandStatus_t st = curandSetGeneratorOffset((curandGenerator_t)rng->gen, offset);
    if (st != CURAND_STATUS_SUCCESS)
        return kp_fail(err, KP_EXIT_ENV, "curandSetGeneratorOffset(%llu) failed (status %d)",
                       (unsigned long long)offset, (int)st);
    return 0;
}

int kp_rng_next(kp_rng *rng, uint32_t *dst, size_t n, kp_error *err) {
    if (n == 0) return 0;
    curandStatus_t st = curandGenerate((curandGenerator_t)rng->gen, dst, n);
    if (st != CURAND_STATUS_SUCCESS)
        return kp_fail(err, KP_EXIT_ENV, "curandGenerate of %zu draws failed (status %d)", n, (int)st);
    return 0;
}

int kp_rng_draw(kp_rng *rng, uint64_t offset, uint32_t *dst, size_t n, kp_error *err) {
    int rc = kp_rng_seek(rng, offset, err);
    return rc ? rc : kp_rng_next(rng, dst, n, err);
}

void kp_rng_close(kp_rng *rng) {
    if (rng->gen) curandDestroyGenerator((curandGenerator_t)rng->gen);
    rng->gen = NULL;
}

int kp_curand_version(void) {
    int v = -1;
    return curandGetVersion(&v) == CURAND_STATUS_SUCCESS ? v : -1;
}
