/* moe_cuda.cuh: the NVFP4 MoE steps shared by moe.invariant@cuda (moe_invariant.cu) and
 * moe.marlin_like@cuda / moe.marlin_gemv32@cuda (moe_marlin.cu): routing, the tensor-core GEMM core,
 * gemv32's f32 path, the combine and one launcher templated on the algorithm. kernels/moe_plan.h states
 * the numerics; families.md §A and §B the model. Everything runs on args->stream, no host sync.
 *
 * Launches (each after the first with programmatic dependent launch on sm_90, kp_cuda.cuh):
 *   1. moe_route_kernel: blocks [0, chunks) route MOE_CHUNK pairs each, the others round x to bf16.
 *      Token order (invariant; marlin below 1024 pairs with <= 64 experts): a block counts its chunk's
 *      pairs per expert and ranks each pair among its chunk's earlier pairs of the same expert, in
 *      pair order (no atomics on positions). Atomic order (marlin otherwise): after a memset, one
 *      atomicAdd per pair on its expert's counter over ceil(pairs / 256) blocks: the arrival order.
 *   2. moe_scan_kernel (one block): each chunk's prefix per expert, the experts' first positions,
 *      m tiles of MOE_TM rows (expert-major), marlin's blocks (block0) and stream-K iters.
 *   3. moe_place_kernel: slot = chunk prefix + rank; order[first[e] + slot] = pair.
 *   4. moe_gemm_kernel<1>: h = W13 x per m tile, the activation fused, into act (bf16) by position.
 *      (gemv32: moe_f32_kernel<1> for the experts of <= 32 rows, into actf.)
 *   5. moe_gemm_kernel<2>: y = W2 act, times alpha2 (and the routing weight, marlin), into y by pair.
 *      (gemv32: moe_f32_kernel<2>.)
 *   6. moe_combine_kernel: out[t] from its topk y rows in slot order j, written once.
 *
 * The GEMM core. A CTA (MOE_WARPS = 4 warps) computes a tile of MOE_TM = 64 rows (positions of one
 * expert) by MOE_TN = 128 weight rows, over K in stages of MOE_TK = 64 through a MOE_STAGES = 4 deep
 * cp.async ring. Each warp owns 32 weight rows for all 64 rows, so the NVFP4 codes are decoded once per
 * CTA, in registers, straight into mma.sync m16n8k16 B fragments (bf16, f32 accumulate); gated GEMM1
 * gives a warp 16 gate rows and the same 16 up rows, so silu(gate) * up needs no exchange. m16 tiles
 * that hold no row of the expert are neither loaded nor multiplied (warp-uniform); the rest of a tile's
 * rows are zero. Why these numbers: 64 rows puts Qwen3's 144 rows per expert at M = 2304 in 3 tiles;
 * a warp's decode (about 2.5 instructions a weight) is shared by its 4 m16 tiles; the kernel is bound
 * by latency, and 168 registers without spills at 3 CTAs (12 warps) an SM beat 128 registers with
 * spills at 4 CTAs, and 8-warp CTAs of 256 weight rows (less L2 traffic for the activations, fewer
 * CTAs at small M). Each CTA reads its tile's description (int4) beside the tile count, so its first
 * copies wait on one dependent load (GEMM1: two, for the tokens).
 *
 * Shared memory per stage: A [64 rows][128 bytes] with 16-byte units XOR-swizzled by row % 8 and read
 * with ldmatrix.x4 (conflict-free); codes [128 rows][32 bytes], the two 16-byte span halves swapped
 * where row bit 2 is set, also read with ldmatrix.x4 (lane 8 j + i gives row i of n8 tile j); scales
 * [128 rows][4 bytes]. K a multiple of 64 takes copies with fixed destinations and sources advanced a
 * stage at a time; other multiples of 16 take a general loader (code rows 8-byte aligned when K % 32,
 * scales by plain loads; zero fill past K). Activation rows are padded with zeros to a multiple of 64.
 *
 * Decoding (exact): an E2M1 nibble masked into bf16 bits is value * 2^-126 (Marlin's trick, §A); an
 * E4M3 scale masked into bf16 is sf * 2^-120, then times 2^119 twice (exact) sf * 2^118; their bf16
 * product (exact: at most 6 significant bits) is the weight * 2^-8, and the f32 sums are multiplied
 * by 256 (exact) before anything else touches them.
 *
 * K order. A thread holds codes k = 8 l4 .. 8 l4 + 7 of a 32-k span as one 32-bit word and decodes
 * them as the pairs (k, k + 4) with shifts and masks; activations are stored so that 16-byte segment q
 * of a span holds, for l4 = 0..3, the pair (8 l4 + q, 8 l4 + q + 4) (moe_span_pos), which ldmatrix
 * hands to the same lanes. A span is two mma k steps: k = 0, 1, 4, 5 (mod 8) then 2, 3, 6, 7; spans
 * ascend. That order depends on nothing but K, and mma rows are independent, so an output's sum does
 * not depend on its row's tile, neighbours or batch: invariant is batch-invariant with one tile for
 * every M. marlin replays its cuts at the stage boundaries that start one of its k tiles (64 or 128).
 *
 * Workspace (moe_workspace_layout; 256-byte aligned pieces):
 *   hist [chunks, experts] i32, first [experts + 1] i32, block0 [experts] i32, tiles [tile_cap] int4
 *   (expert, m0, first position, expert's rows; tile_cap = ceil(pairs / 64) + min(experts, pairs)
 *   bounds the m tiles),
 *   info [4] i64 (tiles, blocks, iters1, iters2), order [pairs] i32 (pair by position), xb [rows,
 *   kp1] bf16 (hidden rounded up to 64, span-ordered), act [pairs, kp2] bf16 (by position, inter
 *   rounded up, span-ordered), y [pairs, hidden] f32 (by pair) and, gemv32, actf [pairs, inter] f32 (by
 *   position).
 * A pair whose expert id lies outside [0, experts) is not routed: slot -1, no contribution (the host
 * port refuses such ids; a GPU impl cannot read them without a sync). */
#ifndef KP_MOE_CUDA_CUH
#define KP_MOE_CUDA_CUH

#include <cuda_bf16.h>

#include <limits.h>
#include <math.h>
#include <mutex>

#include "../moe_plan.h"
#include "kp_cuda.cuh"

