/* test_mla_checks.c: the gate's checks on mla through the kparity binary, each against a plugin with one planted
 * defect (tests/fixtures/plugin_mla_defects.c) it must catch, and the clean build of that plugin, which must pass. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/kp_checks.h"
#include "kp_test_util.h"

TestSuite(mla_checks, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 300);

/* The tolerance checks' case: two requests of 64 heads over 256 of 512 tokens. Power-of-two tile scales: on raw
 * ones the bf16-rounded scale alone misses FlashMLA's tolerances (ci/gates/sparse-mla.json's raw_scales). Request 1,
 * head 5, value 37 of out [2, 1, 64, 512] is where PERTURB_ONE and NAN_ONE plant theirs. */
#define TOL_CASE "mla(batch=2,h_q=64,profile=uniform,s_kv=512,scale=pow2,seed=11,topk=256)"
#define OUT_ROW (64 * 512)
#define PERTURB_AT (OUT_ROW + 5 * 512 + 37)
#define LOG2E 1.4426950408889634

/* FlashMLA's decode tolerances, as ci/gates/sparse-mla.json declares them. */
#define TOLERANCES                                                                                                     \
    "\"tensors\":{"                                                                                                    \
    "\"out\":{\"atol\":0.001,\"rtol\":0.015703125,\"cosine\":5e-06,\"element_rule\":\"both\",\"round_reference\":true}," \
    "\"lse\":{\"atol\":1e-06,\"rtol\":0.0001222229,\"element_rule\":\"both\",\"round_reference\":true},"               \
    "\"max_logits\":{\"atol\":1e-06,\"rtol\":0.0001222229,\"element_rule\":\"both\",\"round_reference\":true}}"

/* Build the defect plugin with one -D flag (or none) and a name; returns its path. */
static char *plugin(const char *flag, const char *name) {
    return kpt_build_plugin("plugin_mla_defects.c", flag, name, PERTURB_AT);
}

/* Build the plugin and write a config with it as the candidate, FlashMLA's tolerances and `cases` (JSON). */
static char *config(const char *flag, const char *name, const char *cases) {
    char *so = plugin(flag, name), *body, *path;
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"plugins\":[{\"path\":\"%s\"}],"
                       "\"impls\":{\"mla.candidate\":\"%s\"},\"defaults\":{" TOLERANCES "},\"cases\":[%s]}",
                       so, name, cases) > 0);
    cr_assert(asprintf(&path, "%s/%s.json", kpt_dir, name) > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    free(body), free(so);
    return path;
}

/* Run the gate on a config into bundle <kpt_dir>/<tag>; asserts the exit code, returns the bundle's path. */
static char *gate(const char *cfg, const char *tag, int want_rc) {
    char *out, *o, *e;
    cr_assert(asprintf(&out, "%s/%s", kpt_dir, tag) > 0);
    const int rc = kpt_gate(cfg, out, &o, &e);
    cr_assert_eq(rc, want_rc, "%s: exit %d, not %d\n%s\n%s", tag, rc, want_rc, o, e);
    free(o), free(e);
    return out;
}

static const cJSON *tensor_of(const cJSON *chk, const char *name) {
    for (const cJSON *t = kpt_at(kpt_at(chk, "findings"), "tensors")->child; t; t = t->next)
        if (!strcmp(kpt_str(t, "tensor"), name)) return t;
    cr_assert_fail("the tolerance check has no tensor %s", name);
    return NULL;
}
static double count_of(const cJSON *tensor, const char *list) { return kpt_num(kpt_at(tensor, list), "count"); }
static double first_of(const cJSON *tensor, const char *list) {
    const cJSON *first = cJSON_GetArrayItem(kpt_at(kpt_at(tensor, list), "first"), 0);
    cr_assert(cJSON_IsNumber(first), "%s lists no element", list);
    return first->valuedouble;
}

/* The tolerance check alone of the plugin built with `flag` on TOL_CASE; returns its receipt. */
static cJSON *tolerance_of(const char *flag, const char *name, int want_rc) {
    char *cfg = config(flag, name, "{\"case\":\"" TOL_CASE "\",\"checks\":[{\"check\":\"tolerance\",\"impl\":\"candidate\"}]}");
    char *bundle = gate(cfg, name, want_rc);
    cJSON *rec = kpt_receipt(bundle, 1);
    free(cfg), free(bundle);
    return rec;
}

