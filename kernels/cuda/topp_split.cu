/* topp_split.cu: topp.split_logit@cuda (incumbent) and topp.split_prob@cuda (candidate), the steps
 * of kernels/topp_split.h. All launches on args->stream; no host sync; graph-capturable.
 *
 * split_logit (unchanged, vLLM's small-batch split pipeline with its defect): a 1-D grid of
 * batch * S programs (256 threads, program row * S + slice), S = the largest power of two <= 32 with
 * S * 2 * batch <= sm_count, 7 launches: stats, 5 rounds, mask.
 *   1. topp_stats_kernel: per piece, max / min / finite count (order-free) and sum exp(x - max)
 *      (lane t sums tokens t, t + 256, ... in order, then a halving tree over the 256 lanes, the
 *      last levels of which one warp runs with shuffles, in the same order).
 *   2. topp_round_kernel x5: every program replays the combine of the stored stats and of the
 *      earlier rounds' partials (sequential over pieces, in piece order), evaluates the round's 8
 *      pivots over its slice and stores (mass, smallest prob, count) per piece and pivot.
 *   3. topp_mask_kernel: replays the search, then masks; the tie budget is handed out in index
 *      order (dup counts of lower pieces from the stored partials, a ballot scan inside).
 *
 * split_prob: the search of topp_split.h with KP_TOPP_FANOUT_PROB_GPU = 2048 pivots a round spaced
 * by a power of two, so KP_TOPP_ROUNDS_PROB_GPU = 3 rounds decide (the host port takes 64 a round,
 * 5 rounds; the decision depends only on the multiset of f32 probs and P, not on the pivots on the
 * way). Two paths, the same bits (the tests compare both with the host port, and a row across them):
 * - fused, when a row fits in a cluster of at most 16 blocks of at most 16 tiles and the device can
 *   hold every row's cluster at once (topp_fused_plan): prob_fused_kernel, one thread-block cluster
 *   per row holding the row in shared memory, then prob_select_kernel (see there).
 * - split, otherwise: a memset zeroes the bucket masses and counters, then 6 launches:
 *   1. prob_stats_kernel: one warp per 2048-token tile (staged in shared memory by async copies),
 *      no block barriers; the records are topp_stats_kernel's bit for bit (see there). The warp
 *      that finishes a row's last tile (a fence, then a counter) combines the tiles in order and
 *      stores round 0's state.
 *   2. prob_round_kernel x3, programs per row chosen so the grid is about KP_TOPP_BLOCKS_PER_SM
 *      programs per SM (the tiles and the integer sums make every bit independent of that choice).
 *      A program reads the state entering its round (a decided row passes it on and returns); it
 *      buckets the tokens of its tiles with lo < prob <= hi (expf skipped outside a 1e-3-nat band)
 *      into a shared histogram of 64-bit fix-masses (32-bit atomics with carry; per warp group, by
 *      float, when the bracket is at most 255 floats wide), then adds them into the row's buckets
 *      with 64-bit global atomics: integer sums, exact and order-free. The row's last program (fence,
 *      counter) decides the round with a parallel suffix scan and stores the next state. Round 0
 *      computes each batch of 16 probs with no branch between them (its bracket holds nearly every
 *      token). Round 1 lists the tokens in its bracket (through a per-block shared buffer); unless
 *      the list overflowed, its last program then runs round 2 (whose bracket lies inside) over that
 *      list itself, and the round-2 launch only passes the state on. A row whose list overflowed is
 *      read again by round 2's programs.
 *   3. prob_mask_kernel: the final state; keeps prob > lo and drops the rest, leaving the members
 *      of a level to be trimmed to prob_select_kernel, and lists them (logit key, index) in the
 *      workspace, in a varying order (shared buffer per tile, one global atomic per tile and block).
 *   4. prob_select_kernel: one 1024-thread block per row that needs a trim; it ranks a level of up to
 *      1024 members directly, selects over the list up to 16384 (cached in dynamic shared memory),
 *      or rescans the row past that.
 * Workspace: split_logit: stats [batch][32] and partials [batch][5][32][8] (16 bytes each);
 * split_prob: tile stats [batch][ceil(vocab / 2048)] (16 bytes), buckets [batch][3][2049] (8 bytes)
 * and counters [batch][8] (4 bytes; these two zeroed by the memset), states [batch][4] and level
 * lists [batch][3][min(vocab, 16384) rounded up to 4] (4 bytes); the fused path uses only the last
 * state, the level count (which it zeroes) and the lists. Nothing is read from the workspace before
 * this call wrote it.
 * The host ports (kernels/host/topp_split.c) use the same order of f32 operations, so host and
 * CUDA differ only where CUDA's expf/logf differ from the host libm's in the last bits.
 * f32 products that feed a sum use __fmul_rn so nvcc cannot contract them into an FMA the host
 * port does not do. */
#include <cooperative_groups.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <math.h>
#include <mutex>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* kp_registry.h is not included: it pulls in cases/kp_common.h, whose C11 _Noreturn is not C++. The
 * two kp_impl objects at the end are the ones it declares, with C linkage. */
#include "../kparity_kernel.h"
#include "../topp_split.h"
#include "topp_div.cuh"

#define TOPP_THREADS 256 /* the lane count of every in-piece reduction; the host port mirrors it */

enum topp_algo { ALGO_SPLIT_LOGIT = 0, ALGO_SPLIT_PROB = 1 };

/* One piece's statistics: [batch][P]. */
struct topp_stats {
    float max, sum, min;
    int count;
};

/* split_logit: one pivot over one piece, [batch][ROUNDS][P][F]; key: the smallest f32 prob above it. */
struct topp_part {
    float mass, key;
    int count, unused;
};

/* Where a row's work lives; the same numbers for every kernel of one run. */
struct topp_plan {
    const float *logits;
    float *out;
    const float *top_p;
    int64_t row_stride;
    int vocab;
    int slices;            /* S: programs per row */
    int piece_len;         /* L (split_logit) or KP_TOPP_TILE */
    int piece_count;       /* pieces per row actually used */
    int piece_cap;         /* pieces per row in the workspace */
    int pieces_per_program;
    topp_stats *stats;     /* [batch][piece_cap] */
    topp_part *parts;      /* split_logit: [batch][rounds][piece_cap][F] */
    unsigned long long *hist; /* split_prob: [batch][PROB_R][PROB_F + 1] bucket fix-masses */
    kp_topp_search *search;   /* split_prob: [batch][PROB_R + 1] the state entering each round */
    unsigned *counts;         /* split_prob: [batch][CNT_WORDS]: members of the trimmed level the mask appended,
                                 programs finished per kernel (zeroed by the launcher) */
    uint32_t *level_list;     /* split_prob: [batch][3][level_cap] their logit keys, indices, and scratch */
    int level_cap;            /* split_prob: entries per list, min(vocab, LEVEL_CAP) rounded up to 4 */
    int sel_cap;              /* split_prob: entries prob_select_kernel caches in shared memory */
};

__device__ __forceinline__ bool finite_logit(float x) { return isfinite(x); }

__device__ __forceinline__ void key_merge(float &key, int &count, float other_key, int other_count) {
    if (other_count == 0) return;
    if (other_key < key) {
        key = other_key;
        count = other_count;
    } else if (other_key == key) {
        count += other_count;
    }
}

/* Lane t's tokens begin + t, begin + t + 256, ... handed to fn(index, value) in that order, with
 * LANE_BATCH loads in flight per thread; the order of every per-lane sum is the plain loop's. (16 in
 * flight measured no faster on an H200: with one 256-thread block per row the passes are bound by
 * the per-token expf, division and 8 pivot compares, not by memory.) */
#define LANE_BATCH 4
template <typename Fn>
__device__ __forceinline__ void lane_tokens(const float *x, int begin, int end, Fn &&fn) {
    int i = begin + (int)threadIdx.x;
    for (; i + (LANE_BATCH - 1) * TOPP_THREADS < end; i += LANE_BATCH * TOPP_THREADS) {
        float v[LANE_BATCH];
#pragma unroll
        for (int u = 0; u < LANE_BATCH; u++) v[u] = x[i + u * TOPP_THREADS];
#pragma unroll
        for (int u = 0; u < LANE_BATCH; u++) fn(i + u * TOPP_THREADS, v[u]);
    }
    for (; i < end; i += TOPP_THREADS) fn(i, x[i]);
}

/* v[u] = x[base + u * THREADS + threadIdx.x] where that index is below limit, else fill: N loads in
 * flight per thread. */
template <int N, int THREADS, typename T>
__device__ __forceinline__ void load_strided(T (&v)[N], const T *x, int base, int limit, T fill) {
#pragma unroll
    for (int u = 0; u < N; u++) {
        const int i = base + u * THREADS + (int)threadIdx.x;
        v[u] = i < limit ? x[i] : fill;
    }
}

/* ---- reductions over the 256 lanes of a block, in the order the host port replays ---- */

static_assert(TOPP_THREADS == 256, "the warp-local trees below are written for 256 lanes");
static_assert(TOPP_THREADS / 32 >= KP_TOPP_FANOUT, "one warp reduces each pivot");

/* The halving tree over buf[0..255] (lane t adds lane t + half, half = 128 .. 1) run by one warp:
 * lane l carries lanes l, l + 32, l + 64, l + 96 through the first three levels, then shuffles down.
 * Bit-identical to the block-wide tree and to the host port's; valid in lane 0. */
__device__ __forceinline__ float warp_tree_sum(const float *buf) {
    const int l = threadIdx.x & 31;
    const float v0 = buf[l] + buf[l + 128], v1 = buf[l + 32] + buf[l + 160];
    const float v2 = buf[l + 64] + buf[l + 192], v3 = buf[l + 96] + buf[l + 224];
    float u = (v0 + v2) + (v1 + v3);
    for (int half = 16; half > 0; half /= 2) u = u + __shfl_down_sync(0xffffffffu, u, half);
    return u;
}

