/* mla_batch.c: the mla family's batch stage: where split_count's plan stops splitting a full-length request (the
 * threshold its batch probes straddle, and so the filler requests a case holds), and what each probe's split counts
 * were, for its receipt entry. */
#include <stdbool.h>
#include <stdlib.h>

#include "../kernels/mla_plan.h"
#include "mla_family.h"

#define THRESHOLD_SEARCH 4096 /* batch sizes searched for split_count's last split */

/* Request 0's split count under split_count's plan in a batch of n full-length requests, on the modelled device. */
static int64_t first_request_splits(const kp_mla_case *mc, int64_t n, int64_t *blocks, int64_t *splits) {
    for (int64_t i = 0; i < n; i++) blocks[i] = kp_mla_blocks(mc->topk);
    if (kp_mla_split_count_plan(blocks, n, kp_mla_sm_parts(KP_MLA_HOST_SMS, mc->s_q, mc->h_q), splits, NULL, 0) < 0) return -1;
    return splits[0];
}

/* The search's answer for the last few (topk, s_q, h_q), the only fields it reads: a gate asks for it several times
 * a case (its config's row count, the launch estimate, each batch check's header and probes), and each search plans
 * ~8 million requests. Per thread, so no lock; a failed allocation is not remembered. */
#define THRESHOLD_MEMO 8
typedef struct threshold_memo {
    int64_t topk, s_q, h_q, last;
} threshold_memo;

static int64_t last_split_batch(const kp_mla_case *mc) {
    static _Thread_local threshold_memo memo[THRESHOLD_MEMO];
    static _Thread_local int nmemo, next;
    for (int i = 0; i < nmemo; i++)
        if (memo[i].topk == mc->topk && memo[i].s_q == mc->s_q && memo[i].h_q == mc->h_q) return memo[i].last;
    int64_t *blocks = malloc(sizeof *blocks * THRESHOLD_SEARCH), *splits = malloc(sizeof *splits * THRESHOLD_SEARCH);
    const bool searched = blocks && splits;
    int64_t last = 0;
    for (int64_t n = 1; searched && n < THRESHOLD_SEARCH; n++)
        if (first_request_splits(mc, n, blocks, splits) > 1) last = n;
    free(blocks), free(splits);
    if (searched) {
        memo[next] = (threshold_memo){mc->topk, mc->s_q, mc->h_q, last};
        next = (next + 1) % THRESHOLD_MEMO;
        if (nmemo < THRESHOLD_MEMO) nmemo++;
    }
    return last;
}

/* The largest batch of full-length requests in which split_count still cuts the first into more than one split:
 * a probe of T requests and one of T + 1 straddle the last change of its plan. */
int kp_mla_case_thresholds(const kp_case *c, kp_threshold *t) {
    const int64_t last = last_split_batch(kp_mla_case_of(c));
    if (last < 1) return 0;
    t[0] = (kp_threshold){last, "split_count's plan (FlashMLA's SM90 scheduler on an H200's 132 SMs) cuts a full-length "
                                "request into more than one split up to here, and into one from one request more"};
    return 1;
}

int64_t kp_mla_extra_requests(const kp_case *c) {
    kp_threshold t[KP_THRESHOLDS_MAX];
    return kp_threshold_probe_rows(t, kp_mla_case_thresholds(c, t));
}

/* Every probe's split counts: per position, the probe's and (for the case's own rows) the full batch's. */
void kp_mla_describe_probe(const void *data, const kp_output *probe, const int64_t *rows, int64_t nrows,
                           const kp_output *full, cJSON *p) {
    const mla_data *d = data;
    cJSON *s = cJSON_AddObjectToObject(p, "splits");
    cJSON *in_probe = cJSON_AddArrayToObject(s, "probe"), *in_full = cJSON_AddArrayToObject(s, "full_batch");
    const int32_t *ps = probe->t[3].data, *fs = full->t[3].data;
    for (int64_t i = 0; i < nrows; i++) {
        cJSON_AddItemToArray(in_probe, cJSON_CreateNumber(ps[i]));
        cJSON_AddItemToArray(in_full, rows[i] < d->mc.batch ? cJSON_CreateNumber(fs[rows[i]]) : cJSON_CreateNull());
    }
}

