/* kp_gpu_test.h: what the GPU test files share: a CUDA call asserted with its error, a device and a
 * stream opened inside a test (never before Criterion forks), and a main that skips with 77 where the
 * build has no CUDA impls or the machine no GPU. Included by tests/test_gpu_*.c only. */
#ifndef KP_GPU_TEST_H
#define KP_GPU_TEST_H

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "../kernels/kp_registry.h"
#include "kp_test_util.h"

#define CUDA_OK(call)                                                                             \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        cr_assert_eq(e_, cudaSuccess, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_),     \
                     __FILE__, __LINE__);                                                         \
    } while (0)

typedef struct gpu {
    int sm_count;
    cudaStream_t stream;
} gpu;

/* A blocking stream: it orders with the tests' cudaMemcpy / cudaMemset calls on the legacy stream. */
static inline gpu gpu_open(void) {
    gpu g;
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaDeviceGetAttribute(&g.sm_count, cudaDevAttrMultiProcessorCount, 0));
    CUDA_OK(cudaStreamCreate(&g.stream));
    return g;
}

/* main() of a GPU test binary: 77 unless the build has `impl` and a GPU answers (asked in a throwaway
 * child, so this process never touches CUDA before Criterion forks). */
static inline int kpt_gpu_main(int argc, char *argv[], const char *name, const char *impl) {
    if (!kp_registry_has_cuda() || !kp_impl_find(impl)) {
        fprintf(stderr, "%s: built without the CUDA impls; skipping (77)\n", name);
        return 77;
    }
    if (!kpt_gpu_available()) {
        fprintf(stderr, "%s: no CUDA device; skipping (77)\n", name);
        return 77;
    }
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    const int go = criterion_handle_args(argc, argv, true);
    if (go > 0) result = !criterion_run_all_tests(tests);
    else result = go < 0 ? 2 : 0;
    criterion_finalize(tests);
    return result;
}

#endif
