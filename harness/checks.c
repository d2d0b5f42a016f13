/* checks.c: the declared checks. exact: two impls bit for bit, with the family's evidence of who
 * meets the rule; rule: the family's judge; repeat: run-to-run bits; batch: per-row bits across
 * batch compositions; expect: a known defect must reproduce. Launch errors never become mismatches. */
#define _GNU_SOURCE
#include "kp_checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_json.h"
#include "kp_device.h"

int kp_case_ctx_open(kp_case_ctx *ctx, const kp_case_spec *cs, kp_evidence *ev, cJSON *receipt, kp_error *err) {
    memset(ctx, 0, sizeof *ctx);
    ctx->cs = cs;
    ctx->ev = ev;
    ctx->receipt = receipt;
    ctx->fam = kp_family_find(cs->c.family);
    KP_ASSERT(ctx->fam);
    int64_t extra = 0;
    for (int k = 0; k < cs->nchecks; k++)
        if (cs->checks[k].kind == KP_CHECK_BATCH || (cs->checks[k].kind == KP_CHECK_EXPECT && cs->checks[k].of == KP_CHECK_BATCH))
            extra = 65; /* filler rows for the 65-row probe */
    double t0 = kp_now();
    int rc = ctx->fam->prepare(&cs->c, extra, &ctx->data, err);
    kp_stage_add(KP_STAGE_GENERATION, kp_now() - t0);
    if (rc) return err->code;
    ctx->batch = ctx->fam->batch(ctx->data);
    cJSON *inputs = cJSON_AddObjectToObject(receipt, "inputs");
    ctx->fam->describe_inputs(ctx->data, inputs);
    ctx->reference = cJSON_AddObjectToObject(receipt, "reference");
    ctx->impls = cJSON_AddArrayToObject(receipt, "impls");
    return 0;
}

void kp_case_ctx_close(kp_case_ctx *ctx) {
    for (int i = 0; i < ctx->nouts; i++) ctx->fam->free_output(ctx->outs[i].out);
    ctx->fam->release(ctx->data);
    ctx->nouts = 0;
}

/* An output's rows in order, as spans (malloc'd): what its digest hashes. */
static kp_span *output_rows(kp_case_ctx *ctx, const void *out, int64_t nrows) {
    kp_span *rows = malloc(sizeof *rows * (size_t)(nrows > 0 ? nrows : 1));
    if (!rows) kp_abort(__FILE__, __LINE__, "out of host memory for an output digest");
    for (int64_t r = 0; r < nrows; r++) rows[r].data = ctx->fam->out_row(ctx->data, out, r, &rows[r].len);
    return rows;
}

/* An output's digest, now. */
static void output_digest(kp_case_ctx *ctx, const void *out, int64_t nrows, char hex[KP_SHA256_HEX_LEN]) {
    kp_span *rows = output_rows(ctx, out, nrows);
    kp_sha256_spans_hex(NULL, 0, rows, (size_t)nrows, hex);
    free(rows);
}

/* The same digest on a worker thread (kp_digest_start), recorded as entry[key] at settle. */
static void output_digest_later(kp_case_ctx *ctx, const void *out, int64_t nrows, cJSON *entry, const char *key) {
    kp_span *rows = output_rows(ctx, out, nrows);
    kp_digest_start(NULL, 0, rows, (size_t)nrows, NULL, entry, key);
    free(rows);
}

