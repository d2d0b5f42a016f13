/* mla_cuda.cuh: the sparse MLA decode shared by mla.split_count@cuda (mla_split_count.cu) and
 * mla.split_size@cuda (mla_split_size.cu): the plan kernel, the per-split attention kernel on tensor cores
 * with its combine, and one launcher templated on the plan. The numerics are the host port's
 * (kernels/host/mla.c) and the plan is kernels/mla_plan.h; everything runs on args->stream, no host sync.
 *
 * Launches (the second with programmatic dependent launch on sm_90, kp_cuda.cuh):
 *   1. mla_plan_kernel (one CTA): request b's blocks = kp_mla_blocks(its longest row), then the plan
 *      (split_count: kp_mla_split_count_plan's greedy cut, on one thread in 32-bit registers with the
 *      blocks in shared memory; split_size: kp_mla_split_size_splits), the splits' prefix (items,
 *      request-major), splits[b], and the arrival counters zeroed.
 *   2. mla_attend_kernel: one CTA of 8 warps per (item = (request, split), query row, 64-head group);
 *      CTAs past the plan's item count exit at once (the grid covers the most items any plan can make:
 *      batch + parts for split_count, every split of a topk-long request for split_size). A request of
 *      one split writes out, lse and max_logits itself. Otherwise every split writes its lse, max logit
 *      and out (acc / l, f32) to the workspace and the last of them to arrive (an atomic counter, not on
 *      values) combines all of them in split order: which CTA combines varies, the arithmetic does not.
 *
 * A split, per 64-slot block (KP_MLA_BLOCK) of its range:
 *   - the block's indices are read two blocks ahead; slot j of row (b, i) counts when j < len and its
 *     index lies in [0, slots). A block with no counted slot is skipped whole.
 *   - fp8_ds_mla: one block ahead, a bulk copy (cp.async.bulk, completion counted by an mbarrier) brings each
 *     counted token's 656 raw bytes into a staging buffer, and the others' are stored as zeros (no read of the
 *     cache; 2,624 16-byte cp.async a block, with their address arithmetic, competed with the ldmatrix of
 *     Q K^T for the MIO queue: 271 -> 257 us at batch 64 on the H200). Each thread then turns one (token, tile) scale into bf16(scale) * 2^112
 *     (exact), and the block is dequantized into the K tile as bf16(e4m3 * bf16(scale)): an e4m3 pair becomes
 *     f16x2 (exact), its bits shifted into bf16 are the values * 2^-112 (exact: every e4m3 value is a normal
 *     f16), and one bf16x2 FMA with the multiplier and -0 gives the product rounded once to nearest even, the
 *     host port's value. A block where a multiplier would overflow (bf16(scale) >= 2^16) takes the exact f32
 *     path instead. bf16 caches are copied straight into the K tile (zeros for the tokens that do not count).
 *   - S = Q K^T on mma.sync m16n8k16 (bf16 in, f32 accumulate). Warp w = mh + 2 ns + 4 kh computes heads
 *     [32 mh, +32) x slots [32 ns, +32) over half the 576 dims (kh), the halves added through shared
 *     memory, so every score is computed once and each warp ends with its quarter q = 2 ns + kh of the
 *     slots: 16 slots for 32 heads.
 *   - softmax in the log2 domain as the host port: s = dot * (sm_scale * log2 e), the block max over the
 *     four quarters through shared memory, the running max starting at -1e30, rescale exp2f(m - mnew),
 *     p = exp2f(s - mnew) (0 for slots that do not count: their s is -inf), l += f32 p, P rounded to bf16
 *     for the PV mma. A row whose block holds no counted slot keeps m, l and acc (rescale 1, p 0), as the
 *     host skips it. Maxima propagate NaN as the host port's do.
 *   - O += P V: warp w owns dims [64 w, +64) of all 64 heads (128 f32 accumulators a thread), so P and V
 *     are each read from shared memory once per warp that needs them.
 *   Split lse = log2f(l) + m (-inf when no block counted), split out = acc / l (0 when none).
 * The combine, per (row, head), in split order, as the host port: gmax, lse_sum = sum exp2f(lse_s - gmax),
 * out = sum (exp2f(lse_s - gmax) / lse_sum) * out_s, lse2 = log2f(lse_sum) + gmax, the sink as
 * out *= 1 / (1 + exp2f(sink * log2 e - lse2)), out to bf16 (nearest even), lse = lse2 / log2 e; an empty
 * row gives out 0, lse +inf. max_logits = (max counted dot) * sm_scale (rounding is monotone, so this is the
 * max of the natural logits), -inf when nothing counts. Every f32 operation the host port rounds
 * separately is an explicit __f*_rn here, so nvcc does not contract it into an FMA.
 *
 * Shared memory (one CTA an SM, 223,520 bytes): Q [64 heads][576] bf16 and K [64 tokens][576] bf16 in rows of
 * 1168 bytes (16 bytes of padding put 8 consecutive rows in 8 different bank groups, so ldmatrix is
 * conflict-free and every address is a per-lane base plus a constant); the raw staging [64][656]; P [64][64]
 * bf16 in rows of 144 bytes; the S exchange [8 warps][16][32] f32; the scale multipliers [64][4]; per-row
 * statistics.
 *
 * Known differences from the host port, none of them in the plan: (1) dot products (QK and PV) and the sum
 * l are added in another order (tensor cores, per-thread partial sums), and exp2f / log2f are CUDA's (within
 * 2 ulp), so bits differ from the host port's by rounding; (2) the host port refuses an index outside
 * [-1, slots); these kernels cannot without a host sync, so such a slot does not count and is never read,
 * like -1; (3) an e4m3 NaN code (S.1111.111, which no quantizer emits: they saturate at 448) reads as a
 * finite value here, NaN in the host port; (4) the split_count plan's failure (the parts running out, which
 * its payload rules out) leaves every split count 0 and the outputs unwritten instead of an error.
 *
 * Workspace (mla_workspace_layout; 256-byte aligned pieces): plan_blocks, plan_splits [batch] i32 and first
 * [batch, max_splits] i32 (split_count), used when they do not fit in the plan kernel's shared memory,
 * item_base [batch + 1] i32, items [max_items] int4 (request, its split count, first block, end block),
 * counters [batch * s_q * groups] i32, split_lse and split_max [max_items, s_q, h_q] f32, split_out
 * [max_items, s_q, h_q, 512] f32.
 *
 * One file past the usual size on purpose: the plan, the kernel and the launcher share mla_run and the
 * shared-memory map above, and the two impls (.cu) are only names around mla_cuda_run. */
#ifndef KP_MLA_CUDA_CUH
#define KP_MLA_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <math.h>
#include <mutex>

#include "../kp_formats.h"
#include "../mla_plan.h"
#include "kp_cuda.cuh"

enum { MLA_SPLIT_COUNT = 0, MLA_SPLIT_SIZE = 1 };

#define MLA_D_QK 576
#define MLA_D_V 512
#define MLA_HEADS 64            /* heads a CTA */
#define MLA_THREADS 256         /* 8 warps */
#define MLA_ROWP 1168           /* a Q or K row in shared memory: 576 bf16 and 16 bytes of padding */
#define MLA_PROWP 144           /* a P row: 64 bf16 and 16 bytes of padding */
#define MLA_OROW 520            /* a row of O staged for the epilogue, in floats: rows 8 banks apart */
#define MLA_FP8_TOKEN 656
#define MLA_BF16_TOKEN 1152
#define MLA_MAX_TOPK 16384      /* the combine stages 64 heads' split weights in the K tile: 256 splits */
#define MLA_MAX_BATCH (1 << 22) /* the plan's sums in 32 bits */
#define MLA_LOG2E 1.4426950408889634f

