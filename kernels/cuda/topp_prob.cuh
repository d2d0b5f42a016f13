/* topp_prob.cuh: split_prob's device steps shared by its split kernels (topp_split_prob.cu), its
 * fused kernel (topp_prob_fused.cu) and its select kernel (topp_prob_select.cu): the search's
 * counters and states, tile records, the row's start, bands, buckets, a round's decision and the
 * mask's rule; and the sizes the launchers need. Overview: topp_split.cu. */
#ifndef KP_TOPP_PROB_CUH
#define KP_TOPP_PROB_CUH

#include "topp_cuda.cuh"
#include "topp_div.cuh"

/* ---- split_prob: the exact level search of topp_split.h (kp_topp_* shared with the host port) ---- */

#define PROB_F KP_TOPP_FANOUT_PROB_GPU
#define PROB_R KP_TOPP_ROUNDS_PROB_GPU
static_assert(KP_TOPP_TILE == 8 * TOPP_THREADS, "tile_stats_warp: a lane stands for 8 lanes of 8 tokens");
/* per-row counters of finished programs, one per kernel that ends in a last-program step; CNT_CAND:
 * tokens round 1 listed; CNT_MASKED: 1 once round 1's last program wrote the listed tokens' outputs */
enum { CNT_LEVEL = 0, CNT_STATS = 1, CNT_ROUND = 2, CNT_CAND = CNT_ROUND + PROB_R, CNT_MASKED, CNT_WORDS = 8 };
static_assert(CNT_MASKED < CNT_WORDS, "a counter per round, the candidates' and the mask's flag");

/* split_prob's reads of the logits carry L2 eviction priorities (l2_policy_keep, l2_policy_drop,
 * kp_cuda.cuh): the statistics and round 0 read a row with evict_last, so that round 1, the last pass
 * over most rows, finds it in L2; round 1 and the mask read it with evict_first, which also leaves no
 * line of it at evict_last once the call is done, and write the outputs with .cs stores. */

/* A place for each thread that gets here together, consecutive from *count (a counter in shared or
 * global memory): one atomic per group of such threads, the places in a varying order. */
__device__ __forceinline__ unsigned claim_slot(unsigned *count) {
    cooperative_groups::coalesced_group g = cooperative_groups::coalesced_threads();
    unsigned pos = 0;
    if (g.thread_rank() == 0) pos = atomicAdd(count, g.size());
    return g.shfl(pos, 0) + g.thread_rank();
}

/* Appends i to list (cap entries) after *count (claim_slot). */
__device__ __forceinline__ void append_index(uint32_t *list, unsigned *count, unsigned cap, uint32_t i) {
    const unsigned pos = claim_slot(count);
    if (pos < cap) list[pos] = i;
}

/* The last program of a row to get here returns true (for the whole block), after every other
 * program's global writes and atomics are visible to it (the fence-then-count pattern). Each counter
 * is zeroed by the launcher's memset and used once per call. Every thread fences: fencing in thread 0
 * alone, after the barrier, was no faster (measured variants: MEASURED.md). */
__device__ __forceinline__ bool last_program_of_row(unsigned *counter, int slices) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == (unsigned)(slices - 1);
    __syncthreads();
    if (last) __threadfence();
    return last;
}

/* Step 1's combine for one row, by one warp, from its tiles' records (fetch(i), in tile order): max,
 * min and count are order-free; Z adds the tiles' terms in tile order (the host port's order), each
 * lane computing the terms of its tiles and every lane adding them all, in order, via shuffles.
 * Lane 0 starts the search in *out. */