/* The impl's output on the whole case, computed once per case and recorded in receipt["impls"]. */
static int full_output(kp_case_ctx *ctx, const kp_impl *impl, const char *role) {
    for (int i = 0; i < ctx->nouts; i++)
        if (ctx->outs[i].impl == impl) return i;
    KP_ASSERT(ctx->nouts < KP_CTX_MAX_IMPLS);
    int i = ctx->nouts++;
    ctx->outs[i].impl = impl;
    int64_t *rows = malloc(sizeof *rows * (size_t)ctx->batch);
    for (int64_t r = 0; rows && r < ctx->batch; r++) rows[r] = r;
    cJSON *entry = cJSON_CreateObject();
    cJSON_AddItemToArray(ctx->impls, entry);
    cJSON_AddStringToObject(entry, "name", impl->name);
    if (role && role[0]) cJSON_AddStringToObject(entry, "role", role);
    cJSON_AddStringToObject(entry, "memory", impl->memory == KP_MEMORY_CUDA ? "cuda" : "host");
    const char *plugin_sha = NULL, *origin = kp_impl_origin(impl, &plugin_sha);
    cJSON_AddStringToObject(entry, "binary", origin ? origin : "kparity (built in)");
    cJSON_AddStringToObject(entry, "binary_sha256", origin && plugin_sha ? plugin_sha : kp_self_sha256());
    cJSON *timing = cJSON_AddObjectToObject(entry, "timing");
    kp_error err = {0};
    ctx->outs[i].status = rows ? ctx->fam->run_rows(ctx->data, impl, rows, ctx->batch, &ctx->outs[i].out, timing, &err)
                               : KP_FAILED;
    if (!rows) snprintf(err.msg, sizeof err.msg, "out of host memory");
    free(rows);
    cJSON_AddStringToObject(entry, "status", kp_result_name(ctx->outs[i].status));
    if (ctx->outs[i].status == KP_PASSED) {
        output_digest_later(ctx, ctx->outs[i].out, ctx->batch, entry, "output_sha256");
    } else {
        snprintf(ctx->outs[i].message, sizeof ctx->outs[i].message, "%s", err.msg);
        cJSON_AddStringToObject(entry, "message", err.msg);
    }
    return i;
}

static void check_header(const kp_check_spec *spec, cJSON *chk) {
    cJSON_AddStringToObject(chk, "check", kp_check_name(spec->kind));
    cJSON_AddStringToObject(chk, "label", spec->label);
    cJSON_AddStringToObject(chk, "impl", spec->impl[0]->name);
    if (spec->nimpl == 2) cJSON_AddStringToObject(chk, "impl_b", spec->impl[1]->name);
    cJSON *params = cJSON_AddObjectToObject(chk, "params");
    if (spec->kind == KP_CHECK_EXACT || spec->kind == KP_CHECK_RULE || (spec->kind == KP_CHECK_EXPECT && spec->of == KP_CHECK_RULE)) {
        cJSON_AddStringToObject(params, "tie_policy", kp_tie_policy_name(spec->tie_policy));
        kp_json_add_double(params, "band", spec->band);
    }
    if (spec->kind == KP_CHECK_EXACT) cJSON_AddStringToObject(params, "comparison", "bitwise, every output element");
    if (spec->runs) kp_json_add_int(params, "runs", spec->runs);
    if (spec->kind == KP_CHECK_BATCH || (spec->kind == KP_CHECK_EXPECT && spec->of == KP_CHECK_BATCH))
        cJSON_AddStringToObject(params, "probes", "alone, halves, reversed65");
    if (spec->kind == KP_CHECK_EXPECT) {
        cJSON_AddStringToObject(params, "of", kp_check_name(spec->of));
        cJSON_AddStringToObject(params, "expected", kp_result_name(spec->expect_result));
        if (spec->defect[0]) cJSON_AddStringToObject(params, "defect", spec->defect);
    }
}

static kp_result not_ok(kp_case_ctx *ctx, int i, cJSON *chk) {
    char summary[1200];
    snprintf(summary, sizeof summary, "%s did not produce an output: %s", ctx->outs[i].impl->name, ctx->outs[i].message);
    cJSON_AddStringToObject(chk, "summary", summary);
    return ctx->outs[i].status;
}

/* Indices where two rows' element bytes differ (element size 4 for every family so far). */
static int64_t diff_indices(const void *a, const void *b, size_t bytes, int64_t *idx) {
    const uint32_t *x = a, *y = b;
    int64_t n = 0;
    for (size_t i = 0; i < bytes / 4; i++)
        if (x[i] != y[i]) idx[n++] = (int64_t)i;
    return n;
}

