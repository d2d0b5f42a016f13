/* topp_split.c: host ports of topp.split_logit (incumbent) and topp.split_prob (candidate), the
 * steps of kernels/topp_split.h in f32, one row per kp_parallel_for item so threads never matter.
 *
 * Inside a piece the host sums in the order the CUDA kernels do (TOPP_LANES strided lanes, then a
 * halving tree over the lanes), so the two devices differ only where expf/logf differ in the last
 * bits; a plain sequential f32 sum over a 131,072-token slice drifts by ~1e-5 of mass, enough to
 * drop boundary tokens. Every combine across pieces is sequential in piece order on both devices.
 * -0 and +0 count as one logit value in the tie group.
 * decide_row / topp_row are split_logit's alone;
 * split_prob runs prob_row, the exact level search of topp_split.h with the CUDA kernels' integer
 * arithmetic (kp_topp_start / kp_topp_advance are the same functions on both devices). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kp_registry.h"
#include "../topp_split.h"

/* Threads per block in the CUDA kernels (TOPP_THREADS, kernels/cuda/topp_cuda.cuh): the lane count of
 * every in-piece reduction. */
#define TOPP_LANES 256

typedef enum topp_algo { ALGO_SPLIT_LOGIT = 0, ALGO_SPLIT_PROB = 1 } topp_algo;

/* Step 1, one piece: max, sum of exp(x - max), min and count over finite x. */
typedef struct piece_stats {
    float max, sum, min;
    int64_t count;
} piece_stats;

/* Step 2, one pivot over a piece or a row: mass above the pivot and its smallest member. The key is
 * the f32 prob for split_logit and the logit for split_prob; count is how many share it. */
typedef struct ladder_part {
    float mass;
    float key;
    int64_t count;
} ladder_part;

/* What the search decided for a row. */
typedef enum row_mode { MODE_COPY, MODE_KEEP_FINITE, MODE_PIVOT } row_mode;
typedef struct row_decision {
    row_mode mode;
    float pivot;
    float dup_prob;   /* boundary prob (split_logit: matched on prob) */
    int64_t numdup, numkeep;
} row_decision;

/* Slices a GPU with `sm_count` multiprocessors would cut a row into (topp_split.h step 1). */
static int64_t topp_slice_count(int64_t batch, int32_t sm_count) {
    int64_t sms = sm_count > 0 ? sm_count : KP_TOPP_HOST_SM_COUNT;
    int64_t s = 1;
    while (s * 2 <= KP_TOPP_MAX_SLICES && batch <= sms / (s * 2 * 2)) s *= 2; /* (2s) * 2 * batch <= sms */
    return s;
}

typedef struct row_job {
    const kp_topp_args *args;
    topp_algo algo;
    int64_t piece_len, piece_count;
    int failed; /* a row could not get its scratch memory: the call fails, never a partial mask */
} row_job;

static int is_finite(float x) { return isfinite(x) != 0; }

/* sum[0] = the halving tree over TOPP_LANES lane sums: lane t adds lane t + half, half = 128 .. 1. */
static float lane_tree_sum(float sum[TOPP_LANES]) {
    for (int half = TOPP_LANES / 2; half > 0; half /= 2)
        for (int t = 0; t < half; t++) sum[t] += sum[t + half];
    return sum[0];
}

static piece_stats stats_of(const float *x, int64_t begin, int64_t end) {
    piece_stats st = {-INFINITY, 0.0f, INFINITY, 0};
    for (int64_t i = begin; i < end; i++) {
        if (!is_finite(x[i])) continue;
        if (x[i] > st.max) st.max = x[i];
        if (x[i] < st.min) st.min = x[i];
        st.count++;
    }
    float lane[TOPP_LANES] = {0};
    for (int64_t i = begin; i < end; i++)
        if (is_finite(x[i])) lane[(i - begin) % TOPP_LANES] += expf(x[i] - st.max);
    st.sum = lane_tree_sum(lane);
    return st;
}