enum { MOE_INVARIANT = 0, MOE_MARLIN = 1, MOE_MARLIN_GEMV = 2 };

#define MOE_TM 64          /* rows (expert positions) per CTA tile */
#define MOE_TK 64          /* k per pipeline stage */
#ifndef MOE_STAGES /* these three may be overridden to build tiling variants for timing */
#define MOE_STAGES 4
#endif
#ifndef MOE_CTAS_PER_SM
#define MOE_CTAS_PER_SM 3 /* invariant (168 registers); marlin's cut state takes 255, 2 CTAs */
#endif
#ifndef MOE_WARPS
#define MOE_WARPS 4        /* each owns 32 weight rows of the tile, for all its rows */
#endif
#define MOE_THREADS (32 * MOE_WARPS)
#define MOE_TN (32 * MOE_WARPS) /* weight rows per CTA tile */
#define MOE_A_ROWS_PER_PASS (MOE_THREADS / 8) /* A rows one cp.async pass covers (8 threads a row) */
#define MOE_A_PASSES (MOE_TM / MOE_A_ROWS_PER_PASS)
#define MOE_A_BYTES (MOE_TM * MOE_TK * 2)  /* bf16, rows of 128 bytes, 16-byte units XOR row % 8 */
#define MOE_B_BYTES (MOE_TN * MOE_TK / 2)  /* codes, rows of 32 bytes, 16-byte halves swizzled by row bit 2 */
#define MOE_S_BYTES (MOE_TN * MOE_TK / 16) /* E4M3 scales, 4 a row */
#define MOE_STAGE_BYTES (MOE_A_BYTES + MOE_B_BYTES + MOE_S_BYTES)
#define MOE_SMEM_BYTES (MOE_STAGES * MOE_STAGE_BYTES)
#define MOE_CHUNK 256      /* pairs per routing block */
#define MOE_SCAN_THREADS 1024
#define MOE_F32_THREADS 256 /* gemv32's f32 path: 8 warps x 8 weight rows, a lane per row */
#define MOE_F32_KC 128      /* its k per step */
#define MOE_F32_SMEM ((64 * MOE_F32_KC + KP_MOE_GEMV_ROWS * (MOE_F32_KC + 1)) * 4)
#define MOE_MAX_PAIRS (1ll << 28)

enum { MOE_INFO_TILES = 0, MOE_INFO_BLOCKS = 1, MOE_INFO_ITERS1 = 2, MOE_INFO_ITERS2 = 3 };

/* One call as the kernels read it: the args, the plan, the workspace's pieces. */
struct moe_run {
    const float *x;        /* [rows, hidden] */
    const int32_t *ids;    /* [rows, topk] */
    const float *weights;  /* [rows, topk] */
    const uint8_t *w13, *s13, *w2, *s2;
    const float *g13, *g2; /* [experts] */
    float *out;            /* [rows, hidden] */
    int32_t *slots;        /* [rows, topk] */
    int64_t rows, hidden, inter, experts, w13_rows, pairs;
    int64_t kp1, kp2;      /* xb's and act's row strides: hidden and inter rounded up to MOE_TK (zeros past) */
    int32_t topk, gated, scale_dir;
    int32_t atomic;        /* slot order from atomic arrival */
    int64_t chunks;        /* routing blocks; hist has `chunks` rows (1 when atomic) */
    int64_t tile_cap;
    int32_t n_tiles1, n_tiles2, f32_tiles1, f32_tiles2; /* CTA column tiles of each GEMM */
    int32_t bsm;           /* marlin's block_size_m */
    int64_t mtile_n, mtile_k, m_ntiles1, m_ktiles1, m_ntiles2, m_ktiles2, grid;
    int32_t *hist, *first, *block0, *order;
    int4 *tiles;           /* m tile: expert, m0, position of its row 0, the expert's rows */
    int64_t *info;
    uint16_t *xb, *act;
    float *actf, *y;
};

/* ---- small device helpers ---- */

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* d += a b, m16n8k16, bf16 in, f32 accumulate. */
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* a * b in bf16x2, exact where the product is (fma with -0: keeps a zero product's sign). */
__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}

/* The E2M1 nibbles at bits 12..15 and 28..31 of v as bf16x2 of value * 2^-126. */
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t v) { return (v & 0x80008000u) | ((v & 0x70007000u) >> 6); }

/* E4M3 bytes at bits 0..7 and 16..23 of x (the rest 0) as bf16x2 of sf * 2^118. E4M3's NaN pattern
 * S.1111.111 reads as 480 here (the generator never emits it; the host port gives NaN). */
__device__ __forceinline__ uint32_t e4m3_pair(uint32_t x) {
    const uint32_t tiny = ((x << 4) & 0x07f007f0u) | ((x << 8) & 0x80008000u); /* sf * 2^-120 */
    const uint32_t two119 = 0x7b007b00u;
    return bmul2(bmul2(tiny, two119), two119);
}

/* Where element i of a row sits in the stored activations (K order above): in its 32-element span,
 * 16-byte segment i % 4, 32-bit word (i / 8) % 4, half (i / 4) % 2. */
__host__ __device__ __forceinline__ int64_t moe_span_pos(int64_t i) {
    return (i & ~(int64_t)31) | ((i & 3) << 3) | (((i >> 3) & 3) << 1) | ((i >> 2) & 1);
}

/* Four 8x8 b16 matrices from shared memory; lane l gives row l % 8 of matrix l / 8. */
__device__ __forceinline__ void ldsm4(uint32_t addr, uint32_t &d0, uint32_t &d1, uint32_t &d2, uint32_t &d3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
                 : "r"(addr));
}

__device__ __forceinline__ uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float bf16r(float v) { return kp_bf16_round(v); }
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

/* Exclusive scan of N ints over a block of MOE_SCAN_THREADS; total receives the block's sums. */
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

/* ---- 4, 5. the tensor-core GEMMs ---- */

/* GEMM 1: act[pos] = activation(alpha13 W13 x) (gated: gate and up rows of the same CTA);
 * GEMM 2: y[pair] = alpha2 W2 act[pos] (marlin: with the routing weight). ALGO selects the epilogue:
 * marlin (and gemv32's tensor path, for experts of more than 32 rows) cuts each sum at marlin's
 * stream-K points and rounds to bf16 as moe_plan.h says. */
