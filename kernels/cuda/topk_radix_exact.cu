/* topk_radix_exact.cu: topk.radix_exact@cuda, the candidate (kernels/topk_radix.h), launched on
 * args->stream, no sync, no workspace.
 *
 * radix_exact: one launch; each row is split into chunks of about EXACT_TILE entries, one 512-thread
 * block a chunk, the row's blocks a thread-block cluster of up to 16 (one block a row where the kernel
 * runs no sm_90 code). A chunk of at most EXACT_MAX_CACHED entries is brought into shared memory once
 * (a bulk copy on sm_90) and kept there as keys. The count-th largest key T comes from a 3-pass descent
 * over 11, 11 and 10-bit digits: per pass each block counts its matching keys into a shared histogram,
 * adds it into the cluster's (each 4-bin group summed in one block's shared memory), and every block
 * picks the digit by kp_topk_pick_digit's rule. After the first pass each warp lists, in index order,
 * its entries whose top digit reaches the one picked; the later passes and the output sweep only the
 * lists. Each block then counts its keys > T and == T, adds the earlier blocks' counts, and writes its
 * selected entries in index order with a warp ballot scan: an entry's slot is the keys > T before it
 * plus min(keys == T before it, ties taken). Every count is an integer and every position comes from
 * counts, so the bits are the host port's, in any batch and on every run. */
#include <cooperative_groups.h>
#include <mutex>

#include "topk_cuda.cuh"


/* Each row is split into `blocks` chunks of `chunk` entries, one 512-thread block a chunk, the blocks
 * of a row one thread-block cluster (sm_90), so a launch of few long rows fills the GPU and the
 * blocks add their histograms and counts into each other's shared memory: one launch, no workspace,
 * and a row's bits depend only on its own entries (the tiling depends on width alone, and every
 * decision is an integer count). A chunk of at most EXACT_MAX_CACHED entries is kept in shared memory
 * as keys, so the scores are read from global memory once (plus the selected values). Chunks of
 * 16,384 rather than 8,192: half the blocks exchanging histograms per row, at two blocks an SM. */
#define EXACT_THREADS 512
#define EXACT_WARPS (EXACT_THREADS / 32)
#define EXACT_BINS 2048          /* 11-bit digits: the descent takes 11, 11 and 10 bits */
#define EXACT_TILE 16384         /* entries a block takes while a row needs at most EXACT_MAX_BLOCKS */
#define EXACT_MAX_BLOCKS 16      /* the largest cluster sm_90 runs (non-portable past 8) */
#define EXACT_MAX_CACHED 16384   /* keys a block keeps: 64 KiB, so two blocks share an SM */
#define EXACT_LIST 2048          /* listed entries a block holds, EXACT_SEG a warp */
#define EXACT_SEG (EXACT_LIST / EXACT_WARPS)
#define EXACT_LOADS 8            /* entries per thread per step of the first pass: loads in flight */
#define EXACT_BATCH 4            /* entries per lane per step of a warp's sweeps */
#define EXACT_NO_BIN 0xffffffffu

static_assert(EXACT_BINS == 4 * EXACT_THREADS, "a thread owns 4 bins of each histogram");

/* A block's state, at the start of its dynamic shared memory; a cached chunk's keys follow it. */
struct alignas(16) exact_shared {
    uint32_t local[EXACT_BINS];                        /* this block's histogram of the pass */
    uint32_t total[3][EXACT_BINS];                     /* pass p's row histogram: see push_histogram */
    uint32_t list_key[EXACT_LIST];                     /* warp v's listed entries at [v * EXACT_SEG, ...): */
    uint16_t list_pos[EXACT_LIST];                     /* their keys and places in the warp's range */
    uint32_t seg_len[EXACT_WARPS];                     /* entries warp v listed (past EXACT_SEG: overflow) */
    uint32_t warp_a[EXACT_WARPS], warp_b[EXACT_WARPS]; /* per-warp counts and scan scratch */
    uint32_t digit, above, overflow;                   /* the pick, broadcast; whether a segment overflowed */
    uint32_t gt_before, eq_before;                     /* keys > T and == T in the earlier blocks: they add in */
    uint64_t loaded;                                   /* sm_90, cached: the chunk's bulk copy is in */
};

