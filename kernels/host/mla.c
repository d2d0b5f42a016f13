/* mla.c: the host ports of mla.split_count (incumbent) and mla.split_size (candidate), the sparse MLA
 * decode of kernels/mla_plan.h in f32 with the production kernel's numerics (families.md §D2, §D5):
 * fp8 values times their tile scale rounded to bf16, products rounded to bf16; scores in the log2
 * domain; each split an online softmax over 64-slot blocks whose P is rounded to bf16 for the PV sum
 * while L sums the f32 P; splits combined in split order in log2, the lse divided by log2(e) at the
 * end; out rounded to bf16. The two differ only in the plan, so split_size's bits cannot depend on the
 * batch and split_count's do. One (query row, 16 heads) per kp_parallel_for item, each block's tokens
 * decoded once for the 16. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kp_formats.h"
#include "../kp_registry.h"
#include "../mla_plan.h"

#define D_QK 576
#define D_V 512
#define LOG2E 1.4426950408889634f

enum { ALGO_SPLIT_COUNT = 0, ALGO_SPLIT_SIZE = 1 };

/* A cache token's 576 values as the kernel multiplies them: fp8 e4m3 times bf16(scale), rounded to bf16. */
static void token_values(const kp_mla_args *a, int32_t slot, float *k) {
    if (a->cache_format == KP_MLA_CACHE_BF16) {
        const uint16_t *t = (const uint16_t *)a->cache + (int64_t)slot * D_QK;
        for (int i = 0; i < D_QK; i++) k[i] = kp_bf16_value(t[i]);
        return;
    }
    const uint8_t *t = (const uint8_t *)a->cache + (int64_t)slot * 656;
    for (int tile = 0; tile < 4; tile++) {
        float scale;
        memcpy(&scale, t + 512 + 4 * tile, sizeof scale);
        const float s = kp_bf16_round(scale);
        for (int i = 0; i < 128; i++) k[tile * 128 + i] = kp_bf16_round(kp_e4m3_decode(t[tile * 128 + i]) * s);
    }
    for (int i = 0; i < 64; i++) {
        uint16_t h;
        memcpy(&h, t + 528 + 2 * i, sizeof h);
        k[512 + i] = kp_bf16_value(h);
    }
}

static int mla_host_check(const char *name, const void *args, char *message, size_t len) {
    const kp_mla_args *a = args;
    const char *why = NULL;
    if (a->batch < 1 || a->s_q < 1 || a->slots < 1) why = "batch, s_q or slots below 1";
    else if (a->h_q < 64 || a->h_q % 64) why = "h_q is not a positive multiple of 64";
    else if (a->topk < 64 || a->topk % 64) why = "topk is not a positive multiple of 64";
    else if (a->cache_format != KP_MLA_CACHE_FP8_DS_MLA && a->cache_format != KP_MLA_CACHE_BF16) why = "cache_format";
    else if (!(a->sm_scale > 0.0f) || isinf(a->sm_scale)) why = "sm_scale is not positive and finite";
    if (!why) return KP_RUN_OK;
    if (message && len) snprintf(message, len, "%s: %s", name, why);
    return KP_RUN_NOT_SUPPORTED;
}

static size_t mla_host_workspace_bytes(const void *args) {
    const kp_mla_args *a = args;
    return (size_t)(a->batch * 2 + 1) * sizeof(int64_t) + (size_t)(a->batch * (a->topk / KP_MLA_BLOCK + 1)) * sizeof(int64_t);
}

typedef struct mla_job {
    const kp_mla_args *a;
    const int64_t *nsplits, *first; /* per request: split count and first block of each split */
    int64_t max_splits;
    atomic_int failed;
} mla_job;

/* The counted slots of row (b, i): -1 never counts, nor (with topk_length) a slot at or past it. */
static int64_t row_length(const kp_mla_args *a, int64_t row) {
    int64_t n = a->topk;
    if (a->topk_length) n = a->topk_length[row] < 0 ? 0 : a->topk_length[row] < n ? a->topk_length[row] : n;
    return n;
}

#define GROUP 16 /* heads an item: a block's tokens are decoded once for all of them */

/* One head's split-by-split state. */
typedef struct head_state {
    float q[D_QK], acc[D_V], m, l, max_logit;
    int any;
} head_state;

