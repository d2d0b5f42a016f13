/* moe_gemm.cuh: steps 4 and 5 of moe_cuda.cuh, the tensor-core GEMMs (moe_gemm_kernel<GEMM, ALGO>) and the
 * cp.async, mma.sync, ldmatrix and NVFP4 decode helpers they are built from.
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
 */
#ifndef KP_MOE_GEMM_CUH
#define KP_MOE_GEMM_CUH

#include <limits.h>

#include "moe_common.cuh"

/* ---- the GEMMs' device helpers ---- */

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

#endif
