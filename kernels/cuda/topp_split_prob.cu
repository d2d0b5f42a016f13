/* topp_split_prob.cu: topp.split_prob@cuda's split path (the statistics, the three rounds, the mask)
 * and the launches of one call, which pick the fused path (topp_prob_fused.cu) when it fits and end
 * with the select (topp_prob_select.cu). Overview: topp_split.cu; the algorithm: kernels/topp_split.h. */

#include "topp_prob.cuh"

/* Step 1, one 256-thread block per tile: thread t reads tokens t, t + 256, ... (8 loads in flight),
 * max / min / count are reduced block-wide (order-free), thread t sums its tokens' exps in order and
 * warp_tree_sum combines the 256 sums: topp_stats_kernel's record for a 2048-token piece, bit for bit.
 * The block that finishes a row's last tile (a fence, then a counter) starts the row's search.
 * A block, not a warp, per tile: a warp's tile staged in shared memory (8 KiB) left too few tiles
 * on an SM at once. The pass waits on its loads and its blocks' ends, not on issue, so fewer
 * instructions or more loads in flight gained nothing (measured variants: MEASURED.md). */
__global__ void __launch_bounds__(TOPP_THREADS) prob_stats_kernel(topp_plan plan, long long tiles) {
    __shared__ float sum_buf[TOPP_THREADS], max_w[TOPP_THREADS / 32], min_w[TOPP_THREADS / 32];
    __shared__ int count_w[TOPP_THREADS / 32];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const long long tile = blockIdx.x;
    const int64_t row = tile / plan.piece_count;
    const int piece = (int)(tile % plan.piece_count);
    const float *x = plan.logits + row * plan.row_stride + piece * KP_TOPP_TILE;
    const int n = min(KP_TOPP_TILE, plan.vocab - piece * KP_TOPP_TILE);
    const uint64_t keep = l2_policy_keep();
    constexpr int PER = KP_TOPP_TILE / TOPP_THREADS;
    float v[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = t + TOPP_THREADS * k;
        v[k] = i < n ? ld_hint(x + i, keep) : NAN; /* NaN: absent */
    }
    float mx = -INFINITY, mn = INFINITY;
    int count = 0;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const bool f = finite_logit(v[k]);
        mx = fmaxf(mx, f ? v[k] : -INFINITY);
        mn = fminf(mn, f ? v[k] : INFINITY);
        count += f;
    }
    for (int off = 16; off > 0; off /= 2) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, off));
        count += __shfl_xor_sync(0xffffffffu, count, off);
    }
    if (lane == 0) max_w[warp] = mx, min_w[warp] = mn, count_w[warp] = count;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < TOPP_THREADS / 32; w++) {
        mx = fmaxf(mx, max_w[w]);
        mn = fminf(mn, min_w[w]);
    }
    float sum = 0.0f; /* tokens t, t + 256, ... in order; a non-finite one adds expf(-inf) = +0 */
#pragma unroll
    for (int k = 0; k < PER; k++) sum = sum + expf(finite_logit(v[k]) ? v[k] - mx : -INFINITY);
    sum_buf[t] = sum;
    __syncthreads();
    if (warp != 0) return;
    count = 0;
    for (int w = 0; w < TOPP_THREADS / 32; w++) count += count_w[w];
    const float total = warp_tree_sum(sum_buf);
    int last = 0;
    if (lane == 0) {
        plan.stats[row * plan.piece_cap + piece] = topp_stats{mx, total, mn, count};
        __threadfence();
        last = atomicAdd(plan.counts + row * CNT_WORDS + CNT_STATS, 1u) == (unsigned)(plan.piece_count - 1);
        if (last) __threadfence();
    }
    if (!__shfl_sync(0xffffffffu, last, 0)) return;
    const topp_stats *stats = plan.stats + row * plan.piece_cap;
    kp_topp_search s;
    start_search_warp([&](int i) { return load_stats_l2(stats + i); }, plan.piece_count, plan.top_p[row], &s);
    if (lane == 0) plan.search[row * (PROB_R + 1)] = s;
}