static kp_result check_exact(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    int a = full_output(ctx, spec->impl[0], spec->role[0]), b = full_output(ctx, spec->impl[1], spec->role[1]);
    if (ctx->outs[a].status != KP_PASSED) return not_ok(ctx, a, chk);
    if (ctx->outs[b].status != KP_PASSED) return not_ok(ctx, b, chk);
    size_t bytes;
    ctx->fam->out_row(ctx->data, ctx->outs[a].out, 0, &bytes);
    int64_t *idx = malloc(bytes / 4 * sizeof *idx + 8), *rows = malloc(sizeof *rows * (size_t)ctx->batch + 8);
    if (!idx || !rows) {
        free(idx), free(rows);
        cJSON_AddStringToObject(chk, "summary", "out of host memory");
        return KP_FAILED;
    }
    cJSON *f = cJSON_AddObjectToObject(chk, "findings");
    cJSON *per_row = cJSON_CreateArray();
    int64_t nrows_diff = 0, tokens = 0;
    kp_error err = {0};
    for (int64_t r = 0; r < ctx->batch; r++) {
        const void *ra = ctx->fam->out_row(ctx->data, ctx->outs[a].out, r, &bytes);
        const void *rb = ctx->fam->out_row(ctx->data, ctx->outs[b].out, r, &bytes);
        if (!memcmp(ra, rb, bytes)) continue;
        int64_t n = diff_indices(ra, rb, bytes, idx);
        if (!n) continue;
        rows[nrows_diff++] = r;
        tokens += n;
        cJSON *row = cJSON_CreateObject();
        cJSON_AddItemToArray(per_row, row);
        kp_json_add_int(row, "row", r);
        char name[64];
        snprintf(name, sizeof name, "exact.row%lld.differ", (long long)r);
        if (kp_evidence_list(ctx->ev, row, "differ", name, idx, n, &err)) break;
    }
    kp_json_add_int(f, "rows", ctx->batch);
    kp_json_add_int(f, "rows_identical", ctx->batch - nrows_diff);
    kp_json_add_int(f, "rows_differ", nrows_diff);
    kp_json_add_int(f, "elements_differ", tokens);
    cJSON_AddItemToObject(f, "per_row", per_row);
    /* where they differ, say who meets the rule: the evidence the seed's gate lacked */
    /* (a failure here leaves its message in err, which fails the check below) */
    if (nrows_diff && !err.msg[0] && ctx->fam->explain_exact && !ctx->fam->reference(ctx->data, spec, ctx->reference, &err))
        ctx->fam->explain_exact(ctx->data, spec, ctx->outs[a].out, ctx->outs[b].out, rows, nrows_diff, per_row, ctx->ev,
                                &err);
    free(idx), free(rows);
    if (err.msg[0]) {
        cJSON_AddStringToObject(chk, "summary", err.msg);
        return KP_FAILED;
    }
    char summary[256];
    if (nrows_diff)
        snprintf(summary, sizeof summary, "%lld/%lld rows bit-identical; %lld rows differ in %lld elements",
                 (long long)(ctx->batch - nrows_diff), (long long)ctx->batch, (long long)nrows_diff, (long long)tokens);
    else
        snprintf(summary, sizeof summary, "%lld/%lld rows bit-identical", (long long)ctx->batch, (long long)ctx->batch);
    cJSON_AddStringToObject(chk, "summary", summary);
    return nrows_diff ? KP_INCORRECT : KP_PASSED;
}

static kp_result check_rule(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    int a = full_output(ctx, spec->impl[0], spec->role[0]);
    if (ctx->outs[a].status != KP_PASSED) return not_ok(ctx, a, chk);
    kp_error err = {0};
    if (ctx->fam->reference(ctx->data, spec, ctx->reference, &err)) {
        cJSON_AddStringToObject(chk, "summary", err.msg);
        return KP_FAILED;
    }
    kp_result r = ctx->fam->rule(ctx->data, spec, ctx->outs[a].out, spec->impl[0], chk, ctx->ev, &err);
    if (r == KP_FAILED && err.msg[0]) cJSON_AddStringToObject(chk, "summary", err.msg);
    return r;
}

/* Runs 2..R are compared with run 1 row by row (memcmp); digests are computed only where they
 * differ, so a deterministic impl costs no hashing beyond run 1's output digest. */
