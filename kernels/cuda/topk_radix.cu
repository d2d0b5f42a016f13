/* topk_radix.cu: topk.radix_exact@cuda (candidate) and topk.radix_buffer@cuda (incumbent), the steps of
 * kernels/topk_radix.h on the device: one 1024-thread block per row, launched on args->stream, no sync.
 *
 * radix_exact: the 4-pass descent for T (per pass a shared 256-bin integer histogram, so the counts and
 * hence T do not depend on the order of the atomics; the digit pick is kp_topk_pick_digit, run by one
 * thread), then one sweep in index order with a block-wide ballot scan: an entry's output slot is the
 * number of keys > T before it plus min(ties before it, ties taken). No order-dependent atomics, so the
 * bits are the host port's, in any batch and on every run.
 * radix_buffer: the same descent, but the selected entries are appended with shared-memory atomics in
 * arrival order (<= KP_TOPK_EXACT_MAX_ROWS rows); more rows take the coarse fp16 bin and a candidate
 * buffer of KP_TOPK_BUFFER_CAP entries in dynamic shared memory (64 KiB) that drops late arrivals.
 * Neither needs a workspace. */
#include <math.h>

#include "kp_cuda.cuh"
#include "../topk_radix.h"

#define TOPK_THREADS 1024
#define TOPK_WARPS (TOPK_THREADS / 32)
#define TOPK_LOADS 4 /* entries per thread per step of a histogram sweep: loads in flight */
#define TOPK_NO_BIN 256u

/* What every kernel reads: the run's args, with the row count deciding radix_buffer's path. */
struct topk_params {
    const float *scores;   /* [rows, row_stride], f32 */
    const int32_t *starts; /* [rows] */
    const int32_t *ends;   /* [rows] */
    int32_t *indices;      /* [rows, k], int32 */
    float *values;         /* [rows, k], f32 */
    int64_t rows, row_stride;
    int32_t k, index_base, fill;
};

/* Per-block state, in shared memory. */
struct topk_shared {
    uint32_t hist[256];
    uint32_t warp_gt[TOPK_WARPS], warp_eq[TOPK_WARPS]; /* the index-order scan's per-warp counts */
    uint32_t prefix, need;                             /* a pick, broadcast by thread 0 */
    uint32_t out, ties_taken, buffered;                /* radix_buffer's append counters */
};

/* hist[bin]++ for every lane with bin < 256; all 32 lanes call it. Lanes with the same bin add once
 * (__match_any_sync, sm_70 on): rows of few distinct values would otherwise serialize on one bin. */
__device__ __forceinline__ void count_bin(uint32_t *hist, uint32_t bin) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
    const unsigned peers = __match_any_sync(0xffffffffu, bin);
    if (bin < 256 && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], (uint32_t)__popc(peers));
#else
    if (bin < 256) atomicAdd(&hist[bin], 1u);
#endif
}

/* Adds bin_of(q) to hist for q in [0, n) (TOPK_NO_BIN: not counted). The loop bounds are the block's,
 * so whole warps reach count_bin together. */
template <typename BinOf>
__device__ __forceinline__ void count_bins(BinOf bin_of, int64_t n, uint32_t *hist) {
    for (int64_t base = 0; base < n; base += (int64_t)TOPK_THREADS * TOPK_LOADS) {
        uint32_t bin[TOPK_LOADS];
#pragma unroll
        for (int u = 0; u < TOPK_LOADS; u++) {
            const int64_t q = base + (int64_t)u * TOPK_THREADS + threadIdx.x;
            bin[u] = q < n ? bin_of(q) : TOPK_NO_BIN;
        }
#pragma unroll
        for (int u = 0; u < TOPK_LOADS; u++) count_bin(hist, bin[u]);
    }
}

/* The key T of the need-th largest of the n keys key_of(0 .. n-1), as the host port's descend();
 * *ties receives how many entries with key == T the answer takes. need in [1, n]; all threads call it
 * with the same arguments and get the same answer. */
