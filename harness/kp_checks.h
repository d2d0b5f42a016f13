/* kp_checks.h: one case's working state and the declared checks (exact, rule, tolerance, repeat,
 * batch, expect) that run against it. Family-specific judging goes through kp_family hooks. */
#ifndef KP_CHECKS_H
#define KP_CHECKS_H

#include "kp_launch.h"

/* One impl's output on the whole case, made once per case and shared by its checks. */
typedef struct kp_case_out {
    const kp_impl *impl;
    kp_result status;
    kp_output *out;
    char message[1024];
} kp_case_out;

typedef struct kp_case_ctx {
    const kp_case_spec *cs;
    const kp_family *fam;
    kp_prepared prep;
    int64_t batch;
    kp_evidence *ev;
    cJSON *receipt;   /* the case's receipt under construction */
    cJSON *impls;     /* receipt["impls"] */
    cJSON *reference; /* receipt["reference"] */
    cJSON *cache;     /* receipt["cache"]: where the inputs and the reference came from (NULL: no cache) */
    kp_case_out *outs; /* one per impl the case's checks name, sized at open */
    int nouts, cap;
} kp_case_ctx;

/* Extra rows a case's checks need beyond its batch: the probes' filler rows (kp_family_probe_rows) when a check
 * probes batches, else 0. What the case is prepared with, and estimated with at load. */
int64_t kp_case_extra_rows(const kp_case_spec *cs);
int kp_case_ctx_open(kp_case_ctx *ctx, const kp_case_spec *cs, kp_evidence *ev, cJSON *receipt, kp_error *err);
void kp_case_ctx_close(kp_case_ctx *ctx);
/* Run one check; its record (check, label, impl, params, result, summary, findings) goes into `chk`. */
kp_result kp_check_run(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk);
/* A check's head, as every record of it starts: check, label, impl (and impl_b). */
void kp_check_head(const kp_check_spec *spec, cJSON *chk);
/* The record of a check that did not run, with the reason: the same head as kp_check_run writes. */
void kp_check_stub(const kp_check_spec *spec, kp_result result, const char *why, cJSON *chk);

/* One batch probe: rows[i] of the case ran at position i of a batch of nrows. Compares each
 * row's bits with the full-batch output and says whether the probe moved at least min_moved rows
 * (at least 1); one that moved fewer is vacuous. Exposed for tests. */
typedef struct kp_probe_result {
    int64_t rows_probed, rows_moved, rows_differ;
    int vacuous;
    int not_given; /* a judged impl (outputs made elsewhere) was given no outputs for this row set */
} kp_probe_result;
kp_result kp_batch_probe(kp_case_ctx *ctx, const kp_impl *impl, const kp_output *full_out, const char *name,
                         const int64_t *rows, int64_t nrows, int64_t min_moved, cJSON *probes, kp_probe_result *pr);

/* tolerance.c: the tolerance check of one impl's full output (an output the impl declared absent is NOT_RUN in its
 * entry and the verdict is over the others; NOT_RUN when none is left), and its thresholds for the receipt. */
/* The finite pairs a tolerance check holds at once between its threads' blocks and its sums (16 bytes each; more
 * only where one output row alone has more elements): the memory estimate counts them (harness/launch.c). */
#define KP_TOLERANCE_WAVE_ELEMENTS (32 * 16384)
kp_result kp_tolerance_check(const kp_prepared *p, const kp_check_spec *spec, const kp_output *o, cJSON *chk,
                             kp_evidence *ev);
void kp_tolerance_describe(const kp_family *fam, const kp_check_spec *spec, cJSON *params);

#endif