template <typename Fetch>
__device__ __forceinline__ void start_search_warp(Fetch fetch, int pieces, float top_p, kp_topp_search *out) {
    const int lane = threadIdx.x & 31;
    float row_max = -INFINITY, row_min = INFINITY;
    long long finite = 0;
    for (int i = lane; i < pieces; i += 32) {
        const topp_stats st = fetch(i);
        if (st.count == 0) continue;
        row_max = fmaxf(row_max, st.max);
        row_min = fminf(row_min, st.min);
        finite += st.count;
    }
    for (int off = 16; off > 0; off /= 2) {
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, off));
        row_min = fminf(row_min, __shfl_xor_sync(0xffffffffu, row_min, off));
        finite += __shfl_xor_sync(0xffffffffu, finite, off);
    }
    float z = 0.0f; /* an empty tile adds +0: z (>= +0) keeps its bits, as the host's skip does */
    for (int base = 0; base < pieces; base += 32) {
        const int i = base + lane, n = min(32, pieces - base);
        float term = 0.0f;
        if (i < pieces) {
            const topp_stats st = fetch(i);
            if (st.count) term = __fmul_rn(st.sum, expf(st.max - row_max));
        }
        for (int k = 0; k < n; k++) z = z + __shfl_sync(0xffffffffu, term, k);
    }
    if (lane == 0) {
        const float min_prob = finite ? expf(row_min - row_max) / z : 0.0f;
        kp_topp_start(out, row_max, z, row_min, finite, top_p, min_prob);
    }
}

/* One tile's record by one warp (get(q) = token lane + 32q of the tile, NaN past the row). Lane l
 * stands for the lanes l + 32j (j = 0..7) of topp_stats_kernel's 256-lane reduction: it reads their
 * 64 tokens, keeps their 8 sums in the same order, and warp_tree_sum's first levels combine them as
 * that tree does, so the record is the same bits. Valid in lane 0. */
#define STATS_LANE (KP_TOPP_TILE / 32) /* tokens per lane of a tile */
/* The fused kernel's statistics (the split path's prob_stats_kernel runs a block per tile). get(q)
 * is called twice per token, once for max/min/count and once for the sums: holding a lane's 64
 * tokens in registers, or reading the first pass as float4s, was slower (measured variants: MEASURED.md). */
template <typename Get>
__device__ __forceinline__ topp_stats tile_stats_warp(Get get) {
    auto token = [&](int q) { return get(q); }; /* token 8u + j = lane + 32j + 256u */
    constexpr int unroll_q = 16, unroll_u = 1;
    float mx = -INFINITY, mn = INFINITY;
    int count = 0;
#pragma unroll unroll_q
    for (int q = 0; q < STATS_LANE; q++) { /* no branch: a non-finite token leaves max, min and count as they are */
        const float x = token(q);
        const bool f = finite_logit(x);
        mx = fmaxf(mx, f ? x : -INFINITY);
        mn = fminf(mn, f ? x : INFINITY);
        count += f;
    }
    for (int off = 16; off > 0; off /= 2) { /* order-free */
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, off));
        count += __shfl_xor_sync(0xffffffffu, count, off);
    }
    float s[8]; /* s[j]: lane l + 32j's sum, its tokens in order */
#pragma unroll
    for (int j = 0; j < 8; j++) s[j] = 0.0f;
#pragma unroll unroll_u
    for (int u = 0; u < STATS_LANE / 8; u++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float x = token(8 * u + j);
            /* a non-finite token adds expf(-inf) = +0, which keeps s[j]'s bits (s[j] >= +0): no branch */
            s[j] = s[j] + expf(finite_logit(x) ? x - mx : -INFINITY);
        }
    /* warp_tree_sum from registers: buf[l + 32j] = s[j] */
    const float v0 = s[0] + s[4], v1 = s[1] + s[5], v2 = s[2] + s[6], v3 = s[3] + s[7];
    float sum = (v0 + v2) + (v1 + v3);
    for (int half = 16; half > 0; half /= 2) sum = sum + __shfl_down_sync(0xffffffffu, sum, half);
    return topp_stats{mx, sum, mn, count};
}

__device__ __forceinline__ topp_stats load_stats_l2(const topp_stats *p) {
    const uint4 raw = __ldcg(reinterpret_cast<const uint4 *>(p));
    return *reinterpret_cast<const topp_stats *>(&raw);
}

