/* topp_cuda.cuh: what the topp CUDA files share: the plan of a run (where a row's work lives), the
 * lane and tree helpers whose order the host ports replay, and error reporting. The overview of the
 * kernels, and which file holds what: topp_split.cu. */
#ifndef KP_TOPP_CUDA_CUH
#define KP_TOPP_CUDA_CUH

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* kp_registry.h is not included: it pulls in cases/kp_common.h, whose C11 _Noreturn is not C++. */
#include "../kparity_kernel.h"
#include "../topp_split.h"

#define TOPP_THREADS 256 /* the lane count of every in-piece reduction; the host port mirrors it */

enum topp_algo { ALGO_SPLIT_LOGIT = 0, ALGO_SPLIT_PROB = 1 };

/* One piece's statistics: [batch][P]. */
struct topp_stats {
    float max, sum, min;
    int count;
};

/* split_logit: one pivot over one piece, [batch][ROUNDS][P][F]; key: the smallest f32 prob above it. */
struct topp_part {
    float mass, key;
    int count, unused;
};

/* Where a row's work lives; the same numbers for every kernel of one run. */
struct topp_plan {
    const float *logits;
    float *out;
    const float *top_p;
    int64_t row_stride;
    int vocab;
    int slices;            /* S: programs per row */
    int piece_len;         /* L (split_logit) or KP_TOPP_TILE */
    int piece_count;       /* pieces per row actually used */
    int piece_cap;         /* pieces per row in the workspace */
    int pieces_per_program;
    topp_stats *stats;     /* [batch][piece_cap] */
    topp_part *parts;      /* split_logit: [batch][rounds][piece_cap][F] */
    unsigned long long *hist; /* split_prob: [batch][PROB_R][PROB_F + 1] bucket fix-masses */
    kp_topp_search *search;   /* split_prob: [batch][PROB_R + 1] the state entering each round */
    unsigned *counts;         /* split_prob: [batch][CNT_WORDS]: members of the trimmed level the mask appended,
                                 programs finished per kernel (zeroed by the launcher) */
    uint32_t *level_list;     /* split_prob: [batch][3][level_cap] their logit keys, indices, and scratch */
    int level_cap;            /* split_prob: entries per list, min(vocab, LEVEL_CAP) rounded up to 4 */
    uint32_t *cand_list;      /* split_prob: [batch][3 * level_cap] indices of round 1's bracket tokens */
    int sel_cap;              /* split_prob: entries prob_select_kernel caches in shared memory */
};

/* Programmatic dependent launch (sm_90): a kernel launched with launch_after (below) is launched
 * while the kernel before it on the stream drains, so the launch's latency hides behind that
 * kernel's last blocks; pdl_wait, its first statement, waits until that kernel has finished and its
 * writes are visible. Nothing calls griddepcontrol.launch_dependents: letting the next kernel's
 * blocks onto the SMs before a kernel's last block has exited measured erratic on an H200 while two
 * halves of a batch ran side by side (64 x 154,856: 98.4-115.4 us). Without the launch attribute,
 * or before sm_90, pdl_wait does nothing. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when
 * programmatic (only where the device runs sm_90 code: topp_device_info::sm90). */
template <typename... Params, typename... Args>
static cudaError_t launch_after(bool programmatic, void (*kernel)(Params...), unsigned grid, unsigned block,
                                size_t smem, cudaStream_t stream, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = programmatic ? 1 : 0;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e != cudaSuccess) (void)cudaGetLastError(); /* reported by the caller, not again by a later check */
    return e;
}

__device__ __forceinline__ bool finite_logit(float x) { return isfinite(x); }

__device__ __forceinline__ void key_merge(float &key, int &count, float other_key, int other_count) {
    if (other_count == 0) return;
    if (other_key < key) {
        key = other_key;
        count = other_count;
    } else if (other_key == key) {
        count += other_count;
    }
}

/* Lane t's tokens begin + t, begin + t + 256, ... handed to fn(index, value) in that order, with
 * LANE_BATCH loads in flight per thread; the order of every per-lane sum is the plain loop's. (16 in
 * flight measured no faster on an H200: with one 256-thread block per row the passes are bound by
 * the per-token expf, division and 8 pivot compares, not by memory.) */
#define LANE_BATCH 4
template <typename Load, typename Fn>
__device__ __forceinline__ void lane_tokens_by(Load &&load, int begin, int end, Fn &&fn) {
    int i = begin + (int)threadIdx.x;
    for (; i + (LANE_BATCH - 1) * TOPP_THREADS < end; i += LANE_BATCH * TOPP_THREADS) {
        float v[LANE_BATCH];
#pragma unroll
        for (int u = 0; u < LANE_BATCH; u++) v[u] = load(i + u * TOPP_THREADS);
#pragma unroll
        for (int u = 0; u < LANE_BATCH; u++) fn(i + u * TOPP_THREADS, v[u]);
    }
    for (; i < end; i += TOPP_THREADS) fn(i, load(i));
}
template <typename Fn>
__device__ __forceinline__ void lane_tokens(const float *x, int begin, int end, Fn &&fn) {
    lane_tokens_by([&](int i) { return x[i]; }, begin, end, fn);
}

