/* moe_gen.cu: moe's NVFP4 expert weights on a CUDA device, byte for byte the host generator's (kp_moe_case_experts
 * in cases/moe_case.c is the definition, tests/test_gpu_moe_gen.c the proof): cuRAND's device Philox, then
 * kp_moe_weight's map and kp_nvfp4_quantize's arithmetic, in the host's order, one rounding per operation.
 *
 * Every floating-point operation is a rounded intrinsic (__dmul_rn, __fdiv_rn, ...): each is the host's single
 * IEEE operation and is never contracted into an FMA; the file is also built with -fmad=false, IEEE division
 * and square root and no flush to zero (CMakeLists.txt), so nothing written plainly can be either. */
#include <cuda_runtime.h>
#include <curand.h>
#include <stdio.h>

#include "kp_staged_copy.h"
#include "moe_gen_cuda.h"

namespace {

constexpr int THREADS = 256;

/* kp_moe_weight: (draw * 2^-32 - 0.5) * scale in double (the first two exact), rounded once to f32. */
__device__ __forceinline__ float weight_of(uint32_t draw, double scale) {
    const double unit = __dmul_rn(__uint2double_rn(draw), 1.0 / 4294967296.0);
    return __double2float_rn(__dmul_rn(__dadd_rn(unit, -0.5), scale));
}

/* kp_e2m1_quantize: the code is the number of midpoints below |x|, a midpoint going to the even code. */
__device__ __forceinline__ uint32_t e2m1_quantize(float x) {
    if (isnan(x)) return 0;
    const float a = fabsf(x);
    const uint32_t code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
    return (signbit(x) ? 8u : 0u) | code;
}

/* kp_e4m3_value: (1 + m / 8) * 2^(e - 7) from its f32 bits, subnormals m / 512 (exact). */
__device__ __forceinline__ float e4m3_value(uint32_t bits) {
    const uint32_t e = (bits >> 3) & 0xfu, m = bits & 7u;
    if (e == 15 && m == 7) return __uint_as_float(0x7fc00000u);
    const float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : __fdiv_rn(__uint2float_rn(m), 512.0f);
    return (bits & 0x80u) ? -v : v;
}

/* kp_e4m3_quantize: the host's search over the 127 magnitudes (nearest() in kp_nvfp4.c), the same comparisons and
 * the same midpoint in double, so the proof is a port read side by side, then every f32 run through both. */
__device__ uint32_t e4m3_quantize(float x) {
    if (isnan(x)) return 0x7fu;
    const float a = fabsf(x);
    uint32_t code;
    int lo = 0, hi = 0x7e;
    if (a >= e4m3_value((uint32_t)hi)) {
        code = (uint32_t)hi;
    } else {
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (e4m3_value((uint32_t)mid) <= a) lo = mid;
            else hi = mid - 1;
        }
        const double below = e4m3_value((uint32_t)lo), above = e4m3_value((uint32_t)(lo + 1));
        const double half = __ddiv_rn(__dadd_rn(below, above), 2.0);
        if ((double)a < half) code = (uint32_t)lo;
        else if ((double)a > half) code = (uint32_t)(lo + 1);
        else code = (uint32_t)(lo % 2 == 0 ? lo : lo + 1);
    }
    return (signbit(x) ? 0x80u : 0u) | code;
}

/* |w|'s bits: for floats without their sign the integer order is the value order, so an integer max is the
 * host's exact max of fabsf (every weight is finite: |w| <= scale / 2). */
__device__ __forceinline__ uint32_t abs_bits(float w) { return __float_as_uint(w) & 0x7fffffffu; }

__device__ __forceinline__ uint32_t block_max(uint32_t v) { /* thread 0's is the block's */
    __shared__ uint32_t warp_max[THREADS / 32];
    for (int s = 16; s > 0; s /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, s));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x < THREADS / 32 ? warp_max[threadIdx.x] : 0u;
    if (threadIdx.x < 32)
        for (int s = 16; s > 0; s /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, s));
    return v;
}

/* A group's tensors, blockIdx.y = t: expert q = t / 2's W13 (t even) or W2 (t odd). Its draws sit at q * per, W2's
 * after W13's n13, as the host draws them. */