static kp_result check_repeat(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    int a = full_output(ctx, spec->impl[0], spec->role[0]);
    if (ctx->outs[a].status != KP_PASSED) return not_ok(ctx, a, chk);
    const int64_t B = ctx->batch;
    const void *first = ctx->outs[a].out;
    char(*row_digest)[KP_SHA256_HEX_LEN] = calloc((size_t)(B * spec->runs), KP_SHA256_HEX_LEN); /* "" = same as run 1 */
    char(*whole)[KP_SHA256_HEX_LEN] = calloc((size_t)spec->runs, KP_SHA256_HEX_LEN);             /* "" = same as run 1 */
    int64_t *rows = malloc(sizeof *rows * (size_t)B);
    uint8_t *varies = calloc((size_t)B, 1);
    if (!row_digest || !whole || !rows || !varies) {
        free(row_digest), free(whole), free(rows), free(varies);
        cJSON_AddStringToObject(chk, "summary", "out of host memory");
        return KP_FAILED;
    }
    for (int64_t r = 0; r < B; r++) rows[r] = r;
    kp_result result = KP_PASSED;
    for (int run = 1; run < spec->runs; run++) {
        void *out = NULL;
        kp_error err = {0};
        kp_result st = ctx->fam->run_rows(ctx->data, spec->impl[0], rows, B, &out, NULL, &err);
        if (st != KP_PASSED) {
            char summary[1200];
            snprintf(summary, sizeof summary, "run %d of %d: %s", run + 1, spec->runs, err.msg);
            cJSON_AddStringToObject(chk, "summary", summary);
            result = st;
            break;
        }
        double t0 = kp_now();
        int any = 0;
        for (int64_t r = 0; r < B; r++) {
            size_t bytes;
            const void *now = ctx->fam->out_row(ctx->data, out, r, &bytes);
            const void *was = ctx->fam->out_row(ctx->data, first, r, &bytes);
            if (!memcmp(now, was, bytes)) continue;
            any = 1;
            if (!varies[r]) kp_sha256_hex(was, bytes, row_digest[r * spec->runs]);
            varies[r] = 1;
            kp_sha256_hex(now, bytes, row_digest[r * spec->runs + run]);
        }
        if (any) output_digest(ctx, out, B, whole[run]);
        kp_stage_add(KP_STAGE_JUDGING, kp_now() - t0);
        ctx->fam->free_output(out);
    }
    if (result == KP_PASSED) {
        cJSON *f = cJSON_AddObjectToObject(chk, "findings");
        int distinct = 1;
        for (int run = 1; run < spec->runs; run++) {
            if (!whole[run][0]) continue;
            int seen = 0;
            for (int q = 1; q < run; q++) seen |= !strcmp(whole[q], whole[run]);
            distinct += !seen;
        }
        kp_json_add_int(f, "runs", spec->runs);
        kp_json_add_int(f, "distinct_outputs", distinct);
        cJSON *varying = cJSON_AddArrayToObject(f, "rows_varying");
        int64_t nvary = 0;
        for (int64_t r = 0; r < B; r++) {
            if (!varies[r]) continue;
            nvary++;
            cJSON *row = cJSON_CreateObject();
            kp_json_add_int(row, "row", r);
            cJSON *ds = cJSON_AddArrayToObject(row, "digests");
            for (int run = 0; run < spec->runs; run++) {
                const char *d = row_digest[r * spec->runs + run][0] ? row_digest[r * spec->runs + run] : row_digest[r * spec->runs];
                cJSON_AddItemToArray(ds, cJSON_CreateString(d));
            }
            cJSON_AddItemToArray(varying, row);
        }
        char summary[200];
        snprintf(summary, sizeof summary, "%d distinct outputs over %d runs; %lld/%lld rows vary", distinct, spec->runs,
                 (long long)nvary, (long long)B);
        cJSON_AddStringToObject(chk, "summary", summary);
        result = distinct == 1 ? KP_PASSED : KP_INCORRECT;
    }
    free(row_digest), free(whole), free(rows), free(varies);
    return result;
}

