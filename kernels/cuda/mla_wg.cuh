/* mla_wg.cuh: mla.split_size_wg@cuda's attention kernel, mla_wg_kernel: split_size's plan and combine (mla_cuda.cuh)
 * around a core on sm_90a's warpgroup matrix multiply (wgmma), with the dequantization of the next 64-token block
 * overlapped with the matrix work on this one. Built only for sm_90a (CMakeLists.txt); the impl refuses other devices.
 *
 * A CTA (384 threads, three warpgroups) per (request, split, query row, 64-head group), as mla_attend_kernel's:
 *   - warpgroup 2, the producer, fills K tile s (of two) with block n's tokens: each thread reads a quarter of two
 *     tokens' 656 bytes with 16-byte loads (four lanes a token, so a warp's load reads 64 contiguous bytes of each of
 *     8 tokens), dequantizes its e4m3 codes to the bits mla_dequant2 gives (bf16(e4m3 * bf16(scale)):
 *     mla_wg_dequant2; the f32 path, a loop, where the multiplier overflows), copies its RoPE quarter by cp.async,
 *     stores them in the layout wgmma reads (128-byte swizzle) and arrives on full[s]; a token that does not count is
 *     zeros, never read. It waits on empty[s] before reusing a tile, its first token's loads already issued. A
 *     block's slots are read a block ahead and its tokens sent towards L2 two blocks ahead, so the loads meet L2's
 *     latency. It starts while the math warpgroups load Q.
 *   - warpgroup 0 scores: S = Q K^T for all 64 heads x 64 tokens over the 576 dims (wgmma m64n64k16, Q and K from
 *     shared memory), the softmax in the log2 domain (running max from -1e30, rescale exp2f(m - mnew), p = 2^(s - m)
 *     with subnormal p flushed to 0, P rounded to bf16, l summed in f32; maxima and sums as trees, shorter chains for
 *     a warp alone on its scheduler), P [64 heads][64 tokens] and the rescale through shared memory to warpgroup 1
 *     (mbarrier pready), then O += P V over dims [0, 256), its P from its own registers (the accumulator layout of
 *     S is the A operand's), so it waits for no other thread's P.
 *   - warpgroup 1 rescales its O and adds P V over dims [256, 512), then frees P (mbarrier pfree): its P V runs while
 *     warpgroup 0 scores the next block. Both P V are wgmma m64n256k16, V read as N-major from the same K tile: 128 f32
 *     accumulators a thread.
 *   A block with no counted slot is skipped whole by both (the mask the producer publishes, read by each warp's lane 0).
 *   Every hand-off is one compute-sanitizer racecheck follows: mbarriers every thread arrives on (a bar.arrive, or a
 *   lane-0 arrival for its warp, it does not take as ordering: scripts/racecheck-probe.cu), and in the epilogue
 *   barriers over the whole CTA, the producer waiting at them.
 * A split's O goes out unscaled, staged in the free K tiles so one small loop writes it, with its l, lse and max logit:
 * the combine adds RN(c O) over the splits in order, c a head's weight over its l (mla_wg_coef), one division a head
 * instead of one an element. A request of one split finishes there. CTAs run in clusters of two, items 2 p and 2 p + 1
 * of the plan: a request's two splits there combine through each other's shared memory, each CTA half the heads
 * (mla_wg_pair_combine), their outs never in the workspace, no wait.
 * Otherwise a split of several arrives first (a counter), then writes its O unless it is the last to arrive, which
 * combines from its own O in shared memory and the others' once they are written (mla_wg_combine). Both are the same
 * arithmetic in the same order, so a request's bits do not depend on which way it went.
 * Whole runs (mla_wg_kernel<FP8, true>, the launcher's choice once one split a CTA would need more CTAs than SMs, h_q a
 * multiple of 128): a CTA per (request, query row, head group) runs the request's splits one after another, each
 * split leaving for the workspace as its own CTA would (from the registers, then a fresh start) and the last
 * combining them; the cluster is then the request's two head groups, whose producers each dequantize one round (32
 * tokens) of every block and copy it into the peer's tile with the copy engine (cp.async.bulk, counted in bytes on
 * the peer's full barrier; empty barriers count both CTAs' math warps), loading the next block's round while storing
 * this one's. The same splits, the same combine: the bits are those of one split a CTA.
 *
 * Numerics against split_size@cuda: the same dequantized values and plan; dot products and l add in another order
 * (the tensor cores' and the trees), p below 2^-126 is 0, and the combine scales O by w / l where split_size's
 * divides O by l and scales by w, so bits differ from it by rounding. Every order here is fixed by the code and the
 * request alone, so bits do not depend on the batch or the run.
 *
 * Shared memory (232,008 bytes with the slack that puts the map on a 1024-byte boundary, as ncu reports it):
 * Q [9 panels][64 heads][128 bytes] (a panel: 64 of the 576 dims, rows 128 bytes with 16-byte chunk c of row r at
 * c ^ (r % 8): the 128-byte swizzle), K [2 tiles][9 panels][64 tokens][128 bytes],
 * P [64 heads][128 bytes] (the same swizzle), then the statistics, the masks and the mbarriers. */
#ifndef KP_MLA_WG_CUH
#define KP_MLA_WG_CUH

#include "mla_common.cuh"

#define MLA_WG_THREADS 384
#define MLA_WG_MATH 256     /* warpgroups 0 and 1 */
#define MLA_WG_PANEL 8192   /* 64 rows x 128 bytes */
#define MLA_WG_Q_AT 0
#define MLA_WG_K_AT (9 * MLA_WG_PANEL)
#define MLA_WG_KTILE (9 * MLA_WG_PANEL)
#define MLA_WG_P_AT (MLA_WG_K_AT + 2 * MLA_WG_KTILE)
#define MLA_WG_ST_AT (MLA_WG_P_AT + MLA_WG_PANEL)
/* statistics, in floats from MLA_WG_ST_AT */
#define MLA_WG_XSC 0      /* [64] the block's rescale, warpgroup 0 to 1 */
#define MLA_WG_XL 0       /* [64] l, at the end (warpgroup 1 is past its last read of XSC) */
#define MLA_WG_XMD 128    /* [64] max dot, at the end */
#define MLA_WG_OSC 256    /* [64] the combine's o_scale */
#define MLA_WG_EMPTY 320  /* [64] int: the combined row is empty */
#define MLA_WG_FLAG 384   /* int: this CTA combines */
#define MLA_WG_EP_NONE 5 /* the epilogue's per-head "no split counted" after five per-head floats (in the P buffer) */
#define MLA_WG_MASK 386   /* u64 [2]: a tile's counted tokens */
#define MLA_WG_FULL 390   /* u64 [2] mbarriers: tile s filled (128 producer arrivals) */
#define MLA_WG_EMPTYB 394 /* u64 [2] mbarriers: tile s read (8 math warps) */
#define MLA_WG_PREADY 398 /* u64 mbarrier: P and the rescale written (warpgroup 0's 128 threads) */
#define MLA_WG_PFREE 400  /* u64 mbarrier: P and the rescale read (warpgroup 1's 128 threads) */
#define MLA_WG_ST_BYTES (402 * 4)
/* the swizzle's pattern repeats every 1024 bytes from a 1024-byte boundary: the map starts at the first one */
#define MLA_WG_SMEM_BYTES (MLA_WG_ST_AT + MLA_WG_ST_BYTES + 1024)

