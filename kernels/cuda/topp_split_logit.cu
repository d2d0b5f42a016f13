/* topp_split_logit.cu: topp.split_logit@cuda, the incumbent (vLLM's small-batch split pipeline with
 * its defect, unchanged): the replayed combine, its three kernels and their launches. Overview:
 * topp_split.cu; the algorithm: kernels/topp_split.h. */
#include "topp_cuda.cuh"

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

static int topp_slice_count(int64_t batch, int sm_count) {
    int s = 1;
    while (s * 2 <= KP_TOPP_MAX_SLICES && batch <= sm_count / (s * 2 * 2)) s *= 2; /* (2s) * 2 * batch <= sms */
    return s;
}

/* The launches of one call: plan has the run's pointers and the workspace's start (topp_cuda_run). */
int topp_logit_launch(topp_plan plan, const kp_topp_args *a, int sm_count, cudaStream_t stream, char *message,
                      size_t message_len) {
    constexpr int rounds = KP_TOPP_ROUNDS_LOGIT;
    plan.slices = topp_slice_count(a->batch, sm_count);
    plan.piece_count = plan.slices;
    plan.piece_len = (int)((a->vocab + plan.slices - 1) / plan.slices);
    plan.pieces_per_program = 1;
    plan.parts = reinterpret_cast<topp_part *>(plan.stats + a->batch * plan.piece_cap);
    const unsigned programs = (unsigned)(a->batch * plan.slices);
    topp_stats_kernel<<<programs, TOPP_THREADS, 0, stream>>>(plan);
    KP_LAUNCH_CHECK("topp_stats_kernel");
    for (int round = 0; round < rounds; round++) {
        topp_round_kernel<<<programs, TOPP_THREADS, 0, stream>>>(plan, round);
        KP_LAUNCH_CHECK("topp_round_kernel");
    }
    topp_mask_kernel<<<programs, TOPP_THREADS, 0, stream>>>(plan);
    KP_LAUNCH_CHECK("topp_mask_kernel");
    return KP_RUN_OK;
}