/* Step 5 for a row's tokens in pieces [first, last) once its search is decided (s final): keep
 * prob > lo and drop the rest, leaving the members of a level to be trimmed to prob_select_kernel,
 * listed (logit key, index) in the workspace in a varying order (shared buffer per tile, one global
 * atomic per tile and block). Called by whole blocks. */
__device__ void mask_pieces(const topp_plan &plan, const kp_topp_search &s, int64_t row, int first, int last) {
    __shared__ float below, above;
    const int t = threadIdx.x;
    const float *x = plan.logits + row * plan.row_stride;
    float *y = plan.out + row * plan.row_stride;
    const int begin = min(first * plan.piece_len, plan.vocab), end = min(last * plan.piece_len, plan.vocab);
    if (begin >= end) return;
    const uint64_t drop = l2_policy_drop(); /* the row's last read (topp_prob.cuh) */
    auto load = [&](int i) { return ld_hint(x + i, drop); };
    if (s.mode == KP_TOPP_COPY) { /* bits, NaN payloads included */
        const uint32_t *xb = reinterpret_cast<const uint32_t *>(x);
        uint32_t *yb = reinterpret_cast<uint32_t *>(y);
        for (int i = begin + t; i < end; i += TOPP_THREADS) yb[i] = xb[i];
        return;
    }
    if (s.mode == KP_TOPP_KEEP_FINITE) {
        lane_tokens_by(load, begin, end, [&](int i, float v) { y[i] = finite_logit(v) ? v : -INFINITY; });
        return;
    }
    const mask_rule rule = block_mask_rule(s, &below, &above);
    if (!level_trimmed(s)) {
        lane_tokens_by(load, begin, end, [&](int i, float v) { y[i] = rule.classify(v) != MASK_DROP ? v : -INFINITY; });
        return;
    }
    __shared__ uint32_t buf_key[KP_TOPP_TILE], buf_idx[KP_TOPP_TILE];
    __shared__ unsigned nbuf;
    __shared__ int base_sh;
    const int cap = plan.level_cap;
    uint32_t *list_key = row_level_list(plan, row), *list_idx = list_key + cap;
    if (t == 0) nbuf = 0;
    __syncthreads();
    for (int piece = first; piece < last; piece++) {
        const int tb = piece * plan.piece_len, te = min(tb + plan.piece_len, plan.vocab);
        lane_tokens_by(load, tb, te, [&](int i, float v) {
            const int c = rule.classify(v);
            if (c == MASK_LEVEL) { /* a level member: prob_select_kernel writes it */
                const unsigned pos = claim_slot(&nbuf);
                buf_key[pos] = kp_topp_logit_key(v);
                buf_idx[pos] = (uint32_t)i;
                return;
            }
            y[i] = c == MASK_KEEP ? v : -INFINITY;
        });
        __syncthreads();
        const int n = (int)nbuf;
        __syncthreads(); /* every thread has read nbuf before thread 0 resets it */
        if (n == 0) continue;
        if (t == 0) {
            base_sh = (int)atomicAdd(plan.counts + row * CNT_WORDS + CNT_LEVEL, (unsigned)n);
            nbuf = 0;
        }
        __syncthreads();
        const int64_t base = base_sh;
        for (int j = t; j < n; j += TOPP_THREADS)
            if (base + j < cap) {
                list_key[base + j] = buf_key[j];
                list_idx[base + j] = buf_idx[j];
            }
        __syncthreads(); /* the buffer is refilled by the next tile */
    }
}

/* fn(index, logit, position in the list) for each of the n tokens of a row's bracket list,
 * FOLD_LOADS gathers in flight per thread, by a whole block. */