/* Panel byte offset of 16-byte chunk c (0..7) of row r under the 128-byte swizzle. */
__device__ __forceinline__ uint32_t mla_sw128(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

/* A wgmma shared-memory descriptor, 128-byte swizzle: start address, leading and stride byte offsets (16-byte units).
 * K-major operands (Q, K as B of Q K^T, P): the leading offset is unused, the stride 1024 bytes (8 rows of 128 bytes).
 * N-major V: the leading offset is the next 64 dims (a panel, 8192 bytes), the stride the next 8 tokens (1024). */
__device__ __forceinline__ uint64_t mla_desc(uint32_t addr, uint32_t lead, uint32_t stride) {
    return (uint64_t)((addr & 0x3ffffu) >> 4) | (uint64_t)((lead & 0x3ffffu) >> 4) << 16 |
           (uint64_t)((stride & 0x3ffffu) >> 4) << 32 | (uint64_t)1 << 62;
}
/* Descriptor d moved on by bytes: the start address is its low 14 bits (in 16-byte units), and every operand here ends
 * below 256 KB, so the sum stays in the field. Built once, moved by constants in the loops. */
__device__ __forceinline__ uint64_t mla_desc_add(uint64_t d, uint32_t bytes) {
    return (d & 0xffffffff00000000ull) | (uint32_t)((uint32_t)d + (bytes >> 4));
}
#ifndef MLA_WG_V_SWAP
#define MLA_WG_V_LEAD MLA_WG_PANEL
#define MLA_WG_V_STRIDE 1024
#else /* the other reading of the two offsets for N-major operands, kept to try on the device */
#define MLA_WG_V_LEAD 1024
#define MLA_WG_V_STRIDE MLA_WG_PANEL
#endif

__device__ __forceinline__ void mla_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mla_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mla_wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Keeps the compiler from moving uses of an accumulator across a wgmma fence or wait. */
__device__ __forceinline__ void mla_wg_pin(float &x) { asm volatile("" : "+f"(x)::"memory"); }

/* The 128 accumulators of an m64n256 wgmma as asm operands %0..%127 ("+f"), for the two P V forms below. */
#define MLA_WG_ACC128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MLA_WG_ACC128_OUT(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

/* d += A B: m64n256k16, A K-major and B N-major (transposed) in shared memory. */
__device__ __forceinline__ void mla_wgmma_pv(float (&d)[128], uint64_t a, uint64_t b) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 MLA_WG_ACC128
                 "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
                 : MLA_WG_ACC128_OUT(d)
                 : "l"(a), "l"(b), "n"(1));
}

/* d += A B: m64n256k16, A (16 tokens of P, bf16 pairs) from this thread's registers in the accumulator layout of
 * m64n64 (a0: row r0, a1: row r0 + 8, a2 and a3 the same rows 8 columns on), B N-major (transposed) in shared memory. */
__device__ __forceinline__ void mla_wgmma_pv_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 MLA_WG_ACC128
                 "}, {%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n}\n"
                 : MLA_WG_ACC128_OUT(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

/* d (+)= A B: m64n64k16, bf16 in, f32 accumulate, A and B K-major in shared memory; accumulate 0 overwrites d. */
__device__ __forceinline__ void mla_wgmma_qk(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b), "r"(accumulate));
}

/* Two floats rounded to bf16 (to nearest, even) by the hardware's conversion, lo in the low half. */
__device__ __forceinline__ uint32_t mla_wg_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* 2^x, subnormal results flushed to +0 (ex2.approx.ftz: -inf gives +0, NaN stays NaN) */
__device__ __forceinline__ float mla_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Named barrier id over count threads. */
__device__ __forceinline__ void mla_bar_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }

/* Every thread of the CTA, each at its own instruction (barrier.sync without .aligned): the epilogue's hand-offs, where
 * the producer warpgroup, done, waits with the math */
__device__ __forceinline__ void mla_wg_cta_sync() { asm volatile("barrier.sync 0;\n" ::: "memory"); }
__device__ __forceinline__ void mla_named_sync(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(MLA_WG_MATH) : "memory"); }
template <int N>
__device__ __forceinline__ void mla_setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void mla_setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

/* The tile multiplier's power of two: mla_wg_dequant8's codes read as bf16 are their values times 2^-120. */
#define MLA_WG_MULT_EXP 0x1p120f
/* Two e4m3 codes, bytes sel of codes (0x1404: bytes 0 and 1; 0x3424: 2 and 3), times the bf16x2 multiplier
 * bf16(scale) * 2^120, as bf16x2 bits, the bits mla_dequant2 gives with a byte move where it converts to f16: a code
 * moved to bits 8..15 of its half, its sign kept and its 7 exponent and mantissa bits shifted into bf16's bits 4..10,
 * is a bf16 of its value times 2^-120 (e4m3's bias is 7, bf16's 127; subnormal codes become subnormal bf16s, which the
 * FMA takes as they are), and the FMA (with -0, which keeps a zero product's sign) rounds the exact product once to
 * nearest even. Checked against mla_dequant2 on every pair of codes (MEASURED.md); a NaN code reads as a finite value
 * (mla_cuda.cuh's difference 3). */
__device__ __forceinline__ uint32_t mla_wg_dequant2(uint32_t codes, uint32_t sel, uint32_t mult) {
    uint32_t t, d;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(t) : "r"(codes), "r"(sel));
    const uint32_t v = (t & 0x80008000u) | ((t >> 4) & 0x07f007f0u);
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(v), "r"(mult), "r"(0x80008000u));
    return d;
}
/* Eight e4m3 codes (a uint2) as eight bf16 (a uint4) through tile multiplier mult. */
__device__ __forceinline__ uint4 mla_wg_dequant8(uint2 codes, uint32_t mult) {
    return make_uint4(mla_wg_dequant2(codes.x, 0x1404u, mult), mla_wg_dequant2(codes.x, 0x3424u, mult),
                      mla_wg_dequant2(codes.y, 0x1404u, mult), mla_wg_dequant2(codes.y, 0x3424u, mult));
}

/* bytes at src (16-byte aligned, a multiple of 16) towards L2, without waiting or registers: the producer's loads of a
 * later block then meet L2's latency, not memory's */
__device__ __forceinline__ void mla_prefetch_l2(const void *src) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src)); }

/* The cluster's CTAs (two here) past this point, each thread at its own instruction, their shared-memory writes before it
 * seen by the other's reads after it. */
__device__ __forceinline__ void mla_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
/* The cluster's CTAs past this point, ordering no memory: for the start, the mbarriers' inits being released by
 * mla_mbar_init's fence, and for the exits of whole runs, where every remote operation into a CTA is one its own
 * mbarrier waits count (the release's GPU-scope membar waited on the loads and stores in flight). */
__device__ __forceinline__ void mla_cluster_meet() {
    asm volatile("barrier.cluster.arrive.relaxed;\nbarrier.cluster.wait;\n" ::: "memory");
}
/* Two floats to global memory, kept in L2 by policy pol (mla_keep_policy). */
__device__ __forceinline__ void mla_st_keep(float *p, float a, float b, uint64_t pol) {
    asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;" ::"l"(p), "f"(a), "f"(b), "l"(pol) : "memory");
}
__device__ __forceinline__ uint64_t mla_keep_policy() {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
/* The address in the cluster's shared window of this CTA's shared address a, in the CTA of cluster rank peer. */
__device__ __forceinline__ uint32_t mla_peer(uint32_t a, uint32_t peer) {
    uint32_t d;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(peer));
    return d;
}
__device__ __forceinline__ float mla_peer_f32(uint32_t a) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ float4 mla_peer_f4(uint32_t a) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
    return v;
}

/* bytes from this CTA's shared memory at src to the peer's at rdst, by the copy engine, counted on the peer's rbar. */
__device__ __forceinline__ void mla_bulk_to_peer(uint32_t rdst, uint32_t src, uint32_t bytes, uint32_t rbar) {
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(rdst),
                 "r"(src), "r"(bytes), "r"(rbar)
                 : "memory");
}
/* An arrival on the peer's mbarrier rbar. */
__device__ __forceinline__ void mla_mbar_arrive_peer(uint32_t rbar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(rbar) : "memory");
}