/* Bounds on the f32 d = x - M outside which prob(x) is surely <= lo (d < *below) or surely > hi
 * (d > *above), KP_TOPP_BAND_MARGIN nats outside log(lo z) and log(hi z). In f32: the product rounds
 * by 2^-24 relative (6e-8 nats), logf errs by at most 1 ulp and the margin's addition by half an
 * ulp, an ulp being at most 2^-17 nats here (|log| < 128: 1e-30 <= lo z and hi z <= 2^31); under
 * 3e-5 nats in all, so at least 9.7e-4 of the margin stays, where expf and the division need about
 * 3e-7. Float, not double: one thread computes this at the start of every program while its block
 * waits, and a double log is a long software sequence. */
static __device__ __noinline__ void prob_band(float z, uint32_t lo, uint32_t hi, float *below, float *above) {
    *below = logf(kp_topp_float(lo) * z) - (float)KP_TOPP_BAND_MARGIN;
    *above = logf(kp_topp_float(hi) * z) + (float)KP_TOPP_BAND_MARGIN;
}

/* Adds fix-mass v (< 2^63) to a bucket exactly with native 32-bit shared atomics: the low word's
 * carry goes to the high word. Integer sums, so the order of the adds cannot change a bit. Round 0's
 * time is its per-token exp and division, not these atomics: split-significand reductions, fewer
 * adds and 64-bit atomics (a compare-and-swap loop on sm_90) were no faster (measured variants:
 * MEASURED.md). */
__device__ __forceinline__ void bucket_add(unsigned *lo_word, unsigned *hi_word, unsigned long long v) {
    const unsigned v_lo = (unsigned)v;
    const unsigned old = atomicAdd(lo_word, v_lo);
    const unsigned v_hi = (unsigned)(v >> 32) + (old + v_lo < old ? 1u : 0u);
    if (v_hi) atomicAdd(hi_word, v_hi);
}

/* The GPU's pivots (topp_split.h, 3.): pivot_f = lo + f * 2^sh, sh the smallest with F * 2^sh >= hi - lo. */
__device__ __forceinline__ int pivot_shift(uint32_t lo, uint32_t hi) {
    static_assert(PROB_F == 1 << 11, "the shift assumes F = 2^11");
    return kp_topp_gpu_shift(lo, hi);
}

/* A round's outcome from the row's bucket masses (load(k), k = 1 .. F), by a block of THREADS, in
 * parallel: with S(k) = hist[k] + ... + hist[F], mass(f) = mass(hi) + S(f + 1) falls as f rises, so
 * j = #{f : mass(f) >= P} - 1; thread t owns f = B t .. B t + B - 1 and buckets B t + 1 .. B t + B
 * (B = F / THREADS). Integer sums: the same j, mass(j), mass(j + 1) as topp_split.h's top-down scan.
 * kp_topp_advance_to does the rest on thread 0, into *s (shared). */
template <int THREADS, typename Load>
__device__ __forceinline__ void decide_round(Load load, kp_topp_search *s, bool final_round) {
    constexpr int B = PROB_F / THREADS;
    static_assert(B * THREADS == PROB_F, "whole buckets per thread");
    __shared__ unsigned long long warp_total[THREADS / 32];
    __shared__ unsigned long long mass_j, mass_next;
    __shared__ int count_ok;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    unsigned long long h[B], mine = 0;
#pragma unroll
    for (int k = 0; k < B; k++) {
        h[k] = load(B * t + 1 + k);
        mine += h[k];
    }
    /* above = S(B t + B + 1), the chunks after t: a suffix scan in the warp, then the later warps' totals */
    unsigned long long suffix = mine;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
        const unsigned long long other = __shfl_down_sync(0xffffffffu, suffix, off);
        if (lane + off < 32) suffix += other;
    }
    if (lane == 0) warp_total[warp] = suffix;
    if (t == 0) count_ok = 0;
    __syncthreads();
    unsigned long long above = suffix - mine;
    for (int w = warp + 1; w < THREADS / 32; w++) above += warp_total[w];
    const unsigned long long target = s->target;
    /* pivots at or past hi (f > last) are left out: they count nothing, and with P = 0 (top_p under
     * 2^-62) they would all pass */
    const int sh = pivot_shift(s->lo, s->hi), last = kp_topp_gpu_last_pivot(s->lo, s->hi, sh);
    int ok = 0;
    unsigned long long run = s->hi_mass + above; /* mass(B t + B) (the last thread: mass(F) = mass(hi)) */