#define FOLD_LOADS 8
template <typename Fn>
__device__ __forceinline__ void listed_tokens(const uint32_t *list, unsigned n, const float *x, Fn &&fn) {
    const int t = threadIdx.x;
    for (unsigned base = 0; base < n; base += TOPP_THREADS * FOLD_LOADS) {
        uint32_t idx[FOLD_LOADS];
        float v[FOLD_LOADS];
#pragma unroll
        for (int u = 0; u < FOLD_LOADS; u++) {
            const unsigned j = base + u * TOPP_THREADS + t;
            idx[u] = j < n ? __ldcg(list + j) : 0u;
        }
#pragma unroll
        for (int u = 0; u < FOLD_LOADS; u++) v[u] = base + u * TOPP_THREADS + t < n ? x[idx[u]] : -INFINITY;
#pragma unroll
        for (int u = 0; u < FOLD_LOADS; u++)
            if (base + u * TOPP_THREADS + t < n) fn(idx[u], v[u], base + u * TOPP_THREADS + t);
    }
}

/* Round 1's last program, once the search is decided (s final, shared): step 5 for the tokens of
 * round 1's bracket, which its programs left to it (they wrote every other token of the row). A
 * level member to be trimmed is listed for prob_select_kernel. Sets the row's CNT_MASKED, which
 * tells prob_mask_kernel to leave the row; for a final state the bracket cannot hold (a mode other
 * than LEVEL or ABOVE: not reachable, as round 0's lo already holds P), it leaves the flag clear
 * and prob_mask_kernel masks the whole row again. pairs (shared, or NULL): the list's (index, logit
 * bits) as the last round read them, when it read them and they fitted; else the list is read
 * again. */
__device__ void mask_listed(const topp_plan &plan, const kp_topp_search &s, int64_t row, const uint32_t *cand,
                            unsigned listed, const uint32_t *pairs, float *below, float *above) {
    if (s.mode != KP_TOPP_LEVEL && s.mode != KP_TOPP_ABOVE) return;
    const mask_rule rule = block_mask_rule(s, below, above);
    const bool trim = level_trimmed(s);
    const float *x = plan.logits + row * plan.row_stride;
    float *y = plan.out + row * plan.row_stride;
    auto write = [&](uint32_t i, float v) {
        const int c = rule.classify(v);
        if (c == MASK_LEVEL && trim) { /* a level member: prob_select_kernel writes it */
            list_level_member(plan, row, v, i);
            return;
        }
        y[i] = c != MASK_DROP ? v : -INFINITY;
    };
    if (pairs)
        for (unsigned j = threadIdx.x; j < listed; j += TOPP_THREADS) write(pairs[2 * j], kp_topp_float(pairs[2 * j + 1]));
    else
        listed_tokens(cand, listed, x, [&](uint32_t i, float v, unsigned) { write(i, v); });
    if (threadIdx.x == 0) plan.counts[row * CNT_WORDS + CNT_MASKED] = 1u;
}

/* A program's end of a round: its counts into the row's buckets (64-bit global atomics: integer
 * sums, order-free); the row's last program decides the round and stores the next state. */