/* O's rows r0 and r0 + 8 times their block rescale; skipped when the warp's are all 1 (the running max did not move),
 * which changes no bit. */
__device__ __forceinline__ void mla_wg_rescale(float (&o)[128], float sc0, float sc1) {
    if (!__any_sync(0xffffffffu, sc0 != 1.0f || sc1 != 1.0f)) return;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        o[4 * i] = __fmul_rn(o[4 * i], sc0), o[4 * i + 1] = __fmul_rn(o[4 * i + 1], sc0);
        o[4 * i + 2] = __fmul_rn(o[4 * i + 2], sc1), o[4 * i + 3] = __fmul_rn(o[4 * i + 3], sc1);
    }
}

/* A tile's mask, read by lane 0 and passed to its warp (the tile is freed by lane 0's arrival on its empty barrier, so
 * only lane 0's read needs ordering before the producer's next write) */
__device__ __forceinline__ uint64_t mla_wg_mask(const uint64_t *mask, int lane) {
    uint64_t m = 0;
    if (lane == 0) m = *mask;
    return __shfl_sync(0xffffffffu, m, 0);
}

/* The slot of token tok (0..63) of block n, -1 past the CTA's blocks or the row's length. */
__device__ __forceinline__ int32_t mla_wg_slot(const mla_run &r, int64_t row, int64_t len, int32_t n, int32_t blk1, int tok) {
    const int64_t pos = (int64_t)n * KP_MLA_BLOCK + tok;
    return n < blk1 && pos < len ? __ldg(r.indices + row * r.topk + pos) : -1;
}

/* Producer thread pt (warp w, lane l) fills token 8 w + l / 4 of the block's first 32 (u = 0) and token 32 + 8 w + l / 4
 * of the last 32 (u = 1), a quarter of each: chunks 4 j + l % 4 (j = 0..7, one a panel) of its codes and RoPE chunks
 * 2 (l % 4) and + 1. A warp's 16-byte load then reads 64 contiguous bytes of each of 8 tokens, one or two 128-byte
 * lines a token (a lane a token would make it a line a lane: the L1 handles a load a line at a time), and a phase of
 * 8 lanes stores 2 rows, whose swizzles (r % 8 even and odd) put its 8 chunks on 8 bank groups. */
__device__ __forceinline__ int mla_wg_tok(int pt, int u) { return 32 * u + 8 * (pt >> 5) + ((pt & 31) >> 2); }

/* A token's bytes towards L2 when its slot counts: quarter q of it sends 128-byte lines q and q + 4 */
template <bool FP8>
__device__ __forceinline__ void mla_wg_prefetch(const mla_run &r, int32_t idx, int q) {
    const int bytes = FP8 ? MLA_FP8_TOKEN : MLA_BF16_TOKEN;
    if (idx < 0 || idx >= r.slots) return;
    const uint8_t *src = r.cache + (int64_t)idx * bytes;
    const int64_t first = (int64_t)src & ~(int64_t)127, end = (int64_t)src + bytes;
#pragma unroll
    for (int i = 0; i < (bytes + 127) / 128 + 1; i += 4)
        if (first + 128 * (i + q) < end) mla_prefetch_l2(reinterpret_cast<const void *>(first + 128 * (i + q)));
}

/* Round u's loads of one token (its slot idx): the four tile scales and the thread's 8 code chunks, none waiting for
 * another. */
__device__ __forceinline__ void mla_wg_load(const mla_run &r, int32_t idx, int q, float4 &sc4, uint4 (&c)[8]) {
    const bool counted = idx >= 0 && idx < r.slots;
    const uint8_t *src = r.cache + (int64_t)(counted ? idx : 0) * MLA_FP8_TOKEN;
    sc4 = counted ? __ldg(reinterpret_cast<const float4 *>(src + 512)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < 8; j++) c[j] = counted ? __ldg(reinterpret_cast<const uint4 *>(src) + 4 * j + q) : make_uint4(0u, 0u, 0u, 0u);
}

/* The tile's 8-bit mask of round u's 8 tokens of this warp (lane 0 writes it), and the token's RoPE chunks by cp.async. */
template <bool FP8>
__device__ __forceinline__ void mla_wg_begin(const mla_run &r, unsigned char *kt, uint64_t *mask, int32_t idx, int pt, int u) {
    const int t = mla_wg_tok(pt, u), q = pt & 3;
    const bool counted = idx >= 0 && idx < r.slots;
    const uint32_t ball = __ballot_sync(0xffffffffu, counted);
    if ((pt & 31) == 0) {
        uint32_t b8 = 0; /* lane 4 i's bit is token i's */
#pragma unroll
        for (int i = 0; i < 8; i++) b8 |= ((ball >> (4 * i)) & 1u) << i;
        reinterpret_cast<uint8_t *>(mask)[t >> 3] = (uint8_t)b8;
    }
    const uint32_t k_s = mla_smem(kt);
    if (FP8) {
        const uint8_t *src = r.cache + (int64_t)(counted ? idx : 0) * MLA_FP8_TOKEN;
#pragma unroll
        for (int i = 0; i < 2; i++) /* RoPE: dims 512 + 8 (2 q + i) .. + 8, panel 8 */
            mla_cp16(k_s + 8 * MLA_WG_PANEL + mla_sw128(t, 2 * q + i), src + 528 + 16 * (2 * q + i), counted ? 16 : 0);
    } else { /* bf16: chunks q, q + 4, .. of the token's 72, copied */
        const unsigned char *src = r.cache + (int64_t)(counted ? idx : 0) * MLA_BF16_TOKEN;
#pragma unroll 6
        for (int j = 0; j < 18; j++) {
            const int ch = 4 * j + q;
            mla_cp16(k_s + (ch >> 3) * MLA_WG_PANEL + mla_sw128(t, ch & 7), src + 16 * ch, counted ? 16 : 0);
        }
    }
}

/* Round u's codes (c, with the scales sc4) dequantized into tile kt: chunk 4 j + q is panel j's chunks 2 q and 2 q + 1
 * of the token's row, through scale tile j / 2. A token with a tile whose multiplier overflows (bf16(scale) from 2^8
 * up: MLA_WG_MULT_EXP) takes a loop, not unrolled (so the loop stays small enough for the instruction cache), that
 * sends those tiles' chunks through the exact f32 path. REFILL (a producer with one round a block): c[j] and sc4 then
 * take the next block's token nidx, each load issued once its registers are free, so they are in flight during these
 * stores instead of after them. */
template <bool REFILL>
__device__ __forceinline__ void mla_wg_store(const mla_run &r, unsigned char *kt, int pt, int u, float4 &sc4, uint4 (&c)[8],
                                             int32_t nidx) {
    const int t = mla_wg_tok(pt, u), q = pt & 3;
    const float sbv[4] = {kp_bf16_round(sc4.x), kp_bf16_round(sc4.y), kp_bf16_round(sc4.z), kp_bf16_round(sc4.w)};
    uint32_t mult[4];
    bool exact = false;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float m = __fmul_rn(sbv[i], MLA_WG_MULT_EXP);
        exact |= isinf(m) && !isinf(sbv[i]);
        const uint32_t w = __float_as_uint(m) >> 16;
        mult[i] = w | (w << 16);
    }
    const bool ncounted = REFILL && nidx >= 0 && nidx < r.slots;
    const uint8_t *const nsrc = r.cache + (int64_t)(ncounted ? nidx : 0) * MLA_FP8_TOKEN;
    if (!exact) {
        if (REFILL) sc4 = ncounted ? __ldg(reinterpret_cast<const float4 *>(nsrc + 512)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            unsigned char *at = kt + j * MLA_WG_PANEL;
            *reinterpret_cast<uint4 *>(at + mla_sw128(t, 2 * q)) = mla_wg_dequant8(make_uint2(c[j].x, c[j].y), mult[j >> 1]);
            *reinterpret_cast<uint4 *>(at + mla_sw128(t, 2 * q + 1)) = mla_wg_dequant8(make_uint2(c[j].z, c[j].w), mult[j >> 1]);
            if (REFILL) c[j] = ncounted ? __ldg(reinterpret_cast<const uint4 *>(nsrc) + 4 * j + q) : make_uint4(0u, 0u, 0u, 0u);
        }
        return;
    }
