/* checks.c: the declared checks. exact: two impls bit for bit, with the family's evidence of who
 * meets the rule; rule: the family's judge; tolerance: against the float64 reference (tolerance.c);
 * repeat: run-to-run bits; batch: per-row bits across batch compositions that straddle the family's
 * thresholds; expect: a known defect must reproduce. Launch errors never become mismatches. An output an impl
 * declared absent (kp_impl_output_absent) is never judged: comparisons leave it out and say so. */
#define _GNU_SOURCE
#include "kp_checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_json.h"
#include "kp_cache.h"
#include "kp_device.h"
#include "kp_exec.h"
#include "kp_rates.h"

static const char *const check_names[KP_CHECK_KIND_COUNT] = {"exact", "rule", "tolerance", "repeat", "batch", "expect"};

const char *kp_check_name(kp_check_kind k) { return check_names[k]; }

int kp_check_parse(const char *name) {
    for (int k = 0; name && k < KP_CHECK_KIND_COUNT; k++)
        if (!strcmp(name, check_names[k])) return k;
    return -1;
}

static bool needs_probes(const kp_check_spec *s) {
    return s->kind == KP_CHECK_BATCH || (s->kind == KP_CHECK_EXPECT && s->of == KP_CHECK_BATCH);
}

int64_t kp_case_extra_rows(const kp_case_spec *cs) {
    for (int k = 0; k < cs->nchecks; k++)
        if (needs_probes(&cs->checks[k])) return kp_family_probe_rows(cs->fam, &cs->c);
    return 0;
}

int kp_case_ctx_open(kp_case_ctx *ctx, const kp_case_spec *cs, kp_evidence *ev, cJSON *receipt, kp_error *err) {
    memset(ctx, 0, sizeof *ctx);
    ctx->cs = cs;
    ctx->fam = cs->fam;
    ctx->ev = ev;
    ctx->receipt = receipt;
    for (int k = 0; k < cs->nchecks; k++) ctx->cap += cs->checks[k].nimpl;
    ctx->outs = kp_calloc((size_t)ctx->cap, sizeof *ctx->outs, "the case's outputs", err);
    if (!ctx->outs) return err->code;
    int rc = kp_prepare(cs->fam, &cs->c, kp_case_extra_rows(cs), &ctx->prep, err);
    if (rc) {
        free(ctx->outs);
        ctx->outs = NULL;
        return rc;
    }
    ctx->batch = ctx->prep.v.batch;
    kp_describe_inputs(&ctx->prep, cJSON_AddObjectToObject(receipt, "inputs"));
    if (ctx->prep.cache_inputs) { /* which stages came from the cache: the reference's is added when it runs */
        ctx->cache = cJSON_AddObjectToObject(receipt, "cache");
        cJSON_AddStringToObject(ctx->cache, "folder", kp_cache_dir());
        kp_describe_cache(&ctx->prep, false, cJSON_AddObjectToObject(ctx->cache, "inputs"));
    }
    ctx->reference = cJSON_AddObjectToObject(receipt, "reference");
    ctx->impls = cJSON_AddArrayToObject(receipt, "impls");
    return 0;
}

void kp_case_ctx_close(kp_case_ctx *ctx) {
    for (int i = 0; i < ctx->nouts; i++) kp_output_free(ctx->outs[i].out);
    kp_prepared_release(&ctx->prep);
    free(ctx->outs);
    ctx->outs = NULL;
    ctx->nouts = 0;
}

/* The impl's output on the whole case, computed once per case and recorded in receipt["impls"]. */
static kp_case_out *full_output(kp_case_ctx *ctx, const kp_impl *impl, const char *role) {
    for (int i = 0; i < ctx->nouts; i++)
        if (ctx->outs[i].impl == impl) return &ctx->outs[i];
    KP_ASSERT(ctx->nouts < ctx->cap);
    kp_case_out *o = &ctx->outs[ctx->nouts++];
    o->impl = impl;
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
    if (kp_impl_is_judged(impl)) cJSON_AddBoolToObject(entry, "judged", 1); /* outputs made outside, read from files */
    cJSON *absent = NULL; /* outputs the impl declared it does not produce: no check judges them */
    for (int k = 0; ctx->fam->output_names[k]; k++) {
        if (!kp_impl_output_absent(impl, ctx->fam->output_names[k])) continue;
        if (!absent) absent = cJSON_AddArrayToObject(entry, "absent_outputs");
        cJSON_AddItemToArray(absent, cJSON_CreateString(ctx->fam->output_names[k]));
    }
    cJSON *timing = cJSON_AddObjectToObject(entry, "timing");
    kp_error err = {0};
    o->status = rows ? kp_run_rows(&ctx->prep, impl, rows, ctx->batch, &o->out, timing, &err) : KP_FAILED;
    if (!rows) snprintf(err.msg, sizeof err.msg, "out of host memory");
    free(rows);
    cJSON_AddStringToObject(entry, "status", kp_result_name(o->status));
    kp_exec_describe(impl, entry); /* an outside program: its command, files, versions */
    if (o->status == KP_PASSED) {
        kp_output given = *o->out; /* the digest is of what the impl produced: its absent outputs' buffers left out */
        given.ntensors = 0;
        for (int k = 0; k < o->out->ntensors; k++)
            if (!kp_impl_output_absent(impl, o->out->t[k].name)) given.t[given.ntensors++] = o->out->t[k];
        size_t nspans;
        kp_span *spans = kp_output_spans(&given, &nspans);
        kp_digest_start(NULL, 0, spans, nspans, NULL, entry, "output_sha256"); /* hashed on a worker thread */
        free(spans);
    } else {
        snprintf(o->message, sizeof o->message, "%s", err.msg);
        cJSON_AddStringToObject(entry, "message", err.msg);
    }
    return o;
}