/* A cached chunk takes 3 entries more: its first 16-byte aligned score lands on a 16-byte boundary. */
static size_t exact_smem(bool cached, int chunk) {
    return sizeof(exact_shared) + (cached ? ((size_t)chunk + 3) * sizeof(uint32_t) : 0);
}

/* Cluster steps (sm_90). The launcher forms clusters only where the kernel runs sm_90 code, so the
 * other builds never reach these with more than one block a row. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned cluster_rank() { return cooperative_groups::this_cluster().block_rank(); }
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}
template <typename T> __device__ __forceinline__ T *cluster_at(T *p, unsigned rank) {
    return cooperative_groups::this_cluster().map_shared_rank(p, rank);
}
#else
__device__ __forceinline__ unsigned cluster_rank() { return 0; }
__device__ __forceinline__ void cluster_sync() { __trap(); }
template <typename T> __device__ __forceinline__ T *cluster_at(T *p, unsigned) {
    __trap();
    return p;
}
#endif

/* Every thread of the row's blocks (with one block: of the block) waits for all of them, and sees
 * what they wrote before, into their own shared memory or another block's. */
__device__ __forceinline__ void row_sync(int blocks) {
    if (blocks > 1) cluster_sync();
    else __syncthreads();
}

/* hist[bin]++ for every lane with bin != EXACT_NO_BIN; all 32 lanes call it. A warp whose lanes share
 * one bin (a run of one value) adds once; otherwise each lane adds for itself (__match_any_sync costs
 * more than the shared-memory atomics it saves unless most lanes collide). */
__device__ __forceinline__ void count_digit(uint32_t *hist, uint32_t bin) {
    const unsigned counted = __ballot_sync(0xffffffffu, bin != EXACT_NO_BIN);
    if (!counted) return;
    if (__all_sync(0xffffffffu, bin == __shfl_sync(0xffffffffu, bin, 0))) {
        if ((threadIdx.x & 31) == 0) atomicAdd(&hist[bin], (uint32_t)__popc(counted));
    } else if (bin != EXACT_NO_BIN) {
        atomicAdd(&hist[bin], 1u);
    }
}

/* The first pass: hist[key >> 21]++ for the chunk's scores xs[0, m). The loop bounds are the block's,
 * so whole warps reach count_digit together. */
__device__ __forceinline__ void first_pass_global(const float *xs, int m, uint32_t *hist) {
    for (int base = 0; base < m; base += EXACT_THREADS * EXACT_LOADS) {
        float v[EXACT_LOADS];
        load_strided<EXACT_LOADS, EXACT_THREADS>(v, xs, base, m, 0.0f);
#pragma unroll
        for (int u = 0; u < EXACT_LOADS; u++) {
            const int q = base + u * EXACT_THREADS + (int)threadIdx.x;
            count_digit(hist, q < m ? kp_topk_key(v[u]) >> 21 : EXACT_NO_BIN);
        }
    }
}

/* A cached chunk's first pass: the scores into keys[0, m) (keys sits in its 16-byte unit where xs does,
 * so the scores from xs's first 16-byte boundary on land on one), then each turned into its key in
 * place and counted. On sm_90 the aligned middle comes in one bulk copy (the copy engine keeps the whole
 * chunk in flight, where loads would be bounded by registers); `phase` is the parity of the bulk copies
 * this block has waited for. */
__device__ __forceinline__ void first_pass_cached(const float *xs, int m, uint32_t *keys, uint32_t *hist,
                                                  exact_shared &s, uint32_t &phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int head = min(m, (int)((16u - ((uint32_t)reinterpret_cast<uintptr_t>(xs) & 15u)) & 15u) / 4);
    const int body = (m - head) / 4 * 4; /* entries [head, head + body): whole 16-byte units */
    const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&s.loaded);
    if (threadIdx.x == 0 && body > 0) {
        /* the copy overwrites what this block's threads last read or wrote there (the barrier before
         * this call ordered that), seen through the async proxy */
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(body * 4) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         (uint32_t)__cvta_generic_to_shared(keys + head)),
                     "l"(xs + head), "r"(body * 4), "r"(bar)
                     : "memory");
    }
    const int edges = m - body; /* the head's entries and the tail's: at most 6 */
    if ((int)threadIdx.x < edges) {
        const int q = (int)threadIdx.x < head ? (int)threadIdx.x : body + (int)threadIdx.x;
        keys[q] = __float_as_uint(xs[q]);
    }
    if (body > 0) {
        uint32_t done = 0;
        do {
            asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done)
                         : "r"(bar), "r"(phase)
                         : "memory");
        } while (!done);
        phase ^= 1u;
    }
    __syncthreads(); /* the head and tail entries */
    for (int base = 0; base < m; base += EXACT_THREADS) {
        const int q = base + (int)threadIdx.x;
        uint32_t bin = EXACT_NO_BIN;
        if (q < m) {
            const uint32_t key = kp_topk_key(__uint_as_float(keys[q]));
            keys[q] = key;
            bin = key >> 21;
        }
        count_digit(hist, bin);
    }