#pragma unroll 1
    for (int j = 0; j < 8; j++) {
        uint4 cj = c[0]; /* c[j] by selects: indexed by the loop's j, c would live in local memory */
#pragma unroll
        for (int i = 1; i < 8; i++) cj = i == j ? c[i] : cj;
        const int tl = j >> 1;
        const float sb = tl == 0 ? sbv[0] : tl == 1 ? sbv[1] : tl == 2 ? sbv[2] : sbv[3];
        const float m = __fmul_rn(sb, MLA_WG_MULT_EXP);
        unsigned char *at = kt + j * MLA_WG_PANEL;
        uint4 lo, hi;
        if (isinf(m) && !isinf(sb)) {
            lo = make_uint4(mla_dequant2_f32(cj.x, sb), mla_dequant2_f32(cj.x >> 16, sb), mla_dequant2_f32(cj.y, sb),
                            mla_dequant2_f32(cj.y >> 16, sb));
            hi = make_uint4(mla_dequant2_f32(cj.z, sb), mla_dequant2_f32(cj.z >> 16, sb), mla_dequant2_f32(cj.w, sb),
                            mla_dequant2_f32(cj.w >> 16, sb));
        } else {
            const uint32_t w = __float_as_uint(m) >> 16;
            lo = mla_wg_dequant8(make_uint2(cj.x, cj.y), w | (w << 16));
            hi = mla_wg_dequant8(make_uint2(cj.z, cj.w), w | (w << 16));
        }
        *reinterpret_cast<uint4 *>(at + mla_sw128(t, 2 * q)) = lo;
        *reinterpret_cast<uint4 *>(at + mla_sw128(t, 2 * q + 1)) = hi;
    }
    if (REFILL) mla_wg_load(r, nidx, q, sc4, c);
}

/* A split's coefficient in the combine: its weight w (mla_weight) over its l, so that a split's out is its O unscaled and
 * the sum over splits adds RN(coefficient * O) in split order; 0 when w is 0 (a split that counted no slot has l 0).
 * One division a head, where dividing O by l took one an element (MEASURED.md). */
__device__ __forceinline__ float mla_wg_coef(float w, float l) { return w == 0.0f ? 0.0f : __fdiv_rn(w, l); }

/* The combine of a (row, head group) whose splits have all arrived and been written, by the last to arrive (the 256 math
 * threads): mla_combine_last's parts (mla_common.cuh) with each weight made a coefficient (mla_wg_coef), with split own's
 * lse, max, l and O from this CTA's shared memory (ep, ost) and the others' from the workspace; every split's lse, max
 * and l are staged first (in wts and two more [64][ns] after it), so that their loads are in flight together. */
static_assert(3 * MLA_HEADS * (MLA_MAX_TOPK / (KP_MLA_BLOCK * KP_MLA_SPLIT_BLOCKS)) * sizeof(float) <= 9 * MLA_WG_PANEL,
              "the combine's staging fits in Q's panels");
__device__ __forceinline__ void mla_wg_combine(const mla_run &r, int64_t b, int qi, int g, int ns, int own, int tid,
                                               const float *ost, const float *ep, float *wts, float *osc, int *empty) {
    const int64_t row = b * r.s_q + qi, h0 = (int64_t)g * MLA_HEADS, head_at = row * r.h_q + h0, item0 = r.item_base[b];
    if (tid < MLA_HEADS) {
        const int hr = tid;
        auto split_at = [&](int sp) { return ((item0 + sp) * r.s_q + qi) * r.h_q + h0 + hr; };
        float *const lw = wts + hr * ns;
        float *const mw = lw + MLA_HEADS * ns, *const lv = mw + MLA_HEADS * ns;
#pragma unroll 4
        for (int sp = 0; sp < ns; sp++) {
            const bool o = sp == own;
            const float a = o ? ep[3 * MLA_HEADS + hr] : __ldcg(r.split_lse + split_at(sp));
            const float m = o ? ep[4 * MLA_HEADS + hr] : __ldcg(r.split_max + split_at(sp));
            const float l = o ? ep[hr] : __ldcg(r.split_l + split_at(sp));
            lw[sp] = a, mw[sp] = m, lv[sp] = l;
        }
        mla_combine_heads(r, head_at, h0, hr, ns, wts, osc, empty, [&](int sp) { return lw[sp]; }, [&](int sp) { return mw[sp]; });
#pragma unroll 4
        for (int sp = 0; sp < ns; sp++) lw[sp] = mla_wg_coef(lw[sp], lv[sp]);
    }
    mla_wg_cta_sync();
    const int64_t split_stride = r.s_q * r.h_q * (MLA_D_V / 4); /* float4s from one split to the next */
    const float4 *base4 = reinterpret_cast<const float4 *>(r.split_out) + ((item0 * r.s_q + qi) * r.h_q + h0) * (MLA_D_V / 4) + tid;
    const float *own0 = ost + (tid >> 7) * MLA_OROW + 4 * (tid & 127);
    mla_combine_out(r, head_at, ns, tid, wts, osc, empty, [&](int sp, int k) {
        return sp == own ? *reinterpret_cast<const float4 *>(own0 + 2 * k * MLA_OROW) : __ldcg(base4 + sp * split_stride + k * 256);
    });
}

/* The combine of a request's two splits by the cluster that ran them, each CTA the 32 heads [32 rank, + 32) of its
 * (row, head group): the same parts and order as mla_wg_combine, split sp's lse, max, l and O read from the shared memory
 * of the CTA of rank sp (ep, ost), its own or its peer's, once both have passed the cluster barrier. */
__device__ __forceinline__ void mla_wg_pair_combine(const mla_run &r, int64_t row, int g, int rank, int tid, const float *ost,
                                                    const float *ep, float *wts, float *osc, int *empty) {
    const int64_t h0 = (int64_t)g * MLA_HEADS, head_at = row * r.h_q + h0;
    const uint32_t peer = (uint32_t)(rank ^ 1);
    if (tid < 32) {
        const int hr = 32 * rank + tid;
        auto splits = [&](int at, float (&v)[2]) { /* ep[at] of split 0 and split 1 */
            const float own = ep[at], other = mla_peer_f32(mla_peer(mla_smem(ep + at), peer));
            v[0] = rank == 0 ? own : other, v[1] = rank == 0 ? other : own;
        };
        float lse[2], mxs[2], l[2];
        splits(3 * MLA_HEADS + hr, lse);
        splits(4 * MLA_HEADS + hr, mxs);
        splits(hr, l);
        mla_combine_heads(r, head_at, h0, hr, 2, wts, osc, empty, [&](int sp) { return lse[sp]; }, [&](int sp) { return mxs[sp]; });
#pragma unroll
        for (int sp = 0; sp < 2; sp++) wts[hr * 2 + sp] = mla_wg_coef(wts[hr * 2 + sp], l[sp]);
    }
    mla_wg_cta_sync();
    const float *own0 = ost + (tid >> 7) * MLA_OROW + 4 * (tid & 127);
    const uint32_t peer0 = mla_peer(mla_smem(own0), peer);
    mla_combine_out(r, head_at, 2, tid, wts, osc, empty, [&](int sp, int k) {
        return sp == rank ? *reinterpret_cast<const float4 *>(own0 + 2 * k * MLA_OROW)
                          : mla_peer_f4(peer0 + (uint32_t)(2 * k * MLA_OROW * sizeof(float)));
    }, rank, rank + 1);
}