__device__ __forceinline__ void finish_round(const topp_plan &plan, round_counter &rc, unsigned *hist_words,
                                             kp_topp_search *s, int64_t row, int round, float *below, float *above,
                                             uint32_t *pair_buf, unsigned pair_cap) {
    const int t = threadIdx.x;
    rc.flush();
    __syncthreads();
    unsigned long long *row_hist = plan.hist + (row * PROB_R + round) * (PROB_F + 1);
    const int span = rc.narrow ? (int)rc.width : PROB_F;
    for (int i = 1 + t; i <= span; i += TOPP_THREADS) {
        const unsigned long long sum = round_counter::total(hist_words, rc.narrow, i);
        if (sum) atomicAdd(row_hist + i, sum);
    }
    if (!last_program_of_row(plan.counts + row * CNT_WORDS + CNT_ROUND + round, plan.slices)) return;
    decide_round<TOPP_THREADS>([&](int k) { return __ldcg(row_hist + k); }, s, round + 1 == PROB_R);
    /* The collecting round's last program finishes the row from the list of the tokens in this
     * round's bracket (the last bracket lies inside it), when the list did not overflow: one block,
     * a few thousand tokens, and no launch. It runs the last round over the list (a row still
     * searching), stores the decided state in the last round's place, so prob_round_kernel<PROB_R - 1>
     * passes it on, and writes the listed tokens' outputs (mask_listed). This tail is a chain of
     * dependent global reads; spreading it over the next launches cost them more than it saved
     * round 1 (measured variants: MEASURED.md). */
    const unsigned listed = round == PROB_R - 2 ? __ldcg(plan.counts + row * CNT_WORDS + CNT_CAND) : 0u;
    if (round != PROB_R - 2 || listed > 3u * (unsigned)plan.level_cap) {
        if (t == 0) plan.search[row * (PROB_R + 1) + round + 1] = *s;
        return;
    }
    const float *x = plan.logits + row * plan.row_stride;
    const uint32_t *cand = row_cand_list(plan, row);
    const uint32_t *pairs = nullptr; /* the list as the last round read it, for mask_listed */
    if (s->mode == KP_TOPP_LIVE) {
        for (int k = t; k < HIST_WORDS; k += TOPP_THREADS) hist_words[k] = 0;
        if (t == 0) prob_band(s->z, s->lo, s->hi, below, above);
        __syncthreads();
        round_counter last(hist_words, *s, *below, *above);
        const bool keep = listed <= pair_cap;
        listed_tokens(cand, listed, x, [&](uint32_t i, float v, unsigned j) {
            last.add(v);
            if (keep) {
                pair_buf[2 * j] = i;
                pair_buf[2 * j + 1] = kp_topp_bits(v);
            }
        });
        if (keep) pairs = pair_buf;
        last.flush();
        __syncthreads();
        const int last_span = last.narrow ? (int)last.width : PROB_F;
        decide_round<TOPP_THREADS>(
            [&](int k) { return k <= last_span ? round_counter::total(hist_words, last.narrow, k) : 0ull; }, s, true);
    }
    if (t == 0) plan.search[row * (PROB_R + 1) + round + 1] = *s;
    mask_listed(plan, *s, row, cand, listed, pairs, below, above);
}

/* Round 0 takes the start's bracket (lo from the row's smallest prob) and computes every prob in it:
 * a raised lo, or no round 0 at all (a bracket certified by the statistics pass), cost the statistics
 * pass or round 1 more than round 0 saved (measured variants: MEASURED.md). */
