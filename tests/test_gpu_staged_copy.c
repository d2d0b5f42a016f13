/* test_gpu_staged_copy.c: kp_staged_copy (cases/cuda/kp_staged_copy.h) moves every byte, both ways: sizes across its
 * staging buffers' edges (one byte under the staged minimum, exactly one buffer, buffers and a ragged tail), odd
 * addresses, pageable memory never touched before (the generator's case), page-locked memory (passed straight
 * through), and the device side compared by a second, plain copy. Exit 77 without a GPU or the CUDA build. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_gpu_test.h"
#include "kp_test_util.h"

#ifdef KP_HAVE_CUDA
#include "../cases/cuda/kp_staged_copy.h"

TestSuite(gpu_staged_copy, .timeout = 300);

static void fill(unsigned char *p, size_t n, uint32_t seed) {
    uint32_t x = seed | 1;
    for (size_t i = 0; i < n; i++) x = x * 1664525u + 1013904223u, p[i] = (unsigned char)(x >> 23);
}

/* first byte where a and b differ, or n */
static size_t first_difference(const unsigned char *a, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return n;
}

Test(gpu_staged_copy, every_byte_arrives_both_ways_at_every_size) {
    gpu g = gpu_open();
    const size_t mib = (size_t)1 << 20;
    const size_t sizes[] = {1, KP_STAGED_MIN - 1, KP_STAGED_MIN, 64 * mib, 64 * mib + 1, 3 * 64 * mib + 12345};
    const size_t most = 3 * 64 * mib + 12345 + 64;
    unsigned char *host = malloc(most), *dev;
    cr_assert_not_null(host);
    CUDA_OK(cudaMalloc((void **)&dev, most));
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        for (size_t skew = 0; skew < 2; skew++) { /* an odd address on the host and on the device */
            const size_t n = sizes[i], off = skew * 7;
            fill(host + off, n, (uint32_t)(i * 2 + skew + 1));
            cr_assert_eq(kp_staged_copy(dev + off, host + off, n, 1, g.stream), 0, "to the device, %zu bytes", n);
            unsigned char *check = malloc(n); /* a plain copy back: what the device holds */
            cr_assert_not_null(check);
            CUDA_OK(cudaMemcpy(check, dev + off, n, cudaMemcpyDeviceToHost));
            size_t at = first_difference(check, host + off, n);
            cr_assert_eq(at, n, "to the device, %zu bytes at offset %zu: byte %zu differs", n, off, at);
            unsigned char *back = malloc(n + 3); /* pages never touched: the generator's destination */
            cr_assert_not_null(back);
            cr_assert_eq(kp_staged_copy(back + 3, dev + off, n, 0, g.stream), 0, "back, %zu bytes", n);
            at = first_difference(back + 3, host + off, n);
            cr_assert_eq(at, n, "back, %zu bytes at offset %zu: byte %zu differs", n, off, at);
            free(check), free(back);
        }
    }
    /* page-locked memory goes straight through, and arrives the same */
    unsigned char *pinned;
    const size_t n = 64 * mib + 99;
    CUDA_OK(cudaMallocHost((void **)&pinned, n));
    fill(pinned, n, 77);
    cr_assert_eq(kp_staged_copy(dev, pinned, n, 1, g.stream), 0);
    memset(host, 0, n);
    cr_assert_eq(kp_staged_copy(host, dev, n, 0, g.stream), 0);
    cr_assert_eq(first_difference(host, pinned, n), n);
    CUDA_OK(cudaFreeHost(pinned));
    CUDA_OK(cudaFree(dev));
    free(host);
}

#endif

/* kpt_gpu_main skips (77) in a build without the CUDA impls too */
int main(int argc, char *argv[]) { return kpt_gpu_main(argc, argv, "test_gpu_staged_copy", "moe.invariant@cuda"); }