template <int GEMM, int ALGO>
static __global__ void __launch_bounds__(MOE_THREADS, ALGO == MOE_INVARIANT ? MOE_CTAS_PER_SM : 8 / MOE_WARPS) moe_gemm_kernel(moe_run r) {
    constexpr bool CUTS = ALGO != MOE_INVARIANT;
    extern __shared__ __align__(16) unsigned char moe_smem[];
    pdl_wait();
    const int n_tiles = GEMM == 1 ? r.n_tiles1 : r.n_tiles2;
    const int64_t tile = blockIdx.x / (unsigned)n_tiles;
    const int nt = (int)(blockIdx.x % (unsigned)n_tiles);
    const int4 d = r.tiles[tile]; /* read beside the count (no dependent load): past it, unused */
    if (tile >= r.info[MOE_INFO_TILES]) return;
    const int e = d.x, m0 = d.y, pos0 = d.z, count = d.w;
    if (ALGO == MOE_MARLIN_GEMV && count <= KP_MOE_GEMV_ROWS) return; /* moe_f32_kernel's */
    const int mvalid = min(MOE_TM, count - m0), mact = (mvalid + 15) >> 4;
    const bool gated1 = GEMM == 1 && r.gated;
    const int64_t K = GEMM == 1 ? r.hidden : r.inter, N = GEMM == 1 ? r.w13_rows : r.hidden;
    const int64_t n_cols = GEMM == 1 ? r.inter : r.hidden; /* output columns (gate/up pairs when gated) */
    const int n0 = nt * (gated1 ? MOE_TN / 2 : MOE_TN);
    const uint8_t *codes = (GEMM == 1 ? r.w13 : r.w2) + (int64_t)e * N * (K / 2);
    const uint8_t *scales = (GEMM == 1 ? r.s13 : r.s2) + (int64_t)e * N * (K / 16);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, l4 = lane & 3;

    /* loads: A rows (tid >> 3) + 16 u, 16-byte column tid & 7; weight row tid */
    const uint16_t *arow[MOE_A_PASSES];
#pragma unroll
    for (int u = 0; u < MOE_A_PASSES; u++) {
        const int ra = (tid >> 3) + MOE_A_ROWS_PER_PASS * u;
        arow[u] = r.xb;
        if (ra < mvalid)
            arow[u] = GEMM == 1 ? r.xb + (int64_t)(r.order[pos0 + ra] / r.topk) * r.kp1
                                : r.act + (int64_t)(pos0 + ra) * r.kp2;
    }
    int64_t brow;
    bool bvalid;
    if (gated1) {
        const int64_t c = n0 + tid % (MOE_TN / 2);
        bvalid = c < r.inter;
        brow = (tid < MOE_TN / 2 ? 0 : r.inter) + c;
    } else {
        brow = n0 + tid;
        bvalid = brow < n_cols;
    }
    const uint8_t *crow = codes + (bvalid ? brow : 0) * (K / 2), *srow = scales + (bvalid ? brow : 0) * (K / 16);
    const bool k32 = K % 32 == 0, k64 = K % 64 == 0;
    const int ktiles = (int)((K + MOE_TK - 1) / MOE_TK);
    const int ac = tid & 7; /* this thread's 16-byte column of A */

    /* The hot path (K a multiple of 64: every stage full, rows 16-byte aligned): destinations fixed
     * within a stage, sources advanced a stage at a time (not at all for rows past the tile's end,
     * whose copies are zero-fill). */
    uint32_t a_dst[MOE_A_PASSES];
    const unsigned char *a_src[MOE_A_PASSES];
    int a_step[MOE_A_PASSES], a_bytes[MOE_A_PASSES];
#pragma unroll
    for (int u = 0; u < MOE_A_PASSES; u++) {
        const int ra = (tid >> 3) + MOE_A_ROWS_PER_PASS * u;
        a_dst[u] = ra * 128 + ((ac ^ (ra & 7)) << 4); /* 16-byte units swizzled by row: ldmatrix without conflicts */
        const bool ok = ra < mvalid;
        a_src[u] = reinterpret_cast<const unsigned char *>(arow[u]) + (ok ? ac * 16 : 0);
        a_step[u] = ok ? MOE_TK * 2 : 0;
        a_bytes[u] = ok ? 16 : 0;
    }
    const uint32_t b_dst = MOE_A_BYTES + tid * 32, b_swz = ((tid >> 2) & 1) << 4;
    const unsigned char *b_src = crow, *s_src = srow;
    const int b_step = bvalid ? MOE_TK / 2 : 0, s_step = bvalid ? MOE_TK / 16 : 0, b_bytes = bvalid ? 16 : 0;
    const uint32_t s_dst = MOE_A_BYTES + MOE_B_BYTES + tid * 4;
    auto load_fast = [&](uint32_t stage) {
#pragma unroll
        for (int u = 0; u < MOE_A_PASSES; u++)
            if ((tid >> 3) + MOE_A_ROWS_PER_PASS * u < 16 * mact) {
                cp_async16(stage + a_dst[u], a_src[u], a_bytes[u]);
                a_src[u] += a_step[u];
            }
        cp_async16(stage + b_dst + b_swz, b_src, b_bytes);
        cp_async16(stage + b_dst + (b_swz ^ 16), b_src + 16, b_bytes);
        cp_async4(stage + s_dst, s_src, b_bytes >> 2);
        b_src += b_step, s_src += s_step;
    };
    /* Any K a multiple of 16: a stage may be partly past K, code rows only 8-byte aligned (K % 32),
     * scale rows not 4-byte aligned (K % 64, read with plain loads). */
    auto load_any = [&](unsigned char *sa, int kt) {
        unsigned char *sb = sa + MOE_A_BYTES, *ss = sb + MOE_B_BYTES;
        const int64_t kb = (int64_t)kt * MOE_TK;
#pragma unroll
        for (int u = 0; u < MOE_A_PASSES; u++)
            if ((tid >> 3) + MOE_A_ROWS_PER_PASS * u < 16 * mact) { /* activation rows are padded to a whole stage */
                cp_async16(smem_addr(sa + a_dst[u]), a_src[u], a_bytes[u]);
                a_src[u] += a_step[u];
            }
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const int64_t k0 = kb + 32 * s;
            const int bytes = bvalid ? (int)max((int64_t)0, min((int64_t)16, (K - k0) / 2)) : 0;
            unsigned char *dst = sb + tid * 32 + ((s ^ ((tid >> 2) & 1)) << 4);
            const uint8_t *src = crow + k0 / 2;
            if (k32) {
                cp_async16(smem_addr(dst), bytes ? src : crow, bytes);
            } else {
                cp_async8(smem_addr(dst), bytes ? src : crow, min(bytes, 8));
                cp_async8(smem_addr(dst + 8), bytes > 8 ? src + 8 : crow, max(bytes - 8, 0));
            }
        }
        const int groups = bvalid ? (int)max((int64_t)0, min((int64_t)4, (K - kb) / 16)) : 0;
        uint32_t w = 0;
        for (int q = 0; q < groups; q++) w |= (uint32_t)__ldg(srow + kb / 16 + q) << (8 * q);
        *reinterpret_cast<uint32_t *>(ss + tid * 4) = w;
    };

    /* this warp's weight rows for n8 tile j: gated, 16 gate rows then the same 16 up rows */
    int rb[4];