/* Smallest key and how many share it over 256 lanes, by one warp (order-free); valid in lane 0. */
__device__ __forceinline__ void warp_key_merge(const float *keys, const int *counts, float &key, int &count) {
    const int l = threadIdx.x & 31;
    key = INFINITY;
    count = 0;
    for (int j = 0; j < TOPP_THREADS / 32; j++) key_merge(key, count, keys[l + 32 * j], counts[l + 32 * j]);
    for (int half = 16; half > 0; half /= 2) {
        float other_key = __shfl_down_sync(0xffffffffu, key, half);
        int other_count = __shfl_down_sync(0xffffffffu, count, half);
        key_merge(key, count, other_key, other_count);
    }
}

/* ---- the replayed combine: every program of every kernel computes the same state from the workspace ---- */

enum { MODE_COPY = 0, MODE_KEEP_FINITE = 1, MODE_PIVOT = 2, MODE_LIVE = 3 };

struct topp_state {
    int mode;
    float row_max, z, p;
    float pivots[KP_TOPP_FANOUT]; /* MODE_LIVE: the pivots of the round to evaluate now */
    float pivot, dup_prob, dup_key;
    int64_t numdup, numkeep;
    int chosen_round, chosen_slot;
};

/* Pieces' partials travel through shared memory in chunks, so the sequential combines read shared
 * memory, not a chain of global loads. */
#define REPLAY_CHUNK 64 /* pieces per chunk of partials: 64 x F records of 16 bytes */

/* Replays steps 1 to 3 for `row`. With stop_round < rounds it stops where round `stop_round` would be
 * evaluated (MODE_LIVE) or reports that the search is decided; with stop_round == rounds it returns
 * the final decision. Every thread of the block calls it; the result is in the shared `st`. */
__device__ void topp_replay(const topp_plan &plan, int64_t row, int stop_round, topp_state *st) {
    constexpr int rounds = KP_TOPP_ROUNDS_LOGIT;
    constexpr int records_cap = REPLAY_CHUNK * KP_TOPP_FANOUT;
    __shared__ uint4 records[records_cap];
    __shared__ float round_mass[KP_TOPP_FANOUT], round_key[KP_TOPP_FANOUT];
    __shared__ int round_count[KP_TOPP_FANOUT];
    __shared__ float lo, hi, best, best_mass, best_key, chosen_mass, chosen_key;
    __shared__ int have_best, best_round, best_slot, best_count, chosen_count, done;
    const int t = threadIdx.x;
    const int pieces = plan.piece_count;
    const uint4 *stats = reinterpret_cast<const uint4 *>(plan.stats + row * plan.piece_cap);
    const uint4 *parts = reinterpret_cast<const uint4 *>(plan.parts + row * (int64_t)rounds * plan.piece_cap *
                                                                          KP_TOPP_FANOUT);
    const topp_stats *stat_rec = reinterpret_cast<const topp_stats *>(records);
    const topp_part *part_rec = reinterpret_cast<const topp_part *>(records);

    /* Step 1: M (a max), then Z = sum s_i * exp(m_i - M) in piece order, on thread 0. */
    float row_max = -INFINITY, row_min = INFINITY, z = 0.0f;
    int64_t finite = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int base = 0; base < pieces; base += records_cap) {
            const int n = min(records_cap, pieces - base);
            for (int i = t; i < n; i += TOPP_THREADS) records[i] = stats[base + i];
            __syncthreads();
            if (t == 0) {
                for (int i = 0; i < n; i++) {
                    const topp_stats s = stat_rec[i];
                    if (s.count == 0) continue;
                    if (pass == 0) {
                        if (s.max > row_max) row_max = s.max;
                        continue;
                    }
                    z = z + __fmul_rn(s.sum, expf(s.max - row_max));
                    if (s.min < row_min) row_min = s.min;
                    finite += s.count;
                }
            }
            __syncthreads();
        }
    }
    if (t == 0) {
        st->row_max = row_max;
        st->z = z;
        st->p = plan.top_p[row];
        st->mode = finite == 0 ? MODE_COPY : MODE_KEEP_FINITE;
        done = finite == 0 || st->p >= 1.0f;
        if (!done) {
            const float l = expf(row_min - row_max) / z;
            lo = l < KP_TOPP_PIVOT_FLOOR ? KP_TOPP_PIVOT_FLOOR : l;
            hi = 1.0f / z;
        }
        have_best = 0;
        best = 0.0f;
    }
    __syncthreads();

    /* Step 2: the ladder, one round per iteration, each round's partials combined in piece order. */
    for (int round = 0; round < rounds; round++) {
        const int stop = done; /* every thread reads `done`, then a barrier, and only then may it change */
        __syncthreads();
        if (stop) break;
        if (t == 0) {
            if (hi <= lo * (1.0f + KP_TOPP_COLLAPSE)) {
                done = 1;
            } else {
                const float span = logf(hi / lo);
                for (int f = 0; f < KP_TOPP_FANOUT; f++)
                    st->pivots[f] = lo * expf(span * (float)(f + 1) / (float)(KP_TOPP_FANOUT + 1));
                if (round == stop_round) {
                    st->mode = MODE_LIVE;
                    done = 1;
                }
            }
        }
        __syncthreads();
        if (done) break; /* read between two barriers: uniform */

        float mass = 0.0f, key = INFINITY;
        int count = 0;
        const uint4 *round_parts = parts + (int64_t)round * plan.piece_cap * KP_TOPP_FANOUT;
        for (int base = 0; base < pieces; base += REPLAY_CHUNK) {
            const int n = min(REPLAY_CHUNK, pieces - base);
            for (int i = t; i < n * KP_TOPP_FANOUT; i += TOPP_THREADS)
                records[i] = round_parts[(int64_t)base * KP_TOPP_FANOUT + i];
            __syncthreads();
            if (t < KP_TOPP_FANOUT) { /* one pivot per thread */
                for (int i = 0; i < n; i++) {
                    const topp_part part = part_rec[i * KP_TOPP_FANOUT + t];
                    mass = mass + part.mass;
                    key_merge(key, count, part.key, part.count);
                }
            }
            __syncthreads();
        }
        if (t < KP_TOPP_FANOUT) {
            round_mass[t] = mass;
            round_key[t] = key;
            round_count[t] = count;
        }
        __syncthreads();
        if (t == 0) {
            const float p = st->p;
            int found = -1;
            for (int f = KP_TOPP_FANOUT - 1; f >= 0 && found < 0; f--) {
                const float min_prob = round_key[f];
                if (round_count[f] > 0 && round_mass[f] >= p &&
                    round_mass[f] - __fmul_rn(min_prob, (float)round_count[f]) < p)
                    found = f;
            }
            if (found >= 0) {
                st->mode = MODE_PIVOT;
                st->pivot = st->pivots[found];
                st->chosen_round = round;
                st->chosen_slot = found;
                chosen_mass = round_mass[found];
                chosen_key = round_key[found];
                chosen_count = round_count[found];
                done = 1;
            } else {
                float next_lo = lo, next_hi = hi;
                for (int f = 0; f < KP_TOPP_FANOUT; f++) {
                    if (round_mass[f] >= p) {
                        next_lo = st->pivots[f]; /* pivots rise with f: the last one is the largest */
                        if (!have_best || st->pivots[f] > best) {
                            have_best = 1;
                            best = st->pivots[f];
                            best_round = round;
                            best_slot = f;
                            best_mass = round_mass[f];
                            best_key = round_key[f];
                            best_count = round_count[f];
                        }
                    } else if (st->pivots[f] < next_hi) {
                        next_hi = st->pivots[f];
                    }
                }
                lo = next_lo;
                hi = next_hi;
            }
        }
        __syncthreads();
    }

    if (t == 0 && stop_round >= rounds) {
        /* no ok pivot: fall back to the largest pivot seen with mass >= p, else keep every finite token */
        if (st->mode == MODE_KEEP_FINITE && have_best) {
            st->mode = MODE_PIVOT;
            st->pivot = best;
            st->chosen_round = best_round;
            st->chosen_slot = best_slot;
            chosen_mass = best_mass;
            chosen_key = best_key;
            chosen_count = best_count;
        }
        if (st->mode == MODE_PIVOT) { /* step 3: the boundary tie group */
            const float dup_prob = chosen_key;
            st->dup_key = chosen_key;
            st->dup_prob = dup_prob;
            st->numdup = chosen_count;
            float excess = chosen_mass - st->p;
            if (!(excess > 0.0f)) excess = 0.0f;
            const float drop = floorf(excess / dup_prob);
            int64_t keep = 1;
            if ((double)drop < (double)chosen_count) keep = (int64_t)chosen_count - (int64_t)drop;
            st->numkeep = keep < 1 ? 1 : keep;
        }
    }
    __syncthreads();
}

/* ---- kernels ---- */

__global__ void __launch_bounds__(TOPP_THREADS) topp_stats_kernel(topp_plan plan) {
    __shared__ float sum_buf[TOPP_THREADS], max_buf[TOPP_THREADS], min_buf[TOPP_THREADS];
    __shared__ int count_buf[TOPP_THREADS];
    __shared__ float piece_max_sh;
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    const int64_t row = blockIdx.x / plan.slices;
    const int slice = blockIdx.x % plan.slices;
    const float *x = plan.logits + row * plan.row_stride;
    const int first = slice * plan.pieces_per_program;
    const int last = min(first + plan.pieces_per_program, plan.piece_count);
    for (int piece = first; piece < last; piece++) {
        const int begin = piece * plan.piece_len, end = min(begin + plan.piece_len, plan.vocab);
        float mx = -INFINITY, mn = INFINITY;
        int count = 0;
        lane_tokens(x, begin, end, [&](int, float v) {
            if (!finite_logit(v)) return;
            mx = fmaxf(mx, v);
            mn = fminf(mn, v);
            count++;
        });
        max_buf[t] = mx;
        min_buf[t] = mn;
        count_buf[t] = count;
        __syncthreads();
        if (warp == 0) { /* max, min and count are order-free */
            for (int j = 1; j < TOPP_THREADS / 32; j++) {
                mx = fmaxf(mx, max_buf[lane + 32 * j]);
                mn = fminf(mn, min_buf[lane + 32 * j]);
                count += count_buf[lane + 32 * j];
            }
            for (int half = 16; half > 0; half /= 2) {
                mx = fmaxf(mx, __shfl_down_sync(0xffffffffu, mx, half));
                mn = fminf(mn, __shfl_down_sync(0xffffffffu, mn, half));
                count += __shfl_down_sync(0xffffffffu, count, half);
            }
            if (lane == 0) piece_max_sh = mx;
        }
        __syncthreads();
        const float piece_max = piece_max_sh;
        float lane_sum = 0.0f; /* lane t: tokens t, t + 256, ... in order */
        lane_tokens(x, begin, end, [&](int, float v) {
            if (finite_logit(v)) lane_sum = lane_sum + expf(v - piece_max);
        });
        sum_buf[t] = lane_sum;
        __syncthreads();
        if (warp == 0) {
            const float sum = warp_tree_sum(sum_buf);
            if (lane == 0) plan.stats[row * plan.piece_cap + piece] = topp_stats{piece_max, sum, mn, count};
        }
        __syncthreads();
    }
}