/* shared memory, byte offsets */
#define MLA_Q_AT 0
#define MLA_K_AT (MLA_Q_AT + MLA_HEADS * MLA_ROWP)
#define MLA_RAW_AT (MLA_K_AT + KP_MLA_BLOCK * MLA_ROWP)
#define MLA_P_AT (MLA_RAW_AT + KP_MLA_BLOCK * MLA_FP8_TOKEN)
#define MLA_XCH_AT (MLA_P_AT + MLA_HEADS * MLA_PROWP)
#define MLA_MULT_AT (MLA_XCH_AT + 8 * 16 * 32 * 4)
#define MLA_STAT_AT (MLA_MULT_AT + KP_MLA_BLOCK * 4 * 4)
/* statistics, in floats from MLA_STAT_AT: [4][64] arrays first, then [64] ones */
#define MLA_ST_QMAX 0    /* [4][64] block max of s per quarter */
#define MLA_ST_QL 256    /* [4][64] l per quarter, at the end */
#define MLA_ST_QMD 512   /* [4][64] max dot per quarter, at the end */
#define MLA_ST_SCALE 768 /* [64] the block's rescale */
#define MLA_ST_M 832     /* [64] running max at the end */
#define MLA_ST_L 896     /* [64] l */
#define MLA_ST_RCP 960   /* [64] RN(1 / l), NaN when l is outside [1, 2^24] */
#define MLA_ST_W0 1088   /* [64] one split: its weight */
#define MLA_ST_OSC 1152  /* [64] o_scale */
#define MLA_ST_ANY 1216  /* [64] int: some block counted */
#define MLA_ST_EMPTY 1280 /* [64] int: the combined row is empty */
#define MLA_ST_MASK 1344 /* u64 [2]: the counted slots of a block, double-buffered */
#define MLA_ST_FLAG 1348 /* int: this CTA combines */
#define MLA_ST_BAR 1350  /* u64: the staging's mbarrier (8-byte aligned) */
#define MLA_SMEM_BYTES (MLA_STAT_AT + 1352 * 4)

#define MLA_PLAN_THREADS 1024
#define MLA_PLAN_SMEM_MAX (48 * 1024)

/* One call as the kernels read it. */
struct mla_run {
    const uint16_t *q;          /* [batch, s_q, h_q, 576] bf16 */
    const uint8_t *cache;       /* [slots, 656] or [slots, 576] bf16 */
    const int32_t *indices;     /* [batch, s_q, topk] */
    const int32_t *topk_length; /* [batch, s_q] or NULL */
    const float *sink;          /* [h_q] or NULL */
    uint16_t *out;              /* [batch, s_q, h_q, 512] bf16 */
    float *lse, *max_logits;    /* [batch, s_q, h_q] */
    int32_t *splits;            /* [batch] */
    int64_t batch, s_q, h_q, topk, slots;
    int32_t groups;             /* h_q / 64 */
    int32_t plan_in_smem;       /* plan_blocks, plan_splits and first in the plan kernel's shared memory */
    float sm_scale, scale_log2; /* scale_log2 = sm_scale * log2 e, in f32 as the host port */
    int64_t parts;              /* split_count's num_sm_parts */
    int64_t max_splits;         /* first's row length: topk / 64 + 1 */
    int64_t max_items;          /* the most (request, split) items the plan can make */
    int32_t *plan_blocks, *plan_splits, *first;
    int32_t *item_base, *counters;
    int4 *items;
    float *split_lse, *split_max, *split_out;
};

/* ---- small device helpers ---- */

__device__ __forceinline__ uint32_t mla_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
/* 16 bytes global -> shared, bypassing L1; bytes 0 zero-fills without reading. */
__device__ __forceinline__ void mla_cp16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mla_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void mla_cp_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ void mla_ldsm4(uint32_t addr, uint32_t &d0, uint32_t &d1, uint32_t &d2, uint32_t &d3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
                 : "r"(addr));
}
__device__ __forceinline__ void mla_ldsm4_t(uint32_t addr, uint32_t &d0, uint32_t &d1, uint32_t &d2, uint32_t &d3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
                 : "r"(addr));
}
/* d += a b, m16n8k16, bf16 in, f32 accumulate. */
__device__ __forceinline__ void mla_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* mbarrier and bulk copy (sm_90): a token's 656 bytes in one cp.async.bulk whose completion the mbarrier counts. */
__device__ __forceinline__ void mla_mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mla_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mla_mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mla_mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n .reg .pred p;\n MLA_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra MLA_WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void mla_bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src),
                 "r"(bytes), "r"(bar)
                 : "memory");
}
/* Orders this thread's generic-proxy accesses to shared memory before later bulk copies into it. */
__device__ __forceinline__ void mla_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* a / l correctly rounded (the IEEE division the host port does), given y = RN(1 / l) for l in [1, 2^24]: q = RN(a y)
 * is within an ulp of a / l, the remainder a - l q is exact in an FMA, and RN(q + remainder y) is the correctly
 * rounded quotient (Markstein's theorem; no underflow or overflow for |a| in [2^-100, 2^100]; 2e8 random pairs
 * agreed with IEEE division on the host). Three instructions instead of __fdiv_rn's dozen and its slow-path branch;
 * mla_div_ok says when they apply. */
__device__ __forceinline__ bool mla_div_ok(float a) { return fabsf(a) >= 0x1p-100f && fabsf(a) <= 0x1p100f; }
__device__ __forceinline__ float mla_div(float a, float l, float y) {
    const float q = __fmul_rn(a, y);
    return __fmaf_rn(__fmaf_rn(-q, l, a), y, q);
}

/* The larger of a and b, NaN when either is (the host port's maxima keep a NaN once seen). */
__device__ __forceinline__ float mla_max(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

/* Two e4m3 codes (bits 0..15, low byte first) times the bf16x2 multiplier bf16(scale) * 2^112, as bf16x2
 * bits: e4m3 -> f16 is exact, an f16's exponent and top 7 mantissa bits shifted into bf16's fields are its
 * value * 2^-112 (exact: e4m3 values are normal f16s or zero, their mantissas 3 bits), and the FMA (with -0,
 * which keeps a zero product's sign) rounds the exact product once to nearest even: the host port's
 * kp_bf16_round(kp_e4m3_decode(code) * bf16(scale)). */
__device__ __forceinline__ uint32_t mla_dequant2(uint32_t codes, uint32_t mult) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(codes & 0xffffu), __NV_E4M3);
    const uint32_t hb = (uint32_t)h.x | ((uint32_t)h.y << 16);
    const uint32_t v = (hb & 0x80008000u) | ((hb >> 3) & 0x0fff0fffu);
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(v), "r"(mult), "r"(0x80008000u));
    return d;
}
/* The exact f32 path for the same pair: the host port's arithmetic. */
__device__ __forceinline__ uint32_t mla_dequant2_f32(uint32_t codes, float sb) {
    return (uint32_t)kp_bf16_bits(kp_e4m3_decode(codes & 0xffu) * sb) |
           ((uint32_t)kp_bf16_bits(kp_e4m3_decode((codes >> 8) & 0xffu) * sb) << 16);
}

__device__ __forceinline__ int64_t mla_row_len(const mla_run &r, int64_t row) {
    int64_t n = r.topk;
    if (r.topk_length) {
        const int64_t t = r.topk_length[row];
        n = t < 0 ? 0 : t < n ? t : n;
    }
    return n;
}

/* ---- the combine of one (row, head), the host port's order ---- */

struct mla_head {
    float gmax, lse_sum, lse2, o_scale;
    int empty;
};

