/* mla.c: the host ports of mla.split_count (incumbent) and mla.split_size (candidate), the sparse MLA
 * decode of kernels/mla_plan.h in f32 with the production kernel's numerics (families.md §D2, §D5):
 * fp8 values times their tile scale rounded to bf16, products rounded to bf16; scores in the log2
 * domain; each split an online softmax over 64-slot blocks whose P is rounded to bf16 for the PV sum
 * while L sums the f32 P; splits combined in split order in log2, the lse divided by log2(e) at the
 * end; out rounded to bf16. The two differ only in the plan, so split_size's bits cannot depend on the
 * batch and split_count's do. One (query row, GROUP = 32 heads) per kp_parallel_for item, each block's
 * tokens decoded once for the 32. */
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

#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define MLA_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef MLA_CLONES
#define MLA_CLONES
#endif

/* k[i] = bf16(e4m3(t[i]) * s) for i < 128: kp_e4m3_decode and kp_bf16_round with each branch made a select by
 * masks (between the same values), so the loop vectorizes; the bits are theirs. */
MLA_CLONES static void fp8_tile(const uint8_t *restrict t, float s, float *restrict k) {
    for (int i = 0; i < 128; i++) {
        const uint32_t b = t[i], e = (b >> 3) & 15u, m = b & 7u;
        const uint32_t normal = ((e + 120u) << 23) | (m << 20); /* (1 + m/8) * 2^(e - 7) */
        const float sub = (float)(int32_t)m * 0.001953125f;      /* e == 0: m / 8 * 2^-6 */
        uint32_t sub_bits;
        memcpy(&sub_bits, &sub, sizeof sub_bits);
        const uint32_t is_sub = 0u - (uint32_t)(e == 0), is_nan = 0u - (uint32_t)(e == 15u && m == 7u);
        uint32_t bits = (sub_bits & is_sub) | (normal & ~is_sub);
        bits = (0x7fc00000u & is_nan) | (bits & ~is_nan);
        bits ^= ((b & 0x80u) << 24) & ~is_nan; /* the sign: -v (NaN is returned before it, unsigned) */
        float v;
        memcpy(&v, &bits, sizeof v);
        const float x = v * s;
        uint32_t xb;
        memcpy(&xb, &x, sizeof xb);
        const uint32_t rounded = (xb + 0x7fffu + ((xb >> 16) & 1u)) & 0xffff0000u;
        const uint32_t keep = 0u - (uint32_t)((xb & 0x7f800000u) == 0x7f800000u); /* inf and NaN as they are */
        xb = (xb & keep) | (rounded & ~keep);
        memcpy(&k[i], &xb, sizeof xb);
    }
}

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
        fp8_tile(t + tile * 128, kp_bf16_round(scale), k + tile * 128);
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

#define GROUP 32 /* heads an item: a block's tokens are decoded once for all of them (at 32 the decode is still
                    about 14% of the port's time, MEASURED.md); h_q 64 still gives a lone request two items */

/* One head's split-by-split state. */
typedef struct head_state {
    float acc[D_V], m, l, max_logit;
    int any;
} head_state;

/* The two products run across lanes, each lane one f32 chain in the scalar order (a product, then a sum: -std=c11
 * keeps gcc from contracting them to an FMA), so the bits are the scalar loops'. Scores: the lanes are the group's
 * 32 heads (q transposed to [576][32]), 2 tokens side by side; PV: the lanes are 64 of the 512 output columns, each
 * summing the block's tokens in ascending order. Either way 8 accumulators of 8 lanes, enough to cover an add's
 * latency. An AVX2 clone is chosen at run time (the same bits: the same per-lane order). */
typedef float lanes8 __attribute__((vector_size(32)));
typedef float lanes8u __attribute__((vector_size(32), aligned(4), may_alias)); /* a view of floats */
#define TOKENS 2

/* dot[t * GROUP + h] = sum over i ascending of q[h][i] * k_t[i], t < TOKENS (qt: [D_QK][GROUP], q transposed). */
MLA_CLONES static void scores(const float *restrict qt, const float *restrict k0, const float *restrict k1,
                              float *restrict dot) {
    lanes8 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0}, a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
    for (int i = 0; i < D_QK; i++) {
        const lanes8u *q = (const lanes8u *)(qt + i * GROUP);
        const lanes8 q0 = q[0], q1 = q[1], q2 = q[2], q3 = q[3];
        const float b0 = k0[i], b1 = k1[i];
        a00 += q0 * b0, a01 += q1 * b0, a02 += q2 * b0, a03 += q3 * b0;
        a10 += q0 * b1, a11 += q1 * b1, a12 += q2 * b1, a13 += q3 * b1;
    }
    lanes8u *d = (lanes8u *)dot;
    d[0] = a00, d[1] = a01, d[2] = a02, d[3] = a03, d[4] = a10, d[5] = a11, d[6] = a12, d[7] = a13;
}