template <typename KeyOf>
__device__ uint32_t block_descend(KeyOf key_of, int64_t n, uint32_t need, uint32_t *ties, topk_shared &s) {
    uint32_t prefix = 0, mask = 0;
    for (int pass = 0; pass < 4; pass++) {
        for (int b = threadIdx.x; b < 256; b += TOPK_THREADS) s.hist[b] = 0;
        __syncthreads();
        count_bins(
            [&](int64_t q) {
                const uint32_t key = key_of(q);
                return (key & mask) == prefix ? kp_topk_digit(key, pass) : TOPK_NO_BIN;
            },
            n, s.hist);
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t above;
            const uint32_t d = kp_topk_pick_digit(s.hist, need, &above);
            s.need = need - above;
            s.prefix = prefix | d << (24 - 8 * pass);
        }
        __syncthreads();
        need = s.need;
        prefix = s.prefix;
        mask |= 0xffu << (24 - 8 * pass);
    }
    *ties = need;
    return prefix;
}

/* One row's window and output. */
struct topk_row {
    const float *x; /* the row's scores */
    int32_t start;
    int64_t len;
    int32_t *idx;
    float *val;
    uint32_t count; /* min(k, len) */
};

__device__ __forceinline__ topk_row row_at(const topk_params &p, int64_t r) {
    topk_row w;
    w.x = p.scores + r * p.row_stride;
    w.start = p.starts[r];
    w.len = (int64_t)p.ends[r] - w.start;
    w.idx = p.indices + r * p.k;
    w.val = p.values + r * p.k;
    w.count = (uint32_t)(w.len < p.k ? w.len : p.k);
    return w;
}

/* The key of window entry i. */
__device__ __forceinline__ uint32_t window_key(const topk_row &w, int64_t i) { return kp_topk_key(w.x[w.start + i]); }

/* Output slot `slot` := window entry i (its index per index_base, its score's bits). */
__device__ __forceinline__ void emit(const topk_params &p, const topk_row &w, uint32_t slot, int64_t i) {
    w.idx[slot] = p.index_base == KP_TOPK_BASE_WINDOW ? (int32_t)i : w.start + (int32_t)i;
    w.val[slot] = w.x[w.start + i]; /* a move: NaN payloads kept */
}

/* Slots [filled, k) := fill and -inf. */
__device__ __forceinline__ void fill_tail(const topk_params &p, const topk_row &w, uint32_t filled) {
    for (int64_t j = (int64_t)filled + threadIdx.x; j < p.k; j += TOPK_THREADS) {
        w.idx[j] = p.fill;
        w.val[j] = -INFINITY;
    }
}

/* ---- radix_exact ---- */

/* Every key > t and the first `ties` keys == t, in index order, each at the slot the scan gives it. */
__device__ void emit_in_index_order(const topk_params &p, const topk_row &w, uint32_t t, uint32_t ties,
                                    topk_shared &s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned below = (1u << lane) - 1u;
    uint32_t gt_before = 0, eq_before = 0; /* in the chunks already swept: the same in every thread */
    for (int64_t base = 0; base < w.len; base += TOPK_THREADS) {
        const int64_t i = base + threadIdx.x;
        const uint32_t key = i < w.len ? window_key(w, i) : 0;
        const bool gt = i < w.len && key > t, eq = i < w.len && key == t;
        const unsigned gt_ballot = __ballot_sync(0xffffffffu, gt), eq_ballot = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) {
            s.warp_gt[warp] = (uint32_t)__popc(gt_ballot);
            s.warp_eq[warp] = (uint32_t)__popc(eq_ballot);
        }
        __syncthreads();
        uint32_t gt_rank = gt_before + (uint32_t)__popc(gt_ballot & below);
        uint32_t eq_rank = eq_before + (uint32_t)__popc(eq_ballot & below);
        for (int v = 0; v < TOPK_WARPS; v++) {
            if (v < warp) gt_rank += s.warp_gt[v], eq_rank += s.warp_eq[v];
            gt_before += s.warp_gt[v];
            eq_before += s.warp_eq[v];
        }
        __syncthreads(); /* the counts are read before the next chunk writes them */
        if (gt || (eq && eq_rank < ties)) emit(p, w, gt_rank + min(eq_rank, ties), i);
        if (gt_before + min(eq_before, ties) >= w.count) break; /* uniform: every entry is out */
    }
}