struct tensors {
    const uint32_t *draws; /* [experts, per] */
    int64_t per, n13, n2, experts;
    double scale13, scale2;
};

__device__ __forceinline__ const uint32_t *draws_of(const tensors &g, int64_t t, int64_t *n, double *scale) {
    const bool w2 = t & 1;
    *n = w2 ? g.n2 : g.n13;
    *scale = w2 ? g.scale2 : g.scale13;
    return g.draws + (t >> 1) * g.per + (w2 ? g.n13 : 0);
}

/* amax_bits[t] = max |weight| over tensor t (zeroed before). n is a multiple of 16: whole uint4s. */
__global__ void __launch_bounds__(THREADS) tensor_amax(tensors g, uint32_t *amax_bits) {
    int64_t n;
    double scale;
    const uint4 *d = reinterpret_cast<const uint4 *>(draws_of(g, blockIdx.y, &n, &scale));
    uint32_t m = 0;
    for (int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x; i < n / 4; i += (int64_t)gridDim.x * THREADS) {
        const uint4 v = d[i];
        m = max(max(m, abs_bits(weight_of(v.x, scale))), abs_bits(weight_of(v.y, scale)));
        m = max(max(m, abs_bits(weight_of(v.z, scale))), abs_bits(weight_of(v.w, scale)));
    }
    m = block_max(m);
    if (threadIdx.x == 0) atomicMax(&amax_bits[blockIdx.y], m);
}

/* kp_nvfp4_quantize after its amax: one thread per block of 16 along K (blocks never straddle rows: K % 16 == 0),
 * packed [n / 2] with element 2j in byte j's low nibble, scales [n / 16], and the tensor's global scale. */
__global__ void __launch_bounds__(THREADS) tensor_quantize(tensors g, const uint32_t *amax_bits, int multiply,
                                                           uint8_t *w13, uint8_t *s13, uint8_t *w2, uint8_t *s2,
                                                           float *globals /* [2, experts]: g13 then g2 */) {
    const int64_t t = blockIdx.y, q = t >> 1;
    int64_t n;
    double scale;
    const uint4 *d = reinterpret_cast<const uint4 *>(draws_of(g, t, &n, &scale));
    uint2 *packed = reinterpret_cast<uint2 *>((t & 1) ? w2 + q * (g.n2 / 2) : w13 + q * (g.n13 / 2));
    uint8_t *scales = (t & 1) ? s2 + q * (g.n2 / 16) : s13 + q * (g.n13 / 16);
    const float amax = __uint_as_float(amax_bits[t]);
    const float gs = amax > 0.0f ? __fdiv_rn(2688.0f, amax) : 1.0f; /* 448 * 6 / amax */
    if (blockIdx.x == 0 && threadIdx.x == 0)
        globals[(t & 1) * g.experts + q] = multiply ? (amax > 0.0f ? __fdiv_rn(amax, 2688.0f) : 1.0f) : gs;
    for (int64_t b = blockIdx.x * (int64_t)THREADS + threadIdx.x; b < n / 16; b += (int64_t)gridDim.x * THREADS) {
        float x[16];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint4 v = d[4 * b + k];
            x[4 * k] = weight_of(v.x, scale), x[4 * k + 1] = weight_of(v.y, scale);
            x[4 * k + 2] = weight_of(v.z, scale), x[4 * k + 3] = weight_of(v.w, scale);
        }
        float bamax = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++)
            if (fabsf(x[i]) > bamax) bamax = fabsf(x[i]);
        const uint32_t sf = e4m3_quantize(__fdiv_rn(__fmul_rn(gs, bamax), 6.0f));
        const float sfv = e4m3_value(sf);
        uint32_t half[2] = {0u, 0u}; /* elements 0..7 and 8..15, little-endian: byte j = (2j) | (2j + 1) << 4 */
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const uint32_t code = sfv > 0.0f ? e2m1_quantize(__fdiv_rn(__fmul_rn(x[i], gs), sfv)) : 0u;
            half[i / 8] |= code << (4 * (i % 8));
        }
        packed[b] = make_uint2(half[0], half[1]);
        scales[b] = (uint8_t)sf;
    }
}