static void part_merge(ladder_part *into, float key, int64_t count) {
    if (count == 0) return;
    if (key < into->key) {
        into->key = key;
        into->count = count;
    } else if (key == into->key) {
        into->count += count;
    }
}

/* One round: the F pivots' parts, each piece reduced alone, then pieces added in index order. */
static void eval_round(const row_job *job, const float *x, float row_max, float z, const float pivots[KP_TOPP_FANOUT],
                       ladder_part row[KP_TOPP_FANOUT]) {
    int64_t vocab = job->args->vocab;
    for (int f = 0; f < KP_TOPP_FANOUT; f++) row[f] = (ladder_part){0.0f, INFINITY, 0};
    for (int64_t piece = 0; piece < job->piece_count; piece++) {
        int64_t begin = piece * job->piece_len, end = begin + job->piece_len;
        if (end > vocab) end = vocab;
        ladder_part part[KP_TOPP_FANOUT];
        float lane_mass[KP_TOPP_FANOUT][TOPP_LANES];
        memset(lane_mass, 0, sizeof lane_mass);
        for (int f = 0; f < KP_TOPP_FANOUT; f++) part[f] = (ladder_part){0.0f, INFINITY, 0};
        for (int64_t i = begin; i < end; i++) {
            if (!is_finite(x[i])) continue;
            float prob = expf(x[i] - row_max) / z;
            float key = prob; /* split_logit's tie group: equal f32 probs */
            int64_t lane = (i - begin) % TOPP_LANES;
            for (int f = 0; f < KP_TOPP_FANOUT; f++) {
                if (!(prob > pivots[f])) continue;
                lane_mass[f][lane] += prob;
                part_merge(&part[f], key, 1);
            }
        }
        for (int f = 0; f < KP_TOPP_FANOUT; f++) part[f].mass = lane_tree_sum(lane_mass[f]);
        for (int f = 0; f < KP_TOPP_FANOUT; f++) {
            row[f].mass += part[f].mass;
            part_merge(&row[f], part[f].key, part[f].count);
        }
    }
}

/* numkeep = numdup - floor(max(mass - p, 0) / dup), clamped to [1, numdup] (step 3). */
static int64_t tie_numkeep(float mass, float p, float dup_prob, int64_t numdup) {
    float excess = mass - p;
    if (!(excess > 0.0f)) excess = 0.0f;
    float drop = floorf(excess / dup_prob);
    if (!((double)drop < (double)numdup)) return 1;
    int64_t keep = numdup - (int64_t)drop;
    return keep < 1 ? 1 : keep;
}

/* Step 1 for one row: M first (a max, order-free), then Z = sum s_i * exp(m_i - M) over the
 * pieces in piece order, and the row's min finite logit. Returns the finite count. */
static int64_t row_stats(const row_job *job, const float *x, float *row_max, float *row_min, float *z) {
    const int64_t vocab = job->args->vocab;
    int64_t finite = 0;
    *row_max = -INFINITY, *row_min = INFINITY, *z = 0.0f;
    for (int64_t i = 0; i < vocab; i++)
        if (is_finite(x[i]) && x[i] > *row_max) *row_max = x[i];
    for (int64_t piece = 0; piece < job->piece_count; piece++) {
        int64_t begin = piece * job->piece_len, end = begin + job->piece_len;
        if (end > vocab) end = vocab;
        if (begin >= end) continue;
        piece_stats st = stats_of(x, begin, end);
        if (st.count == 0) continue;
        *z += st.sum * expf(st.max - *row_max);
        if (st.min < *row_min) *row_min = st.min;
        finite += st.count;
    }
    return finite;
}