kp_result kp_batch_probe(kp_case_ctx *ctx, const kp_impl *impl, const void *full_out, const char *name,
                         const int64_t *rows, int64_t nrows, cJSON *probes, kp_probe_result *pr) {
    memset(pr, 0, sizeof *pr);
    void *out = NULL;
    kp_error err = {0};
    cJSON *p = cJSON_CreateObject();
    cJSON_AddItemToArray(probes, p);
    cJSON_AddStringToObject(p, "probe", name);
    kp_json_add_int(p, "batch", nrows);
    kp_result st = ctx->fam->run_rows(ctx->data, impl, rows, nrows, &out, NULL, &err);
    if (st != KP_PASSED) {
        cJSON_AddStringToObject(p, "error", err.msg);
        return st;
    }
    size_t bytes;
    ctx->fam->out_row(ctx->data, full_out, 0, &bytes);
    int64_t *idx = NULL; /* allocated only when a row differs: most probes find none */
    cJSON *differ = cJSON_AddArrayToObject(p, "rows_differ");
    for (int64_t i = 0; i < nrows; i++) {
        if (rows[i] >= ctx->batch) continue; /* filler rows only perturb */
        pr->rows_probed++;
        pr->rows_moved += rows[i] != i || nrows != ctx->batch;
        const void *probe_row = ctx->fam->out_row(ctx->data, out, i, &bytes);
        const void *full_row = ctx->fam->out_row(ctx->data, full_out, rows[i], &bytes);
        if (!memcmp(probe_row, full_row, bytes)) continue;
        if (!idx && !(idx = malloc(bytes / 4 * sizeof *idx + 8))) {
            cJSON_AddStringToObject(p, "error", "out of host memory");
            ctx->fam->free_output(out);
            return KP_FAILED;
        }
        int64_t n = diff_indices(probe_row, full_row, bytes, idx);
        if (!n) continue;
        pr->rows_differ++;
        cJSON *row = cJSON_CreateObject();
        cJSON_AddItemToArray(differ, row);
        kp_json_add_int(row, "row", rows[i]);
        kp_json_add_int(row, "position", i);
        char aname[96];
        snprintf(aname, sizeof aname, "batch.%s.row%lld.differ", name, (long long)rows[i]);
        if (kp_evidence_list(ctx->ev, row, "elements", aname, idx, n, &err)) {
            cJSON_AddStringToObject(p, "error", err.msg);
            free(idx);
            ctx->fam->free_output(out);
            return KP_FAILED;
        }
    }
    free(idx);
    ctx->fam->free_output(out);
    pr->vacuous = pr->rows_moved == 0;
    kp_json_add_int(p, "rows_probed", pr->rows_probed);
    kp_json_add_int(p, "rows_moved", pr->rows_moved);
    cJSON_AddBoolToObject(p, "vacuous", pr->vacuous);
    return KP_PASSED;
}

static kp_result check_batch(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    int a = full_output(ctx, spec->impl[0], spec->role[0]);
    if (ctx->outs[a].status != KP_PASSED) return not_ok(ctx, a, chk);
    const int64_t B = ctx->batch;
    cJSON *f = cJSON_AddObjectToObject(chk, "findings");
    cJSON *probes = cJSON_AddArrayToObject(f, "probes");
    int64_t *rows = malloc(sizeof *rows * (size_t)(B > 65 ? B : 65));
    kp_result result = KP_PASSED;
    int64_t differ = 0, vacuous = 0, nprobes = 0;
    kp_probe_result pr;
    const void *full = ctx->outs[a].out;
    /* each row alone (batch 1), where that moves it: a batch-1 case is already alone */
    for (int64_t r = 0; B > 1 && r < B && result == KP_PASSED; r++) {
        char name[32];
        snprintf(name, sizeof name, "alone.row%lld", (long long)r);
        rows[0] = r;
        result = kp_batch_probe(ctx, spec->impl[0], full, name, rows, 1, probes, &pr);
        differ += pr.rows_differ, vacuous += pr.vacuous, nprobes++;
    }
    /* two halves: sub-batches that straddle size thresholds */
    for (int half = 0; B > 1 && half < 2 && result == KP_PASSED; half++) {
        int64_t lo = half ? B / 2 : 0, hi = half ? B : B / 2;
        for (int64_t r = lo; r < hi; r++) rows[r - lo] = r;
        result = kp_batch_probe(ctx, spec->impl[0], full, half ? "upper_half" : "lower_half", rows, hi - lo, probes, &pr);
        differ += pr.rows_differ, vacuous += pr.vacuous, nprobes++;
    }
    /* 65 rows: the case's rows reversed, then filler rows (past the split pipeline's 64) */
    if (result == KP_PASSED) {
        int64_t n = B >= 65 ? B : 65;
        for (int64_t i = 0; i < n; i++) rows[i] = i < B ? B - 1 - i : i;
        result = kp_batch_probe(ctx, spec->impl[0], full, "reversed65", rows, n, probes, &pr);
        differ += pr.rows_differ, vacuous += pr.vacuous, nprobes++;
    }
    free(rows);
    if (result != KP_PASSED) {
        cJSON_AddStringToObject(chk, "summary", "a probe run failed (see findings.probes)");
        return result;
    }
    kp_json_add_int(f, "row_differences", differ);
    kp_json_add_int(f, "vacuous_probes", vacuous);
    char summary[200];
    snprintf(summary, sizeof summary, "%lld probes; %lld row differences; %lld vacuous probes", (long long)nprobes,
             (long long)differ, (long long)vacuous);
    cJSON_AddStringToObject(chk, "summary", summary);
    return differ || vacuous ? KP_INCORRECT : KP_PASSED;
}