#pragma unroll
    for (int j = 0; j < 4; j++) rb[j] = gated1 ? (j < 2 ? 16 * warp + 8 * j : MOE_TN / 2 + 16 * warp + 8 * (j - 2)) : 32 * warp + 8 * j;
    const uint32_t ssel = 0x4240u + 0x101u * (uint32_t)(l4 >> 1); /* scale bytes of k groups l4/2 and 2 + l4/2 */
    uint32_t s_rd[4]; /* scale words' offsets within a stage */
#pragma unroll
    for (int j = 0; j < 4; j++) s_rd[j] = MOE_A_BYTES + MOE_B_BYTES + (rb[j] + g) * 4;
    /* ldmatrix lane addresses: A (m16 tile 0; + 2048 a tile) for span s, k step ks: rows 0-7, 8-15
     * of segments 2 ks, 2 ks + 1; codes for span s: rows rb[j] .. + 7 of matrix j = lane / 8 */
    const int lr8 = lane & 7, lm = lane >> 3;
    uint32_t a_rd[2][2], c_ld[2];
#pragma unroll
    for (int s = 0; s < 2; s++) {
#pragma unroll
        for (int ks = 0; ks < 2; ks++)
            a_rd[s][ks] = ((lm & 1) * 8 + lr8) * 128 + (((4 * s + 2 * ks + (lm >> 1)) ^ lr8) << 4);
        const int crow_l = (gated1 ? (lm < 2 ? 16 * warp + 8 * lm : MOE_TN / 2 + 16 * warp + 8 * (lm - 2)) : 32 * warp + 8 * lm) + lr8;
        c_ld[s] = MOE_A_BYTES + crow_l * 32 + ((s ^ ((crow_l >> 2) & 1)) << 4);
    }

    float acc[4][4][4];
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mi][j][c] = 0.0f;
    [[maybe_unused]] float tot[CUTS ? 4 : 1][4][4];
    [[maybe_unused]] int ncut[CUTS ? 4 : 1][2][2];
    [[maybe_unused]] int64_t iters = 1;
    [[maybe_unused]] int mtile_k = MOE_TK;
    if constexpr (CUTS) {
        iters = r.info[GEMM == 1 ? MOE_INFO_ITERS1 : MOE_INFO_ITERS2];
        mtile_k = (int)r.mtile_k;
        const int64_t mnt = GEMM == 1 ? r.m_ntiles1 : r.m_ntiles2, mkt = GEMM == 1 ? r.m_ktiles1 : r.m_ktiles2;
        int64_t ntm[2];
        ntm[0] = (gated1 ? n0 + 16 * warp : n0 + 32 * warp) / r.mtile_n;
        ntm[1] = gated1 ? (r.inter + n0 + 16 * warp) / r.mtile_n : ntm[0];
#pragma unroll
        for (int mi = 0; mi < 4; mi++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int64_t b = r.block0[e] + (m0 + 16 * mi + 8 * hh + g) / r.bsm;
#pragma unroll
                for (int q = 0; q < 2; q++) { /* first k tile past 0 where (b n_tiles + nt) k_tiles + kt = 0 mod iters */
                    const int64_t rem = ((b * mnt + ntm[q]) * mkt) % iters;
                    int64_t c = (iters - rem) % iters;
                    if (c == 0) c = iters;
                    ncut[mi][hh][q] = c >= mkt ? INT_MAX : (int)c;
                }
            }
#pragma unroll
        for (int mi = 0; mi < 4; mi++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) tot[mi][j][c] = 0.0f;
    }

    /* One stage: both spans' codes are requested first; within a span, k step outer, so the 16
     * products of a k step are independent and dependent mma sit 16 apart. */
    auto compute = [&](const unsigned char *sp, uint32_t su) { /* the stage as a pointer and a shared address */
        uint32_t v[2][4];
        ldsm4(su + c_ld[0], v[0][0], v[0][1], v[0][2], v[0][3]); /* word l4 of span s of row rb[j] + g */
        ldsm4(su + c_ld[1], v[1][0], v[1][1], v[1][2], v[1][3]);
        uint32_t sc[4][2];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t sw = *reinterpret_cast<const uint32_t *>(sp + s_rd[j]);
            const uint32_t s2 = e4m3_pair(__byte_perm(sw, 0, ssel));
            sc[j][0] = __byte_perm(s2, 0, 0x1010);
            sc[j][1] = __byte_perm(s2, 0, 0x3232);
        }
#pragma unroll
        for (int s = 0; s < 2; s++) {
            uint32_t b[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                b[j][0] = bmul2(e2m1_pair(v[s][j] << 12), sc[j][s]); /* codes 0, 4: k step 0, b0 */
                b[j][1] = bmul2(e2m1_pair(v[s][j] << 8), sc[j][s]);  /* 1, 5: k step 0, b1 */
                b[j][2] = bmul2(e2m1_pair(v[s][j] << 4), sc[j][s]);  /* 2, 6: k step 1, b0 */
                b[j][3] = bmul2(e2m1_pair(v[s][j]), sc[j][s]);       /* 3, 7: k step 1, b1 */
            }
#pragma unroll
            for (int ks = 0; ks < 2; ks++) {
                uint32_t a[4][4];
#pragma unroll
                for (int mi = 0; mi < 4; mi++)
                    if (mi < mact) ldsm4(su + a_rd[s][ks] + mi * 2048, a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
#pragma unroll
                for (int mi = 0; mi < 4; mi++)
                    if (mi < mact)
#pragma unroll
                        for (int j = 0; j < 4; j++)
                            mma_bf16(acc[mi][j], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b[j][2 * ks], b[j][2 * ks + 1]);
            }
        }
    };

    const bool fast = k64; /* K % 64 == 0: every stage full and aligned */
    const uint32_t smem0 = smem_addr(moe_smem);