#else
    (void)s, (void)phase;
    for (int base = 0; base < m; base += EXACT_THREADS * EXACT_LOADS) {
        float v[EXACT_LOADS];
        load_strided<EXACT_LOADS, EXACT_THREADS>(v, xs, base, m, 0.0f);
#pragma unroll
        for (int u = 0; u < EXACT_LOADS; u++) {
            const int q = base + u * EXACT_THREADS + (int)threadIdx.x;
            uint32_t bin = EXACT_NO_BIN;
            if (q < m) {
                const uint32_t key = kp_topk_key(v[u]);
                keys[q] = key;
                bin = key >> 21;
            }
            count_digit(hist, bin);
        }
    }
#endif
}

/* The row's histogram of a pass, from every block's: with one block, this block's; in a cluster, the
 * 4-bin group g (bins 4g .. 4g + 3) is summed in block g % blocks's `total` (each block adds its nonzero
 * counts there, one remote atomic each), which every block then reads (exact_pick). The owner zeroes
 * its groups after the row_sync that follows every block's reading them (zero_owned). This block's
 * histogram is left zeroed. Ends with row_sync. */
__device__ __forceinline__ void push_histogram(exact_shared &s, uint32_t *total, int blocks) {
    uint4 *mine = reinterpret_cast<uint4 *>(s.local) + threadIdx.x; /* group threadIdx.x */
    const uint4 v = *mine;
    *mine = make_uint4(0, 0, 0, 0);
    if (blocks == 1) {
        reinterpret_cast<uint4 *>(total)[threadIdx.x] = v;
    } else {
        uint32_t *at = cluster_at(total + 4 * threadIdx.x, threadIdx.x % blocks);
        if (v.x) atomicAdd(at, v.x);
        if (v.y) atomicAdd(at + 1, v.y);
        if (v.z) atomicAdd(at + 2, v.z);
        if (v.w) atomicAdd(at + 3, v.w);
    }
    row_sync(blocks);
}

/* In a cluster: this block's groups of a pass's `total`, once every block has read them. */
__device__ __forceinline__ void zero_owned(uint32_t *total, int blocks, unsigned rank) {
    for (int g = rank + threadIdx.x * blocks; g < EXACT_BINS / 4; g += EXACT_THREADS * blocks)
        reinterpret_cast<uint4 *>(total)[g] = make_uint4(0, 0, 0, 0);
}

/* The sum of v over the block's threads after this one (higher threadIdx.x). */
__device__ __forceinline__ uint32_t block_sum_after(uint32_t v, uint32_t *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t from_here = v; /* over lanes >= lane */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_down_sync(0xffffffffu, from_here, o);
        if (lane + o < 32) from_here += y;
    }
    if (lane == 0) scratch[warp] = from_here;
    __syncthreads();
    uint32_t after = from_here - v;
    for (int w = warp + 1; w < EXACT_WARPS; w++) after += scratch[w];
    return after;
}

/* kp_topk_pick_digit's rule over EXACT_BINS bins of a pass's row histogram (push_histogram), by the
 * whole block: the largest d whose bins d and up hold at least need entries; *above receives the count
 * in the bins above d. need >= 1 and the bins hold at least need entries, so exactly one bin passes
 * both tests. Every thread gets the answer. With one block the histogram is left zeroed. */