static kp_result check_expect(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    kp_check_spec inner = *spec;
    inner.kind = spec->of;
    snprintf(inner.label, sizeof inner.label, "%s %s", kp_check_name(spec->of), spec->impl[0]->name);
    cJSON *in = cJSON_AddObjectToObject(chk, "inner");
    kp_result r = kp_check_run(ctx, &inner, in);
    char summary[400];
    if (r != KP_PASSED && r != KP_INCORRECT) {
        snprintf(summary, sizeof summary, "the expected-defect check could not run (%s)", kp_result_name(r));
        cJSON_AddStringToObject(chk, "summary", summary);
        return r;
    }
    int64_t rows_with = 0;
    int defect_ok = 1;
    if (spec->defect[0] && r == KP_INCORRECT) {
        int a = full_output(ctx, spec->impl[0], spec->role[0]);
        defect_ok = ctx->fam->has_defect(ctx->data, ctx->outs[a].out, spec->defect, &rows_with);
        kp_json_add_int(cJSON_AddObjectToObject(chk, "findings"), "rows_with_defect", rows_with);
    }
    if (r == KP_INCORRECT && defect_ok) {
        snprintf(summary, sizeof summary, "known defect reproduced%s%s", spec->defect[0] ? ": " : "", spec->defect);
        if (spec->defect[0]) {
            size_t n = strlen(summary);
            snprintf(summary + n, sizeof summary - n, " on %lld/%lld rows", (long long)rows_with, (long long)ctx->batch);
        }
        cJSON_AddStringToObject(chk, "summary", summary);
        return KP_PASSED;
    }
    snprintf(summary, sizeof summary, "KNOWN DEFECT DID NOT REPRODUCE: %s was %s%s%s", inner.label, kp_result_name(r),
             spec->defect[0] ? "; defect " : "", spec->defect);
    fprintf(stderr, "kparity: WARNING: %s: %s\n", ctx->cs->name, summary);
    cJSON_AddStringToObject(chk, "summary", summary);
    return KP_INCORRECT;
}

static double g_stage[KP_STAGE_COUNT];
static const char *const stage_names[KP_STAGE_COUNT] = {"generation", "reference", "kernels", "judging", "receipts",
                                                        "digests"};

void kp_stage_add(kp_stage stage, double seconds) { g_stage[stage] += seconds; }
double kp_stage_seconds(kp_stage stage) { return g_stage[stage]; }
double kp_stage_total(void) {
    double sum = 0;
    for (int s = 0; s < KP_STAGE_COUNT; s++) sum += g_stage[s];
    return sum;
}
const char *kp_stage_name(kp_stage stage) { return stage_names[stage]; }

kp_result kp_check_run(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    check_header(spec, chk);
    double t0 = kp_now();
    kp_result r;
    switch (spec->kind) {
    case KP_CHECK_EXACT: r = check_exact(ctx, spec, chk); break;
    case KP_CHECK_RULE: r = check_rule(ctx, spec, chk); break;
    case KP_CHECK_REPEAT: r = check_repeat(ctx, spec, chk); break;
    case KP_CHECK_BATCH: r = check_batch(ctx, spec, chk); break;
    default: r = check_expect(ctx, spec, chk); break;
    }
    cJSON_AddStringToObject(chk, "result", kp_result_name(r));
    kp_json_add_double(chk, "seconds", kp_now() - t0);
    return r;
}