void kp_check_head(const kp_check_spec *spec, cJSON *chk) {
    cJSON_AddStringToObject(chk, "check", kp_check_name(spec->kind));
    cJSON_AddStringToObject(chk, "label", spec->label);
    cJSON_AddStringToObject(chk, "impl", spec->impl[0]->name);
    if (spec->nimpl == 2) cJSON_AddStringToObject(chk, "impl_b", spec->impl[1]->name);
}

void kp_check_stub(const kp_check_spec *spec, kp_result result, const char *why, cJSON *chk) {
    kp_check_head(spec, chk);
    cJSON_AddStringToObject(chk, "result", kp_result_name(result));
    cJSON_AddStringToObject(chk, "summary", why);
}

static void check_header(const kp_family *fam, const kp_case *c, const kp_check_spec *spec, cJSON *chk) {
    kp_check_head(spec, chk);
    cJSON *params = cJSON_AddObjectToObject(chk, "params");
    const kp_check_kind kind = spec->kind == KP_CHECK_EXPECT ? spec->of : spec->kind;
    if (spec->has_params && fam->describe_params) {
        fam->describe_params(spec->params, params);
        if (spec->params_defaulted)
            cJSON_AddStringToObject(params, "params_source", "the family's defaults (the config declares none); they "
                                                             "only classify the differences exact finds");
    }
    if (kind == KP_CHECK_EXACT || kind == KP_CHECK_BATCH)
        cJSON_AddStringToObject(params, "comparison", fam->canonical_row ? "bitwise, every output element, rows in the "
                                                                           "family's canonical form"
                                                                         : "bitwise, every output element");
    if (kind == KP_CHECK_TOLERANCE) kp_tolerance_describe(fam, spec, params);
    if (kind == KP_CHECK_REPEAT)
        cJSON_AddStringToObject(params, "comparison", "bitwise, every output element as the impl wrote it (order included)");
    if (spec->runs) kp_json_add_int(params, "runs", spec->runs);
    if (kind == KP_CHECK_BATCH) {
        cJSON_AddStringToObject(params, "probes", "each row alone, two halves, the whole batch reversed (it must move "
                                                  "at least 10% of its rows), and for each threshold T the case's rows "
                                                  "reversed then filler rows in batches of T and T + 1 (reversedT)");
        cJSON *ts = cJSON_AddArrayToObject(params, "thresholds");
        kp_threshold th[KP_THRESHOLDS_MAX];
        const int nth = kp_family_thresholds(fam, c, th);
        for (int t = 0; t < nth; t++) {
            cJSON *o = cJSON_CreateObject();
            kp_json_add_int(o, "rows", th[t].rows);
            cJSON_AddStringToObject(o, "why", th[t].why);
            cJSON_AddItemToArray(ts, o);
        }
    }
    if (spec->kind == KP_CHECK_EXPECT) {
        cJSON_AddStringToObject(params, "of", kp_check_name(spec->of));
        cJSON_AddStringToObject(params, "expected", kp_result_name(spec->expect_result));
        if (spec->defect[0]) cJSON_AddStringToObject(params, "defect", spec->defect);
    }
}

static kp_result not_ok(const kp_case_out *o, cJSON *chk) {
    char summary[1200];
    snprintf(summary, sizeof summary, "%s did not produce an output: %s", o->impl->name, o->message);
    cJSON_AddStringToObject(chk, "summary", summary);
    return o->status;
}

/* Whether output tensor k records the impl's work order, not its answer (the family's order_outputs). */
static bool order_tensor(const kp_case_ctx *ctx, const kp_output *o, int k) {
    for (int i = 0; ctx->fam->order_outputs && ctx->fam->order_outputs[i]; i++)
        if (!strcmp(ctx->fam->order_outputs[i], o->t[k].name)) return true;
    return false;
}

/* Which tensors of o impl a or b (NULL: one impl) declared absent, into absent[]: a comparison leaves them out. Each
 * is named in findings["absent"] and note ("; max_logits: declared absent by IMPL, left out"). Returns how many tensors
 * of the answer (order outputs aside) are left to compare. */
static int absent_tensors(const kp_case_ctx *ctx, const kp_output *o, const kp_impl *a, const kp_impl *b,
                          bool absent[KP_MAX_TENSORS], cJSON *findings, char *note, size_t note_len) {
    int answer = 0;
    cJSON *list = NULL;
    if (note_len) note[0] = '\0';
    for (int k = 0; k < o->ntensors; k++) {
        const kp_impl *by = kp_impl_output_absent(a, o->t[k].name) ? a : b && kp_impl_output_absent(b, o->t[k].name) ? b : NULL;
        absent[k] = by != NULL;
        answer += !by && !order_tensor(ctx, o, k);
        if (!by) continue;
        char why[200];
        snprintf(why, sizeof why, "%s: declared absent by %s, left out", o->t[k].name, by->name);
        if (!list && findings) list = cJSON_AddArrayToObject(findings, "absent");
        if (list) cJSON_AddItemToArray(list, cJSON_CreateString(why));
        const size_t n = note_len ? strlen(note) : 0;
        if (n + 1 < note_len) snprintf(note + n, note_len - n, "; %s", why);
    }
    return answer;
}

/* A check none of whose compared tensors an impl produces: NOT_RUN, saying so. */
static kp_result nothing_to_compare(cJSON *chk, const char *note) {
    char summary[600];
    snprintf(summary, sizeof summary, "nothing to compare: every output of the answer is declared absent%s", note);
    cJSON_AddStringToObject(chk, "summary", summary);
    return KP_NOT_RUN;
}

/* The indices of the elements (esize bytes each) where x and y differ, in order, into idx; returns how many. The
 * common sizes compare as integers (the same bits, so the same answer as memcmp), not with a call an element. */