/* A receipt's impl timing carries the family's FLOP count and TFLOP/s by FlashMLA's formula (2 h_q x attended tokens x
 * (576 + 512) a query row), over kernel_us on a GPU and wall_us on the host, as its note says: checked against the
 * formula on the receipt's own time. */
Test(mla_checks, receipts_carry_tflops_by_flashmlas_formula) {
    char *body, *path;
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"impls\":{\"mla.candidate\":\"mla.split_size@host\"},"
                       "\"defaults\":{" TOLERANCES "},\"cases\":[{\"case\":\"" TOL_CASE "\",\"checks\":[{\"check\":"
                       "\"tolerance\",\"impl\":\"candidate\"}]}]}") > 0);
    cr_assert(asprintf(&path, "%s/flops.json", kpt_dir) > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    char *bundle = gate(path, "flops", 0);
    cJSON *rec = kpt_receipt(bundle, 1);
    const cJSON *timing = NULL;
    const cJSON *impls = kpt_at(rec, "impls");
    for (const cJSON *i = impls ? impls->child : NULL; i; i = i->next)
        if (!strcmp(kpt_str(i, "name"), "mla.split_size@host")) timing = kpt_at(i, "timing");
    cr_assert(timing, "no timing for the candidate");
    const double flops = kpt_num(timing, "flops"), tf = kpt_num(timing, "tflop_per_s"), wall = kpt_num(timing, "wall_us");
    const double want = 2.0 * (2 * 1 * 64) * 256.0 * (576 + 512); /* requests x s_q x h_q heads, topk tokens */
    cr_assert_float_eq(flops, want, 1e-9 * want, "flops %g, the formula %g", flops, want);
    cr_assert(wall > 0 && fabs(tf - flops / (wall * 1e-6) / 1e12) <= 1e-9 * tf, "tflop_per_s %g over wall_us %g", tf, wall);
    cr_assert_str_eq(kpt_str(timing, "tflop_note"), "flops over wall_us");
    cJSON_Delete(rec);
    free(body), free(path), free(bundle);
}

static void tensor_passes(const cJSON *chk, const char *name) {
    const cJSON *t = tensor_of(chk, name);
    cr_assert_str_eq(kpt_str(t, "result"), "PASSED", "%s: %s", name, kpt_str(chk, "summary"));
    cr_assert_eq(count_of(t, "over_tolerance"), 0, "%s", name);
    cr_assert_eq(count_of(t, "nonfinite_mismatch"), 0, "%s", name);
}

/* Whether a row of request 0 counts cache slot 0 (then slot 0 holds a token's finite values: only tokens no counted
 * slot of their request names are NaN). The slots as the harness hands them to impls: the family's input 1. */