/* In clusters of two CTAs (blockIdx.x: pair p, query row, 64-head group pair or group, then the rank). Not WHOLE: items
 * 2 p and 2 p + 1 of the plan, which combine through each other's shared memory when they are a request's two splits,
 * else each goes the workspace's way. WHOLE: request p's head groups 2 i and 2 i + 1, each CTA all of its splits. */
template <bool FP8, bool WHOLE>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(MLA_WG_THREADS, 1) mla_wg_kernel(mla_run r) {
    extern __shared__ __align__(1024) unsigned char mla_wg_smem[];
    unsigned char *const sm = mla_wg_smem + ((1024 - (mla_smem(mla_wg_smem) & 1023)) & 1023);
    float *const st = reinterpret_cast<float *>(sm + MLA_WG_ST_AT);
    int *const st_i = reinterpret_cast<int *>(st);
    uint64_t *const masks = reinterpret_cast<uint64_t *>(st + MLA_WG_MASK);
    const uint32_t full0 = mla_smem(st + MLA_WG_FULL), empty0 = mla_smem(st + MLA_WG_EMPTYB);
    const uint32_t pready = mla_smem(st + MLA_WG_PREADY), pfree = mla_smem(st + MLA_WG_PFREE);

    pdl_wait();
    const int tid = threadIdx.x;
    const int64_t cta = blockIdx.x >> 1;
    const int rank = (int)(blockIdx.x & 1);
    /* WHOLE (the launcher's choice): the cluster is a request's head groups g and g + 1 (cross), each CTA
     * running all the request's splits one after another (item up to last) and dequantizing half of every tile into
     * both CTAs' tiles; else items 2 p and 2 p + 1 of the plan, one split a CTA */
    const bool cross = WHOLE;
    const int64_t half = r.groups >> 1, per = cross ? r.s_q * half : r.s_q * r.groups;
    const int64_t item = cross ? r.item_base[cta / per] : 2 * (cta / per) + rank;
    const int qi = cross ? (int)((cta % per) / half) : (int)((cta % per) / r.groups);
    const int g = cross ? (int)(2 * ((cta % per) % half) + rank) : (int)(cta % r.groups);
    const int32_t n_items = r.item_base[r.batch];
    if (item >= n_items) return; /* the grid covers the most items a plan can make, rounded up to a pair */
    const int4 it = r.items[item];
    const int64_t b = it.x, row = b * r.s_q + qi, h0 = (int64_t)g * MLA_HEADS;
    const int ns = it.y;
    const int64_t last_item = cross ? item + ns - 1 : item; /* the split whose O ends in registers */
    const bool pair = !cross && ns == 2 && item - r.item_base[b] == rank; /* and its peer, the request's other split, sees it too */
    const int32_t blk0 = it.z, blk1 = cross ? r.items[last_item].w : it.w;
    const int64_t len = mla_row_len(r, row);

    /* Q: 64 heads x 72 chunks into its panels, by the math threads, while the producer starts on the first block (the
     * K tiles are not Q's): the math threads wait for Q at named barrier 1, the producer for nothing but the mbarriers */
    const uint16_t *qsrc = r.q + (row * r.h_q + h0) * MLA_D_QK;
    const uint32_t q_s = mla_smem(sm + MLA_WG_Q_AT);
    const int pt = tid - MLA_WG_MATH;
    int32_t idx = -1, nxt = -1, idx1 = -1, nxt1 = -1;
    if (pt < 0) {
        for (int c = tid; c < MLA_HEADS * 72; c += MLA_WG_MATH) {
            const int hr = c / 72, ch = c % 72;
            mla_cp16(q_s + (ch >> 3) * MLA_WG_PANEL + mla_sw128(hr, ch & 7), qsrc + hr * MLA_D_QK + ch * 8, 16);
        }
        mla_cp_commit();
    } else { /* the producer's first two blocks: their slots, and their tokens on the way to L2. Its thread pt reads
              * quarter pt % 4 of tokens mla_wg_tok(pt, 0) and (pt, 1) */
        const int t0 = mla_wg_tok(pt, 0), t1 = mla_wg_tok(pt, 1), q = pt & 3;
        idx = mla_wg_slot(r, row, len, blk0, blk1, t0), nxt = mla_wg_slot(r, row, len, blk0 + 1, blk1, t0);
        idx1 = mla_wg_slot(r, row, len, blk0, blk1, t1), nxt1 = mla_wg_slot(r, row, len, blk0 + 1, blk1, t1);
        mla_wg_prefetch<FP8>(r, idx, q);
        mla_wg_prefetch<FP8>(r, idx1, q);
        mla_wg_prefetch<FP8>(r, nxt, q);
        mla_wg_prefetch<FP8>(r, nxt1, q);
    }
    if (tid == 0) {
        for (int s = 0; s < 2; s++) {
            mla_mbar_init(full0 + 8 * s, MLA_WG_THREADS - MLA_WG_MATH);
            mla_mbar_init(empty0 + 8 * s, (cross ? 2 : 1) * MLA_WG_MATH / 32); /* both CTAs' math warps when they cross */
        }
        mla_mbar_init(pready, 128);
        mla_mbar_init(pfree, 128);
    }
    __syncthreads(); /* the mbarriers */
    if (cross) mla_cluster_meet(); /* the peer's too, before either's first remote arrival */
    const uint32_t peer = (uint32_t)(rank ^ 1);

    /* setmaxnreg moves registers within the CTA's launch allocation (168 a thread at 384 threads): 104 + 2 x 200 fits
     * its 504 (ptxas holds the producer's code to its 104: at 96 it spilled); more for the math would wait forever for
     * registers nobody frees */
    if (pt >= 0) { /* the producer: block n's slots were read a block ahead, its tokens sent to L2 two blocks ahead */
        mla_setmaxnreg_dec<104>();
        const int t0 = mla_wg_tok(pt, 0), t1 = mla_wg_tok(pt, 1), q = pt & 3;
        const bool xfer = FP8 && cross; /* round rank of each block dequantized here, into both CTAs' tiles */
        float4 sc4;
        uint4 c[8];
        if (xfer) mla_wg_load(r, rank ? idx1 : idx, q, sc4, c); /* the first block's; each store loads the next's */
        for (int32_t n = blk0; n < blk1; n++) {
            const int k = n - blk0, s = k & 1;
            const int32_t after = mla_wg_slot(r, row, len, n + 2, blk1, t0), after1 = mla_wg_slot(r, row, len, n + 2, blk1, t1);
            unsigned char *const kt = sm + MLA_WG_K_AT + s * MLA_WG_KTILE;
            if (FP8 && !xfer) mla_wg_load(r, idx, q, sc4, c); /* before the wait for the tile */
            if (k >= 2) mla_mbar_wait(empty0 + 8 * s, (uint32_t)((k >> 1) - 1) & 1u); /* both CTAs' math warps when crossing */
            mla_wg_begin<FP8>(r, kt, masks + s, idx, pt, 0);
            mla_wg_begin<FP8>(r, kt, masks + s, idx1, pt, 1);
            if (xfer) {
                mla_wg_store<true>(r, kt, pt, rank, sc4, c, rank ? nxt1 : nxt);
                /* this warp's 8 rows of each NoPE panel (1 KB contiguous) into the peer's tile by the copy engine, counted
                 * in bytes on the peer's full barrier: no register holds them, and the peer's wgmma reads what the
                 * async proxy wrote */
                mla_fence_proxy();
                __syncwarp();
                if ((pt & 31) == 0) {
                    const uint32_t at = (uint32_t)((32 * rank + 8 * (pt >> 5)) * 128), rkt = mla_peer(mla_smem(kt), peer);
                    const uint32_t rfull = mla_peer(full0 + 8 * s, peer);
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        mla_bulk_to_peer(rkt + j * MLA_WG_PANEL + at, mla_smem(kt) + j * MLA_WG_PANEL + at, 1024u, rfull);
                }
            } else if (FP8) /* one copy of the store for both tokens: unrolled twice, the producer's loop overflowed the
                             * instruction cache */
#pragma unroll 1
                for (int u = 0; u < 2; u++) {
                    if (u == 1) mla_wg_load(r, idx1, q, sc4, c);
                    mla_wg_store<false>(r, kt, pt, u, sc4, c, -1);
                }
            mla_cp_wait_all();
            mla_fence_proxy(); /* the tile, written by stores and cp.async, is read by wgmma */
            if (xfer && pt == 0)
                mla_mbar_arrive_tx(full0 + 8 * s, 8 * 32 * 128); /* and the peer's round: 32 rows of 8 panels */
            else
                mla_mbar_arrive(full0 + 8 * s);
            mla_wg_prefetch<FP8>(r, after, q);
            mla_wg_prefetch<FP8>(r, after1, q);
            idx = nxt, nxt = after, idx1 = nxt1, nxt1 = after1;
        }
        if (cross) /* the last two tiles released by both CTAs' math warps: the copies out of them, which only the peer's
                    * full barrier counts, have been read before the epilogue stages O over the tiles */
            for (int32_t k = blk1 - blk0 - 2 > 0 ? blk1 - blk0 - 2 : 0; k < blk1 - blk0; k++)
                mla_mbar_wait(empty0 + 8 * (k & 1), (uint32_t)(k >> 1) & 1u);
        /* the epilogue's CTA-wide barriers, passed without work: two, then one more for a request of one split, or for
         * a pair the cluster's two around the combine's one, or two more */
        mla_wg_cta_sync();
        mla_wg_cta_sync();
        if (ns == 1) {
            mla_wg_cta_sync();
            if (cross) mla_cluster_meet();
            return;
        }
        if (pair) {
            mla_cluster_sync();
            mla_wg_cta_sync();
            mla_cluster_sync();
            return;
        }
        mla_wg_cta_sync(); /* two more, last or not: the producer reads no flag (racecheck reported its read of one as a
                            * hazard with the write before the barrier above) */
        mla_wg_cta_sync();
        if (cross) mla_cluster_meet(); /* the peer's last remote arrivals are in before either exits */
        return;
    }
    mla_setmaxnreg_inc<200>();
    mla_cp_wait_all();
    mla_fence_proxy(); /* Q, written by cp.async, is read by wgmma */
    mla_named_sync(1);

    const int w = tid >> 7, lane = tid & 31, wq = (tid >> 5) & 3;
    const int r0 = 16 * wq + (lane >> 2); /* this thread's heads: r0 and r0 + 8 */
    float o[128];                         /* O: heads r0 (+8), dims 256 w + 8 i + 2 (lane % 4) (+1) */
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.0f;
    float m_run[2] = {-1e30f, -1e30f}, l_run[2] = {0.0f, 0.0f}, maxdot[2] = {-INFINITY, -INFINITY};
    int any = 0; /* bit j: some block counted a slot of head r0 + 8 j */
    const uint32_t p_s = mla_smem(sm + MLA_WG_P_AT), k_s0 = mla_smem(sm + MLA_WG_K_AT);
    const uint64_t dq = mla_desc(q_s, 16, 1024), dp = mla_desc(p_s, 16, 1024);
    const uint64_t dk0 = mla_desc(k_s0, 16, 1024), dv0 = mla_desc(k_s0, MLA_WG_V_LEAD, MLA_WG_V_STRIDE);

    /* whole: a split that ends before the CTA's last block leaves as a CTA of that split alone would leave it for the
     * combine (its O unscaled, and from warpgroup 0 its l, lse and max logit, reduced in the epilogue's order), straight
     * from the registers to the workspace (the K tiles are not free), and the next split starts afresh */
    int32_t split_end = it.w;
    int sp = 0;
    auto split_done = [&](int32_t n) {
        if (!cross || n + 1 != split_end || n + 1 == blk1) return;
        const int64_t at0 = ((item + sp) * r.s_q + qi) * r.h_q + h0;
        float *const so = r.split_out + at0 * MLA_D_V;
        const uint64_t keep = mla_keep_policy(); /* read back by this CTA after the next split's tokens pass through L2 */
#pragma unroll
        for (int i = 0; i < 32; i++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                mla_st_keep(so + (r0 + 8 * j) * MLA_D_V + 256 * w + 8 * i + 2 * (lane & 3), o[4 * i + 2 * j], o[4 * i + 2 * j + 1], keep);
#pragma unroll
        for (int i = 0; i < 128; i++) o[i] = 0.0f;
        if (w == 0) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                float l = __fadd_rn(l_run[j], __shfl_xor_sync(0xffffffffu, l_run[j], 1));
                l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 2));
                float md = mla_max(maxdot[j], __shfl_xor_sync(0xffffffffu, maxdot[j], 1));
                md = mla_max(md, __shfl_xor_sync(0xffffffffu, md, 2));
                if ((lane & 3) == 0) {
                    const int64_t at = at0 + r0 + 8 * j;
                    r.split_lse[at] = (any >> j) & 1 ? __fadd_rn(log2f(l), m_run[j]) : -INFINITY;
                    r.split_max[at] = __fmul_rn(md, r.sm_scale);
                    r.split_l[at] = l;
                }
                m_run[j] = -1e30f, l_run[j] = 0.0f, maxdot[j] = -INFINITY;
            }
            any = 0;
        }
        split_end = r.items[item + ++sp].w;
    };

    /* P and the rescale go from warpgroup 0 to 1 through mbarriers pready and pfree on which every thread arrives, the
     * u-th block that counts a slot (np) completing phase u of each */
    int np = 0;
    if (w == 0) { /* all 64 tokens' scores and the softmax, then O += P V over dims [0, 256) */
        for (int32_t n = blk0; n < blk1; n++) {
            const int k = n - blk0, s = k & 1;
            mla_mbar_wait(full0 + 8 * s, (uint32_t)(k >> 1) & 1u);
            const uint64_t mask = mla_wg_mask(masks + s, lane);
            if (mask) {
                float sacc[32];
#pragma unroll
                for (int i = 0; i < 32; i++) sacc[i] = 0.0f;
                mla_wg_fence();
#pragma unroll
                for (int kk = 0; kk < 36; kk++) {
                    const uint32_t off = (uint32_t)((kk >> 2) * MLA_WG_PANEL + (kk & 3) * 32);
                    mla_wgmma_qk(sacc, mla_desc_add(dq, off), mla_desc_add(dk0, s * MLA_WG_KTILE + off), kk > 0);
                }
                mla_wg_commit();
                mla_wg_wait0();
#pragma unroll
                for (int i = 0; i < 32; i++) mla_wg_pin(sacc[i]);
                /* this thread's 32 scores: token 8 i + 2 (lane % 4) + e is bit 8 i + e of mine. Maxima as trees (max is
                 * exact: any order gives the same value), p by ex2.approx.ftz (a p below 2^-126 is 0), sums as trees */
                const uint64_t mine = mask >> (2 * (lane & 3));
                float bmv[2][8], mdv[2][8];
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const bool c0 = (mine >> (8 * i)) & 1, c1 = (mine >> (8 * i + 1)) & 1;
                        const float d0 = sacc[4 * i + 2 * j], d1 = sacc[4 * i + 2 * j + 1];
                        mdv[j][i] = mla_max(c0 ? d0 : -INFINITY, c1 ? d1 : -INFINITY);
                        const float s0 = c0 ? __fmul_rn(d0, r.scale_log2) : -INFINITY;
                        const float s1 = c1 ? __fmul_rn(d1, r.scale_log2) : -INFINITY;
                        sacc[4 * i + 2 * j] = s0, sacc[4 * i + 2 * j + 1] = s1;
                        bmv[j][i] = mla_max(s0, s1);
                    }
                float bm[2];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    bm[j] = mla_max(mla_max(mla_max(bmv[j][0], bmv[j][1]), mla_max(bmv[j][2], bmv[j][3])),
                                    mla_max(mla_max(bmv[j][4], bmv[j][5]), mla_max(bmv[j][6], bmv[j][7])));
                    maxdot[j] = mla_max(maxdot[j], mla_max(mla_max(mla_max(mdv[j][0], mdv[j][1]), mla_max(mdv[j][2], mdv[j][3])),
                                                           mla_max(mla_max(mdv[j][4], mdv[j][5]), mla_max(mdv[j][6], mdv[j][7]))));
                }
                float rescale[2];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    bm[j] = mla_max(bm[j], __shfl_xor_sync(0xffffffffu, bm[j], 1));
                    bm[j] = mla_max(bm[j], __shfl_xor_sync(0xffffffffu, bm[j], 2));
                    const float mnew = bm[j] > m_run[j] || isnan(bm[j]) ? bm[j] : m_run[j];
                    rescale[j] = exp2f(__fsub_rn(m_run[j], mnew));
                    any |= (bm[j] != -INFINITY) << j;
                    l_run[j] = __fmul_rn(l_run[j], rescale[j]);
                    m_run[j] = mnew;
                }
                float psum[2], pp[2][8];
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        sacc[4 * i + 2 * j] = mla_ex2(__fsub_rn(sacc[4 * i + 2 * j], m_run[j]));
                        sacc[4 * i + 2 * j + 1] = mla_ex2(__fsub_rn(sacc[4 * i + 2 * j + 1], m_run[j]));
                        pp[j][i] = __fadd_rn(sacc[4 * i + 2 * j], sacc[4 * i + 2 * j + 1]);
                    }