/* lse_at(s): split s's lse in log2. */
template <typename LseAt>
__device__ __forceinline__ mla_head mla_head_plan(int ns, LseAt lse_at, const float *sink, int64_t h) {
    mla_head hd;
    hd.gmax = -INFINITY;
    for (int s = 0; s < ns; s++) hd.gmax = mla_max(hd.gmax, lse_at(s));
    hd.empty = hd.gmax == -INFINITY;
    hd.lse_sum = 0.0f, hd.lse2 = INFINITY, hd.o_scale = 1.0f;
    if (!hd.empty) {
        for (int s = 0; s < ns; s++) hd.lse_sum = __fadd_rn(hd.lse_sum, exp2f(__fsub_rn(lse_at(s), hd.gmax)));
        hd.lse2 = __fadd_rn(log2f(hd.lse_sum), hd.gmax);
        if (sink) /* the sink adds exp(sink) to the denominator */
            hd.o_scale = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp2f(__fsub_rn(__fmul_rn(sink[h], MLA_LOG2E), hd.lse2))));
    }
    return hd;
}
__device__ __forceinline__ float mla_weight(const mla_head &hd, float lse_s) {
    return __fdiv_rn(exp2f(__fsub_rn(lse_s, hd.gmax)), hd.lse_sum);
}
__device__ __forceinline__ float mla_lse_out(const mla_head &hd) {
    return hd.empty ? INFINITY : __fdiv_rn(hd.lse2, MLA_LOG2E);
}
/* The last step of an out element after its sum over splits. */
__device__ __forceinline__ float mla_finish(float o, bool sink, bool empty, float o_scale) {
    if (empty) return 0.0f;
    return sink ? __fmul_rn(o, o_scale) : o;
}
__device__ __forceinline__ uint32_t mla_bf16x2(float lo, float hi) {
    return (uint32_t)kp_bf16_bits(lo) | ((uint32_t)kp_bf16_bits(hi) << 16);
}

/* ---- 1. the plan ---- */

/* Exclusive scan of v over the block (MLA_PLAN_THREADS); *total receives the sum. */
__device__ __forceinline__ int32_t mla_block_scan(int32_t v, int32_t *warp_sums, int32_t *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t x = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int32_t y = __shfl_up_sync(0xffffffffu, x, off);
        if (lane >= off) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int32_t w = warp_sums[lane];
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int32_t y = __shfl_up_sync(0xffffffffu, w, off);
            if (lane >= off) w += y;
        }
        warp_sums[lane] = w; /* inclusive */
    }
    __syncthreads();
    const int32_t before = (warp ? warp_sums[warp - 1] : 0) + x - v;
    *total = warp_sums[31];
    __syncthreads();
    return before;
}

/* kp_mla_split_count_plan (kernels/mla_plan.h) line for line, in 32-bit registers (MLA_MAX_BATCH keeps the
 * sums in range) with the next request's blocks loaded ahead: the header's 64-bit loop over shared and global
 * memory took 21 us on one thread at batch 128 (H200). total = sum of (blocks + KP_MLA_OVERHEAD). Returns
 * whether the batch fit. */
__device__ __forceinline__ bool mla_split_count_plan32(const int32_t *blocks, int32_t n, int32_t total, int32_t parts,
                                                       int32_t *splits, int32_t *first, int32_t max_splits) {
    const int32_t payload = (total + parts - 1) / parts + KP_MLA_OVERHEAD;
    int32_t req = 0, at = 0, split = 0, cur = n > 0 ? blocks[0] : 0, next = n > 1 ? blocks[1] : 0;
    for (int32_t p = 0; p < parts && req < n; p++) {
        int32_t left = payload;
        while (req < n) {
            first[req * max_splits + split] = at;
            const int32_t rest = cur - at;
            if (left >= rest + KP_MLA_OVERHEAD) { /* the rest of the request fits in this part */
                splits[req] = split + 1;
                left -= rest + KP_MLA_OVERHEAD;
                req++, at = 0, split = 0;
                cur = next;
                next = req + 1 < n ? blocks[req + 1] : 0;
            } else {
                if (left > KP_MLA_OVERHEAD) at += left - KP_MLA_OVERHEAD, split++;
                break;
            }
        }
    }
    return req == n;
}

template <int ALGO>
__global__ void __launch_bounds__(MLA_PLAN_THREADS) mla_plan_kernel(mla_run r) {
    extern __shared__ __align__(16) unsigned char mla_plan_smem[];
    __shared__ int32_t warp_sums[32];
    __shared__ int failed;
    int32_t *blocks = r.plan_in_smem ? reinterpret_cast<int32_t *>(mla_plan_smem) : r.plan_blocks;
    int32_t *nspl = r.plan_in_smem ? blocks + r.batch : r.plan_splits;
    int32_t *first = r.plan_in_smem && ALGO == MLA_SPLIT_COUNT ? nspl + r.batch : r.first;
    const int tid = threadIdx.x;
    int32_t total = 0; /* sum of (blocks + overhead), for split_count's payload */
    for (int64_t b0 = 0; b0 < r.batch; b0 += MLA_PLAN_THREADS) { /* a request's length: its longest row's */
        const int64_t b = b0 + tid;
        int32_t nb = 0;
        if (b < r.batch) {
            int64_t longest = 0;
            for (int64_t i = 0; i < r.s_q; i++) {
                const int64_t n = mla_row_len(r, b * r.s_q + i);
                longest = n > longest ? n : longest;
            }
            nb = (int32_t)kp_mla_blocks(longest);
            blocks[b] = nb;
            if (ALGO == MLA_SPLIT_SIZE) nspl[b] = (int32_t)kp_mla_split_size_splits(nb);
        }
        if (ALGO == MLA_SPLIT_COUNT) {
            int32_t chunk;
            (void)mla_block_scan(b < r.batch ? nb + KP_MLA_OVERHEAD : 0, warp_sums, &chunk);
            total += chunk;
        }
    }
    for (int64_t k = tid; k < r.batch * r.s_q * r.groups; k += MLA_PLAN_THREADS) r.counters[k] = 0;
    if (tid == 0) failed = 0;
    __syncthreads();
    if (ALGO == MLA_SPLIT_COUNT && tid == 0) { /* sequential by nature: each part starts where the last one stopped */
        int32_t *const sb = reinterpret_cast<int32_t *>(mla_plan_smem); /* shared loads, not generic, when it fits */
        failed = r.plan_in_smem ? !mla_split_count_plan32(sb, (int32_t)r.batch, total, (int32_t)r.parts, sb + r.batch,
                                                          sb + 2 * r.batch, (int32_t)r.max_splits)
                                : !mla_split_count_plan32(r.plan_blocks, (int32_t)r.batch, total, (int32_t)r.parts, r.plan_splits,
                                                          r.first, (int32_t)r.max_splits);
    }
    __syncthreads();
    int32_t carry = 0;
    const int32_t end_all = (int32_t)kp_mla_blocks(r.topk);
    for (int64_t b0 = 0; b0 < r.batch; b0 += MLA_PLAN_THREADS) {
        const int64_t b = b0 + tid;
        const int32_t ns = b < r.batch && !failed ? nspl[b] : 0;
        int32_t chunk;
        const int32_t before = mla_block_scan(ns, warp_sums, &chunk);
        if (b < r.batch) {
            const int32_t base = carry + before;
            r.item_base[b] = base;
            r.splits[b] = ns;
            for (int32_t s = 0; s < ns; s++) {
                int32_t begin, end;
                if (ALGO == MLA_SPLIT_COUNT) {
                    begin = first[b * r.max_splits + s];
                    end = s + 1 < ns ? first[b * r.max_splits + s + 1] : end_all;
                } else {
                    begin = s * KP_MLA_SPLIT_BLOCKS;
                    end = s + 1 < ns ? (s + 1) * KP_MLA_SPLIT_BLOCKS : end_all;
                }
                r.items[base + s] = make_int4((int)b, ns, begin, end);
            }
        }
        carry += chunk;
    }
    if (tid == 0) r.item_base[r.batch] = carry;
}