#pragma unroll
    for (int s = 0; s < MOE_STAGES - 1; s++) {
        if (s < ktiles) {
            if (fast) load_fast(smem0 + s * MOE_STAGE_BYTES);
            else load_any(moe_smem + s * MOE_STAGE_BYTES, s);
        }
        cp_async_commit();
    }
    int rd = 0, wr = MOE_STAGES - 1; /* the stages read and written this k tile */
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<MOE_STAGES - 2>();
        __syncthreads();
        if (kt + MOE_STAGES - 1 < ktiles) {
            if (fast) load_fast(smem0 + wr * MOE_STAGE_BYTES);
            else load_any(moe_smem + wr * MOE_STAGE_BYTES, kt + MOE_STAGES - 1);
        }
        cp_async_commit();
        if constexpr (CUTS) {
            if (kt > 0 && (kt * MOE_TK) % mtile_k == 0) { /* marlin k tile mk starts: where cut, the partial joins the
                                                                  bf16 running total (bf16 rounding commutes with the 2^-8 scale) */
                const int mk = kt * MOE_TK / mtile_k;
#pragma unroll
                for (int mi = 0; mi < 4; mi++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++)
#pragma unroll
                        for (int q = 0; q < 2; q++)
                            if (ncut[mi][hh][q] == mk) {
#pragma unroll
                                for (int j = 2 * q; j < 2 * q + 2; j++)
#pragma unroll
                                    for (int c = 2 * hh; c < 2 * hh + 2; c++)
                                        tot[mi][j][c] = bf16r(tot[mi][j][c] + acc[mi][j][c]), acc[mi][j][c] = 0.0f;
                                const int64_t next = (int64_t)mk + iters;
                                ncut[mi][hh][q] = next > INT_MAX ? INT_MAX : (int)next;
                            }
            }
        }
        compute(moe_smem + rd * MOE_STAGE_BYTES, smem0 + rd * MOE_STAGE_BYTES);
        rd = rd == MOE_STAGES - 1 ? 0 : rd + 1;
        wr = wr == MOE_STAGES - 1 ? 0 : wr + 1;
    }
    cp_async_wait<0>();

    /* the sum of element (mi, j, c): the last partial joins the running total, then x 256 (the decode's 2^-8) */
    auto sum_of = [&](int mi, int j, int c) {
        float v = acc[mi][j][c];
        if constexpr (CUTS) v = tot[mi][j][c] + v;
        return v * 256.0f;
    };
    if constexpr (GEMM == 1) {
        const float alpha = kp_moe_alpha(r.g13[e], r.scale_dir), alpha_b = bf16r(alpha);
        auto h_of = [&](float sum) { return CUTS ? bf16r(bf16r(sum) * alpha_b) : sum * alpha; };
#pragma unroll
        for (int mi = 0; mi < 4; mi++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int row = 16 * mi + 8 * hh + g;
                if (mi >= mact || row >= mvalid) continue;
                uint16_t *dst = r.act + (int64_t)(pos0 + row) * r.kp2;
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        if (gated1 && j >= 2) continue;
                        const int64_t n = gated1 ? n0 + 16 * warp + 8 * j + 2 * l4 + c : n0 + 32 * warp + 8 * j + 2 * l4 + c;
                        if (n >= r.kp2) continue;
                        float v = 0.0f; /* columns past inter: the zero padding GEMM 2 reads */
                        if (n < r.inter && gated1) {
                            const float hg = h_of(sum_of(mi, j, 2 * hh + c)), hu = h_of(sum_of(mi, (j + 2) & 3, 2 * hh + c));
                            v = __fmul_rn(silu(hg), hu);
                        } else if (n < r.inter) {
                            const float hu = h_of(sum_of(mi, j, 2 * hh + c));
                            v = hu > 0.0f ? __fmul_rn(hu, hu) : 0.0f;
                        }
                        dst[moe_span_pos(n)] = bf16_bits(v);
                    }
            }
    } else {
        const float alpha = kp_moe_alpha(r.g2[e], r.scale_dir), alpha_b = bf16r(alpha);
#pragma unroll
        for (int mi = 0; mi < 4; mi++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int row = 16 * mi + 8 * hh + g;
                if (mi >= mact || row >= mvalid) continue;
                const int32_t pair = r.order[pos0 + row];
                const float scale = CUTS ? bf16r(alpha_b * bf16r(r.weights[pair])) : alpha;
                float *dst = r.y + (int64_t)pair * r.hidden;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int64_t n = n0 + 32 * warp + 8 * j + 2 * l4;
                    if (n >= r.hidden) continue;
                    float2 v;
                    v.x = sum_of(mi, j, 2 * hh);
                    v.y = sum_of(mi, j, 2 * hh + 1);
                    if (CUTS) v.x = bf16r(bf16r(v.x) * scale), v.y = bf16r(bf16r(v.y) * scale);
                    else v.x = v.x * scale, v.y = v.y * scale;
                    *reinterpret_cast<float2 *>(dst + n) = v;
                }
            }
    }
}

/* ---- gemv32's f32 path (experts of at most 32 rows) ---- */

/* GEMM 1: actf[pos] = activation(alpha13 (W13 x)) with x unrounded; GEMM 2: y[pair] = (W2 actf[pos]) *
 * (alpha2 * weight). Each sum one f32 chain in ascending k. A CTA: one expert (one m tile) by 64
 * weight rows (gated: 32 gate, the same 32 up); warp w owns 8 of them, lane l the expert's row l.
 * Codes, scales and activations for the next MOE_F32_KC of k are loaded into registers while the
 * current ones are multiplied. */