#pragma unroll
                for (int j = 0; j < 2; j++)
                    psum[j] = __fadd_rn(__fadd_rn(__fadd_rn(pp[j][0], pp[j][1]), __fadd_rn(pp[j][2], pp[j][3])),
                                        __fadd_rn(__fadd_rn(pp[j][4], pp[j][5]), __fadd_rn(pp[j][6], pp[j][7])));
                if (np > 0) mla_mbar_wait(pfree, (uint32_t)(np - 1) & 1u); /* warpgroup 1 is done with the last P */
                uint32_t pa[4][4]; /* P as this warpgroup's A operand: tokens 16 t .. + 16 in pa[t] */
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int tok = 8 * i + 2 * (lane & 3), hr = r0 + 8 * j;
                        const uint32_t pb = mla_wg_bf16x2(sacc[4 * i + 2 * j], sacc[4 * i + 2 * j + 1]);
                        *reinterpret_cast<uint32_t *>(sm + MLA_WG_P_AT + mla_sw128(hr, tok >> 3) + (tok & 7) * 2) = pb;
                        pa[i >> 1][2 * (i & 1) + j] = pb;
                    }
                if ((lane & 3) == 0) st[MLA_WG_XSC + r0] = rescale[0], st[MLA_WG_XSC + r0 + 8] = rescale[1];
                mla_fence_proxy(); /* P, written by ordinary stores, is read by wgmma */
                mla_mbar_arrive(pready); /* P and the rescale to warpgroup 1 */
                np++;