static int64_t differing_elements(const unsigned char *x, const unsigned char *y, int64_t elems, size_t esize, int64_t *idx) {
    int64_t n = 0;
#define KP_DIFFER_AS(T)                                                                                               \
    for (int64_t e = 0; e < elems; e++) {                                                                             \
        T u, v;                                                                                                       \
        memcpy(&u, x + (size_t)e * sizeof u, sizeof u);                                                               \
        memcpy(&v, y + (size_t)e * sizeof v, sizeof v);                                                               \
        idx[n] = e;                                                                                                   \
        n += u != v;                                                                                                  \
    }
    switch (esize) {
    case 1: KP_DIFFER_AS(uint8_t) break;
    case 2: KP_DIFFER_AS(uint16_t) break;
    case 4: KP_DIFFER_AS(uint32_t) break;
    case 8: KP_DIFFER_AS(uint64_t) break;
    default:
        for (int64_t e = 0; e < elems; e++)
            if (memcmp(x + (size_t)e * esize, y + (size_t)e * esize, esize)) idx[n++] = e;
    }
#undef KP_DIFFER_AS
    return n;
}

/* Row ia of output a against row ib of output b, every tensor of the answer (absent ones left out), element by
 * element (dtype-sized; in the family's canonical form when `canonical`): the differing indices of each tensor go
 * into row_json as evidence, under `key` when there is one tensor, else under key.<tensor>. Returns the count; -1
 * with err set on a failure. */
static int64_t row_diff(kp_case_ctx *ctx, const kp_output *a, int64_t ia, const kp_output *b, int64_t ib, bool canonical,
                        const bool *absent, cJSON *row_json, const char *key, const char *artifact_prefix, kp_error *err) {
    static _Thread_local kp_rowbuf ba, bb;
    static _Thread_local int64_t *idx;
    static _Thread_local int64_t idx_cap;
    int64_t total = 0;
    for (int k = 0; k < a->ntensors; k++) {
        if (order_tensor(ctx, a, k) || absent[k]) continue;
        int64_t n = 0, elems;
        const unsigned char *x = kp_output_row(&ctx->prep, a, k, ia, canonical, &elems, &ba);
        const unsigned char *y = kp_output_row(&ctx->prep, b, k, ib, canonical, &elems, &bb);
        const size_t esize = kp_dtype_size(a->t[k].dtype);
        if (!memcmp(x, y, (size_t)elems * esize)) continue;
        if (elems > idx_cap) {
            int64_t *grown = realloc(idx, sizeof *idx * (size_t)elems);
            if (!grown) return kp_fail(err, KP_EXIT_ENV, "out of host memory listing differences"), -1;
            idx = grown, idx_cap = elems;
        }
        n = differing_elements(x, y, elems, esize, idx);
        total += n;
        char name[160];
        snprintf(name, sizeof name, "%s%s%s", artifact_prefix, a->ntensors > 1 ? "." : "", a->ntensors > 1 ? a->t[k].name : "");
        cJSON *at = row_json;
        const char *k_key = key;
        if (a->ntensors > 1) {
            at = cJSON_GetObjectItemCaseSensitive(row_json, key);
            if (!at) at = cJSON_AddObjectToObject(row_json, key);
            k_key = a->t[k].name;
        }
        if (kp_evidence_list(ctx->ev, at, k_key, name, idx, n, err)) return -1;
    }
    return total;
}