#define CAND_BUF 2048  /* the collecting round's per-block shared list */
__host__ __device__ constexpr bool collect_round(int round) { return round == PROB_R - 2; }
#define ROUND_LOADS 8  /* loads in flight per thread */
#define ROUND_LOADS4 4 /* float4 loads in flight per thread */
template <int ROUND>
__global__ void __launch_bounds__(TOPP_THREADS, 5) prob_round_kernel(topp_plan plan) {
    pdl_wait();
    constexpr int round = ROUND;
    constexpr bool collect = collect_round(ROUND);
    __shared__ kp_topp_search s;
    __shared__ unsigned hist_words[HIST_WORDS];
    __shared__ float below, above;
    const int t = threadIdx.x;
    const int64_t row = blockIdx.x / plan.slices;
    const int slice = blockIdx.x % plan.slices;
    const int first = slice * plan.pieces_per_program;
    const int last = min(first + plan.pieces_per_program, plan.piece_count);
    kp_topp_search *states = plan.search + row * (PROB_R + 1);
    if (t == 0) s = states[round];
    for (int k = t; k < HIST_WORDS; k += TOPP_THREADS) hist_words[k] = 0; /* while thread 0 waits for the state */
    __syncthreads();
    if (s.mode != KP_TOPP_LIVE) { /* decided: the state passes on unchanged (and is final) */
        if (slice == 0 && t == 0) states[round + 1] = s;
        if constexpr (collect) mask_pieces(plan, s, row, first, last); /* round 1 masks a row decided before it */
        return;
    }
    if (t == 0) prob_band(s.z, s.lo, s.hi, &below, &above);
    __syncthreads();
    round_counter rc(hist_words, s, below, above);
    const float *x = plan.logits + row * plan.row_stride;
    float *y = plan.out + row * plan.row_stride;
    const int begin = min(first * plan.piece_len, plan.vocab), end = min(last * plan.piece_len, plan.vocab);
    /* Round 1 (the collecting round) also masks: a token outside its bracket is kept (prob > hi) or
     * dropped (prob <= lo) whatever the later rounds decide, since their brackets lie inside; it
     * writes those outputs and lists the tokens in the bracket (their indices, in the row's bracket
     * list). Unless the list overflowed, its last program then runs the last round over the list and
     * writes the listed tokens (finish_round); otherwise prob_round_kernel<2> reads the row again and
     * prob_mask_kernel masks it. A listed token is first written as -inf and rewritten there. */
    uint32_t *const cand = row_cand_list(plan, row);
    unsigned *const cand_count = plan.counts + row * CNT_WORDS + CNT_CAND;
    const unsigned cand_cap = 3u * (unsigned)plan.level_cap;
    /* The collecting round lists into shared memory first (the global list takes one atomic per block,
     * at the end: a global atomic per token group stalled its warp); past CAND_BUF a block appends to
     * the global list directly. */
    __shared__ uint32_t cand_buf[collect ? CAND_BUF : 1];
    __shared__ unsigned cand_n, cand_base;
    if (collect && t == 0) cand_n = 0;
    __syncthreads();
    /* round 1: the token's output (a listed one's provisional -inf); rounds 0 and 2 only count */
    auto take = [&](float v, int i) -> float {
        if constexpr (!collect) {
            rc.add(v);
            return 0.0f;
        } else {
            const int c = rc.sort(v);
            if (c == MASK_LEVEL) {
                const unsigned pos = claim_slot(&cand_n);
                if (pos < CAND_BUF)
                    cand_buf[pos] = (uint32_t)i;
                else
                    append_index(cand, cand_count, cand_cap, (uint32_t)i);
            }
            return c == MASK_KEEP ? v : -INFINITY;
        }
    };
    auto flush_cands = [&] {
        if (!collect) return;
        __syncthreads();
        const unsigned n = min(cand_n, (unsigned)CAND_BUF);
        if (t == 0 && n) cand_base = atomicAdd(cand_count, n);
        __syncthreads();
        if (n == 0) return;
        for (unsigned j = t; j < n; j += TOPP_THREADS)
            if (cand_base + j < cand_cap) cand[cand_base + j] = cand_buf[j];
    };
    /* The buckets are integer sums, so which thread takes which token cannot change a bit: a row
     * whose slice starts 16-byte aligned (in the output too, for round 1) is read as float4s
     * (ROUND_LOADS4 in flight per thread). The first loads wait for the state: issuing them before it
     * is read was slower (measured variants: MEASURED.md). */
    const float *xs = x + begin;
    float *ys = y + begin;
    const int count = end - begin;
    const uint64_t pol = ROUND == 0 ? l2_policy_keep() : l2_policy_drop();
    const bool aligned = (reinterpret_cast<uintptr_t>(xs) & 15u) == 0 &&
                         (!collect || (reinterpret_cast<uintptr_t>(ys) & 15u) == 0);
    if (aligned) {
        const float4 *x4 = reinterpret_cast<const float4 *>(xs);
        float4 *y4 = reinterpret_cast<float4 *>(ys);
        const int count4 = count / 4;
        for (int base = 0; base < count4; base += TOPP_THREADS * ROUND_LOADS4) {
            float4 v[ROUND_LOADS4];
            load_strided_by<ROUND_LOADS4, TOPP_THREADS>(v, [&](int i) { return ld_hint(x4 + i, pol); }, base, count4,
                                                        make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY));
            if constexpr (ROUND == 0) { /* the first bracket holds nearly every token: their probs first, with no
                                 branch between them, then the counts (add_prob's own test is exact, the
                                 band only saves work; measured variants: MEASURED.md) */
                float p[4 * ROUND_LOADS4];
#pragma unroll
                for (int u = 0; u < ROUND_LOADS4; u++) {
                    p[4 * u] = rc.prob(v[u].x);
                    p[4 * u + 1] = rc.prob(v[u].y);
                    p[4 * u + 2] = rc.prob(v[u].z);
                    p[4 * u + 3] = rc.prob(v[u].w);
                }
#pragma unroll
                for (int u = 0; u < 4 * ROUND_LOADS4; u++) rc.add_prob(p[u]);
            } else if constexpr (collect) { /* every output as if the token lay outside the band (no
                                 branch; a token in the band gets -inf for now), then the few in the band
                                 one by one, read again (an L1 hit), sorted, and rewritten when kept */
                unsigned inband = 0;
#pragma unroll
                for (int u = 0; u < ROUND_LOADS4; u++) {
                    const int j = base + u * TOPP_THREADS + t;
                    float4 o;
                    o.x = rc.outside(v[u].x, inband, 4 * u);
                    o.y = rc.outside(v[u].y, inband, 4 * u + 1);
                    o.z = rc.outside(v[u].z, inband, 4 * u + 2);
                    o.w = rc.outside(v[u].w, inband, 4 * u + 3);
                    if (j < count4) __stcs(y4 + j, o);
                }
                while (inband) {
                    const int k = __ffs(inband) - 1;
                    inband &= inband - 1;
                    const int e = 4 * (base + (k >> 2) * TOPP_THREADS + t) + (k & 3);
                    ys[e] = take(xs[e], begin + e);
                }
            } else {
#pragma unroll
                for (int u = 0; u < ROUND_LOADS4; u++) {
                    const int i = begin + 4 * (base + u * TOPP_THREADS + t);
                    take(v[u].x, i);
                    take(v[u].y, i + 1);
                    take(v[u].z, i + 2);
                    take(v[u].w, i + 3);
                }
            }
        }
        for (int i = count4 * 4 + t; i < count; i += TOPP_THREADS) {
            const float o = take(xs[i], begin + i);
            if (collect) ys[i] = o;
        }
    } else {
        for (int base = begin; base < end; base += TOPP_THREADS * ROUND_LOADS) {
            float v[ROUND_LOADS];
            load_strided<ROUND_LOADS, TOPP_THREADS>(v, x, base, end, -INFINITY);
#pragma unroll
            for (int u = 0; u < ROUND_LOADS; u++) {
                const int i = base + u * TOPP_THREADS + t;
                if (i >= end) continue;
                const float o = take(v[u], i);
                if (collect) y[i] = o;
            }
        }
    }
    flush_cands();
    /* the collecting round's shared list is free once flushed: its last program keeps the bracket
     * list's (index, logit) pairs there */
    finish_round(plan, rc, hist_words, &s, row, round, &below, &above, cand_buf, collect ? CAND_BUF / 2 : 0u);
}