__global__ void __launch_bounds__(TOPP_THREADS) topp_round_kernel(topp_plan plan, int round) {
    constexpr int rounds = KP_TOPP_ROUNDS_LOGIT;
    __shared__ topp_state st;
    __shared__ float mass_buf[KP_TOPP_FANOUT][TOPP_THREADS], key_buf[KP_TOPP_FANOUT][TOPP_THREADS];
    __shared__ int count_buf[KP_TOPP_FANOUT][TOPP_THREADS];
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    const int64_t row = blockIdx.x / plan.slices;
    const int slice = blockIdx.x % plan.slices;
    topp_replay(plan, row, round, &st);
    if (st.mode != MODE_LIVE) return; /* the search is decided: nobody reads this round */

    const float *x = plan.logits + row * plan.row_stride;
    const float row_max = st.row_max, z = st.z;
    float pivots[KP_TOPP_FANOUT];
    for (int f = 0; f < KP_TOPP_FANOUT; f++) pivots[f] = st.pivots[f];
    topp_part *out = plan.parts + ((row * rounds + round) * (int64_t)plan.piece_cap) * KP_TOPP_FANOUT;
    const int first = slice * plan.pieces_per_program;
    const int last = min(first + plan.pieces_per_program, plan.piece_count);
    for (int piece = first; piece < last; piece++) {
        const int begin = piece * plan.piece_len, end = min(begin + plan.piece_len, plan.vocab);
        float mass[KP_TOPP_FANOUT], key[KP_TOPP_FANOUT];
        int count[KP_TOPP_FANOUT];
#pragma unroll
        for (int f = 0; f < KP_TOPP_FANOUT; f++) {
            mass[f] = 0.0f;
            key[f] = INFINITY;
            count[f] = 0;
        }
        lane_tokens(x, begin, end, [&](int, float v) {
            if (!finite_logit(v)) return;
            const float prob = expf(v - row_max) / z;
            const float k = prob;
#pragma unroll
            for (int f = 0; f < KP_TOPP_FANOUT; f++) {
                if (!(prob > pivots[f])) continue;
                mass[f] = mass[f] + prob;
                key_merge(key[f], count[f], k, 1);
            }
        });
#pragma unroll
        for (int f = 0; f < KP_TOPP_FANOUT; f++) {
            mass_buf[f][t] = mass[f];
            key_buf[f][t] = key[f];
            count_buf[f][t] = count[f];
        }
        __syncthreads();
        if (warp < KP_TOPP_FANOUT) { /* warp f reduces pivot f */
            const float piece_mass = warp_tree_sum(mass_buf[warp]);
            float piece_key;
            int piece_count;
            warp_key_merge(key_buf[warp], count_buf[warp], piece_key, piece_count);
            if (lane == 0) out[(int64_t)piece * KP_TOPP_FANOUT + warp] = topp_part{piece_mass, piece_key, piece_count, 0};
        }
        __syncthreads();
    }
}

__global__ void __launch_bounds__(TOPP_THREADS) topp_mask_kernel(topp_plan plan) {
    constexpr int rounds = KP_TOPP_ROUNDS_LOGIT;
    __shared__ topp_state st;
    __shared__ int warp_dups[TOPP_THREADS / 32];
    __shared__ long long before_buf[TOPP_THREADS];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int64_t row = blockIdx.x / plan.slices;
    const int slice = blockIdx.x % plan.slices;
    topp_replay(plan, row, rounds, &st);

    const float *x = plan.logits + row * plan.row_stride;
    float *y = plan.out + row * plan.row_stride;
    const int first = slice * plan.pieces_per_program;
    const int last = min(first + plan.pieces_per_program, plan.piece_count);
    const int begin = min(first * plan.piece_len, plan.vocab);
    const int end = min(last * plan.piece_len, plan.vocab);
    if (begin >= end) return;

    if (st.mode == MODE_COPY) { /* bits, NaN payloads included */
        const uint32_t *xb = reinterpret_cast<const uint32_t *>(x);
        uint32_t *yb = reinterpret_cast<uint32_t *>(y);
        for (int i = begin + t; i < end; i += TOPP_THREADS) yb[i] = xb[i];
        return;
    }
    if (st.mode != MODE_PIVOT) { /* MODE_KEEP_FINITE */
        lane_tokens(x, begin, end, [&](int i, float v) { y[i] = finite_logit(v) ? v : -INFINITY; });
        return;
    }

    const float row_max = st.row_max, z = st.z, pivot = st.pivot;
    const float threshold = logf(pivot) + logf(z) + row_max; /* split_logit: the seed's defect */
    const bool trim = st.numkeep < st.numdup;
    int64_t rank_base = 0;
    if (trim) { /* dup tokens in lower pieces, from the chosen pivot's stored partials (integer sum) */
        const topp_part *chosen = plan.parts +
                                  ((row * rounds + st.chosen_round) * (int64_t)plan.piece_cap) * KP_TOPP_FANOUT +
                                  st.chosen_slot;
        long long mine = 0;
        for (int i = t; i < first; i += TOPP_THREADS) {
            const topp_part part = chosen[(int64_t)i * KP_TOPP_FANOUT];
            if (part.count > 0 && part.key == st.dup_key) mine += part.count;
        }
        before_buf[t] = mine;
        __syncthreads();
        for (int j = 0; j < TOPP_THREADS; j++) rank_base += before_buf[j];
        __syncthreads();
    }
    if (!trim) {
        lane_tokens(x, begin, end, [&](int i, float v) {
            bool keep = false;
            if (finite_logit(v)) keep = v > threshold;
            y[i] = keep ? v : -INFINITY;
        });
        return;
    }
    /* every thread runs the same number of chunks, so the ballots see full warps */
    for (int chunk = begin; chunk < end; chunk += TOPP_THREADS) {
        const int i = chunk + t;
        bool keep = false, dup = false;
        float v = -INFINITY;
        if (i < end) {
            v = x[i];
            if (finite_logit(v)) {
                keep = v > threshold;
                dup = expf(v - row_max) / z == st.dup_prob;
            }
        }
        {
            const unsigned ballot = __ballot_sync(0xffffffffu, dup);
            if (lane == 0) warp_dups[warp] = __popc(ballot);
            __syncthreads();
            int64_t rank = rank_base + __popc(ballot & ((1u << lane) - 1u));
            int chunk_dups = 0;
            for (int w = 0; w < TOPP_THREADS / 32; w++) {
                if (w < warp) rank += warp_dups[w];
                chunk_dups += warp_dups[w];
            }
            __syncthreads();
            if (dup && rank >= st.numkeep) keep = false;
            rank_base += chunk_dups;
        }
        if (i < end) y[i] = keep ? v : -INFINITY;
    }
}

/* ---- split_prob: the exact level search of topp_split.h (kp_topp_* shared with the host port) ---- */

#define PROB_F KP_TOPP_FANOUT_PROB_GPU
#define PROB_R KP_TOPP_ROUNDS_PROB_GPU
static_assert(KP_TOPP_TILE == 8 * TOPP_THREADS, "tile_stats_warp: a lane stands for 8 lanes of 8 tokens");
/* per-row counters of finished programs, one per kernel that ends in a last-program step */
enum { CNT_LEVEL = 0, CNT_STATS = 1, CNT_ROUND = 2, CNT_CAND = CNT_ROUND + PROB_R, CNT_WORDS = 8 };
static_assert(CNT_CAND < CNT_WORDS, "a counter per round, and the candidates'");

/* Appends i to list (cap entries) after *count, one global atomic per warp; all threads that get
 * here together take consecutive places, in a varying order. */
__device__ __forceinline__ void append_index(uint32_t *list, unsigned *count, unsigned cap, uint32_t i) {
    cooperative_groups::coalesced_group g = cooperative_groups::coalesced_threads();
    unsigned pos = 0;
    if (g.thread_rank() == 0) pos = atomicAdd(count, g.size());
    pos = g.shfl(pos, 0) + g.thread_rank();
    if (pos < cap) list[pos] = i;
}

/* The last program of a row to get here returns true (for the whole block), after every other
 * program's global writes and atomics are visible to it (the fence-then-count pattern). Each counter
 * is zeroed by the launcher's memset and used once per call. */
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
/* get(q) is called twice per token, once for max/min/count and once for the sums. Holding the 64
 * tokens in registers took 88-128 registers and measured slower on an H200 (ncu, 64 x 154,856:
 * 31.9 us against 28.9 us). */