template <int GEMM>
static __global__ void __launch_bounds__(MOE_F32_THREADS) moe_f32_kernel(moe_run r) {
    extern __shared__ __align__(16) unsigned char moe_smem[];
    float *ws = reinterpret_cast<float *>(moe_smem);  /* [64][KC] dequantized weights */
    float *xs = ws + 64 * MOE_F32_KC;                 /* [32][KC + 1] activations */
    pdl_wait();
    const int n_tiles = GEMM == 1 ? r.f32_tiles1 : r.f32_tiles2;
    const int64_t tile = blockIdx.x / (unsigned)n_tiles;
    const int nt = (int)(blockIdx.x % (unsigned)n_tiles);
    const int4 d = r.tiles[tile];
    if (tile >= r.info[MOE_INFO_TILES]) return;
    const int e = d.x, pos0 = d.z, count = d.w; /* m0 = 0: at most 32 rows */
    if (count > KP_MOE_GEMV_ROWS) return;
    const bool gated1 = GEMM == 1 && r.gated;
    const int64_t K = GEMM == 1 ? r.hidden : r.inter, N = GEMM == 1 ? r.w13_rows : r.hidden;
    const int64_t n_cols = GEMM == 1 ? r.inter : r.hidden;
    const int n0 = nt * (gated1 ? 32 : 64);
    const uint8_t *codes = (GEMM == 1 ? r.w13 : r.w2) + (int64_t)e * N * (K / 2);
    const uint8_t *scales = (GEMM == 1 ? r.s13 : r.s2) + (int64_t)e * N * (K / 16);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    /* loads: weight row tid >> 2, k quarter tid & 3 (32 codes); activation row tid >> 3, 16 of k */
    const int lr = tid >> 2, kq = tid & 3;
    int64_t brow;
    bool bvalid;
    if (gated1) {
        const int64_t c = n0 + (lr & 31);
        bvalid = c < r.inter;
        brow = (lr < 32 ? 0 : r.inter) + c;
    } else {
        brow = n0 + lr;
        bvalid = brow < n_cols;
    }
    const uint8_t *crow = codes + (bvalid ? brow : 0) * (K / 2), *srow = scales + (bvalid ? brow : 0) * (K / 16);
    const int xr = tid >> 3, xq = tid & 7;
    const float *xrow = NULL;
    if (xr < count) {
        const int32_t pair = r.order[pos0 + xr];
        xrow = GEMM == 1 ? r.x + (int64_t)(pair / r.topk) * r.hidden : r.actf + (int64_t)(pos0 + xr) * r.inter;
    }
    uint2 cw[2];
    uint8_t sb[2];
    float4 xv[4];
    auto fetch = [&](int64_t k0) {
#pragma unroll
        for (int h = 0; h < 2; h++) { /* 16 codes and their scale */
            const int64_t k = k0 + kq * 32 + h * 16;
            const bool ok = bvalid && k < K;
            cw[h] = ok ? __ldg(reinterpret_cast<const uint2 *>(crow + k / 2)) : make_uint2(0, 0);
            sb[h] = ok ? __ldg(srow + k / 16) : (uint8_t)0;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t k = k0 + xq * 16 + u * 4;
            xv[u] = xrow && k < K ? __ldg(reinterpret_cast<const float4 *>(xrow + k)) : make_float4(0, 0, 0, 0);
        }
    };
    float accv[8];
#pragma unroll
    for (int c = 0; c < 8; c++) accv[c] = 0.0f;
    int wr[8]; /* this warp's weight rows */
#pragma unroll
    for (int c = 0; c < 8; c++) wr[c] = gated1 ? (c < 4 ? 4 * warp + c : 32 + 4 * warp + c - 4) : 8 * warp + c;
    fetch(0);
    for (int64_t k0 = 0; k0 < K; k0 += MOE_F32_KC) {
        __syncthreads(); /* the last step's reads are done */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float sf = kp_e4m3_decode(sb[h]);
            float *dst = ws + lr * MOE_F32_KC + kq * 32 + h * 16;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const uint32_t byte = ((q < 4 ? cw[h].x : cw[h].y) >> (8 * (q & 3))) & 0xffu;
                dst[2 * q] = kp_moe_e2m1(byte & 15u) * sf;
                dst[2 * q + 1] = kp_moe_e2m1(byte >> 4) * sf;
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float *dst = xs + xr * (MOE_F32_KC + 1) + xq * 16 + u * 4;
            dst[0] = xv[u].x, dst[1] = xv[u].y, dst[2] = xv[u].z, dst[3] = xv[u].w;
        }
        __syncthreads();
        if (k0 + MOE_F32_KC < K) fetch(k0 + MOE_F32_KC);
        if (lane < count) {
            const float *xl = xs + lane * (MOE_F32_KC + 1);
            for (int k = 0; k < MOE_F32_KC; k++) {
                const float a = xl[k];
#pragma unroll
                for (int c = 0; c < 8; c++) accv[c] = __fadd_rn(accv[c], __fmul_rn(a, ws[wr[c] * MOE_F32_KC + k]));
            }
        }
    }
    if (lane >= count) return;
    const int32_t pos = pos0 + lane, pair = r.order[pos];
    if constexpr (GEMM == 1) {
        const float alpha = kp_moe_alpha(r.g13[e], r.scale_dir);
        float *dst = r.actf + (int64_t)pos * r.inter;
        if (gated1) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int64_t n = n0 + 4 * warp + c;
                if (n < r.inter) dst[n] = __fmul_rn(silu(accv[c] * alpha), accv[c + 4] * alpha);
            }
        } else {
#pragma unroll
            for (int c = 0; c < 8; c++) {
                const int64_t n = n0 + 8 * warp + c;
                const float hu = accv[c] * alpha;
                if (n < r.inter) dst[n] = hu > 0.0f ? __fmul_rn(hu, hu) : 0.0f;
            }
        }
    } else {
        const float scale = __fmul_rn(kp_moe_alpha(r.g2[e], r.scale_dir), r.weights[pair]);
#pragma unroll
        for (int c = 0; c < 8; c++) {
            const int64_t n = n0 + 8 * warp + c;
            if (n < r.hidden) r.y[(int64_t)pair * r.hidden + n] = __fmul_rn(accv[c], scale);
        }
    }
}

/* ---- 6. the combine ---- */

