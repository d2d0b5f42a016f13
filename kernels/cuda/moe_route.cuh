/* moe_route.cuh: steps 1-3 of moe_cuda.cuh: each pair's slot (token or atomic order), the experts' prefixes,
 * m tiles and marlin's blocks, the pairs in position order; x rounded to bf16 in moe_gemm.cuh's K order. */
#ifndef KP_MOE_ROUTE_CUH
#define KP_MOE_ROUTE_CUH

#include "moe_common.cuh"

/* ---- the block scan moe_scan_kernel uses ---- */

/* Inclusive scan of N ints across a warp, in place. */
template <int N>
__device__ __forceinline__ void warp_inclusive_scan(int (&x)[N]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1)
#pragma unroll
        for (int k = 0; k < N; k++) {
            const int t = __shfl_up_sync(0xffffffffu, x[k], off);
            if (lane >= off) x[k] += t;
        }
}

/* Exclusive scan of N ints over a block of MOE_SCAN_THREADS; total receives the block's sums. */
template <int N>
__device__ void block_exclusive_scan(int (&v)[N], int (&total)[N], int (*warp_sums)[N]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inc[N];
#pragma unroll
    for (int k = 0; k < N; k++) inc[k] = v[k];
    warp_inclusive_scan<N>(inc);
    if (lane == 31)
#pragma unroll
        for (int k = 0; k < N; k++) warp_sums[warp][k] = inc[k];
    __syncthreads();
    if (warp == 0) { /* the warps' sums, scanned by warp 0 */
        int s[N];
#pragma unroll
        for (int k = 0; k < N; k++) s[k] = warp_sums[lane][k];
        warp_inclusive_scan<N>(s);
#pragma unroll
        for (int k = 0; k < N; k++) warp_sums[lane][k] = s[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; k++) {
        const int before = warp ? warp_sums[warp - 1][k] : 0;
        total[k] = warp_sums[31][k];
        v[k] = before + inc[k] - v[k];
    }
    __syncthreads(); /* warp_sums is reused by the next call */
}

/* ---- 1. routing and x to bf16 ---- */

static __global__ void __launch_bounds__(MOE_CHUNK) moe_route_kernel(moe_run r) {
    __shared__ int32_t sid[MOE_CHUNK];
    pdl_wait();
    const int tid = threadIdx.x;
    if ((int64_t)blockIdx.x >= r.chunks) { /* x [rows, hidden] f32 -> xb [rows, kp1] bf16, a 32-element span a thread */
        const int64_t spans_per_row = r.kp1 / 32, spans = r.rows * spans_per_row;
        const int64_t stride = (int64_t)(gridDim.x - r.chunks) * MOE_CHUNK;
        for (int64_t q = (int64_t)(blockIdx.x - r.chunks) * MOE_CHUNK + tid; q < spans; q += stride) {
            const int64_t row = q / spans_per_row, k0 = (q % spans_per_row) * 32;
            const float *src = r.x + row * r.hidden + k0;
            float v[32];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const float4 f = k0 + 4 * u < r.hidden ? reinterpret_cast<const float4 *>(src)[u] : make_float4(0, 0, 0, 0);
                v[4 * u] = f.x, v[4 * u + 1] = f.y, v[4 * u + 2] = f.z, v[4 * u + 3] = f.w;
            }
            uint4 *dst = reinterpret_cast<uint4 *>(r.xb + row * r.kp1 + k0);
#pragma unroll
            for (int seg = 0; seg < 4; seg++) { /* word l4 of segment seg: elements 8 l4 + seg and 8 l4 + seg + 4 */
                uint32_t w[4];
#pragma unroll
                for (int l4 = 0; l4 < 4; l4++) w[l4] = bf16_bits(v[8 * l4 + seg]) | (uint32_t)bf16_bits(v[8 * l4 + seg + 4]) << 16;
                dst[seg] = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
        return;
    }
    const int64_t i = (int64_t)blockIdx.x * MOE_CHUNK + tid;
    int32_t id = -1;
    if (i < r.pairs) {
        id = r.ids[i];
        if (id < 0 || id >= r.experts) id = -1;
    }
    if (r.atomic) { /* the counters were zeroed by a memset */
        if (i < r.pairs) r.slots[i] = id < 0 ? -1 : atomicAdd(&r.hist[id], 1);
        return;
    }
    int32_t *h = r.hist + (int64_t)blockIdx.x * r.experts;
    for (int64_t e = tid; e < r.experts; e += MOE_CHUNK) h[e] = 0;
    sid[tid] = id;
    __syncthreads();
    if (i >= r.pairs) return;
    if (id < 0) {
        r.slots[i] = -1;
        return;
    }
    const int n = (int)min((int64_t)MOE_CHUNK, r.pairs - (int64_t)blockIdx.x * MOE_CHUNK);
    int rank = 0, later = 0;
    for (int q = 0; q < n; q++) {
        const int same = sid[q] == id;
        rank += same & (q < tid);
        later |= same & (q > tid);
    }
    r.slots[i] = rank; /* within the chunk; moe_place_kernel adds the chunk's prefix */
    if (!later) h[id] = rank + 1;
}

/* ---- 2. prefixes, tiles, blocks ---- */

static __global__ void __launch_bounds__(MOE_SCAN_THREADS) moe_scan_kernel(moe_run r) {
    __shared__ int warp_sums[32][3];
    pdl_wait();
    const int64_t E = r.experts, chunks = r.atomic ? 1 : r.chunks;
    int64_t carry[3] = {0, 0, 0};
    for (int64_t base = 0; base < E; base += MOE_SCAN_THREADS) {
        const int64_t e = base + threadIdx.x;
        int count = 0;
        if (e < E) { /* each chunk's exclusive prefix for expert e, in place; loads batched */
            int run = 0;
            for (int64_t c0 = 0; c0 < chunks; c0 += 16) {
                int v[16];
#pragma unroll
                for (int u = 0; u < 16; u++) v[u] = c0 + u < chunks ? r.hist[(c0 + u) * E + e] : 0;
#pragma unroll
                for (int u = 0; u < 16; u++)
                    if (c0 + u < chunks) r.hist[(c0 + u) * E + e] = run, run += v[u];
            }
            count = run;
        }
        int v[3] = {count, (count + MOE_TM - 1) / MOE_TM, (count + r.bsm - 1) / r.bsm}, total[3];
        block_exclusive_scan<3>(v, total, warp_sums);
        if (e < E) {
            r.first[e] = (int32_t)(carry[0] + v[0]);
            r.block0[e] = (int32_t)(carry[2] + v[2]);
            const int64_t t0 = carry[1] + v[1];
            const int pos = (int)(carry[0] + v[0]);
            for (int t = 0; t * MOE_TM < count; t++) r.tiles[t0 + t] = make_int4((int)e, t * MOE_TM, pos + t * MOE_TM, count);
        }
        for (int k = 0; k < 3; k++) carry[k] += total[k];
    }
    if (threadIdx.x == 0) {
        r.first[E] = (int32_t)carry[0];
        r.info[MOE_INFO_TILES] = carry[1];
        r.info[MOE_INFO_BLOCKS] = carry[2];
        r.info[MOE_INFO_ITERS1] = kp_marlin_iters(r.m_ktiles1, r.m_ntiles1, carry[2], r.grid);
        r.info[MOE_INFO_ITERS2] = kp_marlin_iters(r.m_ktiles2, r.m_ntiles2, carry[2], r.grid);
    }
}

/* ---- 3. slots and the order ---- */

static __global__ void __launch_bounds__(MOE_CHUNK) moe_place_kernel(moe_run r) {
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * MOE_CHUNK + threadIdx.x;
    if (i >= r.pairs) return;
    int32_t s = r.slots[i];
    if (s < 0) return;
    const int32_t e = r.ids[i];
    s += r.hist[(r.atomic ? 0 : i / MOE_CHUNK) * r.experts + e];
    r.slots[i] = s;
    r.order[r.first[e] + s] = (int32_t)i;
}

#endif
