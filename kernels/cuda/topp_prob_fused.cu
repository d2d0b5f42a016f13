/* topp_prob_fused.cu: topp.split_prob@cuda's fused path, one thread-block cluster per row holding
 * the row in shared memory (sm_90 and later), and the host calls the launcher makes for it.
 * Overview: topp_split.cu. */
#include "topp_prob.cuh"

/* ---- split_prob fused: one thread-block cluster per row, the row held in shared memory ----
 * The same steps and the same bits as the kernels above, in one launch (then prob_select_kernel for
 * rows whose level needs a trim): block r of a row's cluster of C holds tiles [r T, r T + T) of it,
 * read from global memory once. The cluster's blocks meet at cluster barriers and read each other's
 * shared memory (tile records, bucket counts); every block computes the same search state from the
 * same integer sums, so all take the same branches and barriers. Used while a row fits: at most
 * FUSED_MAX_CLUSTER blocks of FUSED_MAX_TILES tiles (see topp_fused_plan). */
#define FUSED_THREADS 512
#define FUSED_WARPS (FUSED_THREADS / 32)
#define FUSED_LOADS 8 /* loads in flight per thread while filling */

struct fused_shared {
    unsigned hist_words[HIST_WORDS];          /* the round's counts; then, as 64-bit words, the row's buckets */
    unsigned long long part[PROB_F + 1];      /* this block's share of the row's counts, summed over the cluster */
    topp_stats tiles[FUSED_MAX_TILES];
    kp_topp_search s;
    float below, above;
};
#define FUSED_FIXED_BYTES ((sizeof(fused_shared) + 15) / 16 * 16)
static_assert(HIST_WORDS * sizeof(unsigned) >= (PROB_F + 1) * sizeof(unsigned long long), "the buckets fit the counts");

namespace cg = cooperative_groups;

