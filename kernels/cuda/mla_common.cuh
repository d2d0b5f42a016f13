/* mla_common.cuh: what the sparse MLA decode's plan, attention kernel and launcher share: the sizes, the
 * shared-memory map, struct mla_run, the small device helpers and the combine of one (row, head). Overview: mla_cuda.cuh. */
#ifndef KP_MLA_COMMON_CUH
#define KP_MLA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <math.h>

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
    float *split_l; /* [max_items, s_q, h_q]: a split's l, which mla_wg.cuh's combine divides its weight by */
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

/* What one attention CTA works on (blockIdx.x: item, query row, 64-head group, the group fastest): its request b, row,
 * first head, split count and block range, and the row's counted length. False for a CTA past the plan's items. */
struct mla_cta {
    int64_t item, b, row, h0, len;
    int qi, g, ns;
    int32_t blk0, blk1;
};
__device__ __forceinline__ bool mla_cta_of(const mla_run &r, mla_cta &c) {
    const int64_t per_item = r.s_q * r.groups;
    c.item = blockIdx.x / per_item;
    c.qi = (int)((blockIdx.x % per_item) / r.groups), c.g = (int)(blockIdx.x % r.groups);
    const int4 it = r.items[c.item]; /* item < max_items: in the array, though past n_items never written */
    if (c.item >= r.item_base[r.batch]) return false;
    c.b = it.x, c.row = c.b * r.s_q + c.qi, c.h0 = (int64_t)c.g * MLA_HEADS;
    c.ns = it.y, c.blk0 = it.z, c.blk1 = it.w;
    c.len = mla_row_len(r, c.row);
    return true;
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
/* Two floats as bf16 bits, lo in the low half: kp_bf16_bits's, by the hardware's conversion (to nearest, even; the same
 * bits for every number) with a NaN's half its top 16 bits (kp_bf16_bits truncates a NaN, the hardware makes it
 * canonical), without a branch: kp_bf16_bits unrolled in the combine's out loop was code the instruction cache missed
 * (MEASURED.md). */
__device__ __forceinline__ uint32_t mla_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u, top;
    memcpy(&u, &h, sizeof u);
    asm("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(top) : "r"(__float_as_uint(lo)), "r"(__float_as_uint(hi)));
    const uint32_t nan = (isnan(lo) ? 0x0000ffffu : 0u) | (isnan(hi) ? 0xffff0000u : 0u);
    return (u & ~nan) | (top & nan);
}

/* The combine's two parts for one (query row, 64-head group) of ns splits, in split order, over 256 threads (tid):
 * mla_combine_heads on thread hr < 64: head hr's plan from lse_at(sp), its weights into wts [64][ns] (which may be
 * where lse_at reads: each slot is read before it is written), o_scale and empty, and its lse and max logit (the largest
 * max_at(sp)) out; then, after a barrier, mla_combine_out: thread t adds dims 4 (t % 128) .. + 3 of heads t / 128 + 2 k,
 * k < 32, load(sp, k) giving split sp's float4 of them, in two halves of 16 loads in flight a split, and writes out. */
template <typename LseAt, typename MaxAt>
__device__ __forceinline__ void mla_combine_heads(const mla_run &r, int64_t head_at, int64_t h0, int hr, int ns, float *wts,
                                                  float *osc, int *empty, LseAt lse_at, MaxAt max_at) {
    const mla_head hd = mla_head_plan(ns, lse_at, r.sink, h0 + hr);
    float mx = -INFINITY;
    for (int sp = 0; sp < ns; sp++) {
        wts[hr * ns + sp] = hd.empty ? 0.0f : mla_weight(hd, lse_at(sp));
        mx = mla_max(mx, max_at(sp));
    }
    osc[hr] = hd.o_scale;
    empty[hr] = hd.empty;
    r.lse[head_at + hr] = mla_lse_out(hd);
    r.max_logits[head_at + hr] = mx;
}
template <typename Load>
__device__ __forceinline__ void mla_combine_out(const mla_run &r, int64_t head_at, int ns, int tid, const float *wts,
                                                const float *osc, const int *empty, Load load, int half0 = 0, int half1 = 2) {
    const bool has_sink = r.sink != NULL;
    uint16_t *out0 = r.out + (head_at + (tid >> 7)) * MLA_D_V + 4 * (tid & 127);
#pragma unroll 1
    for (int half = half0; half < half1; half++) { /* half h: heads [32 h, 32 h + 32) */
        float4 acc[16];
#pragma unroll
        for (int u = 0; u < 16; u++) acc[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int sp = 0; sp < ns; sp++) {
            float4 x[16];
#pragma unroll
            for (int u = 0; u < 16; u++) x[u] = load(sp, 16 * half + u);
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
            const bool none = empty[hr] != 0;
            const float sc = osc[hr];
            *reinterpret_cast<uint2 *>(out0 + (int64_t)2 * (16 * half + u) * MLA_D_V) =
                make_uint2(mla_bf16x2(mla_finish(acc[u].x, has_sink, none, sc), mla_finish(acc[u].y, has_sink, none, sc)),
                           mla_bf16x2(mla_finish(acc[u].z, has_sink, none, sc), mla_finish(acc[u].w, has_sink, none, sc)));
        }
    }
}

/* The combine of a request's splits for one (query row, 64-head group), by the CTA whose split arrives last (an atomic
 * counter, not on values), every split's values from the workspace: tid is the thread's index among the MLA_THREADS
 * (256) that take part, and sync() their barrier; wts [64][ns], osc [64], empty [64] and flag are the CTA's shared
 * scratch. Returns at once in every CTA but the last. */
template <typename Sync>
__device__ __forceinline__ void mla_combine_last(const mla_run &r, int64_t b, int qi, int g, int ns, int tid, float *wts,
                                                 float *osc, int *empty, int *flag, Sync sync) {
    const int64_t row = b * r.s_q + qi, h0 = (int64_t)g * MLA_HEADS, head_at = row * r.h_q + h0;
    __threadfence();
    sync();
    if (tid == 0) *flag = atomicAdd(&r.counters[row * r.groups + g], 1) == ns - 1;
    sync();
    if (!*flag) return;
    __threadfence();
    const int64_t item0 = r.item_base[b];
    if (tid < MLA_HEADS) {
        const int hr = tid;
        auto split_at = [&](int sp) { return ((item0 + sp) * r.s_q + qi) * r.h_q + h0 + hr; };
        mla_combine_heads(r, head_at, h0, hr, ns, wts, osc, empty, [&](int sp) { return __ldcg(r.split_lse + split_at(sp)); },
                          [&](int sp) { return __ldcg(r.split_max + split_at(sp)); });
    }
    sync();
    const int64_t split_stride = r.s_q * r.h_q * (MLA_D_V / 4); /* float4s from one split to the next */
    const float4 *base4 = reinterpret_cast<const float4 *>(r.split_out) + ((item0 * r.s_q + qi) * r.h_q + h0) * (MLA_D_V / 4) + tid;
    mla_combine_out(r, head_at, ns, tid, wts, osc, empty, [&](int sp, int k) { return __ldcg(base4 + sp * split_stride + k * 256); });
}

#endif