/* ---- 2. attention over one split, and the combine ---- */

/* Slot `tok` of block n of row `row`: its index, or -1 past the row's length (the index is checked where
 * it is used, so the load's latency hides behind a block's work). */
__device__ __forceinline__ int32_t mla_index(const mla_run &r, int64_t row, int64_t len, int32_t n, int tok) {
    const int64_t pos = (int64_t)n * KP_MLA_BLOCK + tok;
    return pos < len ? r.indices[row * r.topk + pos] : -1;
}
__device__ __forceinline__ bool mla_counts(const mla_run &r, int32_t idx) { return idx >= 0 && idx < r.slots; }

/* The block's counted slots as a 64-bit mask in shared memory: warp w holds tokens [8 w, 8 w + 8), 4 lanes
 * each; bits 0, 4, ..., 28 of its ballot are its tokens'. */
__device__ __forceinline__ void mla_publish_mask(unsigned char *mask_bytes, bool counted) {
    uint32_t x = __ballot_sync(0xffffffffu, counted) & 0x11111111u;
    x = (x | (x >> 3)) & 0x03030303u;
    x = (x | (x >> 6)) & 0x000f000fu;
    x = (x | (x >> 12)) & 0xffu;
    if ((threadIdx.x & 31) == 0) mask_bytes[threadIdx.x >> 5] = (unsigned char)x;
}

/* This thread's part of a token's copy into shared memory (4 threads a token, 16-byte chunks part, part + 4,
 * ...): the counted token's bytes, or zeros (src-size 0: nothing is read; the address is slot 0's). */
template <int TOKEN_BYTES>
__device__ __forceinline__ void mla_copy_token(uint32_t dst, const uint8_t *cache, int32_t idx, bool counted, int part) {
    const uint8_t *src = cache + (int64_t)(counted ? idx : 0) * TOKEN_BYTES + part * 16;
    const int bytes = counted ? 16 : 0;
#pragma unroll
    for (int i = 0; i < TOKEN_BYTES / 64; i++) mla_cp16(dst + i * 64, src + i * 64, bytes);
    if (TOKEN_BYTES % 64 && part < (TOKEN_BYTES % 64) / 16)
        mla_cp16(dst + (TOKEN_BYTES / 64) * 64, src + (TOKEN_BYTES / 64) * 64, bytes);
}

/* A block's fp8_ds_mla token into the staging: a counted token's 656 bytes in one bulk copy, issued by its first
 * thread after arriving on the mbarrier with the bytes to expect; a token that does not count is zeros, stored by
 * its 4 threads (no read of the cache), its first thread arriving with nothing to expect. */
__device__ __forceinline__ void mla_stage_fp8(unsigned char *sm, uint32_t raw_s, uint32_t bar, const uint8_t *cache, int32_t idx,
                                              bool counted, int tok, int part) {
    if (counted) {
        if (part == 0) {
            mla_mbar_arrive_tx(bar, MLA_FP8_TOKEN);
            mla_bulk_copy(raw_s + tok * MLA_FP8_TOKEN, cache + (int64_t)idx * MLA_FP8_TOKEN, MLA_FP8_TOKEN, bar);
        }
    } else {
        for (int c = part; c < MLA_FP8_TOKEN / 16; c += 4)
            *reinterpret_cast<uint4 *>(sm + MLA_RAW_AT + tok * MLA_FP8_TOKEN + c * 16) = make_uint4(0u, 0u, 0u, 0u);
        mla_fence_proxy();
        if (part == 0) mla_mbar_arrive(bar);
    }
}

template <bool FP8>
__global__ void __launch_bounds__(MLA_THREADS, 1) mla_attend_kernel(mla_run r) {
    extern __shared__ __align__(128) unsigned char mla_smem_buf[];
    unsigned char *const sm = mla_smem_buf;
    float *const st = reinterpret_cast<float *>(sm + MLA_STAT_AT);
    int *const st_i = reinterpret_cast<int *>(st);
    unsigned char *const mask_bytes = reinterpret_cast<unsigned char *>(st + MLA_ST_MASK); /* [2][8] */
    const uint64_t *const mask_words = reinterpret_cast<const uint64_t *>(st + MLA_ST_MASK);
    uint32_t *const mult_s = reinterpret_cast<uint32_t *>(sm + MLA_MULT_AT); /* [64 tokens][4 tiles] */
    const uint32_t q_s = mla_smem(sm + MLA_Q_AT), k_s = mla_smem(sm + MLA_K_AT), raw_s = mla_smem(sm + MLA_RAW_AT);
    const uint32_t p_s = mla_smem(sm + MLA_P_AT);
    float *const xch = reinterpret_cast<float *>(sm + MLA_XCH_AT);

    pdl_wait();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t per_item = r.s_q * r.groups;
    const int64_t item = blockIdx.x / per_item;
    const int qi = (int)((blockIdx.x % per_item) / r.groups), g = (int)(blockIdx.x % r.groups);
    const int32_t n_items = r.item_base[r.batch];
    const int4 it = r.items[item]; /* item < max_items: in the array, though past n_items never written */
    if (item >= n_items) return;
    const int64_t b = it.x, row = b * r.s_q + qi, h0 = (int64_t)g * MLA_HEADS;
    const int ns = it.y;
    const int32_t blk0 = it.z, blk1 = it.w;
    const int64_t len = mla_row_len(r, row);
    const int tok = tid >> 2, part = tid & 3; /* copies: 4 threads a token */

    /* Q: 64 heads x 72 chunks */
    const uint16_t *qsrc = r.q + (row * r.h_q + h0) * MLA_D_QK;
#pragma unroll 2
    for (int c = tid; c < MLA_HEADS * 72; c += MLA_THREADS) {
        const int hr = c / 72, ch = c % 72;
        mla_cp16(q_s + hr * MLA_ROWP + ch * 16, qsrc + hr * MLA_D_QK + ch * 8, 16);
    }
    mla_cp_commit();
    int32_t idx_n = mla_index(r, row, len, blk0, tok);
    int32_t idx_n1 = blk0 + 1 < blk1 ? mla_index(r, row, len, blk0 + 1, tok) : -1;
    const uint32_t bar = mla_smem(st + MLA_ST_BAR);
    if (FP8) {
        if (tid == 0) mla_mbar_init(bar, KP_MLA_BLOCK); /* one arrival a token */
        __syncthreads();
    }
    mla_publish_mask(mask_bytes, mla_counts(r, idx_n));
    if (FP8) mla_stage_fp8(sm, raw_s, bar, r.cache, idx_n, mla_counts(r, idx_n), tok, part);

    /* this warp's roles and its lanes' shared memory bases */
    const int mh = warp & 1, nsl = (warp >> 1) & 1, kh = warp >> 2, quarter = 2 * nsl + kh;
    const uint32_t qa = q_s + (32 * mh + (lane & 15)) * MLA_ROWP + (lane >> 4) * 16 + kh * 576; /* + 16 rows a tile */
    const uint32_t kb = k_s + (32 * nsl + (lane & 7) + ((lane >> 4) << 3)) * MLA_ROWP + ((lane >> 3) & 1) * 16 + kh * 576;
    const uint32_t pa = p_s + (lane & 15) * MLA_PROWP + (lane >> 4) * 16;
    const uint32_t vb = k_s + ((lane & 7) + ((lane >> 3) & 1) * 8) * MLA_ROWP + (8 * warp + (lane >> 4)) * 16;
    float o[4][8][4]; /* O: heads 16 a + (lane / 4) (+ 8), dims 64 warp + 8 t + 2 (lane % 4) */
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int c = 0; c < 4; c++) o[a][t][c] = 0.0f;
    /* per softmax row j = 2 am + e: head 32 mh + 16 am + lane / 4 + 8 e */
    float m_run[4], l_run[4], maxdot[4];
    int any = 0; /* bit j: some block counted a slot of row j */