__global__ void __launch_bounds__(FUSED_THREADS, 2) prob_fused_kernel(topp_plan plan, int tiles_per_block) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900 /* thread-block clusters: sm_90 and later */
    extern __shared__ __align__(16) unsigned char fused_smem[];
    fused_shared &sh = *reinterpret_cast<fused_shared *>(fused_smem);
    float *xs = reinterpret_cast<float *>(fused_smem + FUSED_FIXED_BYTES);
    cg::cluster_group cluster = cg::this_cluster();
    const int C = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    const int64_t row = blockIdx.x / C;
    const float *x = plan.logits + row * plan.row_stride;
    float *y = plan.out + row * plan.row_stride;
    const int first_tile = min(rank * tiles_per_block, plan.piece_count);
    const int my_tiles = min(first_tile + tiles_per_block, plan.piece_count) - first_tile;
    const int begin = min(first_tile * KP_TOPP_TILE, plan.vocab);
    const int n = min(begin + my_tiles * KP_TOPP_TILE, plan.vocab) - begin;
    const int padded = my_tiles * KP_TOPP_TILE;

    /* 1. the block's tokens, NaN (absent) past the row */
    if (rank == 0 && t == 0) {
        atomicExch(plan.counts + row * CNT_WORDS + CNT_LEVEL, 0u); /* appended to after a cluster barrier */
        __threadfence();
    }
    for (int base = 0; base < padded; base += FUSED_THREADS * FUSED_LOADS) {
        float v[FUSED_LOADS];
        load_strided<FUSED_LOADS, FUSED_THREADS>(v, x + begin, base, n, NAN);
#pragma unroll
        for (int u = 0; u < FUSED_LOADS; u++) {
            const int i = base + u * FUSED_THREADS + t;
            if (i < padded) xs[i] = v[u];
        }
    }
    __syncthreads();
    /* 2. tile records, a warp per tile */
    for (int tl = warp; tl < my_tiles; tl += FUSED_WARPS) {
        const float *tile = xs + tl * KP_TOPP_TILE;
        const topp_stats rec = tile_stats_warp([&](int q) { return tile[lane + 32 * q]; });
        if (lane == 0) sh.tiles[tl] = rec;
    }
    cluster.sync();
    /* 3. the row's start, from every block's records in tile order */
    if (warp == 0) {
        kp_topp_search s0;
        start_search_warp(
            [&](int i) {
                const topp_stats *remote = cluster.map_shared_rank(sh.tiles, i / tiles_per_block);
                return remote[i % tiles_per_block];
            },
            plan.piece_count, plan.top_p[row], &s0);
        if (lane == 0) sh.s = s0;
    }
    __syncthreads();
    /* 4. the rounds */
    unsigned long long *const buckets = reinterpret_cast<unsigned long long *>(sh.hist_words);
    for (int round = 0; round < PROB_R; round++) {
        if (sh.s.mode != KP_TOPP_LIVE) break; /* the same state in every block: all leave together */
        for (int k = t; k < HIST_WORDS; k += FUSED_THREADS) sh.hist_words[k] = 0;
        if (t == 0) prob_band(sh.s.z, sh.s.lo, sh.s.hi, &sh.below, &sh.above);
        __syncthreads();
        round_counter rc(sh.hist_words, sh.s, sh.below, sh.above);
        for (int i = t; i < n; i += FUSED_THREADS) rc.add(xs[i]);
        rc.flush();
        cluster.sync(); /* every block's counts are complete */
        /* this block's share of the indices, summed over the cluster (integer sums: order-free) */
        const int span = rc.narrow ? (int)rc.width : PROB_F, per = (span + C - 1) / C;
        const int share_lo = 1 + rank * per, share_hi = min(span, share_lo - 1 + per);
        for (int i = share_lo + t; i <= share_hi; i += FUSED_THREADS) {
            unsigned long long sum = 0;
            if (!rc.narrow) { /* every block's two words loaded first, so the remote reads overlap */
                unsigned lo_w[FUSED_MAX_CLUSTER], hi_w[FUSED_MAX_CLUSTER];
#pragma unroll
                for (int r = 0; r < FUSED_MAX_CLUSTER; r++) {
                    const unsigned *w = cluster.map_shared_rank(sh.hist_words, r < C ? r : 0);
                    lo_w[r] = r < C ? w[i] : 0u;
                    hi_w[r] = r < C ? w[PROB_F + 1 + i] : 0u;
                }
#pragma unroll
                for (int r = 0; r < FUSED_MAX_CLUSTER; r++) sum += ((unsigned long long)hi_w[r] << 32) | lo_w[r];
            } else {
                for (int r = 0; r < C; r++) sum += round_counter::total(cluster.map_shared_rank(sh.hist_words, r), true, i);
            }
            sh.part[i] = sum;
        }
        cluster.sync(); /* every share is complete, and no block reads counts any more */
        { /* buckets 1 .. F (decide_round's), the owners' sums up to span and 0 past it, all loaded before
             any is stored (the compiler cannot tell that the stores do not alias the remote loads) */
            constexpr int K = PROB_F / FUSED_THREADS;
            static_assert(K * FUSED_THREADS == PROB_F, "a whole number of buckets per thread");
            unsigned long long v[K];
#pragma unroll
            for (int k = 0; k < K; k++) {
                const int i = 1 + t + k * FUSED_THREADS;
                v[k] = i <= span ? cluster.map_shared_rank(sh.part, (i - 1) / per)[i] : 0ull;
            }
#pragma unroll
            for (int k = 0; k < K; k++) buckets[1 + t + k * FUSED_THREADS] = v[k];
        }
        __syncthreads();
        decide_round<FUSED_THREADS>([&](int k) { return buckets[k]; }, &sh.s, round + 1 == PROB_R);
    }
    cluster.sync(); /* no block leaves while another may still read its shared memory */
    const kp_topp_search s = sh.s;
    if (rank == 0 && t == 0) plan.search[row * (PROB_R + 1) + PROB_R] = s; /* for prob_select_kernel */

    /* 5. the mask, as prob_mask_kernel */
    if (s.mode == KP_TOPP_COPY) { /* bits, NaN payloads included */
        const uint32_t *xb = reinterpret_cast<const uint32_t *>(xs);
        uint32_t *yb = reinterpret_cast<uint32_t *>(y + begin);
        for (int i = t; i < n; i += FUSED_THREADS) yb[i] = xb[i];
        return;
    }
    if (s.mode == KP_TOPP_KEEP_FINITE) {
        for (int i = t; i < n; i += FUSED_THREADS) y[begin + i] = finite_logit(xs[i]) ? xs[i] : -INFINITY;
        return;
    }
    const mask_rule rule = block_mask_rule(s, &sh.below, &sh.above);
    if (!level_trimmed(s)) {
        for (int i = t; i < n; i += FUSED_THREADS) y[begin + i] = rule.classify(xs[i]) != MASK_DROP ? xs[i] : -INFINITY;
        return;
    }
    /* A trimmed level's members are left to prob_select_kernel, listed for it when the list can hold
     * them all: the search knows the level's size (numdup, from exact integer masses), and a count
     * past level_cap makes the select rescan the row, so a larger level is not listed at all. */
    const bool listing = s.numdup <= plan.level_cap;
    unsigned *const count = plan.counts + row * CNT_WORDS + CNT_LEVEL;
    if (!listing) {
        if (rank == 0 && t == 0) *count = (unsigned)min(s.numdup, (int64_t)UINT32_MAX);
        for (int i = t; i < n; i += FUSED_THREADS) {
            const int c = rule.classify(xs[i]);
            if (c != MASK_LEVEL) y[begin + i] = c == MASK_KEEP ? xs[i] : -INFINITY;
        }
        return;
    }
    /* Each warp gathers its members in its own part of the counts' and sums' words (free since the
     * last cluster barrier) and appends them to the row's list with one atomic per flush, not a global
     * atomic per warp and token group, which was slower (measured variants: MEASURED.md). */
    constexpr int WARP_LIST = HIST_WORDS / FUSED_WARPS;
    static_assert(WARP_LIST >= 64 && 2 * (PROB_F + 1) >= HIST_WORDS, "a warp's share holds two groups of 32 members");
    uint32_t *const wkey = sh.hist_words + warp * WARP_LIST;
    uint32_t *const widx = reinterpret_cast<uint32_t *>(sh.part) + warp * WARP_LIST;
    uint32_t *const list_key = row_level_list(plan, row), *const list_idx = list_key + plan.level_cap;
    int gathered = 0; /* members gathered, the same in every lane */
    auto flush = [&] {
        __syncwarp();
        unsigned base = 0;
        if (lane == 0) base = atomicAdd(count, (unsigned)gathered);
        base = __shfl_sync(0xffffffffu, base, 0);
        for (int j = lane; j < gathered; j += 32)
            if (base + j < (unsigned)plan.level_cap) {
                list_key[base + j] = wkey[j];
                list_idx[base + j] = widx[j];
            }
        __syncwarp();
        gathered = 0;
    };
    for (int b = warp * 32; b < n; b += FUSED_THREADS) { /* whole warps: the ballot below */
        const int i = b + lane;
        const float v = i < n ? xs[i] : NAN;
        const int c = rule.classify(v); /* NaN: MASK_DROP */
        const unsigned level = __ballot_sync(0xffffffffu, c == MASK_LEVEL);
        if (c == MASK_LEVEL) {
            const int pos = gathered + __popc(level & ((1u << lane) - 1u));
            wkey[pos] = kp_topp_logit_key(v);
            widx[pos] = (uint32_t)(begin + i);
        } else if (i < n) {
            y[begin + i] = c == MASK_KEEP ? v : -INFINITY;
        }
        gathered += __popc(level);
        if (gathered > WARP_LIST - 32) flush();
    }
    if (gathered) flush();