__device__ uint32_t exact_pick(uint32_t *total, int blocks, uint32_t need, uint32_t *above, exact_shared &s) {
    uint4 *group = reinterpret_cast<uint4 *>(total) + threadIdx.x; /* bins 4t .. 4t + 3 */
    uint4 h4;
    if (blocks == 1) {
        h4 = *group; /* read by this thread alone */
        *group = make_uint4(0, 0, 0, 0);
    } else {
        h4 = *cluster_at(group, threadIdx.x % blocks);
    }
    const uint32_t h[4] = {h4.x, h4.y, h4.z, h4.w};
    uint32_t after = block_sum_after(h[0] + h[1] + h[2] + h[3], s.warp_a); /* bins past 4t + 3 */
#pragma unroll
    for (int u = 3; u >= 0; u--) {
        if (after < need && after + h[u] >= need) s.digit = 4 * threadIdx.x + u, s.above = after;
        after += h[u];
    }
    __syncthreads();
    *above = s.above;
    return s.digit;
}

/* CACHED: the chunk's keys live in shared memory after the first pass; otherwise a sweep of the whole
 * chunk reads the scores again. Row r's window entries [rank * chunk, (rank + 1) * chunk) go to the
 * block of rank `rank` in the row's cluster (blocks * chunk >= width >= any window).
 * After the first pass picks the top digit d0, each warp lists its range's entries with a top digit
 * >= d0 (all a later pass or the output looks at) in index order; the later passes, the counts and
 * the writes then sweep the lists, or the whole chunk when a warp listed more than EXACT_SEG (the same
 * answer either way). Zeroing: pass p's row histogram total[p] is zeroed by its owners after the
 * row_sync that follows every block's reading it (the next pass's push; for pass 2, the counts'), and
 * no block adds into it again before the row_sync after that.
 * Blocks an SM holds: a cached chunk's shared memory allows 2; 40 registers a thread allow 3. */