#pragma unroll
    for (int k = B - 1; k >= 0; k--) {
        const unsigned long long before = run; /* mass(B t + k + 1) */
        run += h[k];                          /* mass(B t + k) */
        const int f = B * t + k;
        if (f <= last && run >= target) {
            ok++;
            if (before < target || f == last) { /* the largest such f */
                mass_j = run;
                mass_next = before;
            }
        }
    }
    if (ok) atomicAdd(&count_ok, ok);
    __syncthreads();
    if (t == 0) {
        const int j = count_ok - 1;
        uint32_t new_lo = 0, new_hi = s->hi;
        if (j >= 0) kp_topp_gpu_bracket(s->lo, s->hi, sh, j, &new_lo, &new_hi);
        kp_topp_advance_to(s, j, j >= 0 ? mass_j : 0, j >= 0 ? mass_next : 0, new_lo, new_hi);
        if (final_round) kp_topp_finish(s);
    }
    __syncthreads();
}

/* A round whose bracket is at most NARROW floats wide (W = hi - lo; every pivot then stands for few
 * floats, and a near-uniform row puts its tokens on few of them) counts per warp group, by D =
 * prob_bits - lo, so warps do not contend for one shared word; the flush maps D to its bucket.
 * Wide: bucket k at words k (low) and F + 1 + k (high); narrow: group g's D at g (NARROW + 1) + D and
 * that + NARROW_HIGH. */
#define NARROW 255
#define NARROW_GROUPS 8
#define NARROW_HIGH (NARROW_GROUPS * (NARROW + 1))
#define HIST_WORDS (2 * (PROB_F + 1))
static_assert(HIST_WORDS >= 2 * NARROW_HIGH, "the narrow counts fit the buckets' space");

enum { MASK_DROP = 0, MASK_KEEP = 1, MASK_LEVEL = 2 }; /* a token's fate: mask_rule, round_counter::sort */

/* One program's counting for one round: add(v) for each of its tokens, then flush(). */
struct round_counter {
    unsigned *lo_words, *hi_words;
    float row_max, z, recip, lo_band, hi_band;
    uint32_t lo, hi, width;
    int shift;
    bool narrow;
    int pend_k;
    unsigned long long pend;

