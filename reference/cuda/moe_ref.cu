/* moe_ref.cu: moe's float64 reference on the GPU, every output bit the host's (reference/moe_ref.c is the definition).
 * Each element keeps the host's own sequence of operations; only which thread does it differs. Every operation is a
 * rounded intrinsic (__dmul_rn, __dadd_rn, __ddiv_rn) and the file builds with -fmad=false, so nothing fuses. */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_ref_cuda.h"

/* A block computes BM pairs x BN weight rows over all of K, BK of K at a time. The host's dot has 4 lanes (lane l
 * takes k = l, l + 4, ... in order): here lane l is thread l of 4 adjacent threads, which each hold a TM x TN tile of
 * that lane's accumulators; the lanes meet by shuffles at the end, (l0 + l1) + (l2 + l3) as on the host. */
#define BM 32
#define BN 64
#define BK 32
#define KS (BK + 4) /* shared row stride: 4 adjacent lanes of 8 row groups fall on distinct banks */
#define THREADS 256
#define TM (BM / 8)
#define TN (BN / 8)

/* A block's rows: expert e's sorted positions [pos0, pos1), its weights at `slot` of the group's buffers. */
typedef struct tile {
    int32_t e, slot, pos0, pos1;
} tile;

/* kp_exp_det (reference/kp_detmath.c), the same operations in the same order, each one rounding. */
__device__ static double exp_det(double x) {
    const double ln2_hi = 0x1.62e42feep-1, ln2_lo = 0x1.a39ef35793c76p-33, inv_ln2 = 0x1.71547652b82fep+0;
    const double p1 = 0x1.555555555553ep-3, p2 = -0x1.6c16c16bebd93p-9, p3 = 0x1.1566aaf25de2cp-14,
                 p4 = -0x1.bbd41c5d26bf1p-20, p5 = 0x1.6376972bea4dp-25;
    if (isnan(x)) return x;
    if (x > 0x1.62e42fefa39efp+9) return __longlong_as_double(0x7ff0000000000000ll);
    if (x < -0x1.74910d52d3051p+9) return 0.0;
    const double ax = fabs(x);
    if (ax < 0x1p-28) return __dadd_rn(1.0, x);
    int k = 0;
    double hi = x, lo = 0.0, r = x;
    if (ax > __dmul_rn(0.5, ln2_hi)) {
        k = __double2int_rz(__dadd_rn(__dmul_rn(inv_ln2, x), x < 0 ? -0.5 : 0.5)); /* C's (int): toward zero */
        hi = __dsub_rn(x, __dmul_rn((double)k, ln2_hi));
        lo = __dmul_rn((double)k, ln2_lo);
        r = __dsub_rn(hi, lo);
    }
    const double t = __dmul_rn(r, r);
    double poly = __dadd_rn(p4, __dmul_rn(t, p5));
    poly = __dadd_rn(p3, __dmul_rn(t, poly));
    poly = __dadd_rn(p2, __dmul_rn(t, poly));
    poly = __dadd_rn(p1, __dmul_rn(t, poly));
    const double c = __dsub_rn(r, __dmul_rn(t, poly));
    const double rc = __dmul_rn(r, c);
    if (k == 0) return __dsub_rn(1.0, __dsub_rn(__ddiv_rn(rc, __dsub_rn(c, 2.0)), r));
    const double y = __dsub_rn(1.0, __dsub_rn(__dsub_rn(lo, __ddiv_rn(rc, __dsub_rn(2.0, c))), hi));
    if (k == 1024) return __dmul_rn(__dmul_rn(y, 2.0), 0x1p1023);
    if (k >= -1021) return __dmul_rn(y, __longlong_as_double((long long)(k + 1023) << 52));
    return __dmul_rn(__dmul_rn(y, __longlong_as_double((long long)(k + 1000 + 1023) << 52)), 0x1p-1000);
}

/* One GEMM pass: for each tile's pairs and weight rows n, dot(x_pair, W[e, n]) over K in the host's 4-lane order, then
 * the global scale as the host applies it. FIRST: x is the token's f32 row (pass 1), res [pos, N] by sorted position;
 * else x is act [pos, K] in float64 (pass 2), res [pair, N]. codes [slot, N, K / 2], scales [slot, N, K / 16]. */