__global__ void __launch_bounds__(TOPK_THREADS) topk_exact_kernel(topk_params p) {
    __shared__ topk_shared s;
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const topk_row w = row_at(p, r);
        if (w.count > 0) {
            uint32_t ties;
            const uint32_t t = block_descend([&](int64_t i) { return window_key(w, i); }, w.len, w.count, &ties, s);
            emit_in_index_order(p, w, t, ties, s);
        }
        fill_tail(p, w, w.count);
        __syncthreads(); /* the next row reuses s */
    }
}

/* ---- radix_buffer ---- */

/* Appends window entry i in arrival order when its key is above t, or equal to t and among the first
 * `ties` such to arrive. */
__device__ __forceinline__ void append_if_selected(const topk_params &p, const topk_row &w, uint32_t key, uint32_t t,
                                                   uint32_t ties, int64_t i, topk_shared &s) {
    if (key > t || (key == t && atomicAdd(&s.ties_taken, 1u) < ties)) emit(p, w, atomicAdd(&s.out, 1u), i);
}

/* COARSE: the fp16-bin path of more than KP_TOPK_EXACT_MAX_ROWS rows, with the candidate buffer in
 * KP_TOPK_BUFFER_CAP x 4 bytes of dynamic shared memory (launched with 0 bytes otherwise). */
template <bool COARSE>
__global__ void __launch_bounds__(TOPK_THREADS) topk_buffer_kernel(topk_params p) {
    __shared__ topk_shared s;
    extern __shared__ int32_t candidates[]; /* COARSE: [KP_TOPK_BUFFER_CAP], window entries in arrival order */
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const topk_row w = row_at(p, r);
        if (threadIdx.x == 0) s.out = 0, s.ties_taken = 0, s.buffered = 0; /* read after the next barrier */
        if (w.count > 0 && !COARSE) {
            uint32_t ties;
            const uint32_t t = block_descend([&](int64_t i) { return window_key(w, i); }, w.len, w.count, &ties, s);
            for (int64_t i = threadIdx.x; i < w.len; i += TOPK_THREADS)
                append_if_selected(p, w, window_key(w, i), t, ties, i, s);
        } else if (w.count > 0) {
            for (int b = threadIdx.x; b < 256; b += TOPK_THREADS) s.hist[b] = 0;
            __syncthreads();
            count_bins([&](int64_t i) { return kp_topk_coarse_bin(w.x[w.start + i]); }, w.len, s.hist);
            __syncthreads();
            if (threadIdx.x == 0) {
                uint32_t above;
                s.prefix = kp_topk_pick_digit(s.hist, w.count, &above);
                s.need = w.count - above;
            }
            __syncthreads();
            const uint32_t bin = s.prefix, need = s.need;
            for (int64_t i = threadIdx.x; i < w.len; i += TOPK_THREADS) {
                const uint32_t b = kp_topk_coarse_bin(w.x[w.start + i]);
                if (b > bin) {
                    emit(p, w, atomicAdd(&s.out, 1u), i);
                } else if (b == bin) {
                    const uint32_t slot = atomicAdd(&s.buffered, 1u);
                    if (slot < KP_TOPK_BUFFER_CAP) candidates[slot] = (int32_t)i; /* later arrivals: dropped */
                }
            }
            __syncthreads();
            const uint32_t held = min(s.buffered, (uint32_t)KP_TOPK_BUFFER_CAP);
            if (need > 0 && held > 0) {
                uint32_t ties;
                const auto key_of = [&](int64_t q) { return window_key(w, candidates[q]); };
                const uint32_t t = block_descend(key_of, held, min(need, held), &ties, s);
                for (int64_t q = threadIdx.x; q < held; q += TOPK_THREADS)
                    append_if_selected(p, w, key_of(q), t, ties, candidates[q], s);
            }
        }
        __syncthreads();
        fill_tail(p, w, s.out);
        __syncthreads(); /* the next row reuses s and the buffer */
    }
}

/* ---- launchers ---- */