#pragma unroll
    for (int j = 0; j < 4; j++) m_run[j] = -1e30f, l_run[j] = 0.0f, maxdot[j] = -INFINITY;

    for (int32_t n = blk0; n < blk1; n++) {
        const int buf = (n - blk0) & 1;
        mla_cp_wait_all(); /* Q (and, bf16, nothing else) */
        bool slow = false;
        if (FP8) { /* this token's tile scale as the bf16x2 multiplier bf16(scale) * 2^112 (zero-filled: 0) */
            mla_mbar_wait(bar, (uint32_t)(n - blk0) & 1u); /* the block's bulk copies landed */
            __syncwarp(); /* an uncounted token's zeros were stored by lane 4 (tok % 8) of this warp */
            const float sb = kp_bf16_round(*reinterpret_cast<const float *>(sm + MLA_RAW_AT + tok * MLA_FP8_TOKEN + 512 + 4 * part));
            const float m = __fmul_rn(sb, 0x1p112f); /* exact below 2^16 */
            uint32_t w = __float_as_uint(m) >> 16;
            mult_s[tid] = w | (w << 16);
            slow = isinf(m) && !isinf(sb);
        }
        /* A: this block's bytes (and Q) landed, its mask visible, the last PV done with K; whether any
         * multiplier overflowed (bf16(scale) >= 2^16: the block takes the exact f32 path) */
        const bool slow_block = __syncthreads_or(slow) != 0;
        const uint64_t mask = mask_words[buf];
        if (mask) {
            unsigned char *const kt = sm + MLA_K_AT;
            if (FP8) {
                const unsigned char *const raw = sm + MLA_RAW_AT;
                const int pc = tid & 63, tk0 = tid >> 6; /* 64 tokens x 64 pieces of 8 codes; a warp does half a token */
                if (!slow_block) {
#pragma unroll 4
                    for (int i = 0; i < 16; i++) {
                        const int tk = 4 * i + tk0;
                        const uint2 codes = *reinterpret_cast<const uint2 *>(raw + tk * MLA_FP8_TOKEN + pc * 8);
                        const uint32_t mult = mult_s[tk * 4 + (pc >> 4)];
                        *reinterpret_cast<uint4 *>(kt + tk * MLA_ROWP + pc * 16) =
                            make_uint4(mla_dequant2(codes.x, mult), mla_dequant2(codes.x >> 16, mult),
                                       mla_dequant2(codes.y, mult), mla_dequant2(codes.y >> 16, mult));
                    }
                } else {
#pragma unroll 1
                    for (int i = 0; i < 16; i++) {
                        const int tk = 4 * i + tk0;
                        const uint2 codes = *reinterpret_cast<const uint2 *>(raw + tk * MLA_FP8_TOKEN + pc * 8);
                        const float sb = kp_bf16_round(*reinterpret_cast<const float *>(raw + tk * MLA_FP8_TOKEN + 512 + 4 * (pc >> 4)));
                        *reinterpret_cast<uint4 *>(kt + tk * MLA_ROWP + pc * 16) =
                            make_uint4(mla_dequant2_f32(codes.x, sb), mla_dequant2_f32(codes.x >> 16, sb),
                                       mla_dequant2_f32(codes.y, sb), mla_dequant2_f32(codes.y >> 16, sb));
                    }
                }
#pragma unroll
                for (int i = 0; i < 2; i++) { /* RoPE: 64 tokens x 8 chunks, copied */
                    const int task = i * MLA_THREADS + tid, tk = task >> 3, c = task & 7;
                    *reinterpret_cast<uint4 *>(kt + tk * MLA_ROWP + (64 + c) * 16) =
                        *reinterpret_cast<const uint4 *>(raw + tk * MLA_FP8_TOKEN + 528 + c * 16);
                }
            } else { /* bf16: straight into K, zeros for the tokens that do not count */
                mla_copy_token<MLA_BF16_TOKEN>(k_s + tok * MLA_ROWP + part * 16, r.cache, idx_n, mla_counts(r, idx_n), part);
                mla_cp_commit();
                mla_cp_wait_all();
            }
        }
        if (FP8) mla_fence_proxy(); /* this thread's reads and zeros of the staging come before the next bulk copies */
        __syncthreads(); /* B: K ready, the staging free */
        if (n + 1 < blk1) {
            const bool counted = mla_counts(r, idx_n1);
            mla_publish_mask(mask_bytes + 8 * (buf ^ 1), counted);
            if (FP8) mla_stage_fp8(sm, raw_s, bar, r.cache, idx_n1, counted, tok, part);
        }
        idx_n = idx_n1;
        idx_n1 = n + 2 < blk1 ? mla_index(r, row, len, n + 2, tok) : -1;
        if (!mask) continue; /* no counted slot: the host port skips the block */

        /* S = Q K^T: heads [32 mh, +32) x slots [32 nsl, +32) over dims [288 kh, +288) */
        float s[2][4][4];
#pragma unroll
        for (int am = 0; am < 2; am++)
#pragma unroll
            for (int t = 0; t < 4; t++)
#pragma unroll
                for (int c = 0; c < 4; c++) s[am][t][c] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < 18; ks++) {
            uint32_t a[2][4], bf[4][2];
            mla_ldsm4(qa + ks * 32, a[0][0], a[0][1], a[0][2], a[0][3]);
            mla_ldsm4(qa + 16 * MLA_ROWP + ks * 32, a[1][0], a[1][1], a[1][2], a[1][3]);
            mla_ldsm4(kb + ks * 32, bf[0][0], bf[0][1], bf[1][0], bf[1][1]);
            mla_ldsm4(kb + 16 * MLA_ROWP + ks * 32, bf[2][0], bf[2][1], bf[3][0], bf[3][1]);
#pragma unroll
            for (int am = 0; am < 2; am++)
#pragma unroll
                for (int t = 0; t < 4; t++) mla_mma(s[am][t], a[am], bf[t][0], bf[t][1]);
        }
        /* add the two dim halves: this warp keeps n8 tiles 2 kh, 2 kh + 1 (its quarter), hands the others over */
        float *mine = xch + warp * 512, *theirs = xch + (warp ^ 4) * 512;
#pragma unroll
        for (int am = 0; am < 2; am++)
#pragma unroll
            for (int kt = 0; kt < 2; kt++)
