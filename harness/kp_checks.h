/* kp_checks.h: one case's working state and the declared checks (exact, rule, repeat, batch,
 * expect) that run against it. Family-specific judging goes through kp_family hooks. */
#ifndef KP_CHECKS_H
#define KP_CHECKS_H

#include "kp_harness.h"

#define KP_CTX_MAX_IMPLS 8

typedef struct kp_case_ctx {
    const kp_case_spec *cs;
    const kp_family *fam;
    void *data;
    int64_t batch;
    kp_evidence *ev;
    cJSON *receipt;   /* the case's receipt under construction */
    cJSON *impls;     /* receipt["impls"] */
    cJSON *reference; /* receipt["reference"] */
    struct {
        const kp_impl *impl;
        kp_result status;
        void *out;
        char message[1024];
    } outs[KP_CTX_MAX_IMPLS];
    int nouts;
} kp_case_ctx;

int kp_case_ctx_open(kp_case_ctx *ctx, const kp_case_spec *cs, kp_evidence *ev, cJSON *receipt, kp_error *err);
void kp_case_ctx_close(kp_case_ctx *ctx);
/* Run one check; its record (check, label, impl, params, result, summary, findings) goes into `chk`. */
kp_result kp_check_run(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk);

/* One batch probe: rows[i] of the case ran at position i of a batch of nrows. Compares each
 * row's bits with the full-batch output and says whether the probe moved any row at all.
 * Exposed for tests: a probe that moves nothing must be reported vacuous. */
typedef struct kp_probe_result {
    int64_t rows_probed, rows_moved, rows_differ;
    int vacuous;
} kp_probe_result;
kp_result kp_batch_probe(kp_case_ctx *ctx, const kp_impl *impl, const void *full_out, const char *name,
                         const int64_t *rows, int64_t nrows, cJSON *probes, kp_probe_result *pr);

#endif