#pragma unroll
                for (int j = 0; j < 2; j++) l_run[j] = __fadd_rn(l_run[j], psum[j]);
                mla_wg_rescale(o, rescale[0], rescale[1]);
#pragma unroll
                for (int i = 0; i < 128; i++) mla_wg_pin(o[i]);
                mla_wg_fence();
#pragma unroll
                for (int t = 0; t < 4; t++) mla_wgmma_pv_rs(o, pa[t], mla_desc_add(dv0, s * MLA_WG_KTILE + 2048 * t));
                mla_wg_commit();
                mla_wg_wait0();
#pragma unroll
                for (int i = 0; i < 128; i++) mla_wg_pin(o[i]);
            }
            __syncwarp();
            if (lane == 0) {
                mla_mbar_arrive(empty0 + 8 * s);
                if (cross) mla_mbar_arrive_peer(mla_peer(empty0 + 8 * s, peer)); /* the peer writes this tile too */
            }
            split_done(n);
        }
        if (np > 0) mla_mbar_wait(pfree, (uint32_t)(np - 1) & 1u); /* warpgroup 1's last P V done */
    } else { /* warpgroup 1: O += P V over dims [256, 512) with warpgroup 0's P and rescale */
        for (int32_t n = blk0; n < blk1; n++) {
            const int k = n - blk0, s = k & 1;
            mla_mbar_wait(full0 + 8 * s, (uint32_t)(k >> 1) & 1u);
            const uint64_t mask = mla_wg_mask(masks + s, lane);
            if (mask) {
                mla_mbar_wait(pready, (uint32_t)np & 1u);
                const float sc0 = st[MLA_WG_XSC + r0], sc1 = st[MLA_WG_XSC + r0 + 8];
                mla_wg_rescale(o, sc0, sc1);
#pragma unroll
                for (int i = 0; i < 128; i++) mla_wg_pin(o[i]);
                mla_wg_fence();
#pragma unroll
                for (int t = 0; t < 4; t++)
                    mla_wgmma_pv(o, mla_desc_add(dp, 32 * t), mla_desc_add(dv0, s * MLA_WG_KTILE + 4 * MLA_WG_PANEL + 2048 * t));
                mla_wg_commit();
                mla_wg_wait0();
#pragma unroll
                for (int i = 0; i < 128; i++) mla_wg_pin(o[i]);
                mla_mbar_arrive(pfree); /* done with P and the rescale */
                np++;
            }
            __syncwarp();
            if (lane == 0) {
                mla_mbar_arrive(empty0 + 8 * s);
                if (cross) mla_mbar_arrive_peer(mla_peer(empty0 + 8 * s, peer)); /* the peer writes this tile too */
            }
            split_done(n);
        }
    }

    /* the split's per-head results: l and the max dot over warpgroup 0's lanes (warpgroup 1 has neither) */
#pragma unroll
    for (int j = 0; j < 2; j++) {
        l_run[j] = __fadd_rn(l_run[j], __shfl_xor_sync(0xffffffffu, l_run[j], 1));
        l_run[j] = __fadd_rn(l_run[j], __shfl_xor_sync(0xffffffffu, l_run[j], 2));
        maxdot[j] = mla_max(maxdot[j], __shfl_xor_sync(0xffffffffu, maxdot[j], 1));
        maxdot[j] = mla_max(maxdot[j], __shfl_xor_sync(0xffffffffu, maxdot[j], 2));
        if ((lane & 3) == 0 && w == 0)
            st[MLA_WG_XL + 64 * w + r0 + 8 * j] = l_run[j], st[MLA_WG_XMD + 64 * w + r0 + 8 * j] = maxdot[j]; /* w is 0 */
    }
    mla_wg_cta_sync(); /* and both warpgroups are past their last matrix work: the K tiles are free */
    /* O staged in the K tiles as f32 rows of MLA_OROW, so that one small loop below writes it out (unrolled over this
     * thread's 128 values, the division's and the finish's branches made the epilogue's code so large that every CTA
     * waited on instruction fetches there) */
    float *const ost = reinterpret_cast<float *>(sm + MLA_WG_K_AT);