/* Step 5 for the rows round 1 could not finish: those whose bracket list overflowed (and any whose
 * final state its bracket cannot hold). Every other row was written by round 1 and is left alone. */
__global__ void __launch_bounds__(TOPP_THREADS) prob_mask_kernel(topp_plan plan) {
    pdl_wait();
    __shared__ kp_topp_search s;
    __shared__ bool done;
    const int t = threadIdx.x;
    const int64_t row = blockIdx.x / plan.slices;
    const int slice = blockIdx.x % plan.slices;
    if (t == 0) {
        s = plan.search[row * (PROB_R + 1) + PROB_R];
        done = plan.search[row * (PROB_R + 1) + 1].mode != KP_TOPP_LIVE ||
               plan.counts[row * CNT_WORDS + CNT_MASKED] != 0u;
    }
    __syncthreads();
    if (done) return;
    const int first = slice * plan.pieces_per_program;
    mask_pieces(plan, s, row, first, min(first + plan.pieces_per_program, plan.piece_count));
}

/* split_prob: the fused path's shape for rows of `tiles` tiles: a cluster of C blocks per row, each
 * holding T tiles (T = ceil(tiles / C), C = ceil(tiles / T) so no block is empty), and its shared
 * memory bytes. *cluster = 0, and the split kernels run instead, when the code the device runs was
 * built for an architecture without clusters (before sm_90), when a row does not fit (more than
 * FUSED_MAX_CLUSTER x FUSED_MAX_TILES tiles) or when the device cannot hold every row's cluster at
 * once: a fused row is one long chain of cluster barriers, fast while all rows run side by side,
 * slower than the split kernels once rows queue in waves. Both paths give the same bits. No fused
 * path for batches that fit only partly: one block per SM leaves each round's sums and decision and
 * the rows' tails uncovered (measured variants: MEASURED.md). */