/* The host port's checks (kernels/host/topk_radix.c), with the same messages. */
static int topk_check(const char *name, const void *args, char *message, size_t message_len) {
    const kp_topk_args *a = static_cast<const kp_topk_args *>(args);
    const char *why = NULL;
    if (a->rows < 1 || a->width < 1 || a->width > INT32_MAX || a->row_stride < a->width) why = "rows, width or row_stride";
    else if (a->k < 1 || a->k > KP_TOPK_MAX_K) why = "k outside [1, 8192]";
    else if (a->fill != -1 && a->fill != INT32_MAX) why = "fill is neither -1 nor INT32_MAX";
    else if (a->index_base != KP_TOPK_BASE_ROW && a->index_base != KP_TOPK_BASE_WINDOW) why = "index_base";
    if (!why) return KP_RUN_OK;
    return kp_cuda_fail_msg(message, message_len, KP_RUN_NOT_SUPPORTED, "%s: %s", name, why);
}

static size_t topk_workspace_bytes(const void *args) {
    (void)args;
    return 0;
}

static topk_params topk_params_of(const kp_topk_args *a) {
    return topk_params{a->scores, a->starts, a->ends, a->indices, a->values, a->rows, a->row_stride,
                       a->k, a->index_base, a->fill};
}

/* One block per row; rows past the grid limit are taken by the blocks' row loop. */
static unsigned topk_grid(int64_t rows) { return rows < INT32_MAX ? (unsigned)rows : (unsigned)INT32_MAX; }

static int exact_supports(const void *args, char *message, size_t message_len) {
    return topk_check("topk.radix_exact@cuda", args, message, message_len);
}
static int buffer_supports(const void *args, char *message, size_t message_len) {
    return topk_check("topk.radix_buffer@cuda", args, message, message_len);
}

static int exact_run(const void *args, char *message, size_t message_len) {
    const int rc = exact_supports(args, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    const kp_topk_args *a = static_cast<const kp_topk_args *>(args);
    topk_exact_kernel<<<topk_grid(a->rows), TOPK_THREADS, 0, static_cast<cudaStream_t>(a->stream)>>>(topk_params_of(a));
    KP_LAUNCH_CHECK("topk_exact_kernel");
    return KP_RUN_OK;
}

static int buffer_run(const void *args, char *message, size_t message_len) {
    const int rc = buffer_supports(args, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    const kp_topk_args *a = static_cast<const kp_topk_args *>(args);
    cudaStream_t stream = static_cast<cudaStream_t>(a->stream);
    if (a->rows <= KP_TOPK_EXACT_MAX_ROWS) {
        topk_buffer_kernel<false><<<topk_grid(a->rows), TOPK_THREADS, 0, stream>>>(topk_params_of(a));
        KP_LAUNCH_CHECK("topk_buffer_kernel<false>");
        return KP_RUN_OK;
    }
    /* Set on every call: a host-side attribute of the current device's context, no stream work, and it
     * stays right whichever device the caller made current. */
    const size_t buffer_bytes = KP_TOPK_BUFFER_CAP * sizeof(int32_t);
    KP_CUDA_CHECK(cudaFuncSetAttribute(topk_buffer_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)buffer_bytes));
    topk_buffer_kernel<true><<<topk_grid(a->rows), TOPK_THREADS, buffer_bytes, stream>>>(topk_params_of(a));
    KP_LAUNCH_CHECK("topk_buffer_kernel<true>");
    return KP_RUN_OK;
}

extern "C" {
extern const kp_impl kp_topk_radix_exact_cuda;
extern const kp_impl kp_topk_radix_buffer_cuda;
}

extern "C" const kp_impl kp_topk_radix_exact_cuda = {
    KP_ABI_VERSION, "topk", "topk.radix_exact@cuda", KP_MEMORY_CUDA,
    topk_workspace_bytes, exact_supports, exact_run,
};

extern "C" const kp_impl kp_topk_radix_buffer_cuda = {
    KP_ABI_VERSION, "topk", "topk.radix_buffer@cuda", KP_MEMORY_CUDA,
    topk_workspace_bytes, buffer_supports, buffer_run,
};
