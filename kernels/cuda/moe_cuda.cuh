/* moe_cuda.cuh: the NVFP4 MoE steps shared by moe.invariant@cuda (moe_invariant.cu) and
 * moe.marlin_like@cuda / moe.marlin_gemv32@cuda (moe_marlin.cu): routing, the tensor-core GEMM core,
 * gemv32's f32 path, the combine and one launcher templated on the algorithm. kernels/moe_plan.h states
 * the numerics; families.md §A and §B the model. Everything runs on args->stream, no host sync.
 * Files: moe_common.cuh (shared), moe_route.cuh 1-3, moe_gemm.cuh 4-5, moe_f32.cuh gemv32; here 6, the launcher.
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

#include <mutex>

#include "moe_common.cuh"
#include "moe_route.cuh"
#include "moe_gemm.cuh"
#include "moe_f32.cuh"

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