#pragma unroll
                for (int c = 0; c < 4; c++) mine[(am * 8 + kt * 4 + c) * 32 + lane] = kh ? s[am][kt][c] : s[am][kt + 2][c];
        __syncthreads(); /* C */
        const uint32_t my = (uint32_t)(mask >> (16 * quarter + 2 * (lane & 3))); /* bit 8 kt + (c % 2): this lane's slot */
        float sc[2][2][4]; /* this quarter's scores: slots 16 quarter + 8 kt + 2 (lane % 4) + (c % 2) */
        float bpart[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
        for (int am = 0; am < 2; am++)
#pragma unroll
            for (int kt = 0; kt < 2; kt++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const float d = __fadd_rn(kh ? s[am][kt + 2][c] : s[am][kt][c], theirs[(am * 8 + kt * 4 + c) * 32 + lane]);
                    const bool counted = (my >> (8 * kt + (c & 1))) & 1;
                    const int j = 2 * am + (c >> 1);
                    maxdot[j] = mla_max(maxdot[j], counted ? d : -INFINITY);
                    sc[am][kt][c] = counted ? __fmul_rn(d, r.scale_log2) : -INFINITY;
                    bpart[j] = mla_max(bpart[j], sc[am][kt][c]);
                }
        float *const qmax = st + MLA_ST_QMAX;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            bpart[j] = mla_max(bpart[j], __shfl_xor_sync(0xffffffffu, bpart[j], 1));
            bpart[j] = mla_max(bpart[j], __shfl_xor_sync(0xffffffffu, bpart[j], 2));
            if ((lane & 3) == 0) qmax[quarter * 64 + 32 * mh + 16 * (j >> 1) + (lane >> 2) + 8 * (j & 1)] = bpart[j];
        }
        __syncthreads(); /* D */
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int hr = 32 * mh + 16 * (j >> 1) + (lane >> 2) + 8 * (j & 1);
            const float bmax = mla_max(mla_max(mla_max(qmax[hr], qmax[64 + hr]), qmax[128 + hr]), qmax[192 + hr]);
            const float mnew = bmax > m_run[j] || isnan(bmax) ? bmax : m_run[j];
            const float rescale = exp2f(__fsub_rn(m_run[j], mnew));
            any |= (bmax != -INFINITY) << j;
            l_run[j] = __fmul_rn(l_run[j], rescale);
            m_run[j] = mnew;
            if (quarter == 0 && (lane & 3) == 0) st[MLA_ST_SCALE + hr] = rescale;
        }
        float psum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int am = 0; am < 2; am++)
#pragma unroll
            for (int kt = 0; kt < 2; kt++)
#pragma unroll
                for (int e = 0; e < 2; e++) { /* p of a slot that does not count: exp2f(-inf) = 0 */
                    const int j = 2 * am + e;
                    const float p0 = exp2f(__fsub_rn(sc[am][kt][2 * e], m_run[j]));
                    const float p1 = exp2f(__fsub_rn(sc[am][kt][2 * e + 1], m_run[j]));
                    psum[j] = __fadd_rn(psum[j], __fadd_rn(p0, p1));
                    const __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1); /* P in bf16 for the PV product */
                    const int hr = 32 * mh + 16 * am + (lane >> 2) + 8 * e;
                    *reinterpret_cast<__nv_bfloat162 *>(sm + MLA_P_AT + hr * MLA_PROWP + quarter * 32 + kt * 16 + 4 * (lane & 3)) = pb;
                }
#pragma unroll
        for (int j = 0; j < 4; j++) l_run[j] = __fadd_rn(l_run[j], psum[j]);
        __syncthreads(); /* E: P and the rescales ready */

        /* O = O * rescale + P V: dims [64 warp, +64) of all 64 heads */
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const float r0 = st[MLA_ST_SCALE + 16 * a + (lane >> 2)], r1 = st[MLA_ST_SCALE + 16 * a + (lane >> 2) + 8];
#pragma unroll
            for (int t = 0; t < 8; t++) {
                o[a][t][0] = __fmul_rn(o[a][t][0], r0), o[a][t][1] = __fmul_rn(o[a][t][1], r0);
                o[a][t][2] = __fmul_rn(o[a][t][2], r1), o[a][t][3] = __fmul_rn(o[a][t][3], r1);
            }
        }
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            uint32_t pf[4][4];
#pragma unroll
            for (int a = 0; a < 4; a++) mla_ldsm4(pa + a * 16 * MLA_PROWP + ks * 32, pf[a][0], pf[a][1], pf[a][2], pf[a][3]);
#pragma unroll
            for (int pp = 0; pp < 4; pp++) {
                uint32_t v4[4];
                mla_ldsm4_t(vb + ks * 16 * MLA_ROWP + pp * 32, v4[0], v4[1], v4[2], v4[3]);
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    mla_mma(o[a][2 * pp], pf[a], v4[0], v4[1]);
                    mla_mma(o[a][2 * pp + 1], pf[a], v4[2], v4[3]);
                }
            }
        }
    }
    mla_cp_wait_all();

    /* the split's per-row results: l and the max dot over the quarters, in quarter order */
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float lq = l_run[j], md = maxdot[j];
        lq = __fadd_rn(lq, __shfl_xor_sync(0xffffffffu, lq, 1));
        lq = __fadd_rn(lq, __shfl_xor_sync(0xffffffffu, lq, 2));
        md = mla_max(md, __shfl_xor_sync(0xffffffffu, md, 1));
        md = mla_max(md, __shfl_xor_sync(0xffffffffu, md, 2));
        const int hr = 32 * mh + 16 * (j >> 1) + (lane >> 2) + 8 * (j & 1);
        if ((lane & 3) == 0) {
            st[MLA_ST_QL + quarter * 64 + hr] = lq;
            st[MLA_ST_QMD + quarter * 64 + hr] = md;
            if (quarter == 0) st[MLA_ST_M + hr] = m_run[j], st_i[MLA_ST_ANY + hr] = (any >> j) & 1;
        }
    }
    __syncthreads(); /* every warp is past its last PV: Q and K are free */
    float *const obuf = reinterpret_cast<float *>(sm + MLA_Q_AT); /* O staged: [64 heads][MLA_OROW] f32 */
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int e = 0; e < 2; e++)
#pragma unroll
            for (int t = 0; t < 8; t++)
                *reinterpret_cast<float2 *>(obuf + (16 * a + (lane >> 2) + 8 * e) * MLA_OROW + 64 * warp + 8 * t + 2 * (lane & 3)) =
                    make_float2(o[a][t][2 * e], o[a][t][2 * e + 1]);
    const int64_t head_at = row * r.h_q + h0; /* this CTA's first head in lse, max_logits, out */
    if (tid < MLA_HEADS) {
        const int hr = tid;
        const float *ql = st + MLA_ST_QL, *qmd = st + MLA_ST_QMD;
        const float l = __fadd_rn(__fadd_rn(__fadd_rn(ql[hr], ql[64 + hr]), ql[128 + hr]), ql[192 + hr]);
        const float md = mla_max(mla_max(mla_max(qmd[hr], qmd[64 + hr]), qmd[128 + hr]), qmd[192 + hr]);
        const float lse_s = st_i[MLA_ST_ANY + hr] ? __fadd_rn(log2f(l), st[MLA_ST_M + hr]) : -INFINITY;
        const float nat = __fmul_rn(md, r.sm_scale);
        st[MLA_ST_L + hr] = l;
        st[MLA_ST_RCP + hr] = l >= 1.0f && l <= 0x1p24f ? __frcp_rn(l) : NAN; /* l >= 1 when a slot counted */
        if (ns == 1) { /* the combine of one split, here */
            const mla_head hd = mla_head_plan(1, [&](int) { return lse_s; }, r.sink, h0 + hr);
            st[MLA_ST_W0 + hr] = hd.empty ? 0.0f : mla_weight(hd, lse_s);
            st[MLA_ST_OSC + hr] = hd.o_scale;
            st_i[MLA_ST_EMPTY + hr] = hd.empty;
            r.lse[head_at + hr] = mla_lse_out(hd);
            r.max_logits[head_at + hr] = mla_max(-INFINITY, nat);
        } else {
            const int64_t at = (item * r.s_q + qi) * r.h_q + h0 + hr;
            r.split_lse[at] = lse_s;
            r.split_max[at] = nat;
        }
    }
    __syncthreads();
    /* out = acc / l (0 when nothing counted), 4 dims of a head a thread at a time, whole rows a warp */
    const bool has_sink = r.sink != NULL;
    float *const split_out = r.split_out + ((item * r.s_q + qi) * r.h_q + h0) * MLA_D_V;