static int topp_fused_plan(topp_device_info *d, int tiles, int64_t batch, int *cluster, int *tiles_per_block,
                           size_t *bytes, char *message, size_t message_len) {
    *cluster = 0;
    if (!d->sm90) return KP_RUN_OK; /* the code this device runs has no clusters (a pre-sm_90 build) */
    int c = tiles < FUSED_MAX_CLUSTER ? tiles : FUSED_MAX_CLUSTER;
    const int t = (tiles + c - 1) / c;
    if (t > FUSED_MAX_TILES) return KP_RUN_OK;
    c = (tiles + t - 1) / t;
    if (batch > INT32_MAX / c) return KP_RUN_OK;
    const size_t smem = prob_fused_smem(t);
    if (!d->active_plus_one[c][t]) {
        int active = 0;
        KP_CUDA_CHECK(prob_fused_max_active(&active, c, smem));
        d->active_plus_one[c][t] = active + 1;
    }
    if (d->active_plus_one[c][t] - 1 < batch) return KP_RUN_OK;
    *cluster = c;
    *tiles_per_block = t;
    *bytes = smem;
    return KP_RUN_OK;
}

int topp_prob_fused_rows(topp_device_info *dev, int64_t vocab, int64_t batch, bool *fused, char *message,
                         size_t message_len) {
    int cluster = 0, tiles_per_block = 0;
    size_t bytes = 0;
    const int rc = topp_fused_plan(dev, (int)((vocab + KP_TOPP_TILE - 1) / KP_TOPP_TILE), batch, &cluster,
                                   &tiles_per_block, &bytes, message, message_len);
    *fused = cluster != 0;
    return rc;
}

/* The launches of one call: plan has the run's pointers and the workspace's start (topp_cuda_run);
 * dev is the device's cached answers (held under topp_split.cu's lock). The default shared-memory
 * carveout, no L2 persistence window, about KP_TOPP_BLOCKS_PER_SM programs per SM and a launch per
 * pass: the alternatives tried were slower, and folding round 2, the mask and the select into round 1
 * would gain nothing on ordinary rows (measured variants: MEASURED.md). */