/* out[t] from its pairs' y in slot order j (unrouted pairs add nothing). invariant: sum of
 * weight * y in f32 from 0; marlin: y already carries the weight; for topk 2..4 bf16 steps (moe_sum),
 * else an f32 sum rounded once. */
template <int ALGO>
static __global__ void __launch_bounds__(256) moe_combine_kernel(moe_run r) {
    pdl_wait();
    const int64_t H4 = r.hidden / 4, K = r.topk;
    for (int64_t t = blockIdx.x; t < r.rows; t += gridDim.x)
        for (int64_t h = threadIdx.x; h < H4; h += blockDim.x) {
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int64_t j = 0; j < K; j++) {
                const int64_t i = t * K + j;
                float4 y4 = make_float4(0, 0, 0, 0);
                if (r.slots[i] >= 0) y4 = reinterpret_cast<const float4 *>(r.y + i * r.hidden)[h];
                const float y[4] = {y4.x, y4.y, y4.z, y4.w};
                if (ALGO == MOE_INVARIANT) {
                    const float w = r.weights[i];
#pragma unroll
                    for (int c = 0; c < 4; c++) s[c] = __fadd_rn(s[c], __fmul_rn(w, y[c]));
                } else if (K >= 2 && K <= 4) {
#pragma unroll
                    for (int c = 0; c < 4; c++) s[c] = j == 0 ? y[c] : bf16r(s[c] + y[c]);
                } else {
#pragma unroll
                    for (int c = 0; c < 4; c++) s[c] = s[c] + y[c];
                }
            }
            if (ALGO != MOE_INVARIANT && !(K >= 2 && K <= 4))
#pragma unroll
                for (int c = 0; c < 4; c++) s[c] = bf16r(s[c]);
            reinterpret_cast<float4 *>(r.out + t * r.hidden)[h] = make_float4(s[0], s[1], s[2], s[3]);
        }
}

/* ---- the launcher ---- */

static inline int64_t moe_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The plan of a call (no workspace yet). */
static inline moe_run moe_plan_of(const kp_moe_args *a, int algo) {
    moe_run r = {};
    r.x = a->x, r.ids = a->ids, r.weights = a->weights;
    r.w13 = a->w13, r.s13 = a->s13, r.w2 = a->w2, r.s2 = a->s2, r.g13 = a->g13, r.g2 = a->g2;
    r.out = a->out, r.slots = a->slots;
    r.rows = a->rows, r.hidden = a->hidden, r.inter = a->inter, r.experts = a->experts;
    r.w13_rows = kp_moe_w13_rows_of(a), r.pairs = a->rows * a->topk;
    r.kp1 = moe_ceil(a->hidden, MOE_TK) * MOE_TK, r.kp2 = moe_ceil(a->inter, MOE_TK) * MOE_TK;
    r.topk = a->topk, r.gated = a->gated, r.scale_dir = a->scale_dir;
    r.atomic = algo != MOE_INVARIANT && kp_marlin_atomic_order(a->rows, a->topk, a->experts);
    r.chunks = moe_ceil(r.pairs, MOE_CHUNK);
    r.tile_cap = moe_ceil(r.pairs, MOE_TM) + (a->experts < r.pairs ? a->experts : r.pairs);
    r.n_tiles1 = (int32_t)moe_ceil(a->inter, a->gated ? MOE_TN / 2 : MOE_TN);
    r.n_tiles2 = (int32_t)moe_ceil(a->hidden, MOE_TN);
    r.f32_tiles1 = (int32_t)moe_ceil(a->inter, a->gated ? 32 : 64);
    r.f32_tiles2 = (int32_t)moe_ceil(a->hidden, 64);
    r.bsm = kp_marlin_block_size_m(a->rows, a->topk, a->experts);
    kp_marlin_tile(r.bsm, &r.mtile_n, &r.mtile_k);
    r.m_ntiles1 = moe_ceil(r.w13_rows, r.mtile_n), r.m_ktiles1 = moe_ceil(a->hidden, r.mtile_k);
    r.m_ntiles2 = moe_ceil(a->hidden, r.mtile_n), r.m_ktiles2 = moe_ceil(a->inter, r.mtile_k);
    r.grid = a->sm_count > 0 ? a->sm_count : KP_MOE_HOST_SMS;
    return r;
}

/* The workspace's pieces at base (NULL: only the size); returns the bytes. */
static inline size_t moe_workspace_layout(moe_run *r, unsigned char *base, int algo) {
    size_t off = 0;
    auto take = [&](size_t bytes) {
        unsigned char *p = base ? base + off : NULL;
        off += (bytes + 255) & ~(size_t)255;
        return p;
    };
    const size_t P = (size_t)r->pairs, E = (size_t)r->experts;
    r->hist = (int32_t *)take(sizeof(int32_t) * (size_t)r->chunks * E);
    r->first = (int32_t *)take(sizeof(int32_t) * (E + 1));
    r->block0 = (int32_t *)take(sizeof(int32_t) * E);
    r->tiles = (int4 *)take(sizeof(int4) * (size_t)r->tile_cap);
    r->info = (int64_t *)take(sizeof(int64_t) * 4);
    r->order = (int32_t *)take(sizeof(int32_t) * P);
    r->xb = (uint16_t *)take(2 * (size_t)r->rows * (size_t)r->kp1);
    r->act = (uint16_t *)take(2 * P * (size_t)r->kp2);
    r->y = (float *)take(sizeof(float) * P * (size_t)r->hidden);
    r->actf = algo == MOE_MARLIN_GEMV ? (float *)take(sizeof(float) * P * (size_t)r->inter) : NULL;
    return off;
}

/* Why this impl refuses the args, NULL if it runs them: moe_plan.h's reasons, then sizes this tiling
 * indexes in 32 bits. */