__global__ void e2m1_every(uint32_t first, uint32_t n, uint8_t *codes) {
    for (uint32_t i = blockIdx.x * THREADS + threadIdx.x; i < n; i += gridDim.x * THREADS)
        codes[i] = (uint8_t)e2m1_quantize(__uint_as_float(first + i));
}
__global__ void e4m3_every(uint32_t first, uint32_t n, uint8_t *codes) {
    for (uint32_t i = blockIdx.x * THREADS + threadIdx.x; i < n; i += gridDim.x * THREADS)
        codes[i] = (uint8_t)e4m3_quantize(__uint_as_float(first + i));
}
__global__ void weights_every(uint32_t first, uint32_t n, double scale, float *weights) {
    for (uint32_t i = blockIdx.x * THREADS + threadIdx.x; i < n; i += gridDim.x * THREADS)
        weights[i] = weight_of(first + i, scale);
}

/* ---- the launcher ---- */

int cuda_fail(char *msg, size_t len, const char *call, cudaError_t e, const char *file, int line) {
    int name_len = 0; /* the call's name, cut at its '(' */
    while (call[name_len] && call[name_len] != '(') name_len++;
    if (len) snprintf(msg, len, "%.*s failed: %s (%s) (%s:%d)", name_len, call, cudaGetErrorString(e), cudaGetErrorName(e), file, line);
    (void)cudaGetLastError();
    return KP_MOE_GEN_CUDA_FAILED;
}
int curand_fail(char *msg, size_t len, const char *call, curandStatus_t st, const char *file, int line) {
    int name_len = 0;
    while (call[name_len] && call[name_len] != '(') name_len++;
    if (len) snprintf(msg, len, "%.*s failed: cuRAND status %d (%s:%d)", name_len, call, (int)st, file, line);
    (void)cudaGetLastError();
    return KP_MOE_GEN_CUDA_FAILED;
}
#define TRY_CUDA(call)                                                                        \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) return cuda_fail(msg, msg_len, #call, e_, __FILE__, __LINE__); \
    } while (0)
#define TRY_CURAND(call)                                                                                 \
    do {                                                                                                 \
        curandStatus_t s_ = (call);                                                                      \
        if (s_ != CURAND_STATUS_SUCCESS) return curand_fail(msg, msg_len, #call, s_, __FILE__, __LINE__); \
    } while (0)

/* What the calls hold, released whatever happened. */
struct held {
    cudaStream_t stream = nullptr;
    curandGenerator_t gen = nullptr;
    void *scratch = nullptr;
    ~held() {
        if (stream) cudaStreamSynchronize(stream);
        if (scratch) cudaFree(scratch);
        if (gen) curandDestroyGenerator(gen);
        if (stream) cudaStreamDestroy(stream);
        (void)cudaGetLastError();
    }
};

/* No driver, no device, or a device in exclusive use elsewhere: the host generates instead. */
int open_device(int device, char *msg, size_t msg_len) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
        (void)cudaGetLastError();
        return KP_MOE_GEN_CUDA_NO_DEVICE;
    }
    const cudaError_t e = cudaSetDevice(device);
    if (e == cudaErrorDevicesUnavailable) {
        (void)cudaGetLastError();
        return KP_MOE_GEN_CUDA_NO_DEVICE;
    }
    if (e != cudaSuccess) return cuda_fail(msg, msg_len, "cudaSetDevice", e, __FILE__, __LINE__);
    TRY_CUDA(cudaFree(nullptr)); /* the context, made now so that its failure is told apart from a kernel's */
    return KP_MOE_GEN_CUDA_OK;
}

/* The host generator's configuration (kp_rng_open): Philox4_32_10, legacy ordering, the case's seed. Its draws
 * equal the host generator's at every offset (tests/test_gpu_moe_gen.c); its distributions would not. */
