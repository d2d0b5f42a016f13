/* mla_ref.c: sparse MLA decode's float64 reference (mla_ref.h). Inputs are checked first, serially: every index,
 * topk_length and page id a counted slot reaches, so an item never reads outside the buffers. Then items of
 * (row, HB heads) in parallel, each in two passes over the row's counted slots in ascending order, a token's 576
 * values dequantized afresh in each (cheaper than holding topk x 576 doubles a thread, and cache-friendly): scores
 * for the item's heads, then the softmax and the weighted sum of V. Built with -ffp-contract=off. */
#include "mla_ref.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kp_detmath.h"

#define HB 16 /* heads an item takes */

/* ---- the reference ----------------------------------------------------------------------------- */

typedef struct mla_job {
    const kp_mla_ref_in *in;
    const kp_mla_ref_result *res;
    const uint8_t *tokens; /* the cache or kv, token_bytes apart */
    kp_mla_cache_format format;
    int64_t token_bytes, blocks; /* head blocks a row */
    atomic_int failed;
} mla_job;

/* The buffer slot (page * page_size + offset) of every counted slot of `row`, ascending j; returns the count. */
static int64_t counted_slots(const kp_mla_ref_in *in, int64_t row, int64_t *slot) {
    const kp_mla_case *mc = in->mc;
    const int64_t P = (mc->s_kv + mc->page - 1) / mc->page, r = row / mc->s_q;
    const int32_t *idx = in->indices + row * mc->topk, *pages = in->page_table + r * P;
    const int64_t len = mc->topk_length ? in->topk_length[row] : mc->topk;
    int64_t n = 0;
    for (int64_t j = 0; j < len; j++)
        if (idx[j] != -1) slot[n++] = ((int64_t)pages[idx[j] / mc->page] - in->first * P) * mc->page + idx[j] % mc->page;
    return n;
}