/* Steps 1 to 3 for one row. */
static row_decision decide_row(const row_job *job, const float *x, float p, float *row_max_out, float *z_out) {
    row_decision d = {MODE_COPY, 0.0f, 0.0f, 0, 0};

    float row_max, row_min, z;
    int64_t finite = row_stats(job, x, &row_max, &row_min, &z);
    *row_max_out = row_max;
    *z_out = z;
    if (finite == 0) return d; /* MODE_COPY: nothing finite, the row is copied unchanged */
    d.mode = MODE_KEEP_FINITE;
    if (p >= 1.0f) return d;

    /* Step 2: the pivot ladder. */
    const int rounds = KP_TOPP_ROUNDS_LOGIT;
    float lo = expf(row_min - row_max) / z, hi = 1.0f / z;
    if (lo < KP_TOPP_PIVOT_FLOOR) lo = KP_TOPP_PIVOT_FLOOR;
    int have_best = 0, found = 0;
    float best = 0.0f, pivot = 0.0f;
    ladder_part best_part = {0}, chosen = {0};
    for (int round = 0; round < rounds; round++) {
        if (hi <= lo * (1.0f + KP_TOPP_COLLAPSE)) break;
        float pivots[KP_TOPP_FANOUT];
        float span = logf(hi / lo);
        for (int f = 0; f < KP_TOPP_FANOUT; f++)
            pivots[f] = lo * expf(span * (float)(f + 1) / (float)(KP_TOPP_FANOUT + 1));
        ladder_part parts[KP_TOPP_FANOUT];
        eval_round(job, x, row_max, z, pivots, parts);
        for (int f = KP_TOPP_FANOUT - 1; f >= 0 && !found; f--) {
            float min_prob = parts[f].key;
            if (parts[f].count > 0 && parts[f].mass >= p && parts[f].mass - min_prob * (float)parts[f].count < p) {
                found = 1;
                pivot = pivots[f];
                chosen = parts[f];
            }
        }
        if (found) break;
        float next_lo = lo, next_hi = hi;
        for (int f = 0; f < KP_TOPP_FANOUT; f++) {
            if (parts[f].mass >= p) {
                next_lo = pivots[f]; /* pivots rise with f: the last one is the largest */
                if (!have_best || pivots[f] > best) {
                    have_best = 1;
                    best = pivots[f];
                    best_part = parts[f];
                }
            } else if (pivots[f] < next_hi) {
                next_hi = pivots[f];
            }
        }
        lo = next_lo;
        hi = next_hi;
    }
    if (!found && !have_best) return d; /* MODE_KEEP_FINITE */
    if (!found) {
        pivot = best;
        chosen = best_part;
    }

    /* Step 3: the boundary tie group. */
    d.mode = MODE_PIVOT;
    d.pivot = pivot;
    d.dup_prob = chosen.key;
    d.numdup = chosen.count;
    d.numkeep = tie_numkeep(chosen.mass, p, d.dup_prob, chosen.count);
    return d;
}

static void topp_row(void *ctx, int64_t row) {
    const row_job *job = ctx;
    const kp_topp_args *a = job->args;
    const float *x = a->logits + row * a->row_stride;
    float *y = a->out + row * a->row_stride;
    const int64_t vocab = a->vocab;
    float row_max, z;
    row_decision d = decide_row(job, x, a->top_p[row], &row_max, &z);

    if (d.mode == MODE_COPY) {
        if (y != x) memmove(y, x, (size_t)vocab * sizeof *y); /* bits, NaN payloads included */
        return;
    }
    if (d.mode == MODE_KEEP_FINITE) {
        for (int64_t i = 0; i < vocab; i++) y[i] = is_finite(x[i]) ? x[i] : -INFINITY;
        return;
    }
    /* Step 4: the mask. */
    const float threshold = logf(d.pivot) + logf(z) + row_max; /* the seed's defect: rounds to M at 1e9 */
    const int trim = d.numkeep < d.numdup;
    int64_t rank = 0;
    for (int64_t i = 0; i < vocab; i++) {
        float xi = x[i];
        if (!is_finite(xi)) {
            y[i] = -INFINITY;
            continue;
        }
        float prob = expf(xi - row_max) / z;
        int keep = xi > threshold, dup = prob == d.dup_prob;
        if (trim && dup) {
            if (rank >= d.numkeep) keep = 0;
            rank++;
        }
        y[i] = keep ? xi : -INFINITY;
    }
}