static inline const char *moe_cuda_problem(const kp_moe_args *a) {
    const char *why = kp_moe_args_problem(a);
    if (why) return why;
    if (a->rows * a->topk > MOE_MAX_PAIRS) return "rows * topk above 2^28 (positions are int32)";
    const moe_run r = moe_plan_of(a, MOE_MARLIN_GEMV);
    const int64_t widest = r.n_tiles1 > r.f32_tiles1 ? r.n_tiles1 : r.f32_tiles1;
    const int64_t cols = widest > r.n_tiles2 ? widest : r.n_tiles2;
    if (r.tile_cap * cols >= INT32_MAX) return "m tiles x column tiles above 2^31 CTAs";
    /* vector loads and cp.async: what cudaMalloc gives; checked on the pointer values only */
    const uintptr_t wide = (uintptr_t)a->x | (uintptr_t)a->out | (uintptr_t)a->w13 | (uintptr_t)a->w2 |
                           (uintptr_t)a->workspace;
    if (wide & 15 || ((uintptr_t)a->s13 | (uintptr_t)a->s2) & 3)
        return "x, out, w13, w2 or the workspace not 16-byte aligned, or s13 or s2 not 4-byte aligned";
    return NULL;
}

static inline size_t moe_cuda_workspace_bytes(const void *args, int algo) {
    const kp_moe_args *a = static_cast<const kp_moe_args *>(args);
    if (moe_cuda_problem(a)) return 0;
    moe_run r = moe_plan_of(a, algo);
    return moe_workspace_layout(&r, NULL, algo);
}

static inline int moe_cuda_check(const char *name, const void *args, char *message, size_t message_len) {
    const char *why = moe_cuda_problem(static_cast<const kp_moe_args *>(args));
    if (!why) return KP_RUN_OK;
    return kp_cuda_fail_msg(message, message_len, KP_RUN_NOT_SUPPORTED, "%s: %s", name, why);
}

/* Per device, once: the GEMM kernels' shared memory limit, and whether the code is sm_90 (PDL). */
struct moe_device {
    bool ready, sm90;
};
#define MOE_MAX_DEVICES 64

template <int ALGO>
static int moe_device_ready(moe_device *d, char *message, size_t message_len) {
    if (d->ready) return KP_RUN_OK;
    cudaFuncAttributes fa;
    KP_CUDA_CHECK(cudaFuncGetAttributes(&fa, moe_gemm_kernel<1, ALGO>));
    d->sm90 = fa.binaryVersion >= 90;
    const cudaFuncAttribute smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
    KP_CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_kernel<1, ALGO>, smem, MOE_SMEM_BYTES));
    KP_CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_kernel<2, ALGO>, smem, MOE_SMEM_BYTES));
    if constexpr (ALGO == MOE_MARLIN_GEMV) {
        KP_CUDA_CHECK(cudaFuncSetAttribute(moe_f32_kernel<1>, smem, MOE_F32_SMEM));
        KP_CUDA_CHECK(cudaFuncSetAttribute(moe_f32_kernel<2>, smem, MOE_F32_SMEM));
    }
    d->ready = true;
    return KP_RUN_OK;
}

template <int ALGO>
static int moe_cuda_run(const char *name, const void *args, char *message, size_t message_len) {
    const int rc = moe_cuda_check(name, args, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    const kp_moe_args *a = static_cast<const kp_moe_args *>(args);
    moe_run r = moe_plan_of(a, ALGO);
    const size_t need = moe_workspace_layout(&r, NULL, ALGO);
    if (!a->workspace || a->workspace_bytes < need)
        return kp_cuda_fail_msg(message, message_len, KP_RUN_FAILED,
                                "%s: the workspace is missing or smaller than workspace_bytes() (%zu bytes)", name, need);
    moe_workspace_layout(&r, static_cast<unsigned char *>(a->workspace), ALGO);

    static std::mutex lock;
    static moe_device devices[MOE_MAX_DEVICES];
    int device = 0;
    KP_CUDA_CHECK(cudaGetDevice(&device));
    bool sm90;
    {
        std::lock_guard<std::mutex> hold(lock);
        moe_device scratch = {};
        moe_device *d = device < MOE_MAX_DEVICES ? &devices[device] : &scratch;
        const int ready = moe_device_ready<ALGO>(d, message, message_len);
        if (ready != KP_RUN_OK) return ready;
        sm90 = d->sm90;
    }
    cudaStream_t stream = static_cast<cudaStream_t>(a->stream);

    /* 1. routing (a memset first for the atomic counters) and x to bf16 */
    if (r.atomic) KP_CUDA_CHECK(cudaMemsetAsync(r.hist, 0, sizeof(int32_t) * (size_t)r.experts, stream));
    const int64_t spans = r.rows * (r.kp1 / 32), convert = moe_ceil(spans, 2 * MOE_CHUNK);
    const int64_t route_grid = r.chunks + (convert < 4096 ? convert : 4096);
    moe_route_kernel<<<(unsigned)route_grid, MOE_CHUNK, 0, stream>>>(r);
    KP_LAUNCH_CHECK("moe_route_kernel");
    KP_CUDA_CHECK(launch_after(sm90, moe_scan_kernel, 1, MOE_SCAN_THREADS, 0, stream, r));
    KP_CUDA_CHECK(launch_after(sm90, moe_place_kernel, (unsigned)r.chunks, MOE_CHUNK, 0, stream, r));
    /* 2. the GEMMs */
    KP_CUDA_CHECK(launch_after(sm90, moe_gemm_kernel<1, ALGO>, (unsigned)(r.tile_cap * r.n_tiles1), MOE_THREADS,
                               MOE_SMEM_BYTES, stream, r));
    if constexpr (ALGO == MOE_MARLIN_GEMV)
        KP_CUDA_CHECK(launch_after(sm90, moe_f32_kernel<1>, (unsigned)(r.tile_cap * r.f32_tiles1), MOE_F32_THREADS,
                                   MOE_F32_SMEM, stream, r));
    KP_CUDA_CHECK(launch_after(sm90, moe_gemm_kernel<2, ALGO>, (unsigned)(r.tile_cap * r.n_tiles2), MOE_THREADS,
                               MOE_SMEM_BYTES, stream, r));
    if constexpr (ALGO == MOE_MARLIN_GEMV)
        KP_CUDA_CHECK(launch_after(sm90, moe_f32_kernel<2>, (unsigned)(r.tile_cap * r.f32_tiles2), MOE_F32_THREADS,
                                   MOE_F32_SMEM, stream, r));
    /* 3. the combine */
    const unsigned rows_grid = (unsigned)(r.rows < 65535 * 16 ? r.rows : 65535 * 16);
    KP_CUDA_CHECK(launch_after(sm90, moe_combine_kernel<ALGO>, rows_grid, 256, 0, stream, r));
    return KP_RUN_OK;
}

#endif