/* 4 lanes (k mod 4), added in order: an order fixed by the length alone. */
KP_CLONES static double dot576(const double *a, const double *b) {
    double acc[4] = {0, 0, 0, 0};
    for (int k = 0; k < KP_MLA_D_QK; k += 4)
        for (int l = 0; l < 4; l++) acc[l] += a[k + l] * b[k + l];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

KP_CLONES static void axpy512(double *acc, double p, const double *v) {
    for (int d = 0; d < KP_MLA_D_V; d++) acc[d] += p * v[d];
}

static void mla_item(void *ctx, int64_t item) {
    mla_job *jb = ctx;
    const kp_mla_ref_in *in = jb->in;
    const kp_mla_case *mc = in->mc;
    const int64_t row = item / jb->blocks, h0 = (item % jb->blocks) * HB, K = mc->topk;
    const int nh = (int)(mc->h_q - h0 < HB ? mc->h_q - h0 : HB);
    double *out = jb->res->out + (row * mc->h_q + h0) * KP_MLA_D_V;
    double *lse = jb->res->lse + row * mc->h_q + h0, *maxl = jb->res->max_logits + row * mc->h_q + h0;
    int64_t *slot = malloc(sizeof *slot * (size_t)K);
    double *q = malloc(sizeof *q * (size_t)(nh * KP_MLA_D_QK)), *s = malloc(sizeof *s * (size_t)(nh * K));
    double *kv = malloc(sizeof *kv * KP_MLA_D_QK), *acc = calloc((size_t)(nh * KP_MLA_D_V), sizeof *acc);
    if (!slot || !q || !s || !kv || !acc) {
        atomic_store(&jb->failed, 1);
        goto done;
    }
    const int64_t n = counted_slots(in, row, slot);
    if (n == 0) { /* no counted slot: out 0, lse +inf, max_logits -inf */
        for (int64_t e = 0; e < nh * KP_MLA_D_V; e++) out[e] = 0.0;
        for (int h = 0; h < nh; h++) lse[h] = INFINITY, maxl[h] = -INFINITY;
        goto done;
    }
    for (int h = 0; h < nh; h++) {
        const uint16_t *qh = in->q + ((row * mc->h_q) + h0 + h) * KP_MLA_D_QK;
        for (int c = 0; c < KP_MLA_D_QK; c++) {
            const uint32_t b = (uint32_t)qh[c] << 16;
            float f;
            memcpy(&f, &b, sizeof f);
            q[h * KP_MLA_D_QK + c] = (double)f;
        }
    }
    /* pass 1: scores */
    for (int64_t j = 0; j < n; j++) {
        kp_mla_token_values(jb->format, jb->tokens + slot[j] * jb->token_bytes, kv);
        for (int h = 0; h < nh; h++) s[h * K + j] = mc->sm_scale * dot576(q + h * KP_MLA_D_QK, kv);
    }
    /* the softmax of each head: weights exp(s_j - M) in place, M finite unless a score is +-inf or NaN */
    double denom[HB];
    for (int h = 0; h < nh; h++) {
        double *sh = s + h * K, m = -INFINITY, l = 0.0;
        int nan = 0;
        for (int64_t j = 0; j < n; j++) {
            if (isnan(sh[j])) nan = 1;
            else if (sh[j] > m) m = sh[j];
        }
        for (int64_t j = 0; j < n; j++) {
            /* every score -inf: nothing attends; a NaN score stays NaN */
            if (!isnan(sh[j])) sh[j] = m == -INFINITY ? 0.0 : kp_exp_det(sh[j] - m);
            l += sh[j];
        }
        maxl[h] = nan ? NAN : m;
        lse[h] = nan ? NAN : (l == 0.0 ? INFINITY : m + kp_log_det(l));
        denom[h] = l;
        if (mc->sink != KP_MLA_SINK_OFF && l != 0.0) denom[h] += kp_exp_det((double)in->sink[h0 + h] - m);
    }
    /* pass 2: sum_j w_j v_j, ascending j */
    for (int64_t j = 0; j < n; j++) {
        kp_mla_token_values(jb->format, jb->tokens + slot[j] * jb->token_bytes, kv);
        for (int h = 0; h < nh; h++) axpy512(acc + h * KP_MLA_D_V, s[h * K + j], kv);
    }
    for (int h = 0; h < nh; h++)
        for (int d = 0; d < KP_MLA_D_V; d++) {
            const double a = acc[h * KP_MLA_D_V + d];
            /* a zero or +inf denominator (no attending score; an +inf sink) gives 0, never 0 / 0 or -0 */
            out[h * KP_MLA_D_V + d] = denom[h] == 0.0 || denom[h] == INFINITY ? (isnan(a) ? a : 0.0) : a / denom[h];
        }
done:
    free(slot), free(q), free(s), free(kv), free(acc);
}

double kp_mla_reference_bytes(const kp_mla_case *mc, int64_t rows) {
    (void)rows;
    const double item = (double)mc->topk * (8.0 + 8.0 * HB) + (double)HB * (KP_MLA_D_QK + KP_MLA_D_V) * 8.0 +
                        KP_MLA_D_QK * 8.0;
    return (double)kp_thread_count() * item;
}

/* Every index, topk_length and counted page id, before anything is read. */
static int check_inputs(const kp_mla_ref_in *in, kp_error *err) {
    const kp_mla_case *mc = in->mc;
    const int64_t P = (mc->s_kv + mc->page - 1) / mc->page, K = mc->topk;
    if (in->rows < 0 || in->rows % mc->s_q)
        return kp_fail(err, KP_EXIT_USAGE, "mla reference: %lld rows is not a whole number of requests of s_q %lld",
                       (long long)in->rows, (long long)mc->s_q);
    const int64_t n = in->rows / mc->s_q;
    if (!in->q || !in->indices || !in->page_table || (mc->topk_length && !in->topk_length) ||
        (mc->sink != KP_MLA_SINK_OFF && !in->sink))
        return kp_fail(err, KP_EXIT_USAGE, "mla reference: an input tensor is missing");
    for (int64_t row = 0; row < in->rows; row++) {
        const int32_t *idx = in->indices + row * K, *pages = in->page_table + (row / mc->s_q) * P;
        int64_t len = K;
        if (mc->topk_length) {
            len = in->topk_length[row];
            if (len < 0 || len > K)
                return kp_fail(err, KP_EXIT_USAGE, "mla reference: topk_length[%lld] = %lld is outside [0, %lld]",
                               (long long)row, (long long)len, (long long)K);
        }
        for (int64_t j = 0; j < K; j++) {
            const int32_t t = idx[j];
            if (t == -1) continue;
            if (t < 0 || t >= mc->s_kv)
                return kp_fail(err, KP_EXIT_USAGE,
                               "mla reference: indices[%lld][%lld] = %d is outside [0, %lld) and not -1 (row %lld, slot "
                               "%lld)",
                               (long long)row, (long long)j, t, (long long)mc->s_kv, (long long)row, (long long)j);
            if (j >= len) continue;
            const int64_t g = pages[t / mc->page] - in->first * P;
            if (g < 0 || g >= n * P)
                return kp_fail(err, KP_EXIT_USAGE,
                               "mla reference: row %lld slot %lld: token %d's page %d is outside the buffers' pages "
                               "[%lld, %lld)",
                               (long long)row, (long long)j, t, pages[t / mc->page], (long long)(in->first * P),
                               (long long)((in->first + n) * P));
        }
    }
    return 0;
}

static int run_one(const kp_mla_ref_in *in, const kp_mla_ref_result *res, const void *tokens, kp_mla_cache_format format,
                   const char *what, kp_error *err) {
    const kp_mla_case *mc = in->mc;
    if (!res->lse || !res->max_logits)
        return kp_fail(err, KP_EXIT_USAGE, "mla reference: the %s result asks for out without lse and max_logits", what);
    if (!tokens) return kp_fail(err, KP_EXIT_USAGE, "mla reference: the %s result is asked without its input", what);
    mla_job jb = {.in = in, .res = res, .tokens = tokens, .format = format,
                  .token_bytes = format == KP_MLA_BF16 ? KP_MLA_BF16_TOKEN_BYTES : KP_MLA_FP8_TOKEN_BYTES,
                  .blocks = (mc->h_q + HB - 1) / HB};
    atomic_init(&jb.failed, 0);
    kp_parallel_for(in->rows * jb.blocks, mla_item, &jb);
    if (atomic_load(&jb.failed)) return kp_fail(err, KP_EXIT_ENV, "mla reference: out of host memory");
    return 0;
}

int kp_mla_reference(const kp_mla_ref_in *in, const kp_mla_ref_out *out, kp_error *err) {
    if (!out->cache.out && !out->kv.out) return kp_fail(err, KP_EXIT_USAGE, "mla reference: no result asked");
    int rc = check_inputs(in, err);
    if (!rc && out->cache.out) rc = run_one(in, &out->cache, in->cache, in->mc->cache, "cache", err);
    if (!rc && out->kv.out) rc = run_one(in, &out->kv, in->kv, KP_MLA_BF16, "kv", err);
    return rc;
}