/* SHA-256 of rows [r0, r1) of an output's answer as it is (absent tensors left out), tensors in order within a row. */
static void rows_digest(kp_case_ctx *ctx, const kp_output *o, int64_t r0, int64_t r1, const bool *absent,
                        char hex[KP_SHA256_HEX_LEN]) {
    kp_sha256 h;
    kp_error err;
    if (kp_sha256_init(&h, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
    kp_rowbuf buf = {0};
    for (int64_t r = r0; r < r1; r++)
        for (int k = 0; k < o->ntensors; k++) {
            if (order_tensor(ctx, o, k) || absent[k]) continue;
            int64_t elems;
            const void *row = kp_output_row(&ctx->prep, o, k, r, false, &elems, &buf);
            kp_sha256_update(&h, row, (size_t)elems * kp_dtype_size(o->t[k].dtype));
        }
    kp_rowbuf_free(&buf);
    kp_sha256_final_hex(&h, hex);
}

/* Whether row ia of a and row ib of b are the same bits in tensor k (in the family's canonical form when
 * `canonical`). Rows with the same bits as written have the same canonical form (a function of the row), so that
 * form (a sort, for a set) is made only for rows whose bits differ. */
static bool tensor_rows_equal(kp_case_ctx *ctx, const kp_output *a, int64_t ia, const kp_output *b, int64_t ib, int k,
                              bool canonical) {
    static _Thread_local kp_rowbuf ba, bb;
    int64_t elems;
    if (canonical && ctx->fam->canonical_row && tensor_rows_equal(ctx, a, ia, b, ib, k, false)) return true;
    const void *x = kp_output_row(&ctx->prep, a, k, ia, canonical, &elems, &ba);
    const void *y = kp_output_row(&ctx->prep, b, k, ib, canonical, &elems, &bb);
    return !memcmp(x, y, (size_t)elems * kp_dtype_size(a->t[k].dtype));
}

/* Many row comparisons at once, on every thread (each pair is its own memcmp, or two canonical forms in the thread's
 * own row buffers): differ[i] gets a bit k for each tensor k (absent ones left out; order outputs only when
 * with_order) in which row ia[i] of a and row ib[i] of b differ (canonical: in canonical form, where their bits
 * differ); pairs whose ib[i] is at or past `to` are skipped (0). ia, ib NULL: i. The checks' loops read the bits in
 * their own order, so what they record is what comparing one row at a time recorded. */
typedef struct row_pairs {
    kp_case_ctx *ctx;
    const kp_output *a, *b;
    const int64_t *ia, *ib;
    int64_t to;
    bool canonical, with_order;
    const bool *absent;
    const uint8_t *only;
    uint8_t *differ;
} row_pairs;

static void row_pair(void *arg, int64_t i) {
    const row_pairs *p = arg;
    const int64_t ia = p->ia ? p->ia[i] : i, ib = p->ib ? p->ib[i] : i;
    uint8_t bits = 0;
    for (int k = 0; ib < p->to && k < p->a->ntensors; k++)
        if ((!p->only || p->only[i] >> k & 1) && !p->absent[k] && (p->with_order || !order_tensor(p->ctx, p->a, k)) &&
            !tensor_rows_equal(p->ctx, p->a, ia, p->b, ib, k, p->canonical))
            bits |= (uint8_t)(1u << k);
    p->differ[i] = bits;
}

/* The pairs' bits, or NULL when out of host memory. `only` (not NULL): the bits a device comparison found
 * (kp_run_rows_against), and just those tensors of those pairs are compared here (bits 0 are the same bits, so the
 * same canonical form). */
static uint8_t *rows_differ(kp_case_ctx *ctx, const kp_output *a, const int64_t *ia, const kp_output *b, const int64_t *ib,
                            int64_t n, int64_t to, bool canonical, bool with_order, const bool *absent, const uint8_t *only) {
    _Static_assert(KP_MAX_TENSORS <= 8, "a pair's tensors are the bits of a byte");
    row_pairs p = {ctx, a, b, ia, ib, to, canonical, with_order, absent, only, malloc((size_t)n + 1)};
    if (p.differ) kp_parallel_for(n, row_pair, &p);
    return p.differ;
}

/* Whether a pair's bits say its rows are the same bits in every tensor of the answer (order outputs are not). */
static bool pair_equal(const kp_case_ctx *ctx, const kp_output *a, uint8_t bits) {
    for (int k = 0; k < a->ntensors; k++)
        if (!order_tensor(ctx, a, k) && (bits >> k & 1)) return false;
    return true;
}

static int reference_for(kp_case_ctx *ctx, const kp_check_spec *spec, kp_error *err) {
    const bool first = !ctx->prep.have_ref;
    int rc = kp_reference_run(&ctx->prep, spec->has_params ? spec->params : NULL, ctx->reference, err);
    if (!rc && first && ctx->cache && ctx->prep.fam->reference_adopt)
        kp_describe_cache(&ctx->prep, true, cJSON_AddObjectToObject(ctx->cache, "reference"));
    return rc;
}

static kp_result check_exact(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    kp_case_out *a = full_output(ctx, spec->impl[0], spec->role[0]), *b = full_output(ctx, spec->impl[1], spec->role[1]);
    if (a->status != KP_PASSED) return not_ok(a, chk);
    if (b->status != KP_PASSED) return not_ok(b, chk);
    cJSON *f = cJSON_AddObjectToObject(chk, "findings");
    bool absent[KP_MAX_TENSORS];
    char note[400];
    if (!absent_tensors(ctx, a->out, spec->impl[0], spec->impl[1], absent, f, note, sizeof note))
        return nothing_to_compare(chk, note);
    int64_t *rows = malloc(sizeof *rows * (size_t)ctx->batch + 8);
    if (!rows) {
        cJSON_AddStringToObject(chk, "summary", "out of host memory");
        return KP_FAILED;
    }
    const double t0 = kp_now();
    uint8_t *differ = rows_differ(ctx, a->out, NULL, b->out, NULL, ctx->batch, ctx->batch, true, false, absent, NULL);
    if (!differ) {
        free(rows);
        cJSON_AddStringToObject(chk, "summary", "out of host memory");
        return KP_FAILED;
    }
    cJSON *per_row = cJSON_CreateArray();
    int64_t nrows_diff = 0, elements = 0;
    kp_error err = {0};
    for (int64_t r = 0; r < ctx->batch; r++) {
        if (pair_equal(ctx, a->out, differ[r])) continue;
        cJSON *row = cJSON_CreateObject();
        kp_json_add_int(row, "row", r);
        char name[64];
        snprintf(name, sizeof name, "exact.row%lld.differ", (long long)r);
        const int64_t n = row_diff(ctx, a->out, r, b->out, r, true, absent, row, "differ", name, &err);
        if (n <= 0) { /* equal bits compared unequal: impossible; or a failure recorded in err */
            cJSON_Delete(row);
            if (n < 0) break;
            continue;
        }
        cJSON_AddItemToArray(per_row, row);
        rows[nrows_diff++] = r;
        elements += n;
    }
    free(differ);
    kp_stage_add(KP_STAGE_JUDGING, kp_now() - t0);
    kp_json_add_int(f, "rows", ctx->batch);
    kp_json_add_int(f, "rows_identical", ctx->batch - nrows_diff);
    kp_json_add_int(f, "rows_differ", nrows_diff);
    kp_json_add_int(f, "elements_differ", elements);
    cJSON_AddItemToObject(f, "per_row", per_row);
    /* where they differ, say who meets the rule: the evidence the seed's gate lacked
       (a failure here leaves its message in err, which fails the check below); the rule reads every output, so
       not where one is absent */
    if (nrows_diff && !err.msg[0] && !note[0] && ctx->fam->rule && spec->has_params && !reference_for(ctx, spec, &err)) {
        const kp_impl *const impls[2] = {spec->impl[0], spec->impl[1]};
        const kp_output *const outs[2] = {a->out, b->out};
        kp_rule_explain_exact(&ctx->prep.judged, spec->params, impls, outs, rows, nrows_diff, per_row, ctx->ev, &err);
    }
    free(rows);
    if (err.msg[0]) {
        cJSON_AddStringToObject(chk, "summary", err.msg);
        return KP_FAILED;
    }
    char summary[700];
    if (nrows_diff)
        snprintf(summary, sizeof summary, "%lld/%lld rows bit-identical; %lld rows differ in %lld elements%s",
                 (long long)(ctx->batch - nrows_diff), (long long)ctx->batch, (long long)nrows_diff, (long long)elements, note);
    else
        snprintf(summary, sizeof summary, "%lld/%lld rows bit-identical%s", (long long)ctx->batch, (long long)ctx->batch, note);
    cJSON_AddStringToObject(chk, "summary", summary);
    return nrows_diff ? KP_INCORRECT : KP_PASSED;
}

/* The impl's full output and the reference, both needed by rule and tolerance; NULL with the check's
 * result in *r (and its summary written) when either could not be had. */
static const kp_case_out *output_and_reference(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk, kp_result *r) {
    const kp_case_out *a = full_output(ctx, spec->impl[0], spec->role[0]);
    if (a->status != KP_PASSED) {
        *r = not_ok(a, chk);
        return NULL;
    }
    kp_error err = {0};
    if (reference_for(ctx, spec, &err)) {
        cJSON_AddStringToObject(chk, "summary", err.msg);
        *r = KP_FAILED;
        return NULL;
    }
    return a;
}

static kp_result check_rule(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    kp_result r;
    const kp_case_out *a = output_and_reference(ctx, spec, chk, &r);
    if (!a) return r;
    bool absent[KP_MAX_TENSORS];
    char note[400];
    absent_tensors(ctx, a->out, spec->impl[0], NULL, absent, NULL, note, sizeof note);
    for (int k = 0; k < a->out->ntensors; k++)
        if (absent[k] && !order_tensor(ctx, a->out, k)) { /* the rule reads the whole answer: no judgement on part of it */
            char summary[600];
            snprintf(summary, sizeof summary, "not judged: the rule reads every output of the answer%s", note);
            cJSON_AddStringToObject(chk, "summary", summary);
            return KP_NOT_RUN;
        }
    kp_error err = {0};
    r = kp_rule_check(&ctx->prep.judged, spec->params, a->out, spec->impl[0], chk, ctx->ev, &err);
    if (r == KP_FAILED && err.msg[0]) cJSON_AddStringToObject(chk, "summary", err.msg);
    return r;
}

static kp_result check_tolerance(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    kp_result r;
    const kp_case_out *a = output_and_reference(ctx, spec, chk, &r);
    if (!a) return r;
    const double t0 = kp_now();
    r = kp_tolerance_check(&ctx->prep, spec, a->out, chk, ctx->ev);
    kp_stage_add(KP_STAGE_JUDGING, kp_now() - t0);
    return r;
}

/* obj[key] = {"count", "of", "rate", "wilson95": [lo, hi]}: a rate with its Wilson 95% interval (kp_rates.h), so
 * two receipts' rates can be told apart or not (`kparity rates`). */
static void add_rate(cJSON *obj, const char *key, double count, double of) {
    cJSON *o = cJSON_AddObjectToObject(obj, key);
    kp_json_add_double(o, "count", count);
    kp_json_add_double(o, "of", of);
    if (!(of > 0)) return;
    double lo, hi;
    kp_wilson(count, of, 0.95, &lo, &hi);
    kp_json_add_double(o, "rate", count / of);
    cJSON *w = cJSON_AddArrayToObject(o, "wilson95");
    cJSON_AddItemToArray(w, cJSON_CreateNumber(lo));
    cJSON_AddItemToArray(w, cJSON_CreateNumber(hi));
}

/* One row's digest to take: rows_digest of row r of o into hex. */
typedef struct {
    const kp_output *o;
    int64_t r;
    char *hex;
} digest_job;

struct row_digests {
    kp_case_ctx *ctx;
    const bool *absent;
    digest_job *jobs;
    int64_t n;
};

static void row_digest_job(void *arg, int64_t i) {
    const struct row_digests *rd = arg;
    rows_digest(rd->ctx, rd->jobs[i].o, rd->jobs[i].r, rd->jobs[i].r + 1, rd->absent, rd->jobs[i].hex);
}

/* Whether runs p and q gave the same output: the same digest in every row that varied ("" is run 1's row). */
static bool same_rows(char (*row_digest)[KP_SHA256_HEX_LEN], const uint8_t *varies, int64_t B, int runs, int p, int q) {
    for (int64_t r = 0; r < B; r++) {
        if (!varies[r]) continue;
        const char *a = row_digest[r * runs + p], *b = row_digest[r * runs + q];
        if (strcmp(a[0] ? a : row_digest[r * runs], b[0] ? b : row_digest[r * runs])) return false;
    }
    return true;
}

/* Runs 2..R are compared with run 1 row by row, bits as written (a set's order too); digests are computed
 * only where they differ, so a deterministic impl costs no hashing beyond run 1's output digest. A device impl's
 * runs are compared on the device first (kp_run_rows_against): only rows that differ come back. */
static kp_result check_repeat(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    kp_case_out *a = full_output(ctx, spec->impl[0], spec->role[0]);
    if (a->status != KP_PASSED) return not_ok(a, chk);
    const int64_t B = ctx->batch;
    const kp_output *first = a->out;
    bool absent[KP_MAX_TENSORS];
    char note[400];
    if (!absent_tensors(ctx, first, spec->impl[0], NULL, absent, NULL, note, sizeof note)) return nothing_to_compare(chk, note);
    char(*row_digest)[KP_SHA256_HEX_LEN] = calloc((size_t)(B * spec->runs), KP_SHA256_HEX_LEN); /* "" = same as run 1 */
    uint8_t *run_differs = calloc((size_t)spec->runs, 1); /* some row differs from run 1's */
    digest_job *jobs = malloc(sizeof *jobs * (size_t)(2 * B));
    int64_t *rows = malloc(sizeof *rows * (size_t)B);
    uint8_t *varies = calloc((size_t)B, 1), *tensor_varies = calloc((size_t)(B * first->ntensors), 1);
    uint8_t *found = malloc((size_t)B); /* what the device comparison found */
    if (!row_digest || !run_differs || !jobs || !rows || !varies || !tensor_varies || !found) {
        free(row_digest), free(run_differs), free(jobs), free(rows), free(varies), free(tensor_varies), free(found);
        cJSON_AddStringToObject(chk, "summary", "out of host memory");
        return KP_FAILED;
    }
    for (int64_t r = 0; r < B; r++) rows[r] = r;
    kp_result result = KP_PASSED;
    for (int run = 1; run < spec->runs; run++) {
        kp_output *out = NULL;
        kp_error err = {0};
        kp_result st = kp_run_rows_against(&ctx->prep, spec->impl[0], rows, B, first, NULL, found, &out, &err);
        if (st != KP_PASSED) {
            char summary[1200];
            snprintf(summary, sizeof summary, "run %d of %d: %s", run + 1, spec->runs, err.msg);
            cJSON_AddStringToObject(chk, "summary", summary);
            result = st;
            break;
        }
        const double t0 = kp_now();
        struct row_digests rd = {ctx, absent, jobs, 0};
        uint8_t *differ = rows_differ(ctx, out, NULL, first, NULL, B, B, false, true, absent, found);
        if (!differ) {
            kp_output_free(out);
            cJSON_AddStringToObject(chk, "summary", "out of host memory");
            result = KP_FAILED;
            break;
        }
        for (int64_t r = 0; r < B; r++) {
            for (int k = 0; k < first->ntensors; k++)
                if (order_tensor(ctx, first, k)) tensor_varies[r * first->ntensors + k] |= differ[r] >> k & 1;
            if (pair_equal(ctx, out, differ[r])) continue;
            run_differs[run] = 1;
            for (int k = 0; k < first->ntensors; k++) tensor_varies[r * first->ntensors + k] |= differ[r] >> k & 1;
            if (!varies[r]) jobs[rd.n++] = (digest_job){first, r, row_digest[r * spec->runs]};
            varies[r] = 1;
            jobs[rd.n++] = (digest_job){out, r, row_digest[r * spec->runs + run]};
        }
        free(differ);
        kp_parallel_for(rd.n, row_digest_job, &rd); /* the rows' digests: each its own stream, so on every thread */
        kp_stage_add(KP_STAGE_JUDGING, kp_now() - t0);
        kp_output_free(out);
    }
    if (result == KP_PASSED) {
        cJSON *f = cJSON_AddObjectToObject(chk, "findings");
        absent_tensors(ctx, first, spec->impl[0], NULL, absent, f, note, sizeof note); /* named in the findings too */
        int distinct = 1; /* run 1's output, and each run's that differs from it and from every earlier run's */
        for (int run = 1; run < spec->runs; run++) {
            int seen = !run_differs[run];
            for (int q = 1; q < run && !seen; q++) seen = run_differs[q] && same_rows(row_digest, varies, B, spec->runs, q, run);
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
            int flips = 0; /* runs 2..R whose row differs from run 1's */
            for (int run = 0; run < spec->runs; run++) {
                const char *d = row_digest[r * spec->runs + run][0] ? row_digest[r * spec->runs + run] : row_digest[r * spec->runs];
                cJSON_AddItemToArray(ds, cJSON_CreateString(d));
                flips += run > 0 && strcmp(d, row_digest[r * spec->runs]) != 0;
            }
            add_rate(row, "flip_rate", flips, spec->runs - 1);
            cJSON_AddItemToArray(varying, row);
        }
        add_rate(f, "rows_varying_rate", (double)nvary, (double)B);
        /* per output tensor, the rows where it varied; an order output is not part of the
           answer, but says whether the impl's work order changed at all: a run whose order never changed
           tested nothing about order */
        cJSON *by_tensor = cJSON_AddObjectToObject(f, "rows_varying_by_tensor");
        char per[200] = "";
        for (int k = 0; k < first->ntensors; k++) {
            if (absent[k]) continue;
            int64_t n = 0;
            for (int64_t r = 0; r < B; r++) n += tensor_varies[r * first->ntensors + k];
            kp_json_add_int(by_tensor, first->t[k].name, n);
            if (order_tensor(ctx, first, k)) {
                const size_t len = strlen(per);
                snprintf(per + len, sizeof per - len, "; the work order (%s) changed in %lld rows", first->t[k].name,
                         (long long)n);
                cJSON_AddBoolToObject(f, "order_changed", n > 0);
            }
        }
        char summary[800];
        snprintf(summary, sizeof summary, "%d distinct outputs over %d runs; %lld/%lld rows vary%s%s", distinct, spec->runs,
                 (long long)nvary, (long long)B, per, note);
        cJSON_AddStringToObject(chk, "summary", summary);
        result = distinct == 1 ? KP_PASSED : KP_INCORRECT;
    }
    free(row_digest), free(run_differs), free(jobs), free(rows), free(varies), free(tensor_varies), free(found);
    return result;
}

kp_result kp_batch_probe(kp_case_ctx *ctx, const kp_impl *impl, const kp_output *full_out, const char *name,
                         const int64_t *rows, int64_t nrows, int64_t min_moved, cJSON *probes, kp_probe_result *pr) {
    memset(pr, 0, sizeof *pr);
    kp_output *out = NULL;
    kp_error err = {0};
    cJSON *p = cJSON_CreateObject();
    cJSON_AddItemToArray(probes, p);
    cJSON_AddStringToObject(p, "probe", name);
    kp_json_add_int(p, "batch", nrows);
    /* compared on the device first where nothing reads the probe's equal rows (the family's row_moved and
       describe_probe read every row) */
    uint8_t *found = ctx->fam->row_moved || ctx->fam->describe_probe ? NULL : malloc((size_t)nrows);
    kp_result st = found ? kp_run_rows_against(&ctx->prep, impl, rows, nrows, full_out, rows, found, &out, &err)
                         : kp_run_rows(&ctx->prep, impl, rows, nrows, &out, NULL, &err);
    if (st == KP_NOT_SUPPORTED && kp_impl_is_judged(impl)) { /* outputs made elsewhere: none given for these rows */
        cJSON_AddStringToObject(p, "not_given", err.msg);
        pr->not_given = 1;
        free(found);
        return KP_PASSED;
    }
    if (st != KP_PASSED) {
        cJSON_AddStringToObject(p, "error", err.msg);
        free(found);
        return st;
    }
    /* absent tensors (check_batch names them) are not compared; the family's row_moved and describe_probe read the
       order outputs, so where one is absent a row moved when its position did and the probe says nothing of its order */
    bool absent[KP_MAX_TENSORS], by_order = true;
    absent_tensors(ctx, out, impl, NULL, absent, NULL, NULL, 0);
    for (int k = 0; k < out->ntensors; k++) by_order &= !(absent[k] && order_tensor(ctx, out, k));
    const double t0 = kp_now();
    uint8_t *bits = rows_differ(ctx, out, NULL, full_out, rows, nrows, ctx->batch, true, false, absent, found);
    free(found);
    if (!bits) {
        cJSON_AddStringToObject(p, "error", "out of host memory");
        kp_output_free(out);
        return KP_FAILED;
    }
    cJSON *differ = cJSON_AddArrayToObject(p, "rows_differ");
    for (int64_t i = 0; i < nrows; i++) {
        if (rows[i] >= ctx->batch) continue; /* filler rows only perturb */
        pr->rows_probed++;
        if (nrows != ctx->batch) pr->rows_moved++;
        else if (ctx->fam->row_moved && by_order) pr->rows_moved += ctx->fam->row_moved(ctx->prep.v.data, full_out, rows[i], out, i);
        else pr->rows_moved += rows[i] != i;
        if (pair_equal(ctx, out, bits[i])) continue;
        cJSON *row = cJSON_CreateObject();
        kp_json_add_int(row, "row", rows[i]);
        kp_json_add_int(row, "position", i);
        char aname[96];
        snprintf(aname, sizeof aname, "batch.%s.row%lld.differ", name, (long long)rows[i]);
        const int64_t n = row_diff(ctx, out, i, full_out, rows[i], true, absent, row, "elements", aname, &err);
        if (n < 0) {
            cJSON_Delete(row);
            cJSON_AddStringToObject(p, "error", err.msg);
            free(bits);
            kp_output_free(out);
            return KP_FAILED;
        }
        cJSON_AddItemToArray(differ, row);
        pr->rows_differ++;
    }
    free(bits);
    if (ctx->fam->describe_probe && by_order) ctx->fam->describe_probe(ctx->prep.v.data, out, rows, nrows, full_out, p);
    kp_stage_add(KP_STAGE_JUDGING, kp_now() - t0);
    kp_output_free(out);
    pr->vacuous = pr->rows_moved < (min_moved > 1 ? min_moved : 1);
    kp_json_add_int(p, "rows_probed", pr->rows_probed);
    kp_json_add_int(p, "rows_moved", pr->rows_moved);
    if (min_moved > 1) kp_json_add_int(p, "min_moved", min_moved);
    cJSON_AddBoolToObject(p, "vacuous", pr->vacuous);
    return KP_PASSED;
}

static kp_result check_batch(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    kp_case_out *a = full_output(ctx, spec->impl[0], spec->role[0]);
    if (a->status != KP_PASSED) return not_ok(a, chk);
    const kp_family *fam = ctx->fam;
    const int64_t B = ctx->batch, total = ctx->prep.v.rows_total;
    cJSON *f = cJSON_AddObjectToObject(chk, "findings");
    bool absent[KP_MAX_TENSORS];
    char note[400];
    if (!absent_tensors(ctx, a->out, spec->impl[0], NULL, absent, f, note, sizeof note)) return nothing_to_compare(chk, note);
    cJSON *probes = cJSON_AddArrayToObject(f, "probes");
    int64_t *rows = malloc(sizeof *rows * (size_t)total);
    if (!rows) {
        cJSON_AddStringToObject(chk, "summary", "out of host memory");
        return KP_FAILED;
    }
    kp_result result = KP_PASSED;
    int64_t differ = 0, vacuous = 0, nprobes = 0, not_given = 0;
    kp_probe_result pr;
    /* each row alone (batch 1), where that moves it: a batch-1 case is already alone */
    for (int64_t r = 0; B > 1 && r < B && result == KP_PASSED; r++) {
        char name[32];
        snprintf(name, sizeof name, "alone.row%lld", (long long)r);
        rows[0] = r;
        result = kp_batch_probe(ctx, spec->impl[0], a->out, name, rows, 1, 1, probes, &pr);
        differ += pr.rows_differ, vacuous += pr.vacuous, not_given += pr.not_given, nprobes++;
    }
    /* two halves: sub-batches of other sizes */
    for (int half = 0; B > 1 && half < 2 && result == KP_PASSED; half++) {
        int64_t lo = half ? B / 2 : 0, hi = half ? B : B / 2;
        for (int64_t r = lo; r < hi; r++) rows[r - lo] = r;
        result = kp_batch_probe(ctx, spec->impl[0], a->out, half ? "upper_half" : "lower_half", rows, hi - lo, 1, probes, &pr);
        differ += pr.rows_differ, vacuous += pr.vacuous, not_given += pr.not_given, nprobes++;
    }
    /* the whole batch reversed: the same rows in other positions (where an impl orders work by position, other places in that order);
       moving fewer than a tenth of its rows makes it vacuous */
    if (B > 1 && result == KP_PASSED) {
        for (int64_t r = 0; r < B; r++) rows[r] = B - 1 - r;
        result = kp_batch_probe(ctx, spec->impl[0], a->out, "permuted", rows, B, (B + 9) / 10, probes, &pr);
        differ += pr.rows_differ, vacuous += pr.vacuous, not_given += pr.not_given, nprobes++;
    }
    /* T and T + 1 rows for each threshold T: the case's rows reversed, then filler rows */
    kp_threshold th[KP_THRESHOLDS_MAX];
    const int nth = kp_family_thresholds(fam, &ctx->cs->c, th);
    int64_t done[2 * KP_THRESHOLDS_MAX];
    int ndone = 0;
    for (int t = 0; t < nth && result == KP_PASSED; t++)
        for (int side = 0; side < 2 && result == KP_PASSED; side++) {
            const int64_t n = th[t].rows + side;
            KP_ASSERT(n >= 1 && n <= total);
            int seen = 0;
            for (int d = 0; d < ndone; d++) seen |= done[d] == n;
            char name[40];
            snprintf(name, sizeof name, "reversed%lld", (long long)n);
            if (!seen) {
                for (int64_t i = 0; i < n; i++) rows[i] = i < B ? B - 1 - i : i;
                result = kp_batch_probe(ctx, spec->impl[0], a->out, name, rows, n, 1, probes, &pr);
                differ += pr.rows_differ, vacuous += pr.vacuous, not_given += pr.not_given, nprobes++;
                if (ndone < (int)(sizeof done / sizeof *done)) done[ndone++] = n;
            }
            /* the probe names the threshold it straddles, and on which side */
            for (cJSON *p = probes->child; p; p = p->next) {
                const cJSON *pn = cJSON_GetObjectItemCaseSensitive(p, "probe");
                if (!cJSON_IsString(pn) || strcmp(pn->valuestring, name)) continue;
                cJSON *s = cJSON_GetObjectItemCaseSensitive(p, "straddles");
                if (!s) s = cJSON_AddArrayToObject(p, "straddles");
                cJSON *o = cJSON_CreateObject();
                kp_json_add_int(o, "threshold", th[t].rows);
                cJSON_AddStringToObject(o, "side", side ? "above" : "at");
                cJSON_AddItemToArray(s, o);
            }
        }
    free(rows);
    if (result != KP_PASSED) {
        cJSON_AddStringToObject(chk, "summary", "a probe run failed (see findings.probes)");
        return result;
    }
    kp_json_add_int(f, "row_differences", differ);
    kp_json_add_int(f, "vacuous_probes", vacuous);
    char summary[800];
    snprintf(summary, sizeof summary, "%lld probes; %lld row differences; %lld vacuous probes%s", (long long)nprobes,
             (long long)differ, (long long)vacuous, note);
    /* a judged impl: only the probes whose outputs were given were compared. A difference there is a verdict; their
       agreement is not one on the rest, so the check never says PASSED for probes it did not compare */
    const bool broke = differ || vacuous;
    if (not_given) {
        kp_json_add_int(f, "probes_compared", nprobes - not_given);
        kp_json_add_int(f, "probes_not_given", not_given);
        const size_t n = strlen(summary);
        snprintf(summary + n, sizeof summary - n, "; compared %lld of %lld probes; %lld had no outputs given: %s",
                 (long long)(nprobes - not_given), (long long)nprobes, (long long)not_given,
                 broke ? "not compared" : "no verdict on the rest");
    }
    cJSON_AddStringToObject(chk, "summary", summary);
    return broke ? KP_INCORRECT : not_given ? KP_NOT_RUN : KP_PASSED;
}

static kp_result check_expect(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    kp_check_spec inner = *spec;
    inner.kind = spec->of;
    snprintf(inner.label, sizeof inner.label, "%s %s", kp_check_name(spec->of), spec->impl[0]->name);
    cJSON *in = cJSON_AddObjectToObject(chk, "inner");
    kp_result r = kp_check_run(ctx, &inner, in);
    char summary[800];
    if (r != KP_PASSED && r != KP_INCORRECT) {
        snprintf(summary, sizeof summary, "the expected-defect check could not run (%s)", kp_result_name(r));
        cJSON_AddStringToObject(chk, "summary", summary);
        return r;
    }
    int64_t rows_with = 0;
    int defect_ok = 1;
    if (spec->defect[0] && r == KP_INCORRECT) {
        const kp_case_out *a = full_output(ctx, spec->impl[0], spec->role[0]);
        defect_ok = ctx->fam->has_defect(ctx->prep.v.data, &ctx->prep.judged, a->out, spec->defect, &rows_with);
        kp_json_add_int(cJSON_AddObjectToObject(chk, "findings"), "rows_with_defect", rows_with);
    }
    if (r == KP_INCORRECT && defect_ok) {
        snprintf(summary, sizeof summary, "known defect reproduced%s%s", spec->defect[0] ? ": " : "", spec->defect);
        if (spec->defect[0]) {
            size_t n = strlen(summary);
            snprintf(summary + n, sizeof summary - n, " on %lld/%lld rows", (long long)rows_with, (long long)ctx->batch);
        }
        const cJSON *why = cJSON_GetObjectItemCaseSensitive(in, "summary");
        if (cJSON_IsString(why)) { /* how it showed: the expected check's own summary */
            size_t n = strlen(summary);
            snprintf(summary + n, sizeof summary - n, " (%s)", why->valuestring);
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

kp_result kp_check_run(kp_case_ctx *ctx, const kp_check_spec *spec, cJSON *chk) {
    check_header(ctx->fam, &ctx->cs->c, spec, chk);
    const double t0 = kp_now();
    double before[KP_STAGE_COUNT];
    for (int st = 0; st < KP_STAGE_COUNT; st++) before[st] = kp_stage_seconds((kp_stage)st);
    kp_result r = KP_FAILED;
    switch (spec->kind) { /* every kind listed: -Wswitch flags one left out */
    case KP_CHECK_EXACT: r = check_exact(ctx, spec, chk); break;
    case KP_CHECK_RULE: r = check_rule(ctx, spec, chk); break;
    case KP_CHECK_TOLERANCE: r = check_tolerance(ctx, spec, chk); break;
    case KP_CHECK_REPEAT: r = check_repeat(ctx, spec, chk); break;
    case KP_CHECK_BATCH: r = check_batch(ctx, spec, chk); break;
    case KP_CHECK_EXPECT: r = check_expect(ctx, spec, chk); break;
    case KP_CHECK_KIND_COUNT: kp_abort(__FILE__, __LINE__, "check kind %d", (int)spec->kind);
    }
    cJSON_AddStringToObject(chk, "result", kp_result_name(r));
    kp_json_add_double(chk, "seconds", kp_now() - t0);
    cJSON *stages = cJSON_AddObjectToObject(chk, "stages_s"); /* where the check's seconds went */
    for (int st = 0; st < KP_STAGE_COUNT; st++)
        if (kp_stage_seconds((kp_stage)st) > before[st])
            kp_json_add_double(stages, kp_stage_name((kp_stage)st), kp_stage_seconds((kp_stage)st) - before[st]);
    return r;
}