static int request0_counts_slot0(const char *name) {
    kp_case_spec cs = {.fam = kp_family_find("mla")};
    kp_error err = {0};
    cr_assert_not_null(cs.fam);
    cr_assert_eq(kp_case_parse(name, &cs.c, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_case_normalize(&cs.c, &err), 0, "%s", err.msg);
    kp_case_format(&cs.c, cs.name, sizeof cs.name);
    kp_evidence ev = {.artifacts = cJSON_CreateArray(), .inline_limit = 16};
    cJSON *rec = cJSON_CreateObject();
    kp_case_ctx ctx;
    cr_assert_eq(kp_case_ctx_open(&ctx, &cs, &ev, rec, &err), 0, "%s", err.msg);
    const kp_tensor *ind = &ctx.prep.v.inputs[1];
    cr_assert_str_eq(ind->name, "indices");
    const int64_t per_request = ind->shape[1] * ind->shape[2]; /* [batch, s_q, topk] */
    int counted = 0;
    for (int64_t j = 0; j < per_request; j++) counted |= ((const int32_t *)ind->data)[j] == 0;
    kp_case_ctx_close(&ctx);
    cJSON_Delete(rec), cJSON_Delete(ev.artifacts);
    return counted;
}

/* The clean build on two cases: fp8 with every index profile (mixed), and a bf16 cache with sinks (+-inf among them),
 * topk_length and two query rows a request. Every check passes, and the plugin is split_size bit for bit (exact),
 * so each defect below is the flag's and nothing else. Every batch probe carries the split counts. */
Test(mla_checks, the_clean_plugin_passes_tolerance_repeat_and_batch_and_is_split_size_bit_for_bit) {
#define CLEAN_CHECKS                                                                                                   \
    "\"checks\":[{\"check\":\"tolerance\",\"impl\":\"candidate\"},{\"check\":\"repeat\",\"impl\":\"candidate\",\"runs\":3}," \
    "{\"check\":\"batch\",\"impl\":\"candidate\"},{\"check\":\"exact\",\"impls\":[\"candidate\",\"mla.split_size@host\"]}]"
    char *cfg = config(NULL, "mla.plain@host",
                       "{\"case\":\"mla(batch=5,h_q=64,profile=mixed,s_kv=512,scale=pow2,seed=1,topk=256)\"," CLEAN_CHECKS "},"
                       "{\"case\":\"mla(batch=3,cache=bf16,h_q=64,profile=holes,s_kv=256,s_q=2,seed=2,sink=inf,topk=128,"
                       "topk_length=on)\"," CLEAN_CHECKS "}");
    char *bundle = gate(cfg, "clean", 0);
    const int64_t batch[2] = {5, 3};
    for (int c = 0; c < 2; c++) {
        cJSON *rec = kpt_receipt(bundle, c + 1);
        const char *const kinds[4] = {"tolerance", "repeat", "batch", "exact"};
        for (int k = 0; k < 4; k++) {
            cr_assert_str_eq(kpt_str(kpt_check(rec, k), "check"), kinds[k]);
            cr_assert_str_eq(kpt_str(kpt_check(rec, k), "result"), "PASSED", "case %d, %s: %s", c + 1, kinds[k],
                             kpt_str(kpt_check(rec, k), "summary"));
        }
        const cJSON *tol = kpt_check(rec, 0);
        tensor_passes(tol, "out"), tensor_passes(tol, "lse"), tensor_passes(tol, "max_logits");
        cr_assert_eq(kpt_num(tensor_of(tol, "out"), "elements"), batch[c] * (c ? 2 : 1) * 64 * 512);
        const cJSON *f = kpt_at(kpt_check(rec, 2), "findings");
        cr_assert_eq(kpt_num(f, "row_differences"), 0);
        cr_assert_eq(kpt_num(f, "vacuous_probes"), 0);
        int probes = 0;
        for (const cJSON *p = kpt_at(f, "probes")->child; p; p = p->next, probes++) {
            const cJSON *s = kpt_at(p, "splits"), *in_probe = kpt_at(s, "probe"), *in_full = kpt_at(s, "full_batch");
            cr_assert_eq(cJSON_GetArraySize(in_probe), kpt_num(p, "batch"), "%s: a split count for every request", kpt_str(p, "probe"));
            cr_assert_eq(cJSON_GetArraySize(in_full), kpt_num(p, "batch"), "%s", kpt_str(p, "probe"));
            for (int i = 0; i < cJSON_GetArraySize(in_probe); i++) { /* topk <= KP_MLA_SPLIT_BLOCKS blocks: one split, whatever the batch */
                cr_assert_eq(cJSON_GetArrayItem(in_probe, i)->valuedouble, 1, "%s, position %d", kpt_str(p, "probe"), i);
                const cJSON *full = cJSON_GetArrayItem(in_full, i);
                cr_assert(cJSON_IsNull(full) || full->valuedouble == 1, "%s, position %d", kpt_str(p, "probe"), i);
            }
        }
        cr_assert_eq(probes, batch[c] + 2 + 1 + 2, "alone x %lld, two halves, reversed, and T, T + 1 of split_count's plan",
                     (long long)batch[c]);
        cr_assert_eq(kpt_num(kpt_at(kpt_check(rec, 3), "findings"), "rows_differ"), 0);
        cJSON_Delete(rec);
    }
    free(cfg), free(bundle);
}

/* lse in log2: every lse is log2(e) times the reference; out and max_logits untouched. */
Test(mla_checks, an_lse_left_in_log2_is_incorrect_on_lse_alone) {
    cJSON *rec = tolerance_of("-DKPT_LSE_LOG2", "mla.lse_log2@host", 1);
    const cJSON *chk = kpt_check(rec, 0), *lse = tensor_of(chk, "lse");
    cr_assert_str_eq(kpt_str(chk, "result"), "INCORRECT");
    cr_assert_str_eq(kpt_str(lse, "result"), "INCORRECT");
    cr_assert_eq(count_of(lse, "over_tolerance"), 2 * 64, "every lse is over (a full row's lse is about 6)");
    cr_assert_eq(count_of(lse, "nonfinite_mismatch"), 0);
    for (const cJSON *r = kpt_at(lse, "worst_per_row")->child; r; r = r->next) {
        const double ratio = kpt_num(r, "value") / kpt_num(r, "reference");
        cr_assert(fabs(ratio - LOG2E) < 1e-5, "request %g: lse %g against %g, a ratio of %g, not log2(e)", kpt_num(r, "row"),
                  kpt_num(r, "value"), kpt_num(r, "reference"), ratio);
    }
    tensor_passes(chk, "out"), tensor_passes(chk, "max_logits");
    cJSON_Delete(rec);
}

/* A -1 read as slot 0 and counted. Slot 0 is a token request 0 counts in this case (asserted), so the values read
 * are finite and the defect shows as out over tolerance, not as NaN; every request's row has holes. */
Test(mla_checks, a_hole_read_as_slot_0_is_over_tolerance_on_out_in_every_request) {
#define HOLE_CASE "mla(batch=4,h_q=64,profile=holes,s_kv=256,scale=pow2,seed=7,topk=256)"
    cr_assert(request0_counts_slot0(HOLE_CASE), "the case must count slot 0, or reading it gives NaN: pick another seed");
    char *cfg = config("-DKPT_HOLE_READ", "mla.hole_read@host",
                       "{\"case\":\"" HOLE_CASE "\",\"checks\":[{\"check\":\"tolerance\",\"impl\":\"candidate\"}]}");
    char *bundle = gate(cfg, "hole_read", 1);
    cJSON *rec = kpt_receipt(bundle, 1);
    const cJSON *chk = kpt_check(rec, 0), *out = tensor_of(chk, "out");
    cr_assert_str_eq(kpt_str(chk, "result"), "INCORRECT");
    cr_assert_str_eq(kpt_str(out, "result"), "INCORRECT");
    cr_assert_eq(count_of(out, "nonfinite_mismatch"), 0, "slot 0 holds finite values");
    cr_assert(count_of(out, "over_tolerance") > 0);
    cr_assert_eq(cJSON_GetArraySize(kpt_at(kpt_at(out, "over_tolerance"), "first")), 16, "the receipt lists the first 16 over");
    cr_assert_not_null(kpt_at(kpt_at(out, "over_tolerance"), "artifact"), "and every one of them as an artifact");
    cr_assert_eq(cJSON_GetArraySize(kpt_at(out, "worst_per_row")), 4);
    for (const cJSON *r = kpt_at(out, "worst_per_row")->child; r; r = r->next)
        cr_assert(kpt_num(r, "excess") > 0, "request %g has holes, yet its worst element is within tolerance", kpt_num(r, "row"));
    cr_assert_str_eq(kpt_str(tensor_of(chk, "lse"), "result"), "INCORRECT", "the counted slot adds to the denominator");
    cJSON_Delete(rec);
    free(cfg), free(bundle);
}

/* Every slot read one token on: about half the neighbours are tokens no slot counts, which the case fills with NaN,
 * so out and lse carry NaN where the reference is finite. */
Test(mla_checks, a_neighbouring_token_read_is_caught_by_nan_positions) {
    cJSON *rec = tolerance_of("-DKPT_NEXT_TOKEN", "mla.next_token@host", 1);
    const cJSON *chk = kpt_check(rec, 0), *out = tensor_of(chk, "out"), *lse = tensor_of(chk, "lse");
    cr_assert_str_eq(kpt_str(chk, "result"), "INCORRECT");
    cr_assert_str_eq(kpt_str(out, "result"), "INCORRECT");
    cr_assert(count_of(out, "nonfinite_mismatch") > 0, "out: %s", kpt_str(chk, "summary"));
    cr_assert(count_of(lse, "nonfinite_mismatch") > 0, "lse: %s", kpt_str(chk, "summary"));
    cJSON_Delete(rec);
}

/* One NaN written into an otherwise clean out: the only misplaced element, at the planted index, and the verdict
 * INCORRECT though every finite pair is within tolerance. */
Test(mla_checks, a_nan_written_into_out_is_never_accepted) {
    cJSON *rec = tolerance_of("-DKPT_NAN_ONE", "mla.nan_one@host", 1);
    const cJSON *chk = kpt_check(rec, 0), *out = tensor_of(chk, "out");
    cr_assert_str_eq(kpt_str(chk, "result"), "INCORRECT");
    cr_assert_str_eq(kpt_str(out, "result"), "INCORRECT");
    cr_assert_eq(count_of(out, "nonfinite_mismatch"), 1);
    cr_assert_eq(first_of(out, "nonfinite_mismatch"), PERTURB_AT);
    cr_assert_eq(count_of(out, "over_tolerance"), 0, "every finite pair is within tolerance");
    cr_assert_eq(kpt_num(out, "finite_pairs"), 2 * OUT_ROW - 1);
    const cJSON *row1 = cJSON_GetArrayItem(kpt_at(out, "worst_per_row"), 1);
    cr_assert_eq(kpt_num(row1, "index"), PERTURB_AT, "request 1's worst element is the NaN");
    tensor_passes(chk, "lse"), tensor_passes(chk, "max_logits");
    cJSON_Delete(rec);
}

Test(mla_checks, one_perturbed_element_is_the_one_over_and_the_receipt_names_its_index) {
    cJSON *rec = tolerance_of("-DKPT_PERTURB_ONE", "mla.perturb_one@host", 1);
    const cJSON *chk = kpt_check(rec, 0), *out = tensor_of(chk, "out");
    cr_assert_str_eq(kpt_str(out, "result"), "INCORRECT");
    cr_assert_eq(count_of(out, "over_tolerance"), 1, "exactly one element over");
    cr_assert_eq(first_of(out, "over_tolerance"), PERTURB_AT, "the element over is the planted one");
    cr_assert_eq(count_of(out, "nonfinite_mismatch"), 0);
    const cJSON *m = kpt_at(out, "metrics");
    cr_assert_eq(kpt_num(m, "max_abs_at"), PERTURB_AT);
    cr_assert(fabs(kpt_num(m, "max_abs") - 0.5) < 0.01, "max abs %g, planted 0.5 (then rounded to bf16)", kpt_num(m, "max_abs"));
    const cJSON *row1 = cJSON_GetArrayItem(kpt_at(out, "worst_per_row"), 1);
    cr_assert_eq(kpt_num(row1, "index"), PERTURB_AT);
    cr_assert(kpt_num(row1, "excess") > 0.4);
    cr_assert(kpt_num(cJSON_GetArrayItem(kpt_at(out, "worst_per_row"), 0), "excess") <= 0, "request 0 is untouched");
    tensor_passes(chk, "lse"), tensor_passes(chk, "max_logits");
    cJSON_Delete(rec);
}

/* Split counts that depend on the batch: a request alone is cut into one split per block (4), in any batch of two or
 * more into one. Within tolerance either way; batch fails on exactly the alone probes, and their receipt entries say
 * why: 4 splits in the probe, 1 in the full batch. */
Test(mla_checks, splits_that_depend_on_the_batch_fail_batch_on_the_alone_probes_which_name_their_splits) {
    char *cfg = config("-DKPT_BATCH_SPLITS", "mla.batch_splits@host",
                       "{\"case\":\"mla(batch=4,h_q=64,profile=uniform,s_kv=512,scale=pow2,seed=21,topk=256)\",\"checks\":["
                       "{\"check\":\"tolerance\",\"impl\":\"candidate\"},{\"check\":\"batch\",\"impl\":\"candidate\"}]}");
    char *bundle = gate(cfg, "batch_splits", 1);
    cJSON *rec = kpt_receipt(bundle, 1);
    cr_assert_str_eq(kpt_str(kpt_check(rec, 0), "result"), "PASSED", "%s", kpt_str(kpt_check(rec, 0), "summary"));
    const cJSON *chk = kpt_check(rec, 1), *f = kpt_at(chk, "findings");
    cr_assert_str_eq(kpt_str(chk, "result"), "INCORRECT");
    cr_assert_eq(kpt_num(f, "row_differences"), 4, "each request alone differs; no probe of two or more does");
    cr_assert_eq(kpt_num(f, "vacuous_probes"), 0);
    int alone = 0;
    for (const cJSON *p = kpt_at(f, "probes")->child; p; p = p->next) {
        const char *name = kpt_str(p, "probe");
        const cJSON *differ = kpt_at(p, "rows_differ"), *s = kpt_at(p, "splits");
        if (strncmp(name, "alone.row", 9)) {
            cr_assert_eq(cJSON_GetArraySize(differ), 0, "%s: a batch of %g cuts the same splits as the full batch", name,
                         kpt_num(p, "batch"));
            continue;
        }
        const int r = atoi(name + 9);
        alone++;
        cr_assert_eq(cJSON_GetArraySize(differ), 1, "%s", name);
        cr_assert_eq(kpt_num(cJSON_GetArrayItem(differ, 0), "row"), r, "%s names its request", name);
        const cJSON *moved = kpt_at(kpt_at(cJSON_GetArrayItem(differ, 0), "elements"), "out");
        cr_assert(kpt_num(moved, "count") > 0, "%s lists the elements of out that moved", name);
        cr_assert_eq(cJSON_GetArrayItem(kpt_at(s, "probe"), 0)->valuedouble, 4, "%s: 4 splits alone", name);
        cr_assert_eq(cJSON_GetArrayItem(kpt_at(s, "full_batch"), 0)->valuedouble, 1, "%s: 1 in the full batch", name);
    }
    cr_assert_eq(alone, 4);
    cJSON_Delete(rec);
    free(cfg), free(bundle);
}

/* Split counts that change from call to call (as an atomic scheduler's might): within tolerance, but repeat sees
 * two distinct outputs and the work order (splits) changed. */
Test(mla_checks, splits_that_change_between_calls_fail_repeat_with_the_order_changed) {
    char *cfg = config("-DKPT_RUN_DRIFT", "mla.run_drift@host",
                       "{\"case\":\"" TOL_CASE "\",\"checks\":[{\"check\":\"tolerance\",\"impl\":\"candidate\"},"
                       "{\"check\":\"repeat\",\"impl\":\"candidate\",\"runs\":4}]}");
    char *bundle = gate(cfg, "run_drift", 1);
    cJSON *rec = kpt_receipt(bundle, 1);
    cr_assert_str_eq(kpt_str(kpt_check(rec, 0), "result"), "PASSED", "%s", kpt_str(kpt_check(rec, 0), "summary"));
    const cJSON *chk = kpt_check(rec, 1), *f = kpt_at(chk, "findings");
    cr_assert_str_eq(kpt_str(chk, "result"), "INCORRECT");
    cr_assert_eq(kpt_num(f, "distinct_outputs"), 2);
    cr_assert(cJSON_IsTrue(kpt_at(f, "order_changed")));
    cr_assert_eq(kpt_num(kpt_at(f, "rows_varying_by_tensor"), "splits"), 2);
    cr_assert(kpt_num(kpt_at(f, "rows_varying_by_tensor"), "out") > 0);
    cJSON_Delete(rec);
    free(cfg), free(bundle);
}

/* topk_length=request (one length a request, as FlashMLA's decode takes it) with two query rows a request: the
 * built-in candidate is within FlashMLA's tolerances on the host, and the receipt's case says which lengths it has. */
Test(mla_checks, a_case_with_one_topk_length_a_request_passes_the_candidates_tolerance) {
    const char *name = "mla(batch=3,h_q=64,profile=mixed,s_kv=1024,s_q=2,scale=pow2,seed=9,topk=640,topk_length=request)";
    char *body, *path;
    cr_assert(asprintf(&body, "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"impls\":{\"mla.candidate\":"
                              "\"mla.split_size@host\"},\"defaults\":{" TOLERANCES "},\"cases\":[{\"case\":\"%s\","
                              "\"checks\":[{\"check\":\"tolerance\",\"impl\":\"candidate\"}]}]}", name) > 0);
    cr_assert(asprintf(&path, "%s/request.json", kpt_dir) > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    char *bundle = gate(path, "request", 0);
    cJSON *rec = kpt_receipt(bundle, 1);
    cr_assert_str_eq(kpt_str(kpt_at(rec, "case"), "name"), name);
    cr_assert_str_eq(kpt_str(kpt_at(kpt_at(rec, "case"), "params"), "topk_length"), "request");
    const cJSON *chk = kpt_check(rec, 0);
    cr_assert_str_eq(kpt_str(chk, "result"), "PASSED", "%s", kpt_str(chk, "summary"));
    tensor_passes(chk, "out"), tensor_passes(chk, "lse"), tensor_passes(chk, "max_logits");
    cJSON_Delete(rec);
    free(body), free(path), free(bundle);
}