template <bool CACHED>
__global__ void __launch_bounds__(EXACT_THREADS, CACHED ? 2 : 3)
    topk_exact_kernel(topk_params p, int blocks, int chunk) {
    extern __shared__ uint4 exact_dynamic[];
    exact_shared &s = *reinterpret_cast<exact_shared *>(exact_dynamic);
    uint32_t *const key_space = reinterpret_cast<uint32_t *>(&s + 1); /* CACHED: [chunk + 3] */
    uint32_t phase = 0;
    const unsigned rank = blocks > 1 ? cluster_rank() : 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned below = (1u << lane) - 1u;
    const int span = (chunk + EXACT_THREADS - 1) / EXACT_THREADS * 32, first = warp * span; /* warp's range */
    reinterpret_cast<uint4 *>(s.local)[threadIdx.x] = make_uint4(0, 0, 0, 0);
    for (int pass = 0; pass < 3; pass++) reinterpret_cast<uint4 *>(s.total[pass])[threadIdx.x] = make_uint4(0, 0, 0, 0);
    if (threadIdx.x == 0) s.gt_before = 0, s.eq_before = 0, s.overflow = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (CACHED && threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((uint32_t)__cvta_generic_to_shared(&s.loaded)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
#endif
    row_sync(blocks); /* zeroed, and every block of the cluster running, before any block adds in */
    for (int64_t r = blockIdx.x / blocks; r < p.rows; r += gridDim.x / blocks) {
        const topk_row w = row_at(p, r);
        const int64_t lo = min((int64_t)rank * chunk, w.len); /* the chunk: window entries [lo, lo + m) */
        const int m = (int)min((int64_t)chunk, w.len - lo);
        const float *xs = w.x + w.start + lo;
        /* CACHED: chunk entry q at keys[q], placed as xs[q] is in 16-byte units (key_space is aligned) */
        uint32_t *const keys = key_space + (((uint32_t)reinterpret_cast<uintptr_t>(xs) >> 2) & 3u);
        if (w.count > 0) { /* the same for every block of the row: all of them sync, or none */
            const auto key_at = [&](int q) { return CACHED ? keys[q] : kp_topk_key(xs[q]); };
            /* The count-th largest key T, as descend() in the host port: 3 passes of 11, 11, 10 bits. */
            uint32_t need = w.count, above;
            if (CACHED) first_pass_cached(xs, m, keys, s.local, s, phase);
            else first_pass_global(xs, m, s.local);
            __syncthreads();
            push_histogram(s, s.total[0], blocks);
            const uint32_t d0 = exact_pick(s.total[0], blocks, need, &above, s);
            need -= above;

            const int range = max(0, min(m - first, span)); /* this warp's chunk entries [first, first + range) */
            uint32_t *seg_key = s.list_key + warp * EXACT_SEG;
            uint16_t *seg_pos = s.list_pos + warp * EXACT_SEG;
            uint32_t listed = span <= 65536 ? 0 : EXACT_SEG + 1; /* a place past 16 bits: no list */
            for (int j0 = 0; j0 < range; j0 += 32 * EXACT_BATCH) {
                uint32_t key[EXACT_BATCH];
#pragma unroll
                for (int u = 0; u < EXACT_BATCH; u++) {
                    const int j = j0 + u * 32 + lane;
                    key[u] = j < range ? key_at(first + j) : 0;
                }
#pragma unroll
                for (int u = 0; u < EXACT_BATCH; u++) {
                    const int j = j0 + u * 32 + lane;
                    const bool take = j < range && (key[u] >> 21) >= d0;
                    const unsigned ballot = __ballot_sync(0xffffffffu, take);
                    const uint32_t slot = listed + (uint32_t)__popc(ballot & below);
                    if (take && slot < EXACT_SEG) seg_key[slot] = key[u], seg_pos[slot] = (uint16_t)j;
                    listed += (uint32_t)__popc(ballot);
                }
            }
            if (lane == 0 && listed > EXACT_SEG) s.overflow = 1;
            __syncthreads();
            const bool in_list = s.overflow == 0; /* the block's choice */
            const int n = in_list ? (int)listed : range; /* the warp's entries j in [0, n), in index order */
            const auto entry_key = [&](int j) { return in_list ? seg_key[j] : key_at(first + j); };
            const auto entry_pos = [&](int j) { return first + (in_list ? (int)seg_pos[j] : j); };

            uint32_t prefix = d0 << 21, mask = 0x7ffu << 21;
            for (int pass = 1; pass < 3; pass++) {
                const int shift = pass == 1 ? 10 : 0;
                const uint32_t digit_mask = pass == 1 ? 0x7ffu : 0x3ffu;
                for (int j0 = 0; j0 < n; j0 += 32 * EXACT_BATCH) {
                    uint32_t key[EXACT_BATCH];
#pragma unroll
                    for (int u = 0; u < EXACT_BATCH; u++) {
                        const int j = j0 + u * 32 + lane;
                        key[u] = j < n ? entry_key(j) : 0;
                    }
#pragma unroll
                    for (int u = 0; u < EXACT_BATCH; u++) {
                        const int j = j0 + u * 32 + lane;
                        count_digit(s.local, j < n && (key[u] & mask) == prefix ? (key[u] >> shift) & digit_mask
                                                                                 : EXACT_NO_BIN);
                    }
                }
                __syncthreads();
                push_histogram(s, s.total[pass], blocks);
                if (blocks > 1) zero_owned(s.total[pass - 1], blocks, rank); /* read before that row_sync */
                const uint32_t d = exact_pick(s.total[pass], blocks, need, &above, s);
                need -= above;
                prefix |= d << shift;
                mask |= digit_mask << shift;
            }
            const uint32_t t = prefix, ties = need;

            /* Every key > t and the first `ties` keys == t in index order: an entry's slot is the keys > t
             * before it plus min(keys == t before it, ties). The counts before a warp's entries come from
             * the earlier warps and the earlier blocks of the row. */
            uint32_t gt_count = 0, eq_count = 0;
            for (int j0 = 0; j0 < n; j0 += 32 * EXACT_BATCH) {
                uint32_t key[EXACT_BATCH];
#pragma unroll
                for (int u = 0; u < EXACT_BATCH; u++) {
                    const int j = j0 + u * 32 + lane;
                    key[u] = j < n ? entry_key(j) : 0;
                }
#pragma unroll
                for (int u = 0; u < EXACT_BATCH; u++) {
                    const bool in = j0 + u * 32 + lane < n;
                    gt_count += (uint32_t)__popc(__ballot_sync(0xffffffffu, in && key[u] > t));
                    eq_count += (uint32_t)__popc(__ballot_sync(0xffffffffu, in && key[u] == t));
                }
            }
            if (lane == 0) s.warp_a[warp] = gt_count, s.warp_b[warp] = eq_count;
            __syncthreads();
            uint32_t gt_run = 0, eq_run = 0, block_gt = 0, block_eq = 0;
            for (int v = 0; v < EXACT_WARPS; v++) {
                if (v < warp) gt_run += s.warp_a[v], eq_run += s.warp_b[v];
                block_gt += s.warp_a[v], block_eq += s.warp_b[v];
            }
            if (blocks > 1) {
                if (threadIdx.x > rank && (int)threadIdx.x < blocks) { /* into each later block */
                    exact_shared *later = cluster_at(&s, threadIdx.x);
                    atomicAdd(&later->gt_before, block_gt);
                    atomicAdd(&later->eq_before, block_eq);
                }
                row_sync(blocks); /* the last access to another block's memory in this row */
                zero_owned(s.total[2], blocks, rank);
                gt_run += s.gt_before, eq_run += s.eq_before;
            }
            for (int j0 = 0; j0 < n; j0 += 32 * EXACT_BATCH) {
                if (gt_run + min(eq_run, ties) >= w.count) break; /* warp-uniform: the rest is not taken */
                uint32_t key[EXACT_BATCH];
#pragma unroll
                for (int u = 0; u < EXACT_BATCH; u++) {
                    const int j = j0 + u * 32 + lane;
                    key[u] = j < n ? entry_key(j) : 0;
                }
                /* the batch's slots and values first, then its stores: the value loads overlap */
                uint32_t slot[EXACT_BATCH];
                float value[EXACT_BATCH];
                int q[EXACT_BATCH]; /* chunk entries */
#pragma unroll
                for (int u = 0; u < EXACT_BATCH; u++) {
                    const int j = j0 + u * 32 + lane;
                    const bool gt = j < n && key[u] > t, eq = j < n && key[u] == t;
                    const unsigned gt_ballot = __ballot_sync(0xffffffffu, gt);
                    const unsigned eq_ballot = __ballot_sync(0xffffffffu, eq);
                    const uint32_t eq_rank = eq_run + (uint32_t)__popc(eq_ballot & below);
                    slot[u] = EXACT_NO_BIN;
                    if (gt || (eq && eq_rank < ties)) {
                        slot[u] = gt_run + (uint32_t)__popc(gt_ballot & below) + min(eq_rank, ties);
                        q[u] = entry_pos(j);
                        value[u] = __ldg(xs + q[u]); /* a move: NaN payloads kept */
                    }
                    gt_run += (uint32_t)__popc(gt_ballot), eq_run += (uint32_t)__popc(eq_ballot);
                }
#pragma unroll
                for (int u = 0; u < EXACT_BATCH; u++)
                    if (slot[u] != EXACT_NO_BIN) {
                        const int32_t i = (int32_t)(lo + q[u]); /* window entry */
                        w.idx[slot[u]] = p.index_base == KP_TOPK_BASE_WINDOW ? i : w.start + i;
                        w.val[slot[u]] = value[u];
                    }
            }
            __syncthreads(); /* the keys, lists and counts read before the next row writes them */
            if (threadIdx.x == 0) s.gt_before = 0, s.eq_before = 0, s.overflow = 0;
        }
        for (int64_t j = (int64_t)w.count + rank * EXACT_THREADS + threadIdx.x; j < p.k;
             j += (int64_t)blocks * EXACT_THREADS) {
            w.idx[j] = p.fill;
            w.val[j] = -INFINITY;
        }
    }
}

static int exact_supports(const void *args, char *message, size_t message_len) {
    return topk_check("topk.radix_exact@cuda", args, message, message_len);
}

/* What radix_exact's launcher asks the driver about a device, once per device: whether the kernel runs
 * sm_90 code (clusters), and the shared memory a block may take (the cached kernel's limit is set
 * then, and the non-portable cluster size allowed). */
struct exact_device {
    bool ready, clusters;
    size_t smem_limit;
};
#define EXACT_MAX_DEVICES 64
static std::mutex exact_devices_lock;
static exact_device exact_devices[EXACT_MAX_DEVICES];

static int exact_device_ready(exact_device *d, int device, char *message, size_t message_len) {
    if (d->ready) return KP_RUN_OK;
    *d = exact_device{};
    cudaFuncAttributes fa;
    KP_CUDA_CHECK(cudaFuncGetAttributes(&fa, topk_exact_kernel<true>));
    d->clusters = fa.binaryVersion >= 90;
    int optin = 0;
    KP_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    d->smem_limit = exact_smem(true, EXACT_MAX_CACHED);
    if ((size_t)optin < d->smem_limit) d->smem_limit = (size_t)optin;
    KP_CUDA_CHECK(cudaFuncSetAttribute(topk_exact_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)d->smem_limit));
    /* all of the unified L1 as shared memory: blocks an SM holds are bounded by it, not by the split */
    KP_CUDA_CHECK(cudaFuncSetAttribute(topk_exact_kernel<true>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    if (d->clusters) {
        const cudaFuncAttribute wide = cudaFuncAttributeNonPortableClusterSizeAllowed;
        KP_CUDA_CHECK(cudaFuncSetAttribute(topk_exact_kernel<true>, wide, 1));
        KP_CUDA_CHECK(cudaFuncSetAttribute(topk_exact_kernel<false>, wide, 1));
    }
    d->ready = true;
    return KP_RUN_OK;
}

/* A launch's tiling, from the width alone (and the device): ceil(width / EXACT_TILE) blocks a row up
 * to EXACT_MAX_BLOCKS (one without clusters), the width split evenly between them; cached when a
 * chunk's keys fit. */
struct exact_plan {
    int blocks, chunk;
    bool cached;
    size_t smem;
};
static exact_plan exact_plan_of(int64_t width, const exact_device &d) {
    exact_plan pl;
    const int64_t tiles = (width + EXACT_TILE - 1) / EXACT_TILE;
    pl.blocks = d.clusters ? (int)(tiles < EXACT_MAX_BLOCKS ? tiles : EXACT_MAX_BLOCKS) : 1;
    pl.chunk = (int)((width + pl.blocks - 1) / pl.blocks);
    pl.cached = pl.chunk <= EXACT_MAX_CACHED && exact_smem(true, pl.chunk) <= d.smem_limit;
    pl.smem = exact_smem(pl.cached, pl.chunk);
    return pl;
}

static int exact_run(const void *args, char *message, size_t message_len) {
    const int rc = exact_supports(args, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    const kp_topk_args *a = static_cast<const kp_topk_args *>(args);
    int device = 0;
    KP_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> hold(exact_devices_lock);
    exact_device scratch = {}; /* a device past the table is asked on every call */
    exact_device *dev = device < EXACT_MAX_DEVICES ? &exact_devices[device] : &scratch;
    const int ready = exact_device_ready(dev, device, message, message_len);
    if (ready != KP_RUN_OK) return ready;
    const exact_plan pl = exact_plan_of(a->width, *dev);
    /* one cluster a row; rows past the grid limit are taken by the clusters' row loop */
    const int64_t clusters = a->rows < INT32_MAX / pl.blocks ? a->rows : INT32_MAX / pl.blocks;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(clusters * pl.blocks));
    cfg.blockDim = dim3(EXACT_THREADS);
    cfg.dynamicSmemBytes = pl.smem;
    cfg.stream = static_cast<cudaStream_t>(a->stream);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)pl.blocks;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pl.blocks > 1 ? 1 : 0;
    const topk_params p = topk_params_of(a);
    const cudaError_t e = pl.cached ? cudaLaunchKernelEx(&cfg, topk_exact_kernel<true>, p, pl.blocks, pl.chunk)
                                    : cudaLaunchKernelEx(&cfg, topk_exact_kernel<false>, p, pl.blocks, pl.chunk);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* reported here, not again by a later check */
        return kp_cuda_call_fail(message, message_len, "cudaLaunchKernelEx", e, __FILE__, __LINE__, NULL);
    }
    return KP_RUN_OK;
}

extern "C" {
extern const kp_impl kp_topk_radix_exact_cuda;
}

extern "C" const kp_impl kp_topk_radix_exact_cuda = {
    KP_ABI_VERSION, "topk", "topk.radix_exact@cuda", KP_MEMORY_CUDA,
    topk_workspace_bytes, exact_supports, exact_run,
};