int open_generator(held *h, uint64_t seed, char *msg, size_t msg_len) {
    TRY_CUDA(cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking));
    TRY_CURAND(curandCreateGenerator(&h->gen, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    TRY_CURAND(curandSetGeneratorOrdering(h->gen, CURAND_ORDERING_PSEUDO_LEGACY));
    TRY_CURAND(curandSetPseudoRandomGeneratorSeed(h->gen, seed));
    TRY_CURAND(curandSetStream(h->gen, h->stream));
    return KP_MOE_GEN_CUDA_OK;
}

size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }

/* A group of g experts in the scratch: seven regions, each 256-byte aligned. */
struct layout {
    size_t draws, w13, s13, w2, s2, amax, globals, total;
};
layout layout_of(int64_t n13, int64_t n2, int64_t g) {
    layout l;
    size_t at = 0;
    const size_t G = (size_t)g;
    l.draws = at, at += up256(G * (size_t)(n13 + n2) * 4);
    l.w13 = at, at += up256(G * (size_t)n13 / 2);
    l.s13 = at, at += up256(G * (size_t)n13 / 16);
    l.w2 = at, at += up256(G * (size_t)n2 / 2);
    l.s2 = at, at += up256(G * (size_t)n2 / 16);
    l.amax = at, at += up256(G * 2 * 4);
    l.globals = at, at += up256(G * 2 * 4);
    l.total = at;
    return l;
}

unsigned blocks_for(int64_t items) { /* grid x for `items` thread-items, one each; gridDim.x allows 2^31 - 1 */
    const int64_t b = (items + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

int generate(const kp_moe_gen_job *job, int64_t group, held *h, char *msg, size_t msg_len) {
    const int64_t n13 = job->w13_rows * job->hidden, n2 = job->hidden * job->inter, per = n13 + n2;
    int rc = open_generator(h, job->seed, msg, msg_len);
    if (rc) return rc;
    const layout l = layout_of(n13, n2, group);
    const cudaError_t e = cudaMalloc(&h->scratch, l.total);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return KP_MOE_GEN_CUDA_NO_ROOM;
    }
    if (e != cudaSuccess) return cuda_fail(msg, msg_len, "cudaMalloc", e, __FILE__, __LINE__);
    char *base = static_cast<char *>(h->scratch);
    uint32_t *draws = reinterpret_cast<uint32_t *>(base + l.draws), *amax = reinterpret_cast<uint32_t *>(base + l.amax);
    uint8_t *w13 = reinterpret_cast<uint8_t *>(base + l.w13), *s13 = reinterpret_cast<uint8_t *>(base + l.s13);
    uint8_t *w2 = reinterpret_cast<uint8_t *>(base + l.w2), *s2 = reinterpret_cast<uint8_t *>(base + l.s2);
    float *globals = reinterpret_cast<float *>(base + l.globals);
    const int64_t most = n13 > n2 ? n13 : n2;
    for (int64_t q0 = 0; q0 < job->experts; q0 += group) {
        const int64_t ne = job->experts - q0 < group ? job->experts - q0 : group;
        const tensors g = {draws, per, n13, n2, ne, job->scale13, job->scale2};
        const dim3 amax_grid(blocks_for(most / 4 / 8), (unsigned)(2 * ne)), quant_grid(blocks_for(most / 16), (unsigned)(2 * ne));
        TRY_CUDA(cudaMemsetAsync(amax, 0, (size_t)(2 * ne) * sizeof *amax, h->stream));
        TRY_CURAND(curandSetGeneratorOffset(h->gen, job->offset + (uint64_t)q0 * (uint64_t)per));
        TRY_CURAND(curandGenerate(h->gen, draws, (size_t)(ne * per)));
        tensor_amax<<<amax_grid, THREADS, 0, h->stream>>>(g, amax);
        TRY_CUDA(cudaGetLastError());
        tensor_quantize<<<quant_grid, THREADS, 0, h->stream>>>(g, amax, job->multiply, w13, s13, w2, s2, globals);
        TRY_CUDA(cudaGetLastError());
        /* back to the caller's pageable memory, staged (kp_staged_copy.h) and waited for: the scratch is the next group's */
        TRY_CUDA((cudaError_t)kp_staged_copy(job->w13 + q0 * (n13 / 2), w13, (size_t)(ne * (n13 / 2)), 0, h->stream));
        TRY_CUDA((cudaError_t)kp_staged_copy(job->s13 + q0 * (n13 / 16), s13, (size_t)(ne * (n13 / 16)), 0, h->stream));
        TRY_CUDA((cudaError_t)kp_staged_copy(job->w2 + q0 * (n2 / 2), w2, (size_t)(ne * (n2 / 2)), 0, h->stream));
        TRY_CUDA((cudaError_t)kp_staged_copy(job->s2 + q0 * (n2 / 16), s2, (size_t)(ne * (n2 / 16)), 0, h->stream));
        TRY_CUDA(cudaMemcpyAsync(job->g13 + q0, globals, (size_t)ne * sizeof(float), cudaMemcpyDeviceToHost, h->stream));
        TRY_CUDA(cudaMemcpyAsync(job->g2 + q0, globals + ne, (size_t)ne * sizeof(float), cudaMemcpyDeviceToHost, h->stream));
        TRY_CUDA(cudaStreamSynchronize(h->stream));
    }
    return KP_MOE_GEN_CUDA_OK;
}

} // namespace