static void group_item(void *ctx, int64_t item) {
    const mla_job *job = ctx;
    const kp_mla_args *a = job->a;
    const int64_t groups = (a->h_q + GROUP - 1) / GROUP, h0 = item % groups * GROUP, row = item / groups;
    const int64_t nh = a->h_q - h0 < GROUP ? a->h_q - h0 : GROUP, b = row / a->s_q, len = row_length(a, row);
    const float scale_log2 = a->sm_scale * LOG2E;
    const int64_t ns = job->nsplits[b];
    head_state *hs = malloc(sizeof *hs * (size_t)nh);
    float *split_lse = malloc(sizeof *split_lse * (size_t)(ns * nh)), *split_out = malloc(sizeof *split_out * (size_t)(ns * nh * D_V));
    float *kblock = malloc(sizeof *kblock * KP_MLA_BLOCK * D_QK); /* a block's tokens, decoded once for every head */
    if (!hs || !split_lse || !split_out || !kblock) {
        atomic_store(&((mla_job *)job)->failed, 1);
        free(hs), free(split_lse), free(split_out), free(kblock);
        return;
    }
    for (int64_t h = 0; h < nh; h++) {
        const uint16_t *qb = a->q + (row * a->h_q + h0 + h) * D_QK;
        for (int i = 0; i < D_QK; i++) hs[h].q[i] = kp_bf16_value(qb[i]);
        hs[h].max_logit = -INFINITY;
    }
    for (int64_t s = 0; s < ns; s++) {
        const int64_t b0 = job->first[b * job->max_splits + s];
        const int64_t b1 = s + 1 < ns ? job->first[b * job->max_splits + s + 1] : kp_mla_blocks(a->topk);
        for (int64_t h = 0; h < nh; h++) { /* the kernel's running max starts at -1e30 */
            hs[h].m = -1e30f, hs[h].l = 0.0f, hs[h].any = 0;
            memset(hs[h].acc, 0, sizeof hs[h].acc);
        }
        for (int64_t blk = b0; blk < b1; blk++) {
            int32_t slot[KP_MLA_BLOCK];
            int counted = 0;
            for (int j = 0; j < KP_MLA_BLOCK; j++) {
                const int64_t at = blk * KP_MLA_BLOCK + j;
                slot[j] = at < len && at < a->topk ? a->indices[row * a->topk + at] : -1;
                if (slot[j] < 0 || slot[j] >= a->slots) { slot[j] = -1; continue; }
                token_values(a, slot[j], kblock + j * D_QK);
                counted++;
            }
            if (!counted) continue;
            for (int64_t h = 0; h < nh; h++) {
                head_state *st = &hs[h];
                float sc[KP_MLA_BLOCK], bmax = -INFINITY;
                for (int j = 0; j < KP_MLA_BLOCK; j++) {
                    if (slot[j] < 0) continue;
                    const float *k = kblock + j * D_QK;
                    float dot = 0.0f;
                    for (int i = 0; i < D_QK; i++) dot += st->q[i] * k[i];
                    const float natural = dot * a->sm_scale;
                    if (natural > st->max_logit || isnan(natural)) st->max_logit = natural;
                    sc[j] = dot * scale_log2;
                    if (sc[j] > bmax || isnan(sc[j])) bmax = sc[j];
                }
                if (bmax == -INFINITY) continue;
                st->any = 1;
                const float mnew = bmax > st->m || isnan(bmax) ? bmax : st->m, rescale = exp2f(st->m - mnew);
                st->l *= rescale;
                for (int i = 0; i < D_V; i++) st->acc[i] *= rescale;
                for (int j = 0; j < KP_MLA_BLOCK; j++) {
                    if (slot[j] < 0) continue;
                    const float p = exp2f(sc[j] - mnew);
                    st->l += p;
                    const float pb = kp_bf16_round(p), *k = kblock + j * D_QK; /* P in bf16 for the PV product */
                    for (int i = 0; i < D_V; i++) st->acc[i] += pb * k[i];
                }
                st->m = mnew;
            }
        }
        for (int64_t h = 0; h < nh; h++) {
            const head_state *st = &hs[h];
            split_lse[h * ns + s] = st->any ? log2f(st->l) + st->m : -INFINITY;
            float *so = split_out + (h * ns + s) * D_V;
            for (int i = 0; i < D_V; i++) so[i] = st->any ? st->acc[i] / st->l : 0.0f;
        }
    }
    for (int64_t h = 0; h < nh; h++) {
        const float *sl = split_lse + h * ns, *so = split_out + h * ns * D_V;
        float out[D_V] = {0}, gmax = -INFINITY, lse_sum = 0.0f, lse2 = INFINITY;
        for (int64_t s = 0; s < ns; s++)
            if (sl[s] > gmax || isnan(sl[s])) gmax = sl[s];
        if (gmax != -INFINITY) { /* combine in split order, in log2 */
            for (int64_t s = 0; s < ns; s++) lse_sum += exp2f(sl[s] - gmax);
            for (int64_t s = 0; s < ns; s++) {
                const float w = exp2f(sl[s] - gmax) / lse_sum;
                for (int i = 0; i < D_V; i++) out[i] += w * so[s * D_V + i];
            }
            lse2 = log2f(lse_sum) + gmax;
            if (a->attn_sink) { /* the sink adds exp(sink) to the denominator: out * 1 / (1 + exp(sink - lse)) */
                const float o_scale = 1.0f / (1.0f + exp2f(a->attn_sink[h0 + h] * LOG2E - lse2));
                for (int i = 0; i < D_V; i++) out[i] *= o_scale;
            }
        }
        const int64_t at = row * a->h_q + h0 + h;
        for (int i = 0; i < D_V; i++) a->out[at * D_V + i] = kp_bf16_bits(out[i]);
        a->lse[at] = gmax == -INFINITY ? INFINITY : lse2 / LOG2E;
        a->max_logits[at] = hs[h].max_logit;
    }
    free(hs), free(split_lse), free(split_out), free(kblock);
}