/* L2 eviction priorities for split_prob's reads of the logits (PTX createpolicy and .L2::cache_hint,
 * sm_80 and later): the statistics and round 0 read a row with evict_last, so that round 1, the last
 * pass over most rows, finds it in L2; round 1 and the mask read it with evict_first, which also
 * leaves no line of it at evict_last once the call is done, and write the outputs with .cs stores. */
__device__ __forceinline__ uint64_t l2_policy_keep(void) {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ uint64_t l2_policy_drop(void) {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ float4 ld_hint(const float4 *x, uint64_t pol) {
    float4 v;
    asm("ld.global.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(x), "l"(pol));
    return v;
}
__device__ __forceinline__ float ld_hint(const float *x, uint64_t pol) {
    float v;
    asm("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(x), "l"(pol));
    return v;
}
/* v[u] = load(base + u * THREADS + threadIdx.x) where that index is below limit, else fill: N loads
 * in flight per thread. */
template <int N, int THREADS, typename T, typename Load>
__device__ __forceinline__ void load_strided_by(T (&v)[N], Load &&load, int base, int limit, T fill) {
#pragma unroll
    for (int u = 0; u < N; u++) {
        const int i = base + u * THREADS + (int)threadIdx.x;
        v[u] = i < limit ? load(i) : fill;
    }
}
template <int N, int THREADS, typename T>
__device__ __forceinline__ void load_strided(T (&v)[N], const T *x, int base, int limit, T fill) {
    load_strided_by<N, THREADS>(v, [&](int i) { return x[i]; }, base, limit, fill);
}

/* ---- reductions over the 256 lanes of a block, in the order the host port replays ---- */

static_assert(TOPP_THREADS == 256, "the warp-local trees below are written for 256 lanes");
static_assert(TOPP_THREADS / 32 >= KP_TOPP_FANOUT, "one warp reduces each pivot");

/* The halving tree over buf[0..255] (lane t adds lane t + half, half = 128 .. 1) run by one warp:
 * lane l carries lanes l, l + 32, l + 64, l + 96 through the first three levels, then shuffles down.
 * Bit-identical to the block-wide tree and to the host port's; valid in lane 0. */
__device__ __forceinline__ float warp_tree_sum(const float *buf) {
    const int l = threadIdx.x & 31;
    const float v0 = buf[l] + buf[l + 128], v1 = buf[l + 32] + buf[l + 160];
    const float v2 = buf[l + 64] + buf[l + 192], v3 = buf[l + 96] + buf[l + 224];
    float u = (v0 + v2) + (v1 + v3);
    for (int half = 16; half > 0; half /= 2) u = u + __shfl_down_sync(0xffffffffu, u, half);
    return u;
}

/* Smallest key and how many share it over 256 lanes, by one warp (order-free); valid in lane 0. */
__device__ __forceinline__ void warp_key_merge(const float *keys, const int *counts, float &key, int &count) {
    const int l = threadIdx.x & 31;
    key = INFINITY;
    count = 0;
    for (int j = 0; j < TOPP_THREADS / 32; j++) key_merge(key, count, keys[l + 32 * j], counts[l + 32 * j]);
    for (int half = 16; half > 0; half /= 2) {
        float other_key = __shfl_down_sync(0xffffffffu, key, half);
        int other_count = __shfl_down_sync(0xffffffffu, count, half);
        key_merge(key, count, other_key, other_count);
    }
}

/* ---- error reporting for the launchers ---- */

__attribute__((format(printf, 4, 5))) static inline int topp_fail(char *message, size_t message_len, int rc,
                                                            const char *fmt, ...) {
    if (message && message_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(message, message_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* "cudaXxx failed: <error string> (file:line)", the CUDA call's name cut at its '('. */
static inline int cuda_fail(char *message, size_t message_len, const char *call, cudaError_t e, const char *file,
                            int line, const char *after) {
    int name_len = 0;
    while (call[name_len] && call[name_len] != '(' && call[name_len] != ' ') name_len++;
    if (message && message_len)
        snprintf(message, message_len, "%.*s failed: %s (%s:%d)%s%s", name_len, call, cudaGetErrorString(e), file,
                 line, after ? " after launching " : "", after ? after : "");
    return KP_RUN_FAILED;
}

#define TOPP_CUDA_CHECK(call)                                                                       \
    do {                                                                                            \
        cudaError_t topp_e_ = (call);                                                               \
        if (topp_e_ != cudaSuccess)                                                                 \
            return cuda_fail(message, message_len, #call, topp_e_, __FILE__, __LINE__, NULL);       \
    } while (0)
#define TOPP_LAUNCH_CHECK(kernel_name)                                                              \
    do {                                                                                            \
        cudaError_t topp_e_ = cudaGetLastError();                                                   \
        if (topp_e_ != cudaSuccess)                                                                 \
            return cuda_fail(message, message_len, "cudaGetLastError", topp_e_, __FILE__, __LINE__, \
                             kernel_name);                                                          \
    } while (0)

/* topp_split_logit.cu: the incumbent's launches of one call (plan filled in by topp_cuda_run). */
int topp_logit_launch(topp_plan plan, const kp_topp_args *a, int sm_count, cudaStream_t stream, char *message,
                      size_t message_len);

#endif