template <bool FIRST>
__global__ void __launch_bounds__(THREADS)
    dots_kernel(const tile *tiles, const int32_t *order, const float *x, const double *act, int64_t topk,
                const uint8_t *codes, const uint8_t *scales, const float *g, int multiply, int64_t N, int64_t K,
                const double *e2m1, const double *e4m3, double *res) {
    __shared__ double xs[BM][KS], ws[BN][KS], t2[16], t4[256];
    const tile t = tiles[blockIdx.x];
    const int64_t n0 = (int64_t)blockIdx.y * BN;
    const int tid = threadIdx.x, lane = tid & 3, gm = (tid >> 2) >> 3, gn = (tid >> 2) & 7;
    if (tid < 16) t2[tid] = e2m1[tid];
    t4[tid] = e4m3[tid]; /* THREADS == 256 */
    const uint8_t *wc = codes + (size_t)t.slot * (size_t)N * (size_t)(K / 2);
    const uint8_t *wsf = scales + (size_t)t.slot * (size_t)N * (size_t)(K / 16);
    double acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = 0.0;
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        const int steps = (int)((K - k0 < BK ? K - k0 : BK) / 4); /* K is a multiple of 16 */
        __syncthreads();
        for (int idx = tid; idx < BM * BK; idx += THREADS) {
            const int m = idx / BK, k = idx % BK;
            const int64_t pos = t.pos0 + m;
            double v = 0.0;
            if (pos < t.pos1 && k0 + k < K)
                v = FIRST ? (double)x[(int64_t)(order[pos] / topk) * K + k0 + k] : act[pos * K + k0 + k];
            xs[m][k] = v;
        }
        /* the tile's weights, dequantized once for all its pairs: code value times block scale, exact */
        for (int idx = tid; idx < BN * BK / 2; idx += THREADS) {
            const int n = idx / (BK / 2), b = idx % (BK / 2);
            const int64_t kk = k0 + 2 * b;
            double lo = 0.0, hi = 0.0;
            if (n0 + n < N && kk < K) {
                const uint8_t byte = wc[(n0 + n) * (K / 2) + kk / 2];
                const double sf = t4[wsf[(n0 + n) * (K / 16) + kk / 16]];
                lo = __dmul_rn(t2[byte & 15], sf), hi = __dmul_rn(t2[byte >> 4], sf);
            }
            ws[n][2 * b] = lo, ws[n][2 * b + 1] = hi;
        }
        __syncthreads();
        for (int s = 0; s < steps; s++) {
            const int k = 4 * s + lane;
            double xr[TM], wr[TN];
#pragma unroll
            for (int i = 0; i < TM; i++) xr[i] = xs[gm + 8 * i][k];
#pragma unroll
            for (int j = 0; j < TN; j++) wr[j] = ws[gn + 8 * j][k];
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) acc[i][j] = __dadd_rn(acc[i][j], __dmul_rn(xr[i], wr[j]));
        }
    }
    const double gs = (double)g[t.e];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) {
            /* lanes 0 and 2 form (l0 + l1) and (l2 + l3), lane 0 their sum: IEEE addition commutes bit for bit */
            const double pair = __dadd_rn(acc[i][j], __shfl_xor_sync(0xffffffffu, acc[i][j], 1));
            const double dot = __dadd_rn(pair, __shfl_xor_sync(0xffffffffu, pair, 2));
            const int64_t pos = t.pos0 + gm + 8 * i, n = n0 + gn + 8 * j;
            if (lane == 0 && pos < t.pos1 && n < N) {
                const double v = multiply ? __dmul_rn(dot, gs) : __ddiv_rn(dot, gs);
                res[(FIRST ? pos : (int64_t)order[pos]) * N + n] = v;
            }
        }
}