#pragma unroll 2
    for (int k = tid; k < MLA_HEADS * (MLA_D_V / 4); k += MLA_THREADS) {
        const int hr = k >> 7, d4 = k & 127;
        const float4 acc = *reinterpret_cast<const float4 *>(obuf + hr * MLA_OROW + 4 * d4);
        const bool counted = st_i[MLA_ST_ANY + hr] != 0;
        const float l = st[MLA_ST_L + hr], y = st[MLA_ST_RCP + hr]; /* y NaN: l outside [1, 2^24] */
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (counted) {
            if (mla_div_ok(acc.x) && mla_div_ok(acc.y) && mla_div_ok(acc.z) && mla_div_ok(acc.w) && !isnan(y))
                x = make_float4(mla_div(acc.x, l, y), mla_div(acc.y, l, y), mla_div(acc.z, l, y), mla_div(acc.w, l, y));
            else
                x = make_float4(__fdiv_rn(acc.x, l), __fdiv_rn(acc.y, l), __fdiv_rn(acc.z, l), __fdiv_rn(acc.w, l));
        }
        if (ns == 1) { /* one split: the combine's arithmetic with its one weight */
            const float w0 = st[MLA_ST_W0 + hr], osc = st[MLA_ST_OSC + hr];
            const bool empty = st_i[MLA_ST_EMPTY + hr] != 0;
            *reinterpret_cast<uint2 *>(r.out + (head_at + hr) * MLA_D_V + 4 * d4) =
                make_uint2(mla_bf16x2(mla_finish(__fadd_rn(0.0f, __fmul_rn(w0, x.x)), has_sink, empty, osc),
                                      mla_finish(__fadd_rn(0.0f, __fmul_rn(w0, x.y)), has_sink, empty, osc)),
                           mla_bf16x2(mla_finish(__fadd_rn(0.0f, __fmul_rn(w0, x.z)), has_sink, empty, osc),
                                      mla_finish(__fadd_rn(0.0f, __fmul_rn(w0, x.w)), has_sink, empty, osc)));
        } else
            *reinterpret_cast<float4 *>(split_out + hr * MLA_D_V + 4 * d4) = x;
    }
    if (ns == 1) return;

    /* the last split of (request, row, head group) to arrive combines them all, in split order */
    __threadfence();
    __syncthreads();
    if (tid == 0) st_i[MLA_ST_FLAG] = atomicAdd(&r.counters[row * r.groups + g], 1) == ns - 1;
    __syncthreads();
    if (!st_i[MLA_ST_FLAG]) return;
    __threadfence();
    const int64_t item0 = r.item_base[b];
    float *const wts = reinterpret_cast<float *>(sm + MLA_K_AT); /* [64 heads][ns] */
    if (tid < MLA_HEADS) {
        const int hr = tid;
        auto split_at = [&](int sp) { return ((item0 + sp) * r.s_q + qi) * r.h_q + h0 + hr; };
        auto lse_at = [&](int sp) { return __ldcg(r.split_lse + split_at(sp)); };
        const mla_head hd = mla_head_plan(ns, lse_at, r.sink, h0 + hr);
        float mx = -INFINITY;
        for (int sp = 0; sp < ns; sp++) {
            wts[hr * ns + sp] = hd.empty ? 0.0f : mla_weight(hd, lse_at(sp));
            mx = mla_max(mx, __ldcg(r.split_max + split_at(sp)));
        }
        st[MLA_ST_OSC + hr] = hd.o_scale;
        st_i[MLA_ST_EMPTY + hr] = hd.empty;
        r.lse[head_at + hr] = mla_lse_out(hd);
        r.max_logits[head_at + hr] = mx;
    }
    __syncthreads();
    /* thread t: dims 4 (t % 128) .. + 3 of heads t / 128 + 2 u, u < 32, in two halves of 16 loads in flight a split */
    const int64_t split_stride = r.s_q * r.h_q * (MLA_D_V / 4); /* float4s from one split to the next */
    const float4 *base4 = reinterpret_cast<const float4 *>(r.split_out) + ((item0 * r.s_q + qi) * r.h_q + h0) * (MLA_D_V / 4) + tid;
    uint16_t *out0 = r.out + (head_at + (tid >> 7)) * MLA_D_V + 4 * (tid & 127);
#pragma unroll 1
    for (int half = 0; half < 2; half++) {
        float4 acc[16];
#pragma unroll
        for (int u = 0; u < 16; u++) acc[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int sp = 0; sp < ns; sp++) {
            float4 x[16];
#pragma unroll
            for (int u = 0; u < 16; u++) x[u] = __ldcg(base4 + sp * split_stride + (16 * half + u) * 256);
#pragma unroll
            for (int u = 0; u < 16; u++) {
                const float w = wts[((tid >> 7) + 2 * (16 * half + u)) * ns + sp];
                acc[u].x = __fadd_rn(acc[u].x, __fmul_rn(w, x[u].x)), acc[u].y = __fadd_rn(acc[u].y, __fmul_rn(w, x[u].y));
                acc[u].z = __fadd_rn(acc[u].z, __fmul_rn(w, x[u].z)), acc[u].w = __fadd_rn(acc[u].w, __fmul_rn(w, x[u].w));
            }
        }
#pragma unroll
        for (int u = 0; u < 16; u++) {
            const int hr = (tid >> 7) + 2 * (16 * half + u);
            const bool empty = st_i[MLA_ST_EMPTY + hr] != 0;
            const float osc = st[MLA_ST_OSC + hr];
            *reinterpret_cast<uint2 *>(out0 + (int64_t)2 * (16 * half + u) * MLA_D_V) =
                make_uint2(mla_bf16x2(mla_finish(acc[u].x, has_sink, empty, osc), mla_finish(acc[u].y, has_sink, empty, osc)),
                           mla_bf16x2(mla_finish(acc[u].z, has_sink, empty, osc), mla_finish(acc[u].w, has_sink, empty, osc)));
        }
    }
}

/* ---- the launcher ---- */

static inline int64_t mla_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The plan kernel's blocks, split counts and (split_count) first blocks, int32, when they sit in shared memory. */
static inline int64_t mla_plan_smem_bytes(int64_t batch, int algo, int64_t max_splits) {
    return batch * (2 + (algo == MLA_SPLIT_COUNT ? max_splits : 0)) * (int64_t)sizeof(int32_t);
}

/* The plan of a call (no workspace yet); sms: the multiprocessors split_count plans for. */
static inline mla_run mla_plan_of(const kp_mla_args *a, int algo, int64_t sms) {
    mla_run r = {};
    r.q = a->q, r.cache = static_cast<const uint8_t *>(a->cache), r.indices = a->indices, r.topk_length = a->topk_length;
    r.sink = a->attn_sink, r.out = a->out, r.lse = a->lse, r.max_logits = a->max_logits, r.splits = a->splits;
    r.batch = a->batch, r.s_q = a->s_q, r.h_q = a->h_q, r.topk = a->topk, r.slots = a->slots;
    r.groups = (int32_t)(a->h_q / MLA_HEADS);
    r.sm_scale = a->sm_scale;
    r.scale_log2 = a->sm_scale * MLA_LOG2E;
    r.parts = kp_mla_sm_parts(sms, a->s_q, a->h_q);
    const int64_t blocks = kp_mla_blocks(a->topk);
    r.max_splits = blocks + 1;
    r.plan_in_smem = mla_plan_smem_bytes(a->batch, algo, r.max_splits) <= MLA_PLAN_SMEM_MAX;
    if (algo == MLA_SPLIT_COUNT) /* every split but a request's last ends a part */
        r.max_items = a->batch + r.parts < a->batch * blocks ? a->batch + r.parts : a->batch * blocks;
    else
        r.max_items = a->batch * kp_mla_split_size_splits(blocks);
    return r;
}

