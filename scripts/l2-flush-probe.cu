/* l2-flush-probe.cu: what the bench's L2 flush costs the first pass over a 64 x 154,856 float batch.
 * kparity bench flushes L2 before each rep with a memset of twice the L2 (harness/device.c), which
 * leaves the L2 full of dirty lines; the first read of the logits then shares DRAM with their
 * write-back. This times one plain read of the batch (CUDA events, 50 reps after 3 warm-ups) after
 * that flush, after the same memset followed by a read of another 128 MiB (the L2 left clean), and
 * with no flush (the batch still in L2). Not part of the build; on a GPU machine:
 *   nvcc -O3 -arch=sm_90 -o /tmp/l2-flush-probe scripts/l2-flush-probe.cu && /tmp/l2-flush-probe */
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                              \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

__global__ void read_all(const float4 *x, size_t n4, float *sink) {
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = __ldg(x + i);
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 12345.678f) *sink = s; /* never true for the zeroed input: keeps the loads */
}

int main(void) {
    const size_t n = 64ull * 154856, flush_bytes = 128ull << 20;
    float *x, *sink;
    void *flush, *other;
    CHECK(cudaMalloc(&x, n * sizeof(float)));
    CHECK(cudaMalloc(&sink, sizeof(float)));
    CHECK(cudaMalloc(&flush, flush_bytes));
    CHECK(cudaMalloc(&other, flush_bytes));
    CHECK(cudaMemset(x, 0, n * sizeof(float)));
    CHECK(cudaMemset(other, 0, flush_bytes));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    static const char *const names[] = {"dirty L2 (memset 128 MiB, as the bench)", "clean L2 (memset, then read 128 MiB)",
                                        "no flush (the batch in L2)"};
    for (int mode = 0; mode < 3; mode++) {
        const int reps = 50, warm = 3;
        float best = 1e30f, total = 0.0f;
        for (int r = 0; r < warm + reps; r++) {
            if (mode < 2) CHECK(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
            if (mode == 1) read_all<<<sms * 8, 256>>>(static_cast<const float4 *>(other), flush_bytes / 16, sink);
            CHECK(cudaEventRecord(a));
            read_all<<<sms * 8, 256>>>(reinterpret_cast<const float4 *>(x), n / 4, sink);
            CHECK(cudaEventRecord(b));
            CHECK(cudaEventSynchronize(b));
            float ms = 0.0f;
            CHECK(cudaEventElapsedTime(&ms, a, b));
            if (r < warm) continue;
            total += ms;
            if (ms < best) best = ms;
        }
        printf("%-42s one read of %.1f MB: mean %.1f us, best %.1f us (%.0f GB/s)\n", names[mode], n * 4 / 1e6,
               total / reps * 1e3, best * 1e3, n * 4 / (best * 1e-3) / 1e9);
    }
    return 0;
}