/* The activation, positions [p0, p1): h [pos, R] (global scale applied), act [pos, I]. */
__global__ void act_kernel(const double *h, int64_t p0, int64_t p1, int64_t I, int gated, double *act) {
    const int64_t R = gated ? 2 * I : I;
    for (int64_t idx = p0 * I + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < p1 * I;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = idx / I, i = idx % I;
        const double a = h[p * R + i];
        double v;
        if (gated) v = __dmul_rn(__ddiv_rn(a, __dadd_rn(1.0, exp_det(-a))), h[p * R + I + i]);
        else v = a > 0.0 ? __dmul_rn(a, a) : 0.0;
        act[idx] = v;
    }
}

/* out[t, h] = sum over slots j ascending of weights[t, j] * y[t * topk + j, h], from 0.0. */
__global__ void combine_kernel(const double *y, const float *weights, int64_t rows, int64_t H, int64_t topk, double *out) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < rows * H; idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / H, h = idx % H;
        double s = 0.0;
        for (int64_t j = 0; j < topk; j++) s = __dadd_rn(s, __dmul_rn((double)weights[t * topk + j], y[(t * topk + j) * H + h]));
        out[idx] = s;
    }
}

static int cuda_fail(char *msg, size_t msg_len, const char *call, cudaError_t e, const char *file, int line) {
    snprintf(msg, msg_len, "%s failed: %s (%s:%d)", call, cudaGetErrorString(e), file, line);
    return KP_MOE_REF_CUDA_FAILED;
}

#define TRY_CUDA(call)                                                                          \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            rc = cuda_fail(msg, msg_len, #call, e_, __FILE__, __LINE__);                        \
            goto done;                                                                          \
        }                                                                                       \
    } while (0)

static int open_device(int device, char *msg, size_t msg_len) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
        (void)cudaGetLastError();
        return KP_MOE_REF_CUDA_NO_DEVICE;
    }
    const cudaError_t e = cudaSetDevice(device);
    if (e == cudaErrorDevicesUnavailable) {
        (void)cudaGetLastError();
        return KP_MOE_REF_CUDA_NO_DEVICE;
    }
    if (e != cudaSuccess) return cuda_fail(msg, msg_len, "cudaSetDevice", e, __FILE__, __LINE__);
    const cudaError_t f = cudaFree(nullptr); /* the context, made now so its failure is told apart from a kernel's */
    return f == cudaSuccess ? KP_MOE_REF_CUDA_OK : cuda_fail(msg, msg_len, "cudaFree(nullptr)", f, __FILE__, __LINE__);
}