/* acc[i] = acc[i] * rescale, then acc[i] += pb[t] * k_t[i] for t < n ascending (i < D_V). */
MLA_CLONES static void pv_block(float *restrict acc, float rescale, const float *restrict pb, const float *const *k, int n) {
    for (int i0 = 0; i0 < D_V; i0 += 64) {
        lanes8u *a = (lanes8u *)(acc + i0);
        lanes8 a0 = a[0] * rescale, a1 = a[1] * rescale, a2 = a[2] * rescale, a3 = a[3] * rescale;
        lanes8 a4 = a[4] * rescale, a5 = a[5] * rescale, a6 = a[6] * rescale, a7 = a[7] * rescale;
        for (int t = 0; t < n; t++) {
            const lanes8u *v = (const lanes8u *)(k[t] + i0);
            const float p = pb[t];
            a0 += p * v[0], a1 += p * v[1], a2 += p * v[2], a3 += p * v[3];
            a4 += p * v[4], a5 += p * v[5], a6 += p * v[6], a7 += p * v[7];
        }
        a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3, a[4] = a4, a[5] = a5, a[6] = a6, a[7] = a7;
    }
}

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
    float *qt = calloc(D_QK * GROUP, sizeof *qt);                 /* [D_QK][GROUP]: the heads' q, transposed */
    float *dots = malloc(sizeof *dots * (KP_MLA_BLOCK + TOKENS) * GROUP); /* [token][GROUP] */
    if (!hs || !split_lse || !split_out || !kblock || !qt || !dots) {
        atomic_store(&((mla_job *)job)->failed, 1);
        free(hs), free(split_lse), free(split_out), free(kblock), free(qt), free(dots);
        return;
    }
    for (int64_t h = 0; h < nh; h++) {
        const uint16_t *qb = a->q + (row * a->h_q + h0 + h) * D_QK;
        for (int i = 0; i < D_QK; i++) qt[i * GROUP + h] = kp_bf16_value(qb[i]);
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
            const float *tok[KP_MLA_BLOCK + TOKENS]; /* the block's counted tokens, ascending */
            int counted = 0;
            for (int j = 0; j < KP_MLA_BLOCK; j++) {
                const int64_t at = blk * KP_MLA_BLOCK + j;
                const int32_t slot = at < len && at < a->topk ? a->indices[row * a->topk + at] : -1;
                if (slot < 0 || slot >= a->slots) continue;
                token_values(a, slot, kblock + j * D_QK);
                tok[counted++] = kblock + j * D_QK;
            }
            if (!counted) continue;
            for (int t = counted; t % TOKENS; t++) tok[t] = tok[counted - 1]; /* padding: its scores are not read */
            for (int t = 0; t < counted; t += TOKENS)
                scores(qt, tok[t], tok[t + 1], dots + t * GROUP);
            for (int64_t h = 0; h < nh; h++) {
                head_state *st = &hs[h];
                float sc[KP_MLA_BLOCK], pb[KP_MLA_BLOCK], bmax = -INFINITY;
                for (int t = 0; t < counted; t++) {
                    const float dot = dots[t * GROUP + h];
                    const float natural = dot * a->sm_scale;
                    if (natural > st->max_logit || isnan(natural)) st->max_logit = natural;
                    sc[t] = dot * scale_log2;
                    if (sc[t] > bmax || isnan(sc[t])) bmax = sc[t];
                }
                if (bmax == -INFINITY) continue;
                st->any = 1;
                const float mnew = bmax > st->m || isnan(bmax) ? bmax : st->m, rescale = exp2f(st->m - mnew);
                st->l *= rescale;
                for (int t = 0; t < counted; t++) {
                    const float p = exp2f(sc[t] - mnew);
                    st->l += p;
                    pb[t] = kp_bf16_round(p); /* P in bf16 for the PV product */
                }
                pv_block(st->acc, rescale, pb, tok, counted);
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
    free(hs), free(split_lse), free(split_out), free(kblock), free(qt), free(dots);
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