template <typename Get>
__device__ __forceinline__ topp_stats tile_stats_warp(Get get) {
    auto token = [&](int q) { return get(q); }; /* token 8u + j = lane + 32j + 256u */
    constexpr int unroll_q = 16, unroll_u = 1;
    float mx = -INFINITY, mn = INFINITY;
    int count = 0;
#pragma unroll unroll_q
    for (int q = 0; q < STATS_LANE; q++) {
        const float x = token(q);
        if (!finite_logit(x)) continue;
        mx = fmaxf(mx, x);
        mn = fminf(mn, x);
        count++;
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
            if (finite_logit(x)) s[j] = s[j] + expf(x - mx);
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

/* Step 1, one warp per tile and no block barriers (tile_stats_warp). The warp that finishes a row's
 * last tile (a fence, then a counter) starts the row's search and stores round 0's state. */
/* A whole, 16-byte aligned tile is first copied into the warp's part of shared memory with async
 * copies (16 of 16 bytes per lane in flight: one round trip to DRAM), and tile_stats_warp's two
 * passes read it there (the same tokens, the same bits). Reading both passes from global memory took
 * 37.4 us against 32.9 us staged (ncu, H200, 64 x 154,856, same run). */
#define STATS_WARPS 4
#define STATS_THREADS (STATS_WARPS * 32)
#define STATS_SMEM (STATS_WARPS * KP_TOPP_TILE * sizeof(float))
__global__ void __launch_bounds__(STATS_THREADS) prob_stats_kernel(topp_plan plan, long long tiles) {
    extern __shared__ __align__(16) float stage[];
    const int lane = threadIdx.x & 31;
    const long long tile = (long long)blockIdx.x * STATS_WARPS + (threadIdx.x >> 5);
    if (tile >= tiles) return; /* whole warps */
    const int64_t row = tile / plan.piece_count;
    const int piece = (int)(tile % plan.piece_count);
    const float *x = plan.logits + row * plan.row_stride + piece * KP_TOPP_TILE;
    const int n = min(KP_TOPP_TILE, plan.vocab - piece * KP_TOPP_TILE);
    float *mine = stage + (threadIdx.x >> 5) * KP_TOPP_TILE;
    const bool staged = n == KP_TOPP_TILE && (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
    if (staged) {
#pragma unroll
        for (int k = 0; k < KP_TOPP_TILE / 128; k++)
            __pipeline_memcpy_async(mine + 4 * (lane + 32 * k), x + 4 * (lane + 32 * k), 16);
        __pipeline_commit();
        __pipeline_wait_prior(0);
        __syncwarp();
    }
    const topp_stats rec = staged ? tile_stats_warp([&](int q) { return mine[lane + 32 * q]; })
                         : n == KP_TOPP_TILE ? tile_stats_warp([&](int q) { return x[lane + 32 * q]; })
                                             : tile_stats_warp([&](int q) {
                                                   const int i = lane + 32 * q;
                                                   return i < n ? x[i] : NAN; /* NaN: absent */
                                               });
    int last = 0;
    if (lane == 0) {
        plan.stats[row * plan.piece_cap + piece] = rec;
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

/* Bounds on the f32 d = x - M outside which prob(x) is surely <= lo (d < *below) or surely > hi
 * (d > *above): expf's error (a few ulp) is far inside KP_TOPP_BAND_MARGIN nats. Rounded outward. */
__device__ __noinline__ void prob_band(float z, uint32_t lo, uint32_t hi, float *below, float *above) {
    const double b = log((double)kp_topp_float(lo) * (double)z) - KP_TOPP_BAND_MARGIN;
    const double a = log((double)kp_topp_float(hi) * (double)z) + KP_TOPP_BAND_MARGIN;
    float fb = (float)b, fa = (float)a;
    if ((double)fb > b) fb = nextafterf(fb, -INFINITY);
    if ((double)fa < a) fa = nextafterf(fa, INFINITY);
    *below = fb;
    *above = fa;
}

/* Adds fix-mass v (< 2^63) to a bucket exactly with native 32-bit shared atomics: the low word's
 * carry goes to the high word. Integer sums, so the order of the adds cannot change a bit. */
__device__ __forceinline__ void bucket_add(unsigned *lo_word, unsigned *hi_word, unsigned long long v) {
    const unsigned v_lo = (unsigned)v;
    const unsigned old = atomicAdd(lo_word, v_lo);
    const unsigned v_hi = (unsigned)(v >> 32) + (old + v_lo < old ? 1u : 0u);
    if (v_hi) atomicAdd(hi_word, v_hi);
}

/* The GPU's pivots (topp_split.h, 3.): pivot_f = lo + f * 2^sh, sh the smallest with F * 2^sh >= hi - lo. */
__device__ __forceinline__ int pivot_shift(uint32_t lo, uint32_t hi) {
    static_assert(PROB_F == 1 << 11, "the shift assumes F = 2^11");
    /* 2^sh >= ceil(W / F) = ((W - 1) >> 11) + 1: sh = the bit length of (W - 1) >> 11 */
    return 32 - __clz((int)((hi - lo - 1) >> 11));
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
    const int sh = pivot_shift(s->lo, s->hi), last = min((int)((s->hi - s->lo - 1) >> sh), PROB_F - 1);
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
        const uint32_t new_lo = j >= 0 ? s->lo + ((uint32_t)j << sh) : 0;
        uint32_t new_hi = s->hi;
        if (j >= 0 && j + 1 < PROB_F && s->lo + ((uint32_t)(j + 1) << sh) < new_hi) new_hi = s->lo + ((uint32_t)(j + 1) << sh);
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
        : row_max(s.row_max), z(s.z), recip(topp_recip(s.z)), lo_band(below), hi_band(above), lo(s.lo), hi(s.hi), width(s.hi - s.lo),
          shift(pivot_shift(s.lo, s.hi)), narrow(s.hi - s.lo <= NARROW), pend_k(0), pend(0) {
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
    /* add(v) in two steps, for a batch of tokens whose probs are computed together (no branch between
     * them): in_band(v) is add's first test, prob(v) its prob (any bits outside the band: unused) */
    __device__ __forceinline__ bool in_band(float v) const {
        const float d = v - row_max;
        return d >= lo_band && d <= hi_band;
    }
    __device__ __forceinline__ float prob(float v) const { return topp_div(expf(v - row_max), z, recip); }
    __device__ __forceinline__ bool add_prob(float prob) {
        const uint32_t pb = kp_topp_bits(prob);
        if (pb <= lo || pb > hi) return false;
        const int k = (int)((pb - lo - 1) >> shift) + 1;
        if (k != pend_k) {
            if (pend_k) bucket_add(&lo_words[pend_k], &hi_words[pend_k], pend);
            pend_k = k;
            pend = 0;
        }
        pend += (unsigned long long)kp_topp_fix(prob); /* < 2^62 each: the row's sum stays < 2^63 */
        return true;
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

/* A program's end of a round: its counts into the row's buckets (64-bit global atomics: integer
 * sums, order-free); the row's last program decides the round and stores the next state. */
#define FOLD_LOADS 8 /* list gathers in flight per thread in finish_round's last round */
__device__ __forceinline__ void finish_round(const topp_plan &plan, round_counter &rc, unsigned *hist_words,
                                             kp_topp_search *s, int64_t row, int round, float *below, float *above) {
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
    /* The collecting round's last program runs the last round itself over the list of the tokens in
     * this round's bracket (the last bracket lies inside it), when the list did not overflow: one
     * block, a few thousand tokens, and no launch. It stores the decided state in the last round's
     * place, so prob_round_kernel<PROB_R - 1> passes it on. */
    const unsigned listed = __ldcg(plan.counts + row * CNT_WORDS + CNT_CAND);
    if (round != PROB_R - 2 || s->mode != KP_TOPP_LIVE || listed > 3u * (unsigned)plan.level_cap) {
        if (t == 0) plan.search[row * (PROB_R + 1) + round + 1] = *s;
        return;
    }
    for (int k = t; k < HIST_WORDS; k += TOPP_THREADS) hist_words[k] = 0;
    if (t == 0) prob_band(s->z, s->lo, s->hi, below, above);
    __syncthreads();
    round_counter last(hist_words, *s, *below, *above);
    const float *x = plan.logits + row * plan.row_stride;
    const uint32_t *cand = plan.level_list + row * 3 * (int64_t)plan.level_cap;
    for (unsigned base = 0; base < listed; base += TOPP_THREADS * FOLD_LOADS) { /* FOLD_LOADS gathers in flight */
        uint32_t idx[FOLD_LOADS];
        float v[FOLD_LOADS];
#pragma unroll
        for (int u = 0; u < FOLD_LOADS; u++) {
            const unsigned j = base + u * TOPP_THREADS + t;
            idx[u] = j < listed ? __ldcg(cand + j) : 0u;
        }
#pragma unroll
        for (int u = 0; u < FOLD_LOADS; u++) v[u] = base + u * TOPP_THREADS + t < listed ? x[idx[u]] : -INFINITY;
#pragma unroll
        for (int u = 0; u < FOLD_LOADS; u++) last.add(v[u]);
    }
    last.flush();
    __syncthreads();
    const int last_span = last.narrow ? (int)last.width : PROB_F;
    decide_round<TOPP_THREADS>(
        [&](int k) { return k <= last_span ? round_counter::total(hist_words, last.narrow, k) : 0ull; }, s, true);
    if (t == 0) plan.search[row * (PROB_R + 1) + round + 1] = *s;
}

#define CAND_BUF 2048  /* the collecting round's per-block shared list */
__host__ __device__ constexpr bool collect_round(int round) { return round == PROB_R - 2; }
#define ROUND_LOADS 8  /* loads in flight per thread */
#define ROUND_LOADS4 4 /* float4 loads in flight per thread */
template <int ROUND>
__global__ void __launch_bounds__(TOPP_THREADS, 5) prob_round_kernel(topp_plan plan) {
    constexpr int round = ROUND;
    __shared__ kp_topp_search s;
    __shared__ unsigned hist_words[HIST_WORDS];
    __shared__ float below, above;
    const int t = threadIdx.x;
    const int64_t row = blockIdx.x / plan.slices;
    const int slice = blockIdx.x % plan.slices;
    kp_topp_search *states = plan.search + row * (PROB_R + 1);
    if (t == 0) s = states[round];
    __syncthreads();
    if (s.mode != KP_TOPP_LIVE) { /* decided: the state passes on unchanged */
        if (slice == 0 && t == 0) states[round + 1] = s;
        return;
    }
    for (int k = t; k < HIST_WORDS; k += TOPP_THREADS) hist_words[k] = 0;
    if (t == 0) prob_band(s.z, s.lo, s.hi, &below, &above);
    __syncthreads();
    round_counter rc(hist_words, s, below, above);
    const float *x = plan.logits + row * plan.row_stride;
    const int first = slice * plan.pieces_per_program;
    const int last = min(first + plan.pieces_per_program, plan.piece_count);
    const int begin = min(first * plan.piece_len, plan.vocab), end = min(last * plan.piece_len, plan.vocab);
    /* The round before the last lists the tokens in its bracket (their indices, in the row's level
     * lists, which the mask fills only later); the last round's bracket lies inside it, so when the
     * list did not overflow, that round's last program runs the last round over the list
     * (finish_round), and this kernel reads the row only for a row whose list overflowed. */
    uint32_t *const cand = plan.level_list + row * 3 * (int64_t)plan.level_cap;
    unsigned *const cand_count = plan.counts + row * CNT_WORDS + CNT_CAND;
    const unsigned cand_cap = 3u * (unsigned)plan.level_cap;
    /* The collecting round lists into shared memory first (the global list takes one atomic per block,
     * at the end: a global atomic per token group stalled its warp); past CAND_BUF a block appends to
     * the global list directly. */
    __shared__ uint32_t cand_buf[collect_round(ROUND) ? CAND_BUF : 1];
    __shared__ unsigned cand_n, cand_base;
    if (collect_round(ROUND) && t == 0) cand_n = 0;
    __syncthreads();
    auto take = [&](float v, int i) {
        if (!rc.add(v) || !collect_round(ROUND)) return;
        cooperative_groups::coalesced_group g = cooperative_groups::coalesced_threads();
        unsigned pos = 0;
        if (g.thread_rank() == 0) pos = atomicAdd(&cand_n, g.size());
        pos = g.shfl(pos, 0) + g.thread_rank();
        if (pos < CAND_BUF)
            cand_buf[pos] = (uint32_t)i;
        else
            append_index(cand, cand_count, cand_cap, (uint32_t)i);
    };
    auto flush_cands = [&] {
        if (!collect_round(ROUND)) return;
        __syncthreads();
        const unsigned n = min(cand_n, (unsigned)CAND_BUF);
        if (t == 0 && n) cand_base = atomicAdd(cand_count, n);
        __syncthreads();
        if (n == 0) return;
        for (unsigned j = t; j < n; j += TOPP_THREADS)
            if (cand_base + j < cand_cap) cand[cand_base + j] = cand_buf[j];
    };
    /* The buckets are integer sums, so which thread takes which token cannot change a bit: a row
     * whose slice starts 16-byte aligned is read as float4s (ROUND_LOADS4 in flight per thread). */
    const float *xs = x + begin;
    const int count = end - begin;
    if ((reinterpret_cast<uintptr_t>(xs) & 15u) == 0) {
        const float4 *x4 = reinterpret_cast<const float4 *>(xs);
        const int count4 = count / 4;
        for (int base = 0; base < count4; base += TOPP_THREADS * ROUND_LOADS4) {
            float4 v[ROUND_LOADS4];
            load_strided<ROUND_LOADS4, TOPP_THREADS>(v, x4, base, count4,
                                                     make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY));
            if constexpr (ROUND == 0) { /* the first bracket holds nearly every token: their probs first, with no
                                 branch between them, then the counts (add_prob's own test is exact, the
                                 band only saves work) */
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
        for (int i = count4 * 4 + t; i < count; i += TOPP_THREADS) take(xs[i], begin + i);
    } else {
        for (int base = begin; base < end; base += TOPP_THREADS * ROUND_LOADS) {
            float v[ROUND_LOADS];
            load_strided<ROUND_LOADS, TOPP_THREADS>(v, x, base, end, -INFINITY);
#pragma unroll
            for (int u = 0; u < ROUND_LOADS; u++) take(v[u], base + u * TOPP_THREADS + t);
        }
    }
    flush_cands();
    finish_round(plan, rc, hist_words, &s, row, round, &below, &above);
}

/* The mask's decision for one token once the search is decided (keep prob > lo): MASK_DROP,
 * MASK_KEEP, or MASK_LEVEL (prob == the level: kept, unless the level is trimmed). expf is skipped
 * outside the band around lo (prob_band(z, lo, lo)). */
enum { MASK_DROP = 0, MASK_KEEP = 1, MASK_LEVEL = 2 };
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

__global__ void __launch_bounds__(TOPP_THREADS) prob_mask_kernel(topp_plan plan) {
    __shared__ kp_topp_search s;
    __shared__ float below, above;
    const int t = threadIdx.x;
    const int64_t row = blockIdx.x / plan.slices;
    const int slice = blockIdx.x % plan.slices;
    if (t == 0) s = plan.search[row * (PROB_R + 1) + PROB_R];
    __syncthreads();
    const float *x = plan.logits + row * plan.row_stride;
    float *y = plan.out + row * plan.row_stride;
    const int first = slice * plan.pieces_per_program;
    const int last = min(first + plan.pieces_per_program, plan.piece_count);
    const int begin = min(first * plan.piece_len, plan.vocab), end = min(last * plan.piece_len, plan.vocab);
    if (begin >= end) return;
    if (s.mode == KP_TOPP_COPY) { /* bits, NaN payloads included */
        const uint32_t *xb = reinterpret_cast<const uint32_t *>(x);
        uint32_t *yb = reinterpret_cast<uint32_t *>(y);
        for (int i = begin + t; i < end; i += TOPP_THREADS) yb[i] = xb[i];
        return;
    }
    if (s.mode == KP_TOPP_KEEP_FINITE) {
        lane_tokens(x, begin, end, [&](int i, float v) { y[i] = finite_logit(v) ? v : -INFINITY; });
        return;
    }
    if (t == 0) prob_band(s.z, s.lo, s.lo, &below, &above);
    __syncthreads();
    const mask_rule rule = {s.row_max, s.z, below, above, s.lo, s.hi, topp_recip(s.z)};
    const bool trim = s.mode == KP_TOPP_LEVEL && s.numkeep < s.numdup;
    if (!trim) {
        lane_tokens(x, begin, end, [&](int i, float v) { y[i] = rule.classify(v) != MASK_DROP ? v : -INFINITY; });
        return;
    }
    /* trim: the level members are left to prob_select_kernel and appended, tile by tile, to the row's
     * list (logit key, index): through a shared buffer, one global atomic per tile and block. The
     * positions vary from run to run; the set, all the select reads, does not. */
    __shared__ uint32_t buf_key[KP_TOPP_TILE], buf_idx[KP_TOPP_TILE];
    __shared__ int nbuf, base_sh;
    const int cap = plan.level_cap;
    uint32_t *list_key = plan.level_list + row * 3 * (int64_t)cap, *list_idx = list_key + cap;
    if (t == 0) nbuf = 0;
    __syncthreads();
    for (int piece = first; piece < last; piece++) {
        const int tb = piece * plan.piece_len, te = min(tb + plan.piece_len, plan.vocab);
        lane_tokens(x, tb, te, [&](int i, float v) {
            const int c = rule.classify(v);
            if (c == MASK_LEVEL) { /* a level member: prob_select_kernel writes it */
                cooperative_groups::coalesced_group g = cooperative_groups::coalesced_threads();
                int pos = 0;
                if (g.thread_rank() == 0) pos = atomicAdd(&nbuf, (int)g.size());
                pos = g.shfl(pos, 0) + (int)g.thread_rank();
                buf_key[pos] = kp_topp_logit_key(v);
                buf_idx[pos] = (uint32_t)i;
                return;
            }
            y[i] = c == MASK_KEEP ? v : -INFINITY;
        });
        __syncthreads();
        const int n = nbuf;
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

/* ---- split_prob fused: one thread-block cluster per row, the row held in shared memory ----
 * The same steps and the same bits as the kernels above, in one launch (then prob_select_kernel for
 * rows whose level needs a trim): block r of a row's cluster of C holds tiles [r T, r T + T) of it,
 * read from global memory once. The cluster's blocks meet at cluster barriers and read each other's
 * shared memory (tile records, bucket counts); every block computes the same search state from the
 * same integer sums, so all take the same branches and barriers. Used while a row fits: at most
 * FUSED_MAX_CLUSTER blocks of FUSED_MAX_TILES tiles (see topp_fused_plan). */
#define FUSED_THREADS 512
#define FUSED_WARPS (FUSED_THREADS / 32)
#define FUSED_MAX_CLUSTER 16
#define FUSED_MAX_TILES 16
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
            for (int r = 0; r < C; r++) sum += round_counter::total(cluster.map_shared_rank(sh.hist_words, r), rc.narrow, i);
            sh.part[i] = sum;
        }
        cluster.sync(); /* every share is complete, and no block reads counts any more */
        for (int k = t; k <= PROB_F; k += FUSED_THREADS) buckets[k] = 0;
        __syncthreads();
        for (int i = 1 + t; i <= span; i += FUSED_THREADS) buckets[i] = cluster.map_shared_rank(sh.part, (i - 1) / per)[i];
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
    if (t == 0) prob_band(s.z, s.lo, s.lo, &sh.below, &sh.above);
    __syncthreads();
    const mask_rule rule = {s.row_max, s.z, sh.below, sh.above, s.lo, s.hi, topp_recip(s.z)};
    const bool trim = s.mode == KP_TOPP_LEVEL && s.numkeep < s.numdup;
    const int cap = plan.level_cap;
    uint32_t *list_key = plan.level_list + row * 3 * (int64_t)cap, *list_idx = list_key + cap;
    for (int i = t; i < n; i += FUSED_THREADS) {
        const float v = xs[i];
        const int c = rule.classify(v);
        if (trim && c == MASK_LEVEL) { /* a level member: prob_select_kernel writes it */
            cg::coalesced_group g = cg::coalesced_threads();
            unsigned pos = 0;
            if (g.thread_rank() == 0) pos = atomicAdd(plan.counts + row * CNT_WORDS + CNT_LEVEL, g.size());
            pos = g.shfl(pos, 0) + g.thread_rank();
            if (pos < (unsigned)cap) {
                list_key[pos] = kp_topp_logit_key(v);
                list_idx[pos] = (uint32_t)(begin + i);
            }
            continue;
        }
        y[begin + i] = c != MASK_DROP ? v : -INFINITY;
    }
#else
    __trap(); /* no cluster code for this architecture: topp_fused_plan never launches it here */
#endif
}

/* Step 4 on the GPU: one block of SEL_THREADS per row whose boundary level must be trimmed.
 * At most SEL_THREADS listed members: each counts the members before it in the rule's order (larger
 * logit key, or the same key and a lower index) and is kept when fewer than numkeep are.
 * When the mask kernel listed every member (at most level_cap of them), steps 1-4 below run over
 * that list instead of the row: the keys (copied to shared memory up to SEL_CAP, else read from the
 * list), the ~indices of the members at T (shared memory or the list's scratch third), and the
 * writes of the listed members. The same multisets, the same selects: the same bits. Otherwise:
 * 1. A pass over the row collects the members' logit keys into shared memory (the order of the
 *    appends varies, the multiset does not).
 * 2. Radix select, 8 bits at a time from the top, of the numkeep-th largest key T: per pass a 256-bin
 *    integer histogram, counted once per distinct digit per warp (__match_any_sync). `need` members
 *    at T are kept.
 * 3. A pass collects ~index of the members at T; the same radix select finds the need-th largest
 *    ~index, i.e. the need lowest indices (indices are unique).
 * 4. A pass writes every member: kept when its key is above T, or at T with one of those indices.
 * Past SEL_CAP values a list is not cached: step 2 rescans the row per digit, and steps 3-4 become
 * one pass in index order with a block-wide ballot scan. */
#define SEL_THREADS 1024
#define SEL_CAP_MAX 49152 /* members cached in (dynamic) shared memory: 192 KiB */
#define SEL_LOADS 4 /* loads in flight per thread in the collecting passes */

__device__ __forceinline__ void count_digit(unsigned int *digit_count, int digit) { /* 256: none */
    const unsigned peers = __match_any_sync(0xffffffffu, digit);
    if (digit < 256 && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&digit_count[digit], __popc(peers));
}

/* Appends `val` where `take`, in a varying order; all threads of the block call it. */
__device__ __forceinline__ void append_value(bool take, uint32_t val, uint32_t *list, int *count,
                                             int cap) {
    const int lane = threadIdx.x & 31;
    const unsigned ballot = __ballot_sync(0xffffffffu, take);
    int base = 0;
    if (lane == 0 && ballot) base = atomicAdd(count, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    const int pos = base + __popc(ballot & ((1u << lane) - 1u));
    if (take && pos < cap) list[pos] = val;
}

/* The select state, in shared memory. */
struct sel_shared {
    unsigned int digit_count[256];
    uint32_t prefix;
    long long need;
};

/* One 8-bit digit step of a radix select from the top: after the histogram, pick the digit. With
 * S(d) = count[d] + ... + count[255], the digit is the largest d >= 1 with S(d) >= need (else 0) and
 * the need left at it is need - S(d + 1): found by warp 0, lane l holding digits 8l .. 8l + 7, with a
 * suffix scan over the lanes (integer sums, so exactly the top-down loop's result). */
__device__ __forceinline__ void digit_pick(sel_shared &sh, int shift) {
    __syncthreads();
    if (threadIdx.x < 32) {
        const int l = threadIdx.x;
        long long c[8], mine = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            c[k] = sh.digit_count[8 * l + k];
            mine += c[k];
        }
        long long suffix = mine; /* S(8l) */
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
            const long long other = __shfl_down_sync(0xffffffffu, suffix, off);
            if (l + off < 32) suffix += other;
        }
        const long long need = sh.need;
        __syncwarp(); /* every lane has read sh.need before one lane rewrites it (a ballot orders no memory) */
        const unsigned fits = __ballot_sync(0xffffffffu, suffix >= need || l == 0);
        if (l == 31 - __clz(fits)) { /* S falls as d rises: the answer lies in the highest such lane */
            long long above = suffix - mine; /* S(8l + 8) */
            int d = 8 * l;
#pragma unroll
            for (int k = 7; k >= 0; k--) {
                if (above + c[k] >= need || 8 * l + k == 0) {
                    d = 8 * l + k;
                    break;
                }
                above += c[k];
            }
            sh.need = need - above; /* above = S(d + 1) */
            sh.prefix |= (uint32_t)d << shift;
        }
    }
    __syncthreads();
}

/* The need-th largest of list[0 .. n) (shared, or global memory this block wrote before a barrier):
 * sh.prefix, and in sh.need how many at it. */
__device__ void select_cached(sel_shared &sh, const uint32_t *list, int n) {
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += SEL_THREADS) sh.digit_count[d] = 0;
        __syncthreads();
        const uint32_t prefix = sh.prefix;
        for (int base = 0; base < n; base += SEL_THREADS) {
            const int j = base + (int)threadIdx.x;
            int digit = 256;
            if (j < n && (list[j] & mask) == prefix) digit = (int)((list[j] >> shift) & 255u);
            count_digit(sh.digit_count, digit);
        }
        digit_pick(sh, shift);
        mask |= 255u << shift;
    }
}

__global__ void __launch_bounds__(SEL_THREADS) prob_select_kernel(topp_plan plan) {
    __shared__ kp_topp_search s;
    __shared__ float below, above;
    __shared__ sel_shared sh;
    extern __shared__ uint32_t list[]; /* SEL_CAP entries */
    const int SEL_CAP = plan.sel_cap;
    __shared__ int nlist;
    __shared__ int warp_eq[SEL_THREADS / 32];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int64_t row = blockIdx.x;
    if (t == 0) s = plan.search[row * (PROB_R + 1) + PROB_R];
    __syncthreads();
    if (!(s.mode == KP_TOPP_LEVEL && s.numkeep < s.numdup)) return;
    if (t == 0) {
        prob_band(s.z, s.lo, s.hi, &below, &above);
        sh.prefix = 0;
        sh.need = s.numkeep;
        nlist = 0;
    }
    __syncthreads();
    const float *x = plan.logits + row * plan.row_stride;
    float *y = plan.out + row * plan.row_stride;
    const unsigned listed = plan.counts[row * CNT_WORDS + CNT_LEVEL];
    if (listed <= (unsigned)plan.level_cap) {
        /* the mask kernel listed every member: steps 1-4 over the list, not the row */
        const int n = (int)listed, cap = plan.level_cap;
        const uint32_t *gkey = plan.level_list + row * 3 * (int64_t)cap, *gidx = gkey + cap;
        uint32_t *scratch = const_cast<uint32_t *>(gidx) + cap;
        if (n <= SEL_THREADS) { /* a small level: each member counts those before it in the rule's order */
            __shared__ uint32_t small_key[SEL_THREADS], small_idx[SEL_THREADS];
            if (t < n) {
                small_key[t] = gkey[t];
                small_idx[t] = gidx[t];
            }
            __syncthreads();
            if (t < n) {
                const uint32_t key = small_key[t], i = small_idx[t];
                int before = 0; /* larger logit, or the same logit and a lower index (indices are unique) */
                for (int j = 0; j < n; j++)
                    before += (small_key[j] > key) | ((small_key[j] == key) & (small_idx[j] < i));
                y[i] = before < s.numkeep ? x[i] : -INFINITY;
            }
            return;
        }
        const bool cached = n <= SEL_CAP;
        if (cached) {
            for (int j = t; j < n; j += SEL_THREADS) list[j] = gkey[j];
            __syncthreads();
        }
        select_cached(sh, cached ? list : gkey, n);
        const uint32_t pivot_key = sh.prefix;
        const long long need = sh.need;
        __syncthreads();
        if (t == 0) {
            nlist = 0;
            sh.prefix = 0;
            sh.need = need;
        }
        __syncthreads();
        uint32_t *eq = cached ? list : scratch; /* members at T: at most n of them */
        for (int base = 0; base < n; base += SEL_THREADS) {
            const int j = base + t;
            const bool m = j < n && gkey[j] == pivot_key;
            append_value(m, m ? ~gidx[j] : 0u, eq, &nlist, cached ? SEL_CAP : cap);
        }
        __syncthreads();
        select_cached(sh, eq, nlist);
        const uint32_t index_key = sh.prefix; /* members at T with ~index >= it are the need lowest */
        for (int j = t; j < n; j += SEL_THREADS) {
            const uint32_t i = gidx[j], key = gkey[j];
            y[i] = (key > pivot_key || (key == pivot_key && ~i >= index_key)) ? x[i] : -INFINITY;
        }
        return;
    }
    const float row_max = s.row_max, z = s.z, recip = topp_recip(s.z), lo_band = below, hi_band = above;
    const uint32_t level = s.hi;
    const int vocab = plan.vocab;
    auto member = [&](float v) -> bool {
        if (!finite_logit(v)) return false;
        const float d = v - row_max;
        if (d < lo_band || d > hi_band) return false;
        return kp_topp_bits(topp_div(expf(d), z, recip)) == level;
    };
    /* 1. the members' keys (all threads run the same number of chunks: full warps) */
    for (int chunk = 0; chunk < vocab; chunk += SEL_THREADS * SEL_LOADS) {
        float v[SEL_LOADS];
        load_strided<SEL_LOADS, SEL_THREADS>(v, x, chunk, vocab, -INFINITY);
#pragma unroll
        for (int u = 0; u < SEL_LOADS; u++) {
            const bool m = member(v[u]);
            append_value(m, m ? kp_topp_logit_key(v[u]) : 0u, list, &nlist, SEL_CAP);
        }
    }
    __syncthreads();
    /* 2. the key T */
    if (nlist <= SEL_CAP) {
        select_cached(sh, list, nlist);
    } else {
        uint32_t mask = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int d = t; d < 256; d += SEL_THREADS) sh.digit_count[d] = 0;
            __syncthreads();
            const uint32_t prefix = sh.prefix;
            for (int chunk = 0; chunk < vocab; chunk += SEL_THREADS) {
                const int i = chunk + t;
                int digit = 256;
                if (i < vocab) {
                    const float v = x[i];
                    if (member(v)) {
                        const uint32_t key = kp_topp_logit_key(v);
                        if ((key & mask) == prefix) digit = (int)((key >> shift) & 255u);
                    }
                }
                count_digit(sh.digit_count, digit);
            }
            digit_pick(sh, shift);
            mask |= 255u << shift;
        }
    }
    const uint32_t pivot_key = sh.prefix;
    const long long need = sh.need;
    /* 3. ~index of the members at T */
    __syncthreads();
    if (t == 0) {
        nlist = 0;
        sh.prefix = 0;
        sh.need = need;
    }
    __syncthreads();
    for (int chunk = 0; chunk < vocab; chunk += SEL_THREADS * SEL_LOADS) {
        float v[SEL_LOADS];
        load_strided<SEL_LOADS, SEL_THREADS>(v, x, chunk, vocab, -INFINITY);
#pragma unroll
        for (int u = 0; u < SEL_LOADS; u++) {
            const bool m = member(v[u]) && kp_topp_logit_key(v[u]) == pivot_key;
            append_value(m, ~(uint32_t)(chunk + u * SEL_THREADS + t), list, &nlist, SEL_CAP);
        }
    }
    __syncthreads();
    if (nlist <= SEL_CAP) {
        select_cached(sh, list, nlist);
        const uint32_t index_key = sh.prefix; /* members at T with ~index >= it are the need lowest */
        /* 4. write the members */
#pragma unroll 4
        for (int i = t; i < vocab; i += SEL_THREADS) {
            const float v = x[i];
            if (!member(v)) continue;
            const uint32_t key = kp_topp_logit_key(v);
            y[i] = (key > pivot_key || (key == pivot_key && ~(uint32_t)i >= index_key)) ? v : -INFINITY;
        }
        return;
    }
    /* 3-4 without the list: in index order, a block-wide ballot scan */
    long long rank_base = 0;
    for (int chunk = 0; chunk < vocab; chunk += SEL_THREADS) {
        const int i = chunk + t;
        bool is_member = false, eq = false;
        float v = 0.0f;
        uint32_t key = 0;
        if (i < vocab) {
            v = x[i];
            is_member = member(v);
            if (is_member) {
                key = kp_topp_logit_key(v);
                eq = key == pivot_key;
            }
        }
        const unsigned ballot = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) warp_eq[warp] = __popc(ballot);
        __syncthreads();
        long long rank = rank_base + __popc(ballot & ((1u << lane) - 1u));
        int chunk_eq = 0;
        for (int w = 0; w < SEL_THREADS / 32; w++) {
            if (w < warp) rank += warp_eq[w];
            chunk_eq += warp_eq[w];
        }
        __syncthreads();
        rank_base += chunk_eq;
        if (is_member) y[i] = (key > pivot_key || (eq && rank < need)) ? v : -INFINITY;
    }
}

/* ---- launcher ---- */

__attribute__((format(printf, 4, 5))) static int topp_fail(char *message, size_t message_len, int rc,
                                                            const char *fmt, ...) {
    if (message && message_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(message, message_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* "cudaXxx failed: <error string> (file:line)", the CUDA call's name cut at its '('. */
static int cuda_fail(char *message, size_t message_len, const char *call, cudaError_t e, const char *file, int line,
                     const char *after) {
    int name_len = 0;
    while (call[name_len] && call[name_len] != '(' && call[name_len] != ' ') name_len++;
    if (message && message_len)
        snprintf(message, message_len, "%.*s failed: %s (%s:%d)%s%s", name_len, call, cudaGetErrorString(e), file,
                 line, after ? " after launching " : "", after ? after : "");
    return KP_RUN_FAILED;
}

#define TOPP_CUDA_CHECK(call)                                                                       \
    do {                                                                                            \
        cudaError_t topp_e_ = (call);                                                               \
        if (topp_e_ != cudaSuccess)                                                                 \
            return cuda_fail(message, message_len, #call, topp_e_, __FILE__, __LINE__, NULL);       \
    } while (0)
#define TOPP_LAUNCH_CHECK(kernel_name)                                                              \
    do {                                                                                            \
        cudaError_t topp_e_ = cudaGetLastError();                                                   \
        if (topp_e_ != cudaSuccess)                                                                 \
            return cuda_fail(message, message_len, "cudaGetLastError", topp_e_, __FILE__, __LINE__, \
                             kernel_name);                                                          \
    } while (0)

static int topp_slice_count(int64_t batch, int sm_count) {
    int s = 1;
    while (s * 2 <= KP_TOPP_MAX_SLICES && batch <= sm_count / (s * 2 * 2)) s *= 2; /* (2s) * 2 * batch <= sms */
    return s;
}

/* split_prob: entries of a row's level list; a larger level is trimmed by rescanning the row */
#define LEVEL_CAP 16384
static int64_t topp_level_cap(int64_t vocab) { return ((vocab < LEVEL_CAP ? vocab : LEVEL_CAP) + 3) / 4 * 4; }

static int64_t topp_piece_cap(int algo, int64_t vocab) {
    return algo == ALGO_SPLIT_LOGIT ? KP_TOPP_MAX_SLICES : (vocab + KP_TOPP_TILE - 1) / KP_TOPP_TILE;
}

/* split_prob: the bucket masses and counters of a row, zeroed by one memset at the start of a call */
static int64_t topp_zeroed_per_row(void) {
    return (int64_t)(PROB_R * (PROB_F + 1) * sizeof(unsigned long long)) + (int64_t)(CNT_WORDS * sizeof(unsigned));
}

/* Workspace bytes for valid args, 0 for args topp_check refuses.
 * split_logit: stats [batch][32] and partials [batch][5][32][8], 16 bytes each.
 * split_prob: tile stats [batch][ceil(vocab / 2048)] (16 bytes), bucket masses
 * [batch][ROUNDS_PROB][F + 1] (8 bytes) and search states [batch][ROUNDS_PROB + 1]. */
static int64_t topp_workspace_per_row(int algo, int64_t vocab) {
    if (algo == ALGO_SPLIT_LOGIT)
        return topp_piece_cap(algo, vocab) *
               (int64_t)(sizeof(topp_stats) + KP_TOPP_ROUNDS_LOGIT * KP_TOPP_FANOUT * sizeof(topp_part));
    return topp_piece_cap(algo, vocab) * (int64_t)sizeof(topp_stats) + topp_zeroed_per_row() +
           (int64_t)((PROB_R + 1) * sizeof(kp_topp_search)) + 3 * topp_level_cap(vocab) * (int64_t)sizeof(uint32_t);
}

static size_t topp_workspace(int algo, const kp_topp_args *a) {
    if (!a || a->batch <= 0 || a->vocab <= 0 || a->vocab > INT32_MAX - KP_TOPP_TILE) return 0;
    const int64_t per_row = topp_workspace_per_row(algo, a->vocab);
    if (a->batch > INT64_MAX / per_row) return 0;
    return (size_t)(a->batch * per_row);
}

/* Shape and pointer checks shared by supports() and run(); the message names the field. */
static int topp_check(const char *name, const kp_topp_args *a, char *message, size_t message_len) {
    const int ns = KP_RUN_NOT_SUPPORTED;
    if (!a) return topp_fail(message, message_len, ns, "%s: args is NULL", name);
    if (!a->logits) return topp_fail(message, message_len, ns, "%s: logits is NULL", name);
    if (!a->out) return topp_fail(message, message_len, ns, "%s: out is NULL", name);
    if (!a->top_p) return topp_fail(message, message_len, ns, "%s: top_p is NULL", name);
    if (a->batch <= 0) return topp_fail(message, message_len, ns, "%s: batch %lld <= 0", name, (long long)a->batch);
    if (a->vocab <= 0) return topp_fail(message, message_len, ns, "%s: vocab %lld <= 0", name, (long long)a->vocab);
    if (a->row_stride < a->vocab)
        return topp_fail(message, message_len, ns, "%s: row_stride %lld < vocab %lld", name,
                         (long long)a->row_stride, (long long)a->vocab);
    if (a->sm_count < 0) return topp_fail(message, message_len, ns, "%s: sm_count %d < 0", name, (int)a->sm_count);
    if (a->vocab > INT32_MAX - KP_TOPP_TILE)
        return topp_fail(message, message_len, ns, "%s: vocab %lld above the 32-bit token index limit %d", name,
                         (long long)a->vocab, INT32_MAX - KP_TOPP_TILE);
    if (a->batch > INT32_MAX / KP_TOPP_MAX_SLICES)
        return topp_fail(message, message_len, ns, "%s: batch %lld above the grid limit %d", name,
                         (long long)a->batch, INT32_MAX / KP_TOPP_MAX_SLICES);
    if ((a->batch - 1) > (INT64_MAX / (int64_t)sizeof(float) - a->vocab) / a->row_stride)
        return topp_fail(message, message_len, ns, "%s: batch %lld x row_stride %lld overflows", name,
                         (long long)a->batch, (long long)a->row_stride);
    return KP_RUN_OK;
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

/* What split_prob's launcher asks the driver about a device, asked once per device (none of it
 * changes between calls; asking on every call cost several driver calls per call): the SM count,
 * whether the code the device runs was built for sm_90 or later (thread-block clusters, for the fused
 * path), the kernels' shared-memory limits (set once to the most any call needs), and, per fused
 * shape, how many clusters can run at once. */
#define TOPP_MAX_DEVICES 64
struct topp_device_info {
    bool ready;
    int sm_count;
    bool sm90;
    int active_plus_one[FUSED_MAX_CLUSTER + 1][FUSED_MAX_TILES + 1]; /* 0: not asked yet */
};
static std::mutex topp_devices_lock; /* held for the whole split_prob launch sequence */
static topp_device_info topp_devices[TOPP_MAX_DEVICES];

static int topp_device_ready(topp_device_info *d, int device, char *message, size_t message_len) {
    if (d->ready) return KP_RUN_OK;
    *d = topp_device_info{};
    TOPP_CUDA_CHECK(cudaDeviceGetAttribute(&d->sm_count, cudaDevAttrMultiProcessorCount, device));
    cudaFuncAttributes fa;
    TOPP_CUDA_CHECK(cudaFuncGetAttributes(&fa, prob_fused_kernel));
    d->sm90 = fa.binaryVersion >= 90;
    const int sel_bytes = (int)(topp_level_cap(LEVEL_CAP) < SEL_CAP_MAX ? topp_level_cap(LEVEL_CAP) : SEL_CAP_MAX) * 4;
    TOPP_CUDA_CHECK(cudaFuncSetAttribute(prob_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sel_bytes));
    if (d->sm90) {
        const int fused_bytes = (int)(FUSED_FIXED_BYTES + (size_t)FUSED_MAX_TILES * KP_TOPP_TILE * sizeof(float));
        TOPP_CUDA_CHECK(
            cudaFuncSetAttribute(prob_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, fused_bytes));
        TOPP_CUDA_CHECK(cudaFuncSetAttribute(prob_fused_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    }
    d->ready = true;
    return KP_RUN_OK;
}

/* split_prob: the fused path's shape for rows of `tiles` tiles: a cluster of C blocks per row, each
 * holding T tiles (T = ceil(tiles / C), C = ceil(tiles / T) so no block is empty), and its shared
 * memory bytes. *cluster = 0, and the split kernels run instead, when the code the device runs was
 * built for an architecture without clusters (before sm_90), when a row does not fit (more than
 * FUSED_MAX_CLUSTER x FUSED_MAX_TILES tiles) or when the device cannot hold every row's cluster at
 * once: a fused row is one long chain of cluster barriers (about 40 us on an H200 at 131,072 tokens),
 * fast while all rows run side by side, slower than the split kernels once rows queue in waves
 * (measured: 64 x 154,856 took 237 us fused, 166 us split). Both paths give the same bits. */
static int topp_fused_plan(topp_device_info *d, int tiles, int64_t batch, int *cluster, int *tiles_per_block,
                           size_t *bytes, char *message, size_t message_len) {
    *cluster = 0;
    if (!d->sm90) return KP_RUN_OK; /* the code this device runs has no clusters (a pre-sm_90 build) */
    int c = tiles < FUSED_MAX_CLUSTER ? tiles : FUSED_MAX_CLUSTER;
    const int t = (tiles + c - 1) / c;
    if (t > FUSED_MAX_TILES) return KP_RUN_OK;
    c = (tiles + t - 1) / t;
    if (batch > INT32_MAX / c) return KP_RUN_OK;
    const size_t smem = FUSED_FIXED_BYTES + (size_t)t * KP_TOPP_TILE * sizeof(float);
    if (!d->active_plus_one[c][t]) {
        cudaLaunchConfig_t cfg;
        cudaLaunchAttribute attr;
        fused_launch_config(&cfg, &attr, c, 1, smem, 0);
        int active = 0;
        TOPP_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&active, prob_fused_kernel, &cfg));
        d->active_plus_one[c][t] = active + 1;
    }
    if (d->active_plus_one[c][t] - 1 < batch) return KP_RUN_OK;
    *cluster = c;
    *tiles_per_block = t;
    *bytes = smem;
    return KP_RUN_OK;
}

template <int ALGO>
static int topp_cuda_run(const char *name, const void *vargs, char *message, size_t message_len) {
    const kp_topp_args *a = static_cast<const kp_topp_args *>(vargs);
    int rc = topp_check(name, a, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    const size_t need = topp_workspace(ALGO, a);
    if (!a->workspace)
        return topp_fail(message, message_len, KP_RUN_FAILED, "%s: workspace is NULL but %zu bytes are needed", name,
                         need);
    if (a->workspace_bytes < need)
        return topp_fail(message, message_len, KP_RUN_FAILED, "%s: workspace_bytes %zu < %zu needed", name,
                         a->workspace_bytes, need);
    if (reinterpret_cast<uintptr_t>(a->workspace) % 16 != 0)
        return topp_fail(message, message_len, KP_RUN_FAILED, "%s: workspace is not 16-byte aligned", name);

    int device = 0;
    TOPP_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> hold(topp_devices_lock);
    topp_device_info scratch = {}; /* a device past the table is asked on every call */
    topp_device_info *dev = device < TOPP_MAX_DEVICES ? &topp_devices[device] : &scratch;
    rc = topp_device_ready(dev, device, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    const int sm_count = a->sm_count ? a->sm_count : dev->sm_count;
    topp_plan plan;
    plan.logits = a->logits;
    plan.out = a->out;
    plan.top_p = a->top_p;
    plan.row_stride = a->row_stride;
    plan.vocab = (int)a->vocab;
    plan.piece_cap = (int)topp_piece_cap(ALGO, a->vocab);
    plan.hist = NULL;
    plan.search = NULL;
    plan.counts = NULL;
    plan.level_list = NULL;
    plan.level_cap = 0;
    plan.sel_cap = 0;
    plan.parts = NULL;
    plan.stats = static_cast<topp_stats *>(a->workspace);
    cudaStream_t stream = static_cast<cudaStream_t>(a->stream);
    if (ALGO == ALGO_SPLIT_LOGIT) {
        constexpr int rounds = KP_TOPP_ROUNDS_LOGIT;
        plan.slices = topp_slice_count(a->batch, sm_count);
        plan.piece_count = plan.slices;
        plan.piece_len = (int)((a->vocab + plan.slices - 1) / plan.slices);
        plan.pieces_per_program = 1;
        plan.parts = reinterpret_cast<topp_part *>(plan.stats + a->batch * plan.piece_cap);
        const unsigned programs = (unsigned)(a->batch * plan.slices);
        topp_stats_kernel<<<programs, TOPP_THREADS, 0, stream>>>(plan);
        TOPP_LAUNCH_CHECK("topp_stats_kernel");
        for (int round = 0; round < rounds; round++) {
            topp_round_kernel<<<programs, TOPP_THREADS, 0, stream>>>(plan, round);
            TOPP_LAUNCH_CHECK("topp_round_kernel");
        }
        topp_mask_kernel<<<programs, TOPP_THREADS, 0, stream>>>(plan);
        TOPP_LAUNCH_CHECK("topp_mask_kernel");
        return KP_RUN_OK;
    }
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
    plan.sel_cap = plan.level_cap < SEL_CAP_MAX ? plan.level_cap : SEL_CAP_MAX;
    const size_t sel_bytes = (size_t)plan.sel_cap * sizeof(uint32_t);
    int cluster = 0, tiles_per_block = 0;
    size_t fused_bytes = 0;
    rc = topp_fused_plan(dev, plan.piece_count, a->batch, &cluster, &tiles_per_block, &fused_bytes, message,
                         message_len);
    if (rc != KP_RUN_OK) return rc;
    if (cluster) { /* one cluster per row, the row in shared memory */
        cudaLaunchConfig_t cfg;
        cudaLaunchAttribute attr;
        fused_launch_config(&cfg, &attr, cluster, a->batch, fused_bytes, stream);
        TOPP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, prob_fused_kernel, plan, tiles_per_block));
        TOPP_LAUNCH_CHECK("prob_fused_kernel");
        prob_select_kernel<<<(unsigned)a->batch, SEL_THREADS, sel_bytes, stream>>>(plan);
        TOPP_LAUNCH_CHECK("prob_select_kernel");
        return KP_RUN_OK;
    }
    TOPP_CUDA_CHECK(cudaMemsetAsync(plan.hist, 0, (size_t)(a->batch * topp_zeroed_per_row()), stream));
    const long long tiles = (long long)a->batch * plan.piece_count;
    prob_stats_kernel<<<(unsigned)((tiles + STATS_WARPS - 1) / STATS_WARPS), STATS_THREADS, STATS_SMEM, stream>>>(plan, tiles);
    TOPP_LAUNCH_CHECK("prob_stats_kernel");
    const unsigned programs = (unsigned)(a->batch * plan.slices);
    static_assert(PROB_R == 3, "one prob_round_kernel instance per round");
    prob_round_kernel<0><<<programs, TOPP_THREADS, 0, stream>>>(plan);
    TOPP_LAUNCH_CHECK("prob_round_kernel<0>");
    prob_round_kernel<1><<<programs, TOPP_THREADS, 0, stream>>>(plan);
    TOPP_LAUNCH_CHECK("prob_round_kernel<1>");
    prob_round_kernel<2><<<programs, TOPP_THREADS, 0, stream>>>(plan);
    TOPP_LAUNCH_CHECK("prob_round_kernel<2>");
    prob_mask_kernel<<<programs, TOPP_THREADS, 0, stream>>>(plan);
    TOPP_LAUNCH_CHECK("prob_mask_kernel");
    prob_select_kernel<<<(unsigned)a->batch, SEL_THREADS, sel_bytes, stream>>>(plan);
    TOPP_LAUNCH_CHECK("prob_select_kernel");
    return KP_RUN_OK;
}

static size_t split_logit_workspace_bytes(const void *args) {
    return topp_workspace(ALGO_SPLIT_LOGIT, static_cast<const kp_topp_args *>(args));
}
static size_t split_prob_workspace_bytes(const void *args) {
    return topp_workspace(ALGO_SPLIT_PROB, static_cast<const kp_topp_args *>(args));
}
static int split_logit_supports(const void *args, char *message, size_t message_len) {
    return topp_check("topp.split_logit@cuda", static_cast<const kp_topp_args *>(args), message, message_len);
}
static int split_prob_supports(const void *args, char *message, size_t message_len) {
    return topp_check("topp.split_prob@cuda", static_cast<const kp_topp_args *>(args), message, message_len);
}
static int split_logit_run(const void *args, char *message, size_t message_len) {
    return topp_cuda_run<ALGO_SPLIT_LOGIT>("topp.split_logit@cuda", args, message, message_len);
}
static int split_prob_run(const void *args, char *message, size_t message_len) {
    return topp_cuda_run<ALGO_SPLIT_PROB>("topp.split_prob@cuda", args, message, message_len);
}

extern "C" {
extern const kp_impl kp_topp_split_logit_cuda;
extern const kp_impl kp_topp_split_prob_cuda;
}

extern "C" const kp_impl kp_topp_split_logit_cuda = {
    KP_ABI_VERSION, "topp", "topp.split_logit@cuda", KP_MEMORY_CUDA,
    split_logit_workspace_bytes, split_logit_supports, split_logit_run,
};

extern "C" const kp_impl kp_topp_split_prob_cuda = {
    KP_ABI_VERSION, "topp", "topp.split_prob@cuda", KP_MEMORY_CUDA,
    split_prob_workspace_bytes, split_prob_supports, split_prob_run,
};
