/* mla_attn.cuh: the sparse MLA decode's second launch, mla_attend_kernel: attention over one split on tensor
 * cores, and the combine of a request's splits by the last to arrive, with its token loads. Overview: mla_cuda.cuh. */
#ifndef KP_MLA_ATTN_CUH
#define KP_MLA_ATTN_CUH

#include <cuda_bf16.h>

#include <math.h>

#include "../mla_plan.h"
#include "kp_cuda.cuh"
#include "mla_common.cuh"

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
    mla_cta c;
    if (!mla_cta_of(r, c)) return;
    const int64_t item = c.item, b = c.b, row = c.row, h0 = c.h0, len = c.len;
    const int qi = c.qi, g = c.g, ns = c.ns;
    const int32_t blk0 = c.blk0, blk1 = c.blk1;
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
    mla_combine_last(r, b, qi, g, ns, tid, reinterpret_cast<float *>(sm + MLA_K_AT), st + MLA_ST_OSC, st_i + MLA_ST_EMPTY,
                     st_i + MLA_ST_FLAG, [] { __syncthreads(); });
}

#endif