/* ---- split_prob: the exact level search of topp_split.h, steps 2 to 5 ---- */

typedef struct level_member {
    uint32_t key; /* kp_topp_logit_key */
    int64_t index;
} level_member;

static int member_order(const void *a, const void *b) { /* the rule's order: logit desc, index asc */
    const level_member *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static float prob_of(float x, float row_max, float z) { return expf(x - row_max) / z; }

static void prob_row(void *ctx, int64_t row) {
    row_job *job = ctx;
    const kp_topp_args *a = job->args;
    const float *x = a->logits + row * a->row_stride;
    float *y = a->out + row * a->row_stride;
    const int64_t vocab = a->vocab;

    float row_max, row_min, z;
    int64_t finite = row_stats(job, x, &row_max, &row_min, &z);
    kp_topp_search s;
    float min_prob = finite ? prob_of(row_min, row_max, z) : 0.0f;
    kp_topp_start(&s, row_max, z, row_min, finite, a->top_p[row], min_prob);

    /* Step 3: the rounds; integer sums, so the order of the tokens does not matter */
    for (int round = 0; round < KP_TOPP_ROUNDS_PROB && s.mode == KP_TOPP_LIVE; round++) {
        uint32_t pivots[KP_TOPP_FANOUT_PROB];
        uint64_t hist[KP_TOPP_FANOUT_PROB + 1] = {0};
        for (int f = 0; f < KP_TOPP_FANOUT_PROB; f++) pivots[f] = kp_topp_pivot(&s, f);
        for (int64_t i = 0; i < vocab; i++) {
            if (!is_finite(x[i])) continue;
            float prob = prob_of(x[i], row_max, z);
            uint32_t pb = kp_topp_bits(prob);
            if (pb <= s.lo || pb > s.hi) continue;
            hist[kp_topp_bucket(pivots, pb)] += kp_topp_fix(prob);
        }
        kp_topp_advance(&s, hist);
    }
    kp_topp_finish(&s);

    if (s.mode == KP_TOPP_COPY) {
        if (y != x) memmove(y, x, (size_t)vocab * sizeof *y); /* bits, NaN payloads included */
        return;
    }
    if (s.mode == KP_TOPP_KEEP_FINITE) {
        for (int64_t i = 0; i < vocab; i++) y[i] = is_finite(x[i]) ? x[i] : -INFINITY;
        return;
    }
    /* Step 5: keep prob > lo; step 4: the level prob == hi trimmed to its first numkeep in rule order */
    const int trim = s.mode == KP_TOPP_LEVEL && s.numkeep < s.numdup;
    level_member *members = NULL;
    int64_t n = 0;
    if (trim && !(members = malloc((size_t)s.numdup * sizeof *members))) {
        __atomic_store_n(&job->failed, 1, __ATOMIC_SEQ_CST);
        return;
    }
    for (int64_t i = 0; i < vocab; i++) {
        float xi = x[i];
        int keep = 0;
        if (is_finite(xi)) {
            uint32_t pb = kp_topp_bits(prob_of(xi, row_max, z));
            keep = pb > s.lo;
            if (keep && trim && pb == s.hi) {
                if (n < s.numdup) members[n++] = (level_member){kp_topp_logit_key(xi), i};
                keep = 0; /* decided below */
            }
        }
        y[i] = keep ? xi : -INFINITY;
    }
    if (trim) {
        qsort(members, (size_t)n, sizeof *members, member_order);
        for (int64_t k = 0; k < s.numkeep && k < n; k++) y[members[k].index] = x[members[k].index];
        free(members);
    }
}

static size_t topp_host_workspace_bytes(const void *args) {
    (void)args;
    return 0;
}

/* Shape and pointer checks shared by supports() and run(); the message names the field. */
static int topp_host_check(const char *name, const void *vargs, char *message, size_t message_len) {
    const kp_topp_args *a = vargs;
    const char *why = NULL;
    char buf[256];
    if (!a) why = "args is NULL";
    else if (!a->logits) why = "logits is NULL";
    else if (!a->out) why = "out is NULL";
    else if (!a->top_p) why = "top_p is NULL";
    else if (a->batch <= 0) snprintf(buf, sizeof buf, "batch %lld <= 0", (long long)a->batch), why = buf;
    else if (a->vocab <= 0) snprintf(buf, sizeof buf, "vocab %lld <= 0", (long long)a->vocab), why = buf;
    else if (a->row_stride < a->vocab)
        snprintf(buf, sizeof buf, "row_stride %lld < vocab %lld", (long long)a->row_stride, (long long)a->vocab),
            why = buf;
    else if (a->sm_count < 0) snprintf(buf, sizeof buf, "sm_count %d < 0", (int)a->sm_count), why = buf;
    else if ((a->batch - 1) > (INT64_MAX / (int64_t)sizeof(float) - a->vocab) / a->row_stride)
        snprintf(buf, sizeof buf, "batch %lld x row_stride %lld overflows", (long long)a->batch,
                 (long long)a->row_stride),
            why = buf;
    if (!why) return KP_RUN_OK;
    if (message && message_len) snprintf(message, message_len, "%s: %s", name, why);
    return KP_RUN_NOT_SUPPORTED;
}

static int topp_host_run(topp_algo algo, const char *name, const void *vargs, char *message, size_t message_len) {
    int rc = topp_host_check(name, vargs, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    const kp_topp_args *a = vargs;
    row_job job = {.args = a, .algo = algo};
    if (algo == ALGO_SPLIT_LOGIT) {
        job.piece_count = topp_slice_count(a->batch, a->sm_count);
        job.piece_len = (a->vocab + job.piece_count - 1) / job.piece_count;
    } else {
        job.piece_len = KP_TOPP_TILE;
        job.piece_count = (a->vocab + KP_TOPP_TILE - 1) / KP_TOPP_TILE;
    }
    kp_parallel_for(a->batch, algo == ALGO_SPLIT_PROB ? prob_row : topp_row, &job);
    if (job.failed) {
        if (message && message_len) snprintf(message, message_len, "%s: out of host memory for a row's boundary level", name);
        return KP_RUN_FAILED;
    }
    return KP_RUN_OK;
}

static int split_logit_supports(const void *args, char *message, size_t message_len) {
    return topp_host_check("topp.split_logit@host", args, message, message_len);
}
static int split_logit_run(const void *args, char *message, size_t message_len) {
    return topp_host_run(ALGO_SPLIT_LOGIT, "topp.split_logit@host", args, message, message_len);
}
static int split_prob_supports(const void *args, char *message, size_t message_len) {
    return topp_host_check("topp.split_prob@host", args, message, message_len);
}
static int split_prob_run(const void *args, char *message, size_t message_len) {
    return topp_host_run(ALGO_SPLIT_PROB, "topp.split_prob@host", args, message, message_len);
}

const kp_impl kp_topp_split_logit_host = {
    .abi = KP_ABI_VERSION,
    .family = "topp",
    .name = "topp.split_logit@host",
    .memory = KP_MEMORY_HOST,
    .workspace_bytes = topp_host_workspace_bytes,
    .supports = split_logit_supports,
    .run = split_logit_run,
};

const kp_impl kp_topp_split_prob_host = {
    .abi = KP_ABI_VERSION,
    .family = "topp",
    .name = "topp.split_prob@host",
    .memory = KP_MEMORY_HOST,
    .workspace_bytes = topp_host_workspace_bytes,
    .supports = split_prob_supports,
    .run = split_prob_run,
};