    /* hist: HIST_WORDS zeroed shared words; below, above: prob_band(z, lo, hi) */
    __device__ __forceinline__ round_counter(unsigned *hist, const kp_topp_search &s, float below, float above)
        : row_max(s.row_max), z(s.z), recip(topp_recip(s.z)), lo_band(below), hi_band(above), lo(s.lo), hi(s.hi),
          width(s.hi - s.lo), shift(pivot_shift(s.lo, s.hi)), narrow(s.hi - s.lo <= NARROW), pend_k(0), pend(0) {
        lo_words = narrow ? hist + ((threadIdx.x >> 5) % NARROW_GROUPS) * (NARROW + 1) : hist;
        hi_words = narrow ? lo_words + NARROW_HIGH : hist + PROB_F + 1;
    }
    /* The bucket #{f : pivot_f < prob_bits} = ((D - 1) >> sh) + 1 (D = prob_bits - lo, 1 <= D <= W);
     * a narrow bracket has sh = 0, so its index D is its bucket. A run of tokens in one bucket is
     * added as one sum (a near-uniform row's tokens mostly share one). */
    /* true: the token lies in the bracket (and was counted) */
    __device__ __forceinline__ bool add(float v) {
        const float d = v - row_max;
        if (!(d >= lo_band && d <= hi_band)) return false; /* outside the band, or NaN / infinite */
        return add_prob(topp_div(expf(d), z, recip));
    }
    /* add(v) without the band, in two steps, for a batch of tokens whose probs are computed together
     * (no branch between them): add_prob's bracket test is exact, the band only saves work */
    __device__ __forceinline__ float prob(float v) const { return topp_div(expf(v - row_max), z, recip); }
    __device__ __forceinline__ bool add_prob(float prob) {
        const uint32_t pb = kp_topp_bits(prob);
        if (pb <= lo || pb > hi) return false;
        const int k = kp_topp_gpu_bucket(pb, lo, shift);
        if (k != pend_k) {
            if (pend_k) bucket_add(&lo_words[pend_k], &hi_words[pend_k], pend);
            pend_k = k;
            pend = 0;
        }
        pend += (unsigned long long)kp_topp_fix(prob); /* < 2^62 each: the row's sum stays < 2^63 */
        return true;
    }
    /* add(v), and where the token lies against the bracket, for round 1's mask: MASK_DROP (prob <= lo,
     * or not finite), MASK_KEEP (prob > hi), MASK_LEVEL (in the bracket: counted). */
    __device__ __forceinline__ int sort(float v) {
        if (!finite_logit(v)) return MASK_DROP;
        const float d = v - row_max;
        if (d < lo_band) return MASK_DROP;
        if (d > hi_band) return MASK_KEEP;
        const float p = topp_div(expf(d), z, recip);
        const uint32_t pb = kp_topp_bits(p);
        if (pb <= lo) return MASK_DROP;
        if (pb > hi) return MASK_KEEP;
        add_prob(p);
        return MASK_LEVEL;
    }
    /* sort(v)'s output for a token outside the band, without a branch: v when it is surely kept,
     * else -inf; sets bit `bit` of inband when the token lies in the band (sort it then). */
    __device__ __forceinline__ float outside(float v, unsigned &inband, int bit) const {
        const float d = v - row_max;
        inband |= (unsigned)(d >= lo_band && d <= hi_band) << bit;
        return finite_logit(v) && d > hi_band ? v : -INFINITY;
    }
    __device__ __forceinline__ void flush() {
        if (pend_k) bucket_add(&lo_words[pend_k], &hi_words[pend_k], pend);
        pend_k = 0;
    }
    /* Bucket i's total in one block's words (narrow: over the warp groups). */
    __device__ static __forceinline__ unsigned long long total(const unsigned *words, bool narrow, int i) {
        if (!narrow) return ((unsigned long long)words[PROB_F + 1 + i] << 32) | words[i];
        unsigned long long sum = 0;
        for (int g = 0; g < NARROW_GROUPS; g++)
            sum += ((unsigned long long)words[NARROW_HIGH + g * (NARROW + 1) + i] << 32) | words[g * (NARROW + 1) + i];
        return sum;
    }
};

/* The mask's decision for one token once the search is decided (keep prob > lo): MASK_DROP,
 * MASK_KEEP, or MASK_LEVEL (prob == the level: kept, unless the level is trimmed). expf is skipped
 * outside the band around lo (prob_band(z, lo, lo)). */
struct mask_rule {
    float row_max, z, lo_band, hi_band;
    uint32_t lo, level;
    float recip; /* topp_recip(z) */
    __device__ __forceinline__ int classify(float v) const {
        if (!finite_logit(v)) return MASK_DROP;
        const float d = v - row_max;
        if (d > hi_band) return MASK_KEEP; /* prob surely > lo * (1 + 1e-3): above the level */
        if (d < lo_band) return MASK_DROP;
        const uint32_t pb = kp_topp_bits(topp_div(expf(d), z, recip));
        return pb <= lo ? MASK_DROP : pb == level ? MASK_LEVEL : MASK_KEEP;
    }
};

/* The mask's rule for a decided row s, by a whole block: thread 0 computes the band around lo into
 * *below and *above (shared), then every thread builds the rule from them. */
__device__ __forceinline__ mask_rule block_mask_rule(const kp_topp_search &s, float *below, float *above) {
    if (threadIdx.x == 0) prob_band(s.z, s.lo, s.lo, below, above);
    __syncthreads();
    return mask_rule{s.row_max, s.z, *below, *above, s.lo, s.hi, topp_recip(s.z)};
}