extern "C" int kp_moe_ref_cuda(const kp_moe_ref_cuda_job *j, char *msg, size_t msg_len) {
    int rc = open_device(j->device, msg, msg_len);
    if (rc) return rc;
    const int64_t H = j->hidden, I = j->inter, E = j->experts, K = j->topk, R = j->gated ? 2 * I : I;
    const int64_t pairs = j->rows * K;
    const size_t b13 = (size_t)(R * (H / 2)), q13 = (size_t)(R * (H / 16)), b2 = (size_t)(H * (I / 2)),
                 q2 = (size_t)(H * (I / 16)), per = b13 + q13 + b2 + q2;
    /* host: a counting sort of the pairs by expert, token order within one (the host's order; any order gives the same
     * bits, since each element is computed alone) */
    int64_t *first = (int64_t *)calloc((size_t)E + 1, sizeof *first);
    int32_t *order = (int32_t *)malloc(sizeof *order * (size_t)(pairs > 0 ? pairs : 1));
    int64_t *at = (int64_t *)calloc((size_t)E, sizeof *at);
    tile *tiles = (tile *)malloc(sizeof *tiles * (size_t)(pairs + E + 1));
    int64_t *used = (int64_t *)malloc(sizeof *used * (size_t)E);
    int32_t *d_order = nullptr;
    tile *d_tiles = nullptr;
    float *d_x = nullptr, *d_w = nullptr, *d_g = nullptr;
    double *d_tab = nullptr, *d_h = nullptr, *d_act = nullptr, *d_y = nullptr, *d_out = nullptr;
    uint8_t *d_wt = nullptr;
    int64_t nused = 0, group = 0;
    size_t free_b = 0, total_b = 0, need = 0;
    if (!first || !order || !at || !tiles || !used) {
        snprintf(msg, msg_len, "out of host memory for the moe reference's order");
        rc = KP_MOE_REF_CUDA_FAILED;
        goto done;
    }
    for (int64_t i = 0; i < pairs; i++) first[j->ids[i] + 1]++;
    for (int64_t e = 0; e < E; e++) first[e + 1] += first[e];
    for (int64_t i = 0; i < pairs; i++) order[first[j->ids[i]] + at[j->ids[i]]++] = (int32_t)i;
    for (int64_t e = 0; e < E; e++)
        if (first[e + 1] > first[e]) used[nused++] = e; /* only experts with pairs go to the device */
    group = (int64_t)(j->weight_bytes / per);
    if (group < 1) {
        rc = KP_MOE_REF_CUDA_NO_ROOM;
        goto done;
    }
    if (group > nused) group = nused;
    /* device: x per set, the routing weights, h [pairs, R] and act [pairs, I] by sorted position, y per set [pairs, H],
     * one output [rows, H], and a group of experts' weights */
    need = (size_t)j->sets * (size_t)(j->rows * H) * 4 + (size_t)pairs * 4 * 2 + (size_t)pairs * (size_t)(R + I) * 8 +
           (size_t)j->sets * (size_t)pairs * (size_t)H * 8 + (size_t)(j->rows * H) * 8 + (size_t)group * per +
           sizeof(tile) * (size_t)(pairs + E + 1) + (size_t)E * 8 + 272 * 8;
    TRY_CUDA(cudaMemGetInfo(&free_b, &total_b));
    if (need + ((size_t)256 << 20) > free_b) { /* a margin for the context and the allocator */
        rc = KP_MOE_REF_CUDA_NO_ROOM;
        goto done;
    }
    TRY_CUDA(cudaMalloc(&d_x, sizeof *d_x * (size_t)(j->sets * j->rows * H)));
    TRY_CUDA(cudaMalloc(&d_w, sizeof *d_w * (size_t)pairs));
    TRY_CUDA(cudaMalloc(&d_g, sizeof *d_g * (size_t)(2 * E)));
    TRY_CUDA(cudaMalloc(&d_order, sizeof *d_order * (size_t)pairs));
    TRY_CUDA(cudaMalloc(&d_tiles, sizeof *d_tiles * (size_t)(pairs + E + 1)));
    TRY_CUDA(cudaMalloc(&d_tab, sizeof *d_tab * 272));
    TRY_CUDA(cudaMalloc(&d_h, sizeof *d_h * (size_t)(pairs * R)));
    TRY_CUDA(cudaMalloc(&d_act, sizeof *d_act * (size_t)(pairs * I)));
    TRY_CUDA(cudaMalloc(&d_y, sizeof *d_y * (size_t)(j->sets * pairs * H)));
    TRY_CUDA(cudaMalloc(&d_out, sizeof *d_out * (size_t)(j->rows * H)));
    TRY_CUDA(cudaMalloc(&d_wt, (size_t)group * per));
    for (int s = 0; s < j->sets; s++)
        TRY_CUDA(cudaMemcpy(d_x + s * j->rows * H, j->x[s], sizeof *d_x * (size_t)(j->rows * H), cudaMemcpyHostToDevice));
    TRY_CUDA(cudaMemcpy(d_w, j->weights, sizeof *d_w * (size_t)pairs, cudaMemcpyHostToDevice));
    TRY_CUDA(cudaMemcpy(d_g, j->g13, sizeof *d_g * (size_t)E, cudaMemcpyHostToDevice));
    TRY_CUDA(cudaMemcpy(d_g + E, j->g2, sizeof *d_g * (size_t)E, cudaMemcpyHostToDevice));
    TRY_CUDA(cudaMemcpy(d_order, order, sizeof *d_order * (size_t)pairs, cudaMemcpyHostToDevice));
    TRY_CUDA(cudaMemcpy(d_tab, j->e2m1, sizeof *d_tab * 16, cudaMemcpyHostToDevice));
    TRY_CUDA(cudaMemcpy(d_tab + 16, j->e4m3, sizeof *d_tab * 256, cudaMemcpyHostToDevice));
    for (int64_t u0 = 0; u0 < nused; u0 += group) {
        const int64_t nu = nused - u0 < group ? nused - u0 : group;
        uint8_t *dw13 = d_wt, *ds13 = dw13 + (size_t)nu * b13, *dw2 = ds13 + (size_t)nu * q13, *ds2 = dw2 + (size_t)nu * b2;
        int64_t ntiles = 0;
        for (int64_t u = 0; u < nu; u++) {
            const int64_t e = used[u0 + u];
            TRY_CUDA(cudaMemcpy(dw13 + u * b13, j->w13 + e * b13, b13, cudaMemcpyHostToDevice));
            TRY_CUDA(cudaMemcpy(ds13 + u * q13, j->s13 + e * q13, q13, cudaMemcpyHostToDevice));
            TRY_CUDA(cudaMemcpy(dw2 + u * b2, j->w2 + e * b2, b2, cudaMemcpyHostToDevice));
            TRY_CUDA(cudaMemcpy(ds2 + u * q2, j->s2 + e * q2, q2, cudaMemcpyHostToDevice));
            for (int64_t p = first[e]; p < first[e + 1]; p += BM)
                tiles[ntiles++] = tile{(int32_t)e, (int32_t)u, (int32_t)p, (int32_t)(first[e + 1] - p < BM ? first[e + 1] : p + BM)};
        }
        TRY_CUDA(cudaMemcpy(d_tiles, tiles, sizeof *tiles * (size_t)ntiles, cudaMemcpyHostToDevice));
        /* the group's experts are consecutive in sorted order: positions [p0, p1) */
        const int64_t p0 = first[used[u0]], p1 = first[used[u0 + nu - 1] + 1];
        for (int s = 0; s < j->sets; s++) {
            dots_kernel<true><<<dim3((unsigned)ntiles, (unsigned)((R + BN - 1) / BN)), THREADS>>>(
                d_tiles, d_order, d_x + s * j->rows * H, nullptr, K, dw13, ds13, d_g, j->multiply, R, H, d_tab, d_tab + 16, d_h);
            TRY_CUDA(cudaGetLastError());
            act_kernel<<<(unsigned)((p1 - p0) * I / 256 < 65536 ? ((p1 - p0) * I + 255) / 256 : 65536), 256>>>(
                d_h, p0, p1, I, j->gated, d_act);
            TRY_CUDA(cudaGetLastError());
            dots_kernel<false><<<dim3((unsigned)ntiles, (unsigned)((H + BN - 1) / BN)), THREADS>>>(
                d_tiles, d_order, nullptr, d_act, K, dw2, ds2, d_g + E, j->multiply, H, I, d_tab, d_tab + 16,
                d_y + s * pairs * H);
            TRY_CUDA(cudaGetLastError());
        }
        TRY_CUDA(cudaDeviceSynchronize()); /* before the next group's copies overwrite these weights */
    }
    for (int s = 0; s < j->sets; s++) {
        combine_kernel<<<(unsigned)(j->rows * H / 256 < 65536 ? (j->rows * H + 255) / 256 : 65536), 256>>>(
            d_y + s * pairs * H, d_w, j->rows, H, K, d_out);
        TRY_CUDA(cudaGetLastError());
        TRY_CUDA(cudaMemcpy(j->out[s], d_out, sizeof *d_out * (size_t)(j->rows * H), cudaMemcpyDeviceToHost));
    }
    rc = KP_MOE_REF_CUDA_OK;
done:
    cudaFree(d_x), cudaFree(d_w), cudaFree(d_g), cudaFree(d_order), cudaFree(d_tiles), cudaFree(d_tab), cudaFree(d_h);
    cudaFree(d_act), cudaFree(d_y), cudaFree(d_out), cudaFree(d_wt);
    free(first), free(order), free(at), free(tiles), free(used);
    return rc;
}