int topp_prob_launch(topp_plan plan, const kp_topp_args *a, topp_device_info *dev, int sm_count, cudaStream_t stream,
                     char *message, size_t message_len) {
    /* split_prob: enough programs per row to give every SM KP_TOPP_BLOCKS_PER_SM of them; the tiles
     * and the integer sums make every bit independent of this choice */
    plan.piece_len = KP_TOPP_TILE;
    plan.piece_count = plan.piece_cap;
    int64_t want = ((int64_t)KP_TOPP_BLOCKS_PER_SM * sm_count + a->batch - 1) / a->batch;
    if (want < 1) want = 1;
    if (want > plan.piece_count) want = plan.piece_count;
    plan.pieces_per_program = (int)((plan.piece_count + want - 1) / want);
    plan.slices = (plan.piece_count + plan.pieces_per_program - 1) / plan.pieces_per_program;
    plan.hist = reinterpret_cast<unsigned long long *>(plan.stats + a->batch * plan.piece_cap);
    plan.counts = reinterpret_cast<unsigned *>(plan.hist + a->batch * PROB_R * (PROB_F + 1));
    plan.search = reinterpret_cast<kp_topp_search *>(plan.counts + a->batch * CNT_WORDS);
    plan.level_cap = (int)topp_level_cap(a->vocab);
    plan.level_list = reinterpret_cast<uint32_t *>(plan.search + a->batch * (PROB_R + 1));
    plan.cand_list = plan.level_list + a->batch * 3 * (int64_t)plan.level_cap;
    plan.sel_cap = plan.level_cap < SEL_CAP_MAX ? plan.level_cap : SEL_CAP_MAX;
    const size_t sel_bytes = (size_t)plan.sel_cap * sizeof(uint32_t);
    const long long tiles = (long long)a->batch * plan.piece_count; /* prob_stats_kernel's blocks */
    if (tiles > INT32_MAX)
        return kp_cuda_fail_msg(message, message_len, KP_RUN_NOT_SUPPORTED,
                                "topp.split_prob@cuda: batch %lld x %d tiles of %d tokens above the grid limit %d",
                                (long long)a->batch, plan.piece_count, KP_TOPP_TILE, INT32_MAX);
    int cluster = 0, tiles_per_block = 0;
    size_t fused_bytes = 0;
    int rc = topp_fused_plan(dev, plan.piece_count, a->batch, &cluster, &tiles_per_block, &fused_bytes, message,
                             message_len);
    if (rc != KP_RUN_OK) return rc;
    if (cluster) { /* one cluster per row, the row in shared memory */
        KP_CUDA_CHECK(prob_fused_launch(plan, cluster, tiles_per_block, a->batch, fused_bytes, stream));
        KP_LAUNCH_CHECK("prob_fused_kernel");
        KP_CUDA_CHECK(prob_select_launch(plan, a->batch, sel_bytes, dev->sm90, stream));
        return KP_RUN_OK;
    }
    /* Every launch after the statistics (and the select after the fused kernel) is programmatic
     * (launch_after, pdl_wait), so each launch's latency hides behind the kernel before it (measured:
     * MEASURED.md). The statistics follow the memset, which is not a kernel. */
    KP_CUDA_CHECK(cudaMemsetAsync(plan.hist, 0, (size_t)(a->batch * topp_zeroed_per_row()), stream));
    prob_stats_kernel<<<(unsigned)tiles, TOPP_THREADS, 0, stream>>>(plan, tiles);
    KP_LAUNCH_CHECK("prob_stats_kernel");
    const unsigned programs = (unsigned)(a->batch * plan.slices);
    static_assert(PROB_R == 3, "one prob_round_kernel instance per round");
    KP_CUDA_CHECK(launch_after(dev->sm90, prob_round_kernel<0>, programs, TOPP_THREADS, 0, stream, plan));
    KP_CUDA_CHECK(launch_after(dev->sm90, prob_round_kernel<1>, programs, TOPP_THREADS, 0, stream, plan));
    KP_CUDA_CHECK(launch_after(dev->sm90, prob_round_kernel<2>, programs, TOPP_THREADS, 0, stream, plan));
    KP_CUDA_CHECK(launch_after(dev->sm90, prob_mask_kernel, programs, TOPP_THREADS, 0, stream, plan));
    KP_CUDA_CHECK(prob_select_launch(plan, a->batch, sel_bytes, dev->sm90, stream));
    return KP_RUN_OK;
}