/* The row's level is trimmed: prob_select_kernel keeps numkeep of its numdup members. */
__device__ __forceinline__ bool level_trimmed(const kp_topp_search &s) {
    return s.mode == KP_TOPP_LEVEL && s.numkeep < s.numdup;
}

/* A row's level list (logit keys at [0, level_cap), indices at [level_cap, 2 level_cap), the select's
 * scratch after) and round 1's bracket list (3 level_cap indices). */
__device__ __forceinline__ uint32_t *row_level_list(const topp_plan &plan, int64_t row) {
    return plan.level_list + row * 3 * (int64_t)plan.level_cap;
}
__device__ __forceinline__ uint32_t *row_cand_list(const topp_plan &plan, int64_t row) {
    return plan.cand_list + row * 3 * (int64_t)plan.level_cap;
}

/* Lists a level member to be trimmed (its logit key and index) in the row's level list for
 * prob_select_kernel (claim_slot on the row's CNT_LEVEL); past level_cap only the count grows, and
 * the select rescans the row. */
__device__ __forceinline__ void list_level_member(const topp_plan &plan, int64_t row, float v, uint32_t i) {
    const unsigned pos = claim_slot(plan.counts + row * CNT_WORDS + CNT_LEVEL);
    if (pos >= (unsigned)plan.level_cap) return;
    uint32_t *list_key = row_level_list(plan, row), *list_idx = list_key + plan.level_cap;
    list_key[pos] = kp_topp_logit_key(v);
    list_idx[pos] = i;
}

/* ---- sizes and host entry points ---- */

/* split_prob: entries of a row's level list; a larger level is trimmed by rescanning the row */
#define LEVEL_CAP 16384
static inline int64_t topp_level_cap(int64_t vocab) { return ((vocab < LEVEL_CAP ? vocab : LEVEL_CAP) + 3) / 4 * 4; }

/* split_prob: the bucket masses and counters of a row, zeroed by one memset at the start of a call */
static constexpr int64_t topp_zeroed_per_row(void) {
    return (int64_t)(PROB_R * (PROB_F + 1) * sizeof(unsigned long long)) + (int64_t)(CNT_WORDS * sizeof(unsigned));
}

#define FUSED_MAX_CLUSTER 16
#define FUSED_MAX_TILES 16
#define SEL_CAP_MAX 49152 /* members cached in (dynamic) shared memory: 192 KiB */

/* What split_prob's launcher asks the driver about a device, once (topp_split.cu). */
struct topp_device_info {
    bool ready;
    int sm_count;
    bool sm90;
    int active_plus_one[FUSED_MAX_CLUSTER + 1][FUSED_MAX_TILES + 1]; /* 0: not asked yet */
    cudaStream_t half;       /* split_prob: the second half of a split batch runs here (0: not made yet) */
    cudaEvent_t fork, join;  /* its start after the call's stream, and the call's stream after its end */
};

/* topp_split_prob.cu: split_prob's launches of one call (plan filled in by topp_cuda_run). */
int topp_prob_launch(topp_plan plan, const kp_topp_args *a, topp_device_info *dev, int sm_count, cudaStream_t stream,
                     char *message, size_t message_len);

/* topp_split_prob.cu: *fused = a batch of `batch` rows of `vocab` takes split_prob's fused path */
int topp_prob_fused_rows(topp_device_info *dev, int64_t vocab, int64_t batch, bool *fused, char *message,
                         size_t message_len);

/* topp_prob_fused.cu */
bool prob_fused_has_clusters(cudaError_t *e); /* the code the device runs was built for sm_90 or later */
cudaError_t prob_fused_set_limits(void);
size_t prob_fused_smem(int tiles_per_block);
cudaError_t prob_fused_max_active(int *active, int cluster, size_t smem);
cudaError_t prob_fused_launch(const topp_plan &plan, int cluster, int tiles_per_block, int64_t batch, size_t smem,
                              cudaStream_t stream);

/* topp_prob_select.cu */
cudaError_t prob_select_set_limit(int bytes);
cudaError_t prob_select_launch(const topp_plan &plan, int64_t batch, size_t sel_bytes, bool programmatic,
                               cudaStream_t stream);

#endif
