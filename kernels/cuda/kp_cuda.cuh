/* kp_cuda.cuh: CUDA helpers any kernel family can use: error reporting for launchers, programmatic
 * dependent launch, L2 cache-policy hinted loads and strided loads with several in flight. */
#ifndef KP_CUDA_CUH
#define KP_CUDA_CUH

#include <cuda_runtime.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* kp_registry.h is not included: it pulls in cases/kp_common.h, whose C11 _Noreturn is not C++. */
#include "../kparity_kernel.h"

/* Programmatic dependent launch (sm_90): a kernel launched with launch_after (below) is launched
 * while the kernel before it on the stream drains, so the launch's latency hides behind that
 * kernel's last blocks; pdl_wait, its first statement, waits until that kernel has finished and its
 * writes are visible. Nothing calls griddepcontrol.launch_dependents: letting the next kernel's
 * blocks onto the SMs before a kernel's last block has exited was erratic while two streams' kernels
 * ran side by side (measured variants: MEASURED.md). Without the launch attribute, or before
 * sm_90, pdl_wait does nothing. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when
 * programmatic (only where the device runs sm_90 code). */
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

/* L2 eviction priorities for global loads (PTX createpolicy and .L2::cache_hint, sm_80 and later):
 * l2_policy_keep marks the lines a load brings in evict_last, for data a later pass reads again;
 * l2_policy_drop marks them evict_first, for a last read, which also leaves no line of it at
 * evict_last once the pass is done. */
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

/* ---- error reporting for the launchers: each returns a kp_impl run() status ---- */

/* rc, with the message formatted into message (when there is one). */
__attribute__((format(printf, 4, 5))) static inline int kp_cuda_fail_msg(char *message, size_t message_len, int rc,
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
static inline int kp_cuda_call_fail(char *message, size_t message_len, const char *call, cudaError_t e,
                                    const char *file, int line, const char *after) {
    int name_len = 0;
    while (call[name_len] && call[name_len] != '(' && call[name_len] != ' ') name_len++;
    if (message && message_len)
        snprintf(message, message_len, "%.*s failed: %s (%s:%d)%s%s", name_len, call, cudaGetErrorString(e), file,
                 line, after ? " after launching " : "", after ? after : "");
    return KP_RUN_FAILED;
}

/* In a launcher with message and message_len in scope: return KP_RUN_FAILED, naming the call. */
#define KP_CUDA_CHECK(call)                                                                         \
    do {                                                                                            \
        cudaError_t kp_e_ = (call);                                                                 \
        if (kp_e_ != cudaSuccess)                                                                   \
            return kp_cuda_call_fail(message, message_len, #call, kp_e_, __FILE__, __LINE__, NULL); \
    } while (0)
#define KP_LAUNCH_CHECK(kernel_name)                                                                \
    do {                                                                                            \
        cudaError_t kp_e_ = cudaGetLastError();                                                     \
        if (kp_e_ != cudaSuccess)                                                                   \
            return kp_cuda_call_fail(message, message_len, "cudaGetLastError", kp_e_, __FILE__,     \
                                     __LINE__, kernel_name);                                        \
    } while (0)

#endif
