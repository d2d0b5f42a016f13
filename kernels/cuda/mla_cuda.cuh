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
 * counters [2][batch * s_q * groups] i32 (arrivals; mla_wg.cuh's outs written), split_lse and split_max [max_items, s_q, h_q] f32, split_out
 * [max_items, s_q, h_q, 512] f32, split_l [max_items, s_q, h_q] f32 (mla_wg.cuh's).
 *
 * Files: mla_common.cuh (sizes, the shared-memory map, mla_run, device helpers, the combine of one (row, head)),
 * mla_attn.cuh (launch 2), this one (launch 1 and the launcher); the impls (.cu) are only names around mla_cuda_run. */
#ifndef KP_MLA_CUDA_CUH
#define KP_MLA_CUDA_CUH

#include <math.h>
#include <mutex>

#include "../mla_plan.h"
#include "kp_cuda.cuh"
#include "mla_common.cuh"

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
    for (int64_t k = tid; k < 2 * r.batch * r.s_q * r.groups; k += MLA_PLAN_THREADS) r.counters[k] = 0;
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

/* ---- 2. attention over one split, and the combine: mla_attn.cuh, included here so the definitions keep their order ---- */

#include "mla_attn.cuh"

/* ---- the launcher ---- */

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
    r->counters = (int32_t *)take(sizeof(int32_t) * 2 * B * (size_t)(r->s_q * r->groups));
    r->split_lse = (float *)take(sizeof(float) * items * heads);
    r->split_max = (float *)take(sizeof(float) * items * heads);
    r->split_out = (float *)take(sizeof(float) * items * heads * MLA_D_V);
    r->split_l = (float *)take(sizeof(float) * items * heads);
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
    if ((most + 1) * a->s_q * (a->h_q / 64) > INT32_MAX) /* + 1: mla_core_wg's grid, the items rounded up to pairs */
        return "(request, split, row, head group) CTAs above 2^31 - 1";
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

/* The attention core a launcher runs: mla_attend_kernel (mma.sync, any sm_90 build) or mla_wg.cuh's (wgmma, sm_90a). */
struct mla_core_mma {
    static constexpr unsigned threads = MLA_THREADS;
    static constexpr size_t smem = MLA_SMEM_BYTES;
    static constexpr int64_t item_pairs = 0; /* mla_core_wg's clusters of two take the items a pair at a time */
    static constexpr bool whole_runs = false;  /* mla_core_wg can run a request's splits in one CTA */
    template <bool FP8>
    static void (*kernel(bool))(mla_run) {
        return mla_attend_kernel<FP8>;
    }
};

/* Per device and core, once: the attention kernels' shared memory limit, and whether the code is sm_90 (PDL). */
struct mla_device {
    bool ready, sm90;
};
#define MLA_MAX_DEVICES 64

template <typename Core>
static int mla_device_ready(mla_device *d, char *message, size_t message_len) {
    if (d->ready) return KP_RUN_OK;
    cudaFuncAttributes fa;
    KP_CUDA_CHECK(cudaFuncGetAttributes(&fa, Core::template kernel<true>(false)));
    d->sm90 = fa.binaryVersion >= 90;
    const cudaFuncAttribute smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
    for (int whole = 0; whole <= (int)Core::whole_runs; whole++) {
        KP_CUDA_CHECK(cudaFuncSetAttribute(Core::template kernel<true>(whole), smem, (int)Core::smem));
        KP_CUDA_CHECK(cudaFuncSetAttribute(Core::template kernel<false>(whole), smem, (int)Core::smem));
    }
    d->ready = true;
    return KP_RUN_OK;
}

template <int ALGO, typename Core = mla_core_mma>
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
        const int ready = mla_device_ready<Core>(d, message, message_len);
        if (ready != KP_RUN_OK) return ready;
        sm90 = d->sm90;
    }
    cudaStream_t stream = static_cast<cudaStream_t>(a->stream);
    const size_t plan_smem = r.plan_in_smem ? (size_t)mla_plan_smem_bytes(r.batch, ALGO, r.max_splits) : 0;
    mla_plan_kernel<ALGO><<<1, MLA_PLAN_THREADS, plan_smem, stream>>>(r);
    KP_LAUNCH_CHECK("mla_plan_kernel");
    /* mla_wg.cuh's whole runs (h_q a multiple of 128): once one split a CTA would need more CTAs than the device has
     * SMs, a CTA per (request, query row, head group) runs the request's splits one after another. Every split and the
     * combine are the same arithmetic either way, so which one runs changes no bit; it changes how many CTAs pay the
     * prologue, the epilogue and the combine's wait. */
    const bool whole = Core::whole_runs && r.groups % 2 == 0 && r.max_items * r.s_q * r.groups > sms;
    const unsigned grid = (unsigned)(whole ? r.batch * r.s_q * r.groups
                                           : (Core::item_pairs ? (r.max_items + 1) / 2 * 2 : r.max_items) * r.s_q * r.groups);
    if (a->cache_format == KP_MLA_CACHE_FP8_DS_MLA)
        KP_CUDA_CHECK(launch_after(sm90, Core::template kernel<true>(whole), grid, Core::threads, Core::smem, stream, r));
    else
        KP_CUDA_CHECK(launch_after(sm90, Core::template kernel<false>(whole), grid, Core::threads, Core::smem, stream, r));
    return KP_RUN_OK;
}

#endif
