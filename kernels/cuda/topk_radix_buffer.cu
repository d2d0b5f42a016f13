/* topk_radix_buffer.cu: topk.radix_buffer@cuda, the incumbent's defect model (kernels/topk_radix.h),
 * launched on args->stream, no sync, no workspace.
 *
 * radix_buffer: one 1024-thread block per row. The same descent over bytes (block_descend), but the
 * selected entries are appended with shared-memory atomics in arrival order (<= KP_TOPK_EXACT_MAX_ROWS
 * rows); more rows take the coarse fp16 bin and a candidate buffer of KP_TOPK_BUFFER_CAP entries in
 * dynamic shared memory (64 KiB) that drops late arrivals. */
#include "topk_cuda.cuh"

#define TOPK_THREADS 1024
#define TOPK_LOADS 4 /* entries per thread per step of a histogram sweep: loads in flight */
#define TOPK_NO_BIN 256u

/* Per-block state, in shared memory. */
struct topk_shared {
    uint32_t hist[256];
    uint32_t prefix, need;              /* a pick, broadcast by thread 0 */
    uint32_t out, ties_taken, buffered; /* the append counters */
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

/* One block per row; rows past the grid limit are taken by the blocks' row loop. */
static unsigned topk_grid(int64_t rows) { return rows < INT32_MAX ? (unsigned)rows : (unsigned)INT32_MAX; }

static int buffer_supports(const void *args, char *message, size_t message_len) {
    return topk_check("topk.radix_buffer@cuda", args, message, message_len);
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
extern const kp_impl kp_topk_radix_buffer_cuda;
}

extern "C" const kp_impl kp_topk_radix_buffer_cuda = {
    KP_ABI_VERSION, "topk", "topk.radix_buffer@cuda", KP_MEMORY_CUDA,
    topk_workspace_bytes, buffer_supports, buffer_run,
};