static int mla_host_run(const void *args, char *message, size_t len, int algo, const char *name) {
    const kp_mla_args *a = args;
    int rc = mla_host_check(name, args, message, len);
    if (rc) return rc;
    for (int64_t i = 0; i < a->batch * a->s_q * a->topk; i++)
        if (a->indices[i] < -1 || a->indices[i] >= a->slots) {
            snprintf(message, len, "%s: indices[%lld] = %d is neither -1 nor a slot in [0, %lld)", name, (long long)i,
                     a->indices[i], (long long)a->slots);
            return KP_RUN_NOT_SUPPORTED;
        }
    if (!a->workspace || a->workspace_bytes < mla_host_workspace_bytes(args)) {
        snprintf(message, len, "%s: the workspace is missing or smaller than workspace_bytes()", name);
        return KP_RUN_FAILED;
    }
    int64_t *blocks = a->workspace, *nsplits = blocks + a->batch, *first = nsplits + a->batch + 1;
    const int64_t max_splits = a->topk / KP_MLA_BLOCK + 1;
    for (int64_t b = 0; b < a->batch; b++) { /* a request's length: its longest row's */
        int64_t longest = 0;
        for (int64_t i = 0; i < a->s_q; i++) {
            const int64_t n = row_length(a, b * a->s_q + i);
            longest = n > longest ? n : longest;
        }
        blocks[b] = kp_mla_blocks(longest);
    }
    if (algo == ALGO_SPLIT_COUNT) {
        const int64_t parts = kp_mla_sm_parts(a->sm_count > 0 ? a->sm_count : KP_MLA_HOST_SMS, a->s_q, a->h_q);
        if (kp_mla_split_count_plan(blocks, a->batch, parts, nsplits, first, max_splits) < 0) {
            snprintf(message, len, "%s: the scheduler's parts could not hold the batch", name);
            return KP_RUN_FAILED;
        }
    } else
        for (int64_t b = 0; b < a->batch; b++) {
            nsplits[b] = kp_mla_split_size_splits(blocks[b]);
            for (int64_t s = 0; s < nsplits[b]; s++) first[b * max_splits + s] = s * KP_MLA_SPLIT_BLOCKS;
        }
    for (int64_t b = 0; b < a->batch; b++) a->splits[b] = (int32_t)nsplits[b];
    mla_job job = {.a = a, .nsplits = nsplits, .first = first, .max_splits = max_splits};
    atomic_init(&job.failed, 0);
    kp_parallel_for(a->batch * a->s_q * ((a->h_q + GROUP - 1) / GROUP), group_item, &job);
    if (atomic_load(&job.failed)) {
        snprintf(message, len, "%s: out of host memory", name);
        return KP_RUN_FAILED;
    }
    return KP_RUN_OK;
}

static int split_count_run(const void *args, char *m, size_t n) { return mla_host_run(args, m, n, ALGO_SPLIT_COUNT, "mla.split_count@host"); }
static int split_size_run(const void *args, char *m, size_t n) { return mla_host_run(args, m, n, ALGO_SPLIT_SIZE, "mla.split_size@host"); }
static int split_count_supports(const void *args, char *m, size_t n) { return mla_host_check("mla.split_count@host", args, m, n); }
static int split_size_supports(const void *args, char *m, size_t n) { return mla_host_check("mla.split_size@host", args, m, n); }

const kp_impl kp_mla_split_count_host = {KP_ABI_VERSION, "mla", "mla.split_count@host", KP_MEMORY_HOST,
                                         mla_host_workspace_bytes, split_count_supports, split_count_run};
const kp_impl kp_mla_split_size_host = {KP_ABI_VERSION, "mla", "mla.split_size@host", KP_MEMORY_HOST,
                                        mla_host_workspace_bytes, split_size_supports, split_size_run};