#else
    __trap(); /* no cluster code for this architecture: topp_fused_plan never launches it here */
#endif
}

/* The fused kernel's launch: batch clusters of c blocks; *attr must outlive *cfg's use. */
static void fused_launch_config(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr, int c, int64_t batch, size_t smem,
                                cudaStream_t stream) {
    *cfg = cudaLaunchConfig_t{};
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = (unsigned)c;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg->gridDim = dim3((unsigned)(batch * c));
    cfg->blockDim = dim3(FUSED_THREADS);
    cfg->dynamicSmemBytes = smem;
    cfg->stream = stream;
    cfg->attrs = attr;
    cfg->numAttrs = 1;
}

bool prob_fused_has_clusters(cudaError_t *e) {
    cudaFuncAttributes fa;
    *e = cudaFuncGetAttributes(&fa, prob_fused_kernel);
    return *e == cudaSuccess && fa.binaryVersion >= 90;
}

/* once per device: the most shared memory any fused shape takes, and clusters past 8 blocks */
cudaError_t prob_fused_set_limits(void) {
    const int bytes = (int)prob_fused_smem(FUSED_MAX_TILES);
    cudaError_t e = cudaFuncSetAttribute(prob_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(prob_fused_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

size_t prob_fused_smem(int tiles_per_block) {
    return FUSED_FIXED_BYTES + (size_t)tiles_per_block * KP_TOPP_TILE * sizeof(float);
}

cudaError_t prob_fused_max_active(int *active, int cluster, size_t smem) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr;
    fused_launch_config(&cfg, &attr, cluster, 1, smem, 0);
    return cudaOccupancyMaxActiveClusters(active, prob_fused_kernel, &cfg);
}

cudaError_t prob_fused_launch(const topp_plan &plan, int cluster, int tiles_per_block, int64_t batch, size_t smem,
                              cudaStream_t stream) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr;
    fused_launch_config(&cfg, &attr, cluster, batch, smem, stream);
    return cudaLaunchKernelEx(&cfg, prob_fused_kernel, plan, tiles_per_block);
}