extern "C" int64_t kp_moe_gen_cuda_group(int64_t w13_rows, int64_t hidden, int64_t inter, size_t scratch_bytes) {
    const int64_t n13 = w13_rows * hidden, n2 = hidden * inter;
    /* an expert's share of every region (amax and globals: 2 words each), and 7 regions' alignment padding */
    const size_t per_expert = (size_t)(n13 + n2) * 4 + (size_t)(n13 / 2 + n13 / 16 + n2 / 2 + n2 / 16) + 16;
    if (scratch_bytes < 7 * 256 + per_expert) return 0;
    const int64_t g = (int64_t)((scratch_bytes - 7 * 256) / per_expert);
    return g > 32767 ? 32767 : g; /* gridDim.y: two tensors an expert, at most 65535 */
}

extern "C" int kp_moe_gen_cuda_experts(const kp_moe_gen_job *job, char *msg, size_t msg_len) {
    if (msg_len) msg[0] = '\0';
    int64_t group = kp_moe_gen_cuda_group(job->w13_rows, job->hidden, job->inter, job->scratch_bytes);
    if (group < 1) return KP_MOE_GEN_CUDA_NO_ROOM;
    if (group > job->experts) group = job->experts;
    const int rc = open_device(job->device, msg, msg_len);
    if (rc) return rc;
    held h;
    return generate(job, group, &h, msg, msg_len);
}

extern "C" int kp_moe_gen_cuda_e2m1(uint32_t first, uint32_t n, uint8_t *dev_codes) {
    e2m1_every<<<blocks_for(n), THREADS>>>(first, n, dev_codes);
    return (int)cudaGetLastError();
}
extern "C" int kp_moe_gen_cuda_e4m3(uint32_t first, uint32_t n, uint8_t *dev_codes) {
    e4m3_every<<<blocks_for(n), THREADS>>>(first, n, dev_codes);
    return (int)cudaGetLastError();
}
extern "C" int kp_moe_gen_cuda_weights(uint32_t first, uint32_t n, double scale, float *dev_weights) {
    weights_every<<<blocks_for(n), THREADS>>>(first, n, scale, dev_weights);
    return (int)cudaGetLastError();
}

extern "C" int kp_moe_gen_cuda_draws(uint64_t seed, uint64_t offset, size_t n, uint32_t *draws, char *msg, size_t msg_len) {
    if (msg_len) msg[0] = '\0';
    held h;
    int rc = open_generator(&h, seed, msg, msg_len);
    if (rc) return rc;
    TRY_CUDA(cudaMalloc(&h.scratch, n * sizeof *draws));
    TRY_CURAND(curandSetGeneratorOffset(h.gen, offset));
    TRY_CURAND(curandGenerate(h.gen, static_cast<uint32_t *>(h.scratch), n));
    TRY_CUDA(cudaMemcpyAsync(draws, h.scratch, n * sizeof *draws, cudaMemcpyDeviceToHost, h.stream));
    TRY_CUDA(cudaStreamSynchronize(h.stream));
    return KP_MOE_GEN_CUDA_OK;
}