#pragma unroll
    for (int i = 0; i < 32; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            *reinterpret_cast<float2 *>(ost + (r0 + 8 * j) * MLA_OROW + 256 * w + 8 * i + 2 * (lane & 3)) =
                make_float2(o[4 * i + 2 * j], o[4 * i + 2 * j + 1]);
    const int64_t head_at = row * r.h_q + h0;
    float *const ep = reinterpret_cast<float *>(sm + MLA_WG_P_AT); /* per head: l, c0, o_scale, lse, max, none */
    int *const ep_none = reinterpret_cast<int *>(ep + MLA_WG_EP_NONE * MLA_HEADS);
    int32_t *const arrived = r.counters + row * r.groups + g, *const written = arrived + r.batch * r.s_q * r.groups;
    if (w == 0 && (lane & 3) == 0) /* warpgroup 0 holds every head's running max and counted flag */
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int hr = r0 + 8 * j;
            const float l = st[MLA_WG_XL + hr];
            const float md = st[MLA_WG_XMD + hr];
            const bool counted = (any >> j) & 1;
            const float lse_s = counted ? __fadd_rn(log2f(l), m_run[j]) : -INFINITY;
            float c0 = 0.0f, osc = 1.0f;
            bool none = false;
            if (ns == 1) { /* the combine of one split, here */
                const mla_head hd = mla_head_plan(1, [&](int) { return lse_s; }, r.sink, h0 + hr);
                c0 = hd.empty ? 0.0f : mla_wg_coef(mla_weight(hd, lse_s), l);
                osc = hd.o_scale, none = hd.empty;
                r.lse[head_at + hr] = mla_lse_out(hd);
                r.max_logits[head_at + hr] = mla_max(-INFINITY, __fmul_rn(md, r.sm_scale));
            } else {
                const int64_t at = (last_item * r.s_q + qi) * r.h_q + h0 + hr;
                r.split_lse[at] = ep[3 * MLA_HEADS + hr] = lse_s;
                r.split_max[at] = ep[4 * MLA_HEADS + hr] = __fmul_rn(md, r.sm_scale);
                r.split_l[at] = l;
            }
            ep[hr] = l;
            ep[MLA_HEADS + hr] = c0;
            ep[2 * MLA_HEADS + hr] = osc;
            ep_none[hr] = none;
        }
    /* A split of several arrives before its out is written: the last to arrive combines, from its own out in shared
     * memory and the others' from the workspace once they are written (the second counter; they arrived first, so they
     * are running and the wait ends). Which CTA combines varies, the values it reads and the order it adds them do not. */
    if (tid == 0 && ns > 1 && !pair) st_i[MLA_WG_FLAG] = cross || atomicAdd(arrived, 1) == ns - 1; /* whole: it ran them all */
    mla_wg_cta_sync();
    /* out = c0 acc (c0 the weight over l, 0 when nothing counted), four dims a thread a step, rows in order, four steps
     * unrolled so their shared-memory reads and stores overlap (one step at a time, the loop was a fifth of the math
     * warps' samples) */
    const bool has_sink = r.sink != NULL;
    if (ns == 1) {
        /* not needed for the ordering (the barrier above orders ep and ost before these reads), but without it
         * compute-sanitizer racecheck 2025.3.1 reports those hand-offs as hazards in a request of one split alone, and
         * with it none (MEASURED.md) */
        mla_wg_cta_sync();
#pragma unroll 4
        for (int e = tid; e < MLA_HEADS * MLA_D_V / 4; e += MLA_WG_MATH) {
            const int hr = e / (MLA_D_V / 4), dim = 4 * (e % (MLA_D_V / 4));
            const float4 a = *reinterpret_cast<const float4 *>(ost + hr * MLA_OROW + dim);
            const float av[4] = {a.x, a.y, a.z, a.w};
            const float c0 = ep[MLA_HEADS + hr], osc = ep[2 * MLA_HEADS + hr];
            const bool none = ep_none[hr] != 0;
            float f[4];
#pragma unroll
            for (int i = 0; i < 4; i++) f[i] = mla_finish(__fadd_rn(0.0f, __fmul_rn(c0, av[i])), has_sink, none, osc);
            *reinterpret_cast<uint2 *>(r.out + (head_at + hr) * MLA_D_V + dim) =
                make_uint2(mla_bf16x2(f[0], f[1]), mla_bf16x2(f[2], f[3]));
        }
        if (cross) mla_cluster_meet(); /* the peer's last remote arrivals are in before either exits */
        return;
    }
    const bool last = pair || st_i[MLA_WG_FLAG]; /* its O stays in ost */
    if (!last) { /* its O to the workspace, for the last */
        float *const split_out = r.split_out + ((last_item * r.s_q + qi) * r.h_q + h0) * MLA_D_V;
#pragma unroll 4
        for (int e = tid; e < MLA_HEADS * MLA_D_V / 4; e += MLA_WG_MATH) {
            const int hr = e / (MLA_D_V / 4), dim = 4 * (e % (MLA_D_V / 4));
            *reinterpret_cast<float4 *>(split_out + hr * MLA_D_V + dim) = *reinterpret_cast<const float4 *>(ost + hr * MLA_OROW + dim);
        }
    }
    if (pair) {
        mla_cluster_sync(); /* both outs in ost, both lse and max in ep */
        mla_wg_pair_combine(r, row, g, rank, tid, ost, ep, reinterpret_cast<float *>(sm + MLA_WG_Q_AT), st + MLA_WG_OSC,
                            st_i + MLA_WG_EMPTY);
        mla_cluster_sync(); /* the peer is done reading this CTA's shared memory */
        return;
    }
    if (!last) {
        __threadfence();
        mla_wg_cta_sync();
        if (tid == 0) atomicAdd(written, 1);
        mla_wg_cta_sync(); /* the producer's fourth, as the last's combine has */
        if (cross) mla_cluster_meet(); /* never taken: a whole run is its request's last */
        return;
    }
    if (tid == 0 && !cross) {
        while (atomicAdd(written, 0) < ns - 1) __nanosleep(64);
        __threadfence();
    }
    mla_wg_cta_sync(); /* the others' lse, max and out written, this one's out in ost */
    mla_wg_combine(r, b, qi, g, ns, (int)(last_item - r.item_base[b]), tid, ost, ep, reinterpret_cast<float *>(sm + MLA_WG_Q_AT),
                   st + MLA_WG_OSC, st_i + MLA_WG_EMPTY);
    if (cross) mla_cluster_meet();
}

/* mla_cuda_run's core for this kernel. */
struct mla_core_wg {
    static constexpr unsigned threads = MLA_WG_THREADS;
    static constexpr size_t smem = MLA_WG_SMEM_BYTES;
    static constexpr int64_t item_pairs = 1;
    static constexpr bool whole_runs = true;
    template <bool FP8>
    static void (*kernel(bool whole))(mla_run) { /* each way its own code: one kernel with both spilled */
        return whole ? mla_wg_kernel<FP8, true> : mla_wg_kernel<FP8, false>;
    }
};

#endif