/* The workspace's pieces at base (NULL: only the size); returns the bytes. */
static inline size_t mla_workspace_layout(mla_run *r, unsigned char *base, int algo) {
    size_t off = 0;
    auto take = [&](size_t bytes) {
        unsigned char *p = base ? base + off : NULL;
        off += (bytes + 255) & ~(size_t)255;
        return p;
    };
    const size_t B = (size_t)r->batch, items = (size_t)r->max_items, heads = (size_t)(r->s_q * r->h_q);
    r->plan_blocks = r->plan_in_smem ? NULL : (int32_t *)take(sizeof(int32_t) * B);
    r->plan_splits = r->plan_in_smem ? NULL : (int32_t *)take(sizeof(int32_t) * B);
    r->first = algo == MLA_SPLIT_COUNT ? (int32_t *)take(sizeof(int32_t) * B * (size_t)r->max_splits) : NULL;
    r->item_base = (int32_t *)take(sizeof(int32_t) * (B + 1));
    r->items = (int4 *)take(sizeof(int4) * items);
    r->counters = (int32_t *)take(sizeof(int32_t) * B * (size_t)(r->s_q * r->groups));
    r->split_lse = (float *)take(sizeof(float) * items * heads);
    r->split_max = (float *)take(sizeof(float) * items * heads);
    r->split_out = (float *)take(sizeof(float) * items * heads * MLA_D_V);
    return off;
}

/* Why these impls refuse the args, NULL if they run them: the host port's reasons (kernels/host/mla.c), then
 * what this tiling needs. */
static inline const char *mla_cuda_problem(const kp_mla_args *a) {
    if (a->batch < 1 || a->s_q < 1 || a->slots < 1) return "batch, s_q or slots below 1";
    if (a->h_q < 64 || a->h_q % 64) return "h_q is not a positive multiple of 64";
    if (a->topk < 64 || a->topk % 64) return "topk is not a positive multiple of 64";
    if (a->cache_format != KP_MLA_CACHE_FP8_DS_MLA && a->cache_format != KP_MLA_CACHE_BF16) return "cache_format";
    if (!(a->sm_scale > 0.0f) || isinf(a->sm_scale)) return "sm_scale is not positive and finite";
    if (a->topk > MLA_MAX_TOPK) return "topk above 16384 (the combine stages 256 splits' weights in shared memory)";
    if (a->batch > MLA_MAX_BATCH || a->s_q > (1 << 16) || a->h_q > (1 << 16))
        return "batch above 2^22, or s_q or h_q above 2^16 (the plan's sums and the grid)";
    const mla_run r = mla_plan_of(a, MLA_SPLIT_COUNT, 1 << 16);
    const mla_run rs = mla_plan_of(a, MLA_SPLIT_SIZE, 1);
    const int64_t most = r.max_items > rs.max_items ? r.max_items : rs.max_items;
    if (most * a->s_q * (a->h_q / 64) > INT32_MAX) return "(request, split, row, head group) CTAs above 2^31 - 1";
    /* cp.async and vector stores: what cudaMalloc gives; checked on the pointer values only */
    if (((uintptr_t)a->q | (uintptr_t)a->cache | (uintptr_t)a->workspace) & 15 || (uintptr_t)a->out & 7)
        return "q, cache or the workspace not 16-byte aligned, or out not 8-byte aligned";
    return NULL;
}

static inline int mla_cuda_check(const char *name, const void *args, char *message, size_t message_len) {
    const char *why = mla_cuda_problem(static_cast<const kp_mla_args *>(args));
    if (!why) return KP_RUN_OK;
    return kp_cuda_fail_msg(message, message_len, KP_RUN_NOT_SUPPORTED, "%s: %s", name, why);
}

/* The multiprocessors split_count plans for: args->sm_count, else the current device's (0 on error). */
static inline int64_t mla_sms(const kp_mla_args *a) {
    if (a->sm_count > 0) return a->sm_count;
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return sms;
}

static inline size_t mla_cuda_workspace_bytes(const void *args, int algo) {
    const kp_mla_args *a = static_cast<const kp_mla_args *>(args);
    if (mla_cuda_problem(a)) return 0;
    const int64_t sms = mla_sms(a);
    if (sms <= 0) return 0;
    mla_run r = mla_plan_of(a, algo, sms);
    return mla_workspace_layout(&r, NULL, algo);
}

/* Per device, once: the attention kernels' shared memory limit, and whether the code is sm_90 (PDL). */
struct mla_device {
    bool ready, sm90;
};
#define MLA_MAX_DEVICES 64

static int mla_device_ready(mla_device *d, char *message, size_t message_len) {
    if (d->ready) return KP_RUN_OK;
    cudaFuncAttributes fa;
    KP_CUDA_CHECK(cudaFuncGetAttributes(&fa, mla_attend_kernel<true>));
    d->sm90 = fa.binaryVersion >= 90;
    const cudaFuncAttribute smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
    KP_CUDA_CHECK(cudaFuncSetAttribute(mla_attend_kernel<true>, smem, MLA_SMEM_BYTES));
    KP_CUDA_CHECK(cudaFuncSetAttribute(mla_attend_kernel<false>, smem, MLA_SMEM_BYTES));
    d->ready = true;
    return KP_RUN_OK;
}

template <int ALGO>
static int mla_cuda_run(const char *name, const void *args, char *message, size_t message_len) {
    const int rc = mla_cuda_check(name, args, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    const kp_mla_args *a = static_cast<const kp_mla_args *>(args);
    int device = 0, sms = a->sm_count;
    KP_CUDA_CHECK(cudaGetDevice(&device));
    if (sms <= 0) KP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    mla_run r = mla_plan_of(a, ALGO, sms);
    const size_t need = mla_workspace_layout(&r, NULL, ALGO);
    if (!a->workspace || a->workspace_bytes < need)
        return kp_cuda_fail_msg(message, message_len, KP_RUN_FAILED,
                                "%s: the workspace is missing or smaller than workspace_bytes() (%zu bytes)", name, need);
    mla_workspace_layout(&r, static_cast<unsigned char *>(a->workspace), ALGO);

    static std::mutex lock;
    static mla_device devices[MLA_MAX_DEVICES];
    bool sm90;
    {
        std::lock_guard<std::mutex> hold(lock);
        mla_device scratch = {};
        mla_device *d = device < MLA_MAX_DEVICES ? &devices[device] : &scratch;
        const int ready = mla_device_ready(d, message, message_len);
        if (ready != KP_RUN_OK) return ready;
        sm90 = d->sm90;
    }
    cudaStream_t stream = static_cast<cudaStream_t>(a->stream);
    const size_t plan_smem = r.plan_in_smem ? (size_t)mla_plan_smem_bytes(r.batch, ALGO, r.max_splits) : 0;
    mla_plan_kernel<ALGO><<<1, MLA_PLAN_THREADS, plan_smem, stream>>>(r);
    KP_LAUNCH_CHECK("mla_plan_kernel");
    const unsigned grid = (unsigned)(r.max_items * r.s_q * r.groups);
    if (a->cache_format == KP_MLA_CACHE_FP8_DS_MLA)
        KP_CUDA_CHECK(launch_after(sm90, mla_attend_kernel<true>, grid, MLA_THREADS, MLA_SMEM_BYTES, stream, r));
    else
        KP_CUDA_CHECK(launch_after(sm90, mla_attend_kernel<false>, grid, MLA_THREADS, MLA_SMEM_BYTES, stream, r));
    return KP_RUN_OK;
}

#endif
