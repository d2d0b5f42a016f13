/* test_family_seam.c: a family is one file per stage plus one table row. The test family `scale`
 * (tests/fixtures/scale/: scale_case.c, scale_ref.c, scale_impls.c built as a plugin, scale_family.c)
 * is registered here through the same table as the built-in ones (kp_family_register) and runs through
 * exact, tolerance, repeat and batch: clean impls pass and each planted defect is caught by its check.
 * The gate runs in this process, as kparity's main would run it. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../harness/kp_harness.h"
#include "../harness/kp_launch.h"
#include "../harness/kp_replay.h"
#include "../harness/kp_runner.h"
#include "../receipts/kp_report.h"
#include "../receipts/kp_verify.h"
#include "kp_test_util.h"

extern const kp_family kpt_scale_family; /* tests/fixtures/scale/scale_family.c */

/* The table row: what a built-in family has in harness/families.c and cases/case_families.c; and its
 * impls, from their plugin (loaded here once: the configs below each run in this one process). */
static void register_scale(void) {
    kpt_dir_setup();
    kp_error err = {0};
    cr_assert_eq(kp_family_register(&kpt_scale_family, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_plugin_load(kpt_scale_plugin(), &err), 0, "%s", err.msg);
}

TestSuite(family_seam, .init = register_scale, .fini = kpt_dir_teardown, .timeout = 120);

#define CASE "scale(cols=300,rows=6,seed=5,stride=301)"

/* A config with `checks` on CASE (the scale plugin's impls are loaded); returns its path. */
static char *config(const char *name, const char *defaults, const char *checks) {
    char *path, *body;
    cr_assert(asprintf(&path, "%s/%s.json", kpt_dir, name) > 0);
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"%s\","
                       "\"impls\":{\"scale.candidate\":\"scale.f32@host\"},\"defaults\":{%s},"
                       "\"cases\":[{\"case\":\"" CASE "\",\"checks\":%s}]}",
                       name, defaults, checks) > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    free(body);
    return kpt_scratch(path);
}

/* Load and run a config in this process; returns the exit class and case 1's receipt. */
static int run(const char *cfg_path, const char *name, cJSON **receipt, char **bundle) {
    kp_config cfg;
    kp_error err = {0};
    int rc = kp_config_load(cfg_path, &cfg, &err);
    if (rc) {
        kp_config_free(&cfg);
        cr_log_info("config: %s", err.msg);
        return rc;
    }
    cr_assert(asprintf(bundle, "%s/%s", kpt_dir, name) > 0);
    kpt_scratch(*bundle);
    kp_run_options opt = {.out_dir = *bundle, .quiet = 1, .command = "run"};
    fflush(stdout);
    rc = kp_run_config(&cfg, &opt, &err);
    kp_config_free(&cfg);
    if (receipt) *receipt = kpt_receipt(*bundle, 1);
    return rc;
}

/* A config (body, written as <name>.json) that kp_config_load refuses with exit class 2 and needle in its message. */
static void refused_at_load(const char *name, const char *body, const char *needle) {
    char *path;
    cr_assert(asprintf(&path, "%s/%s.json", kpt_dir, name) > 0);
    kpt_scratch(path);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    kp_config c;
    kp_error err = {0};
    cr_assert_eq(kp_config_load(path, &c, &err), KP_EXIT_USAGE, "%s was loaded", name);
    cr_assert(strstr(err.msg, needle), "%s", err.msg);
    kp_config_free(&c);
}

/* One config on CASE, run; asserts the exit class and returns case 1's receipt (bundle: where it went). */
static cJSON *gate_case(const char *name, const char *defaults, const char *checks, int want, char **bundle) {
    cJSON *rec = NULL;
    char *dir = NULL;
    cr_assert_eq(run(config(name, defaults, checks), name, &rec, &dir), want, "%s: exit class", name);
    if (bundle) *bundle = dir;
    return rec;
}


#define TOL "\"atol\":1e-30,\"rtol\":1e-6,\"tensors\":{\"y_bf16\":{\"rtol\":0.0039,\"ulp\":0}}"

Test(family_seam, the_row_is_in_the_tables_and_a_bad_row_is_refused) {
    cr_assert_eq(kp_family_find("scale"), &kpt_scale_family);
    cr_assert_not_null(kp_case_family_find("scale"));
    kp_error err = {0};
    cr_assert_eq(kp_family_register(&kpt_scale_family, &err), KP_EXIT_USAGE, "a second row of one name");
    kp_family broken = kpt_scale_family;
    broken.name = "scale2";
    cr_assert_eq(kp_family_register(&broken, &err), KP_EXIT_USAGE, "its case family carries another name");
    kp_case_family cases = *kpt_scale_family.cases;
    cases.name = "scale2";
    broken.cases = &cases;
    broken.fill_args = NULL;
    cr_assert_eq(kp_family_register(&broken, &err), KP_EXIT_USAGE, "a required hook is missing");
    cr_assert(strstr(err.msg, "required hook"), "%s", err.msg);
    broken.fill_args = kpt_scale_family.fill_args;
    broken.output_names = NULL; /* what an impl may declare absent */
    cr_assert_eq(kp_family_register(&broken, &err), KP_EXIT_USAGE, "no output names");
    broken.output_names = kpt_scale_family.output_names;
    broken.defects = (const char *const[]){"x", NULL};
    cr_assert_eq(kp_family_register(&broken, &err), KP_EXIT_USAGE, "defects without has_defect");
    broken.defects = NULL;
    broken.thresholds = (const kp_threshold[]){{0, "no rows"}};
    cr_assert_eq(kp_family_register(&broken, &err), KP_EXIT_USAGE, "a threshold of 0 rows");
    cr_assert(strstr(err.msg, "threshold 0"), "%s", err.msg);
    /* and every built-in row passes the same check */
    for (int i = 0; i < kp_family_count(); i++) cr_assert_eq(kp_family_check(kp_family_at(i), &err), 0, "%s", err.msg);
}

Test(family_seam, clean_impls_pass_exact_tolerance_repeat_and_batch_and_the_bundle_replays) {
    char *bundle;
    cJSON *rec = gate_case("clean", TOL ",\"runs\":3",
                           "[{\"check\":\"exact\",\"impls\":[\"candidate\",\"scale.twin@host\"]},"
                           "{\"check\":\"tolerance\",\"impl\":\"candidate\"},{\"check\":\"repeat\",\"impl\":\"candidate\"},"
                           "{\"check\":\"batch\",\"impl\":\"candidate\"}]", 0, &bundle);
    for (int k = 0; k < 4; k++) {
        char path[32];
        snprintf(path, sizeof path, "checks.%d.result", k);
        cr_assert_str_eq(kpt_str(rec, path), "PASSED", "check %d: %s", k, kpt_str(rec, path));
    }
    cr_assert_str_eq(kpt_str(rec, "case.generator.version"), "scale/v1", "each receipt names its own family's generator");
    cr_assert_str_eq(kpt_str(rec, "reference.provider"), "reference.scale@host-f64");
    cr_assert_str_eq(kpt_str(rec, "impls.0.role"), "scale.candidate", "a role of one family");
    /* the tolerance receipt holds the effective thresholds and every metric, per output tensor */
    cr_assert_eq(kpt_num(rec, "checks.1.params.tolerance.y.rtol"), 1e-6);
    cr_assert(cJSON_IsNull(kpt_at(rec, "checks.1.params.tolerance.y.nmse")), "an undeclared bound is null, not defaulted");
    cr_assert_eq(kpt_num(rec, "checks.1.params.tolerance.y_bf16.rtol"), 0.0039);
    cr_assert_eq(kpt_num(rec, "checks.1.params.tolerance.y_bf16.ulp"), 0);
    cr_assert_eq(kpt_num(rec, "checks.1.params.tolerance.y_bf16.atol"), 1e-30, "the check's atol where the tensor has none");
    const char *metrics[] = {"max_abs", "max_rel", "nmse", "cosine_diff", "max_bf16_ulp", "bf16_ulp_histogram"};
    for (int t = 0; t < 2; t++)
        for (size_t m = 0; m < sizeof metrics / sizeof *metrics; m++) {
            char path[96];
            snprintf(path, sizeof path, "checks.1.findings.tensors.%d.metrics.%s", t, metrics[m]);
            kpt_at(rec, path);
        }
    cr_assert_eq(kpt_num(rec, "checks.1.findings.tensors.0.elements"), 6 * 300);
    cr_assert(kpt_num(rec, "checks.1.findings.tensors.0.finite_pairs") < 6 * 300, "the planted NaN and inf are not metrics");
    cr_assert_eq(cJSON_GetArraySize(kpt_at(rec, "checks.1.findings.tensors.0.worst_per_row")), 6);
    /* the batch probes straddle the family's threshold and say so */
    const cJSON *probes = kpt_at(rec, "checks.3.findings.probes");
    int straddling = 0;
    for (const cJSON *p = probes->child; p; p = p->next)
        if (cJSON_GetObjectItemCaseSensitive(p, "straddles")) {
            straddling++;
            cr_assert_eq(kpt_num(p, "straddles.0.threshold"), 4);
            cr_assert_str_eq(kpt_str(p, "straddles.0.side"), kpt_num(p, "batch") == 4 ? "at" : "above");
        }
    cr_assert_eq(straddling, 2);
    kp_error err = {0};
    cr_assert_eq(kp_bundle_verify(bundle, &err), 0, "%s", err.msg);
    kp_replay_report replayed;
    cr_assert_eq(kp_replay_bundle(bundle, &replayed, &err), 0, "%s", err.msg);
    cr_assert(replayed.replayed == 1 && replayed.with_reference == 1 && replayed.not_replayed == 0);
    kp_replay_report_free(&replayed);
    cJSON_Delete(rec);
}

Test(family_seam, tolerance_catches_one_element_past_its_bound) {
    cJSON *rec = gate_case("perturb", TOL, "[{\"check\":\"tolerance\",\"impl\":\"scale.perturb@host\"}]", 1, NULL);
    cr_assert_str_eq(kpt_str(rec, "checks.0.result"), "INCORRECT");
    cr_assert_str_eq(kpt_str(rec, "checks.0.findings.tensors.0.result"), "INCORRECT");
    cr_assert_eq(kpt_num(rec, "checks.0.findings.tensors.0.over_tolerance.count"), 1);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.tensors.0.over_tolerance.first.0"), 1 * 300 + 2, "row 1, column 2");
    cr_assert_eq(kpt_num(rec, "checks.0.findings.tensors.0.worst_per_row.1.index"), 1 * 300 + 2);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.tensors.0.nonfinite_mismatch.count"), 0);
    cJSON_Delete(rec);
}

Test(family_seam, tolerance_catches_a_moved_nan_before_any_metric) {
    cJSON *rec = gate_case("nanmove", TOL, "[{\"check\":\"tolerance\",\"impl\":\"scale.nanmove@host\"}]", 1, NULL);
    for (int t = 0; t < 2; t++) { /* the NaN left column 0 of row 0 for column 1, in both outputs */
        char path[96];
        snprintf(path, sizeof path, "checks.0.findings.tensors.%d.nonfinite_mismatch.count", t);
        cr_assert_eq(kpt_num(rec, path), 2, "tensor %d", t);
        snprintf(path, sizeof path, "checks.0.findings.tensors.%d.nonfinite_mismatch.first.1", t);
        cr_assert_eq(kpt_num(rec, path), 1);
    }
    cJSON_Delete(rec);
}

/* element_rule both (FlashMLA's): an element fails only past atol and past rtol |r|. The perturbed element's
 * error d, with atol and rtol |r| each 0.6 d, passes the sum rule (1.2 d allowed) and fails both. */
Test(family_seam, element_rule_both_fails_only_an_element_past_both_bounds) {
    cJSON *rec = gate_case("perturb0", TOL, "[{\"check\":\"tolerance\",\"impl\":\"scale.perturb@host\"}]", 1, NULL);
    const double d = kpt_num(rec, "checks.0.findings.tensors.0.worst_per_row.1.abs");
    const double r = fabs(kpt_num(rec, "checks.0.findings.tensors.0.worst_per_row.1.reference"));
    cr_assert(d > 0 && r > 0);
    cJSON_Delete(rec);
    for (int both = 0; both < 2; both++) {
        char defaults[400];
        snprintf(defaults, sizeof defaults,
                 "\"atol\":1e-30,\"rtol\":1e-6,\"tensors\":{\"y\":{\"atol\":%.17g,\"rtol\":%.17g,\"element_rule\":\"%s\"},"
                 "\"y_bf16\":{\"rtol\":0.0039,\"ulp\":0}}", 0.6 * d, 0.6 * d / r, both ? "both" : "sum");
        rec = gate_case(both ? "both" : "sum", defaults, "[{\"check\":\"tolerance\",\"impl\":\"scale.perturb@host\"}]",
                        both, NULL);
        cr_assert_str_eq(kpt_str(rec, "checks.0.findings.tensors.0.result"), both ? "INCORRECT" : "PASSED");
        cr_assert_str_eq(kpt_str(rec, "checks.0.params.tolerance.y.element_rule"), both ? "both" : "sum");
        if (both) cr_assert_eq(kpt_num(rec, "checks.0.findings.tensors.0.over_tolerance.first.0"), 1 * 300 + 2);
        cJSON_Delete(rec);
    }
}

/* NMSE, cosine difference and bf16 ulp each decide a tolerance check alone. scale.perturb's one element off by one
 * part in 1e3 is inside atol 1, as every element is (a first run measures its metrics, with no bound but atol); then
 * one bound at a time: set under the metric it fails the tensor (INCORRECT, with no element over atol and no NaN or
 * inf misplaced, so that bound alone decided), set at or over it (the control) it passes. */
Test(family_seam, nmse_cosine_and_ulp_each_fail_a_tolerance_check_alone) {
    const char *checks = "[{\"check\":\"tolerance\",\"impl\":\"scale.perturb@host\"}]";
    cJSON *rec = gate_case("measured", "\"atol\":1,\"rtol\":0", checks, 0, NULL);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.tensors.0.over_tolerance.count"), 0, "atol 1 must pass every element");
    const double metric[3] = {kpt_num(rec, "checks.0.findings.tensors.0.metrics.nmse"),
                              kpt_num(rec, "checks.0.findings.tensors.0.metrics.cosine_diff"),
                              kpt_num(rec, "checks.0.findings.tensors.0.metrics.max_bf16_ulp")};
    cJSON_Delete(rec);
    const char *bound[3] = {"nmse", "cosine", "ulp"}, *says[3] = {"NMSE over its bound", "cosine diff over its bound",
                                                                  "ulp over its bound"};
    for (int b = 0; b < 3; b++) {
        cr_assert_gt(metric[b], 0, "%s: the perturbed element must show in it", bound[b]);
        for (int tight = 1; tight >= 0; tight--) {
            /* ulp is an integer: one under the largest seen, or it exactly; the others half or twice the metric */
            const double v = b == 2 ? metric[b] - tight : tight ? metric[b] / 2 : metric[b] * 2;
            char defaults[200], name[32];
            snprintf(defaults, sizeof defaults, "\"atol\":1,\"rtol\":0,\"tensors\":{\"y\":{\"%s\":%.17g}}", bound[b], v);
            snprintf(name, sizeof name, "%s_%s", bound[b], tight ? "tight" : "loose");
            rec = gate_case(name, defaults, checks, tight, NULL);
            cr_assert_str_eq(kpt_str(rec, "checks.0.findings.tensors.0.result"), tight ? "INCORRECT" : "PASSED", "%s", name);
            cr_assert_str_eq(kpt_str(rec, "checks.0.findings.tensors.1.result"), "PASSED", "%s: y_bf16 has no such bound", name);
            cr_assert_eq(kpt_num(rec, "checks.0.findings.tensors.0.over_tolerance.count"), 0, "%s", name);
            cr_assert_eq(kpt_num(rec, "checks.0.findings.tensors.0.nonfinite_mismatch.count"), 0, "%s", name);
            const char *summary = kpt_str(rec, "checks.0.summary");
            cr_assert((strstr(summary, says[b]) != NULL) == tight, "%s: %s", name, summary);
            cJSON_Delete(rec);
        }
    }
}

/* round_reference: y_bf16 held to 0 error passes only against the reference rounded to bf16 (FlashMLA compares a
 * bf16 output with a bf16 reference); against the float64 reference the same bits fail. */
Test(family_seam, round_reference_holds_the_output_to_the_reference_in_its_dtype) {
    for (int round = 0; round < 2; round++) {
        char defaults[300];
        snprintf(defaults, sizeof defaults, "\"atol\":1e-30,\"rtol\":1e-6,\"tensors\":{\"y_bf16\":{\"atol\":0,\"rtol\":0,"
                 "\"round_reference\":%s}}", round ? "true" : "false");
        cJSON *rec = gate_case(round ? "rounded" : "unrounded", defaults, "[{\"check\":\"tolerance\",\"impl\":\"candidate\"}]",
                               round ? 0 : 1, NULL);
        cr_assert_str_eq(kpt_str(rec, "checks.0.findings.tensors.1.result"), round ? "PASSED" : "INCORRECT");
        if (round) cr_assert_eq(kpt_num(rec, "checks.0.findings.tensors.1.metrics.max_abs"), 0.0);
        else cr_assert_gt(kpt_num(rec, "checks.0.findings.tensors.1.over_tolerance.count"), 100);
        cr_assert(cJSON_IsTrue(kpt_at(rec, "checks.0.params.tolerance.y_bf16.round_reference")) == round);
        cJSON_Delete(rec);
    }
}

Test(family_seam, exact_names_the_differing_element_per_tensor) {
    cJSON *rec = gate_case("exact", "", "[{\"check\":\"exact\",\"impls\":[\"candidate\",\"scale.perturb@host\"]}]", 1, NULL);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.rows_differ"), 1);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.per_row.0.row"), 1);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.per_row.0.differ.y.count"), 1);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.per_row.0.differ.y.first.0"), 2);
    /* the rule explains the differing row (harness/rule.c): the family's defaults, recorded as such, and who meets it */
    cr_assert_eq(kpt_num(rec, "checks.0.params.ulps"), 0);
    cr_assert(strstr(kpt_str(rec, "checks.0.params.params_source"), "the family's defaults"));
    cr_assert_str_eq(kpt_str(rec, "checks.0.findings.per_row.0.meets_rule"), "scale.f32@host", "perturb breaks the rule");
    const cJSON *perturbed = cJSON_GetObjectItemCaseSensitive(kpt_at(rec, "checks.0.findings.per_row.0"), "scale.perturb@host");
    cr_assert_eq(kpt_num(perturbed, "wrong.first.0"), 2, "its record names the column it got wrong");
    cJSON_Delete(rec);
}

/* The rule of a fifth family, through the harness's rule module: the clean impl meets it on every row, the perturbed
 * one breaks it on row 1 alone, naming column 2; report.html plots it by the figure the family's table row gives
 * (registered here, as receipts/plot_families.c lists the built-in ones), and verify renders the same report. */
Test(family_seam, a_fifth_familys_rule_is_judged_reported_and_plotted_by_the_harness) {
    static const kp_plot_figure figure = {"scale", "max_ulp", "ulp distance", NULL, 1};
    kp_error err = {0};
    if (!kp_table_find(&kp_plot_figures, "scale")) cr_assert_eq(kp_plot_figure_register(&figure, &err), 0, "%s", err.msg);
    char *bundle;
    cJSON *rec = gate_case("rule", "\"ulps\":0", "[{\"check\":\"rule\",\"impl\":\"candidate\"},"
                                                   "{\"check\":\"rule\",\"impl\":\"scale.perturb@host\"}]", 1, &bundle);
    cr_assert_str_eq(kpt_str(rec, "checks.0.result"), "PASSED", "%s", kpt_str(rec, "checks.0.summary"));
    cr_assert_str_eq(kpt_str(rec, "checks.0.summary"), "6/6 rows meet the rule; 0 elements past 0 ulps");
    cr_assert_str_eq(kpt_str(rec, "checks.1.result"), "INCORRECT");
    cr_assert_str_eq(kpt_str(rec, "checks.1.summary"), "5/6 rows meet the rule; 1 elements past 0 ulps");
    cr_assert(cJSON_IsFalse(kpt_at(rec, "checks.1.findings.per_row.1.impl.meets_rule")));
    cr_assert_eq(kpt_num(rec, "checks.1.findings.per_row.1.impl.wrong.first.0"), 2);
    cr_assert_gt(kpt_num(rec, "checks.1.findings.per_row.1.impl.max_ulp"), 1000, "one part in 1e3 is thousands of ulps");
    cr_assert_eq(kpt_num(rec, "checks.1.findings.per_row.0.impl.max_ulp"), 0);
    cr_assert_eq(kpt_num(rec, "checks.1.findings.wrong"), 1);
    cJSON_Delete(rec);
    char *path, *html;
    cr_assert(asprintf(&path, "%s/report.html", bundle) > 0);
    cr_assert_not_null(html = kpt_read(path, NULL));
    cr_assert(strstr(html, "data-plot=\"rule\""), "the failing rule check gets the rule plot");
    cr_assert(strstr(html, "scale.perturb@host: rows breaking the rule: 1 (1 of 6); most ulp distance beyond the reference's: "), "%s", html);
    cr_assert(strstr(html, "<h2>Rows against the rule</h2>") && strstr(html, "5/6 rows meet; worst row 1:"));
    free(html), free(path);
    cr_assert_eq(kp_bundle_verify(bundle, &err), 0, "%s", err.msg);
}

/* Ten rule checks of one output under nine parameter sets: the harness keeps KP_MEMO_MAX (8) judgements, so the first
 * (ulps 0) is evicted before the last asks for it again; every check still gets the judgement of its own parameters.
 * The perturbed element is between 1e4 and 1e5 ulps off: a bound of 1e5 or more passes it, 1e4 or less does not. */
Test(family_seam, judgements_are_kept_per_parameters_and_the_oldest_evicted) {
    static const int ulps[] = {0, 1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 0};
    char checks[2048] = "[";
    size_t used = 1;
    for (size_t i = 0; i < sizeof ulps / sizeof *ulps; i++)
        used += (size_t)snprintf(checks + used, sizeof checks - used, "%s{\"check\":\"rule\",\"impl\":\"scale.perturb@host\","
                                 "\"ulps\":%d}", i ? "," : "", ulps[i]);
    snprintf(checks + used, sizeof checks - used, "]");
    cJSON *rec = gate_case("memo", "", checks, 1, NULL);
    for (size_t i = 0; i < sizeof ulps / sizeof *ulps; i++) {
        const cJSON *chk = kpt_check(rec, (int)i);
        cr_assert_str_eq(kpt_str(chk, "result"), ulps[i] >= 100000 ? "PASSED" : "INCORRECT", "check %zu (ulps %d): %s", i,
                         ulps[i], kpt_str(chk, "summary"));
        cr_assert_eq(kpt_num(chk, "params.ulps"), ulps[i]);
    }
    cJSON_Delete(rec);
}

/* A family without a rule (its record has none) refuses a rule check when the config loads, naming the family. */
Test(family_seam, a_rule_check_on_a_family_without_one_is_refused) {
    refused_at_load("norule", "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"impls\":{},\"cases\":[{\"case\":"
                              "\"moe(hidden=256,inter=128,m=4,model=glm47,profile=uniform,seed=11)\",\"checks\":"
                              "[{\"check\":\"rule\",\"impl\":\"moe.invariant@host\"}]}]}",
                    "family moe has no rule check");
}

/* expect of exact: two impls that differ reproduce the expected difference; two that agree do not, loudly. */
Test(family_seam, expect_of_exact_holds_only_where_impls_differ) {
    cJSON *rec = gate_case("expect_exact", "",
                           "[{\"check\":\"expect\",\"of\":\"exact\",\"impls\":[\"candidate\",\"scale.perturb@host\"],"
                           "\"result\":\"INCORRECT\"},{\"check\":\"expect\",\"of\":\"exact\",\"impls\":[\"candidate\","
                           "\"scale.twin@host\"],\"result\":\"INCORRECT\"}]",
                           1, NULL);
    cr_assert_str_eq(kpt_str(rec, "checks.0.result"), "PASSED");
    cr_assert_str_eq(kpt_str(rec, "checks.1.result"), "INCORRECT");
    cr_assert(strstr(kpt_str(rec, "checks.1.summary"), "DID NOT REPRODUCE"), "%s", kpt_str(rec, "checks.1.summary"));
    cJSON_Delete(rec);
}

Test(family_seam, repeat_catches_run_to_run_variation) {
    cJSON *rec = gate_case("varies", "\"runs\":4", "[{\"check\":\"repeat\",\"impl\":\"scale.varies@host\"}]", 1, NULL);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.distinct_outputs"), 4);
    cr_assert_eq(cJSON_GetArraySize(kpt_at(rec, "checks.0.findings.rows_varying")), 1);
    /* rates with their Wilson intervals: the varying row flipped in all 3 runs after the first, 1 of 6 rows varies */
    cr_assert_eq(kpt_num(rec, "checks.0.findings.rows_varying.0.flip_rate.count"), 3);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.rows_varying.0.flip_rate.of"), 3);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.rows_varying.0.flip_rate.wilson95.1"), 1.0);
    cr_assert_float_eq(kpt_num(rec, "checks.0.findings.rows_varying.0.flip_rate.wilson95.0"), 0.4385, 1e-4);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.rows_varying_rate.count"), 1);
    cr_assert_eq(kpt_num(rec, "checks.0.findings.rows_varying_rate.of"), 6);
    cJSON_Delete(rec);
}

Test(family_seam, batch_catches_a_switch_at_the_declared_threshold) {
    cJSON *rec = gate_case("batchy", "", "[{\"check\":\"batch\",\"impl\":\"scale.batchy@host\"}]", 1, NULL);
    cr_assert_str_eq(kpt_str(rec, "checks.0.result"), "INCORRECT");
    cr_assert_eq(kpt_num(rec, "checks.0.findings.vacuous_probes"), 0);
    /* the full batch (6) truncates; alone (1), the halves (3) and the 4-row probe round, 5 rows truncate */
    const cJSON *probes = kpt_at(rec, "checks.0.findings.probes");
    for (const cJSON *p = probes->child; p; p = p->next) {
        const int64_t batch = (int64_t)kpt_num(p, "batch");
        const int differ = cJSON_GetArraySize(kpt_at(p, "rows_differ"));
        if (batch <= 4) cr_assert(differ > 0, "%s: a probe below the switch must differ", kpt_str(p, "probe"));
        else cr_assert_eq(differ, 0, "%s", kpt_str(p, "probe"));
        if (differ) cr_assert(kpt_num(p, "rows_differ.0.elements.y_bf16.count") > 0, "the bf16 tensor is named");
    }
    cJSON_Delete(rec);
}

Test(family_seam, a_tolerance_config_is_checked_before_anything_runs) {
    struct {
        const char *defaults, *checks, *needle;
    } bad[] = {
        {"\"rtol\":1e-6", "[{\"check\":\"tolerance\",\"impl\":\"candidate\"}]", "checks[0].atol: required"},
        {TOL, "[{\"check\":\"tolerance\",\"impl\":\"candidate\",\"tensors\":{\"z\":{\"atol\":1}}}]", "tensors.z: not an output"},
        {TOL, "[{\"check\":\"tolerance\",\"impl\":\"candidate\",\"ulp\":1.5}]", "checks[0].ulp: 1.5 must be an integer"},
        {TOL, "[{\"check\":\"tolerance\",\"impl\":\"candidate\",\"atol\":-1}]", "checks[0].atol: -1 must be a finite number"},
        {TOL, "[{\"check\":\"rule\",\"impl\":\"candidate\",\"ulps\":-1}]", "checks[0].ulps"},
        {TOL, "[{\"check\":\"tolerance\",\"impl\":\"candidate\",\"band\":1e-6}]", "checks[0].band: unknown field"},
        {TOL, "[{\"check\":\"tolerance\",\"impl\":\"candidate\",\"element_rule\":\"max\"}]",
         "checks[0].element_rule: 'max' is not an element rule"},
        {TOL, "[{\"check\":\"tolerance\",\"impl\":\"candidate\",\"tensors\":{\"y\":{\"round_reference\":1}}}]",
         "checks[0].tensors.y.round_reference: expected true or false"},
        {TOL, "[{\"check\":\"expect\",\"impl\":\"candidate\",\"of\":\"batch\",\"result\":\"INCORRECT\",\"defect\":\"x\"}]",
         "checks[0].defect: 'x' is not a defect family scale knows"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *cfg = config("bad", bad[i].defaults, bad[i].checks);
        kp_config c;
        kp_error err = {0};
        cr_assert_eq(kp_config_load(cfg, &c, &err), KP_EXIT_USAGE, "case %zu loaded", i);
        cr_assert(strstr(err.msg, bad[i].needle), "case %zu: %s", i, err.msg);
        kp_config_free(&c);
    }
}

/* One config, two families: each case's "candidate" is its own family's role, and each receipt names
 * its own family's generator. A role of another family is refused at load, naming both. */
Test(family_seam, one_config_holds_two_families_with_roles_of_their_own) {
    char *path, *body;
    cr_assert(asprintf(&path, "%s/two.json", kpt_dir) > 0);
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"two\",\"impls\":{\"topp.candidate\":\"topp.split_prob@host\","
                       "\"scale.candidate\":\"scale.f32@host\"},\"defaults\":{" TOL ",\"tie_policy\":\"minimal_index\","
                       "\"band\":1e-6},\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=500)\","
                       "\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]},{\"case\":\"" CASE "\",\"checks\":"
                       "[{\"check\":\"tolerance\",\"impl\":\"candidate\"}]}]}") > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    kpt_scratch(path), kpt_scratch(body);
    cJSON *rec;
    char *bundle;
    cr_assert_eq(run(path, "two", &rec, &bundle), 0);
    cr_assert_str_eq(kpt_str(rec, "impls.0.name"), "topp.split_prob@host");
    cr_assert_str_eq(kpt_str(rec, "case.generator.version"), "topp/v1");
    cJSON *rec2 = kpt_receipt(bundle, 2);
    cr_assert_str_eq(kpt_str(rec2, "impls.0.name"), "scale.f32@host");
    cr_assert_str_eq(kpt_str(rec2, "case.generator.version"), "scale/v1");
    cJSON_Delete(rec), cJSON_Delete(rec2);
    /* "candidate" names a scale impl: the topp case cannot use it */
    refused_at_load("bad_role", "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"impls\":{\"candidate\":\"scale.f32@host\"},"
                                "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=500)\",\"checks\":"
                                "[{\"check\":\"exact\",\"impls\":[\"candidate\",\"topp.split_logit@host\"]}]}]}",
                    "impls[0]: impl scale.f32@host is of family scale, the case is topp");
}

/* ------------------------------------------------------------------ generic files name no family */

/* Whether text holds word (case-insensitive) with no letter or digit either side: "topk" in kp_topk_family, not
 * "topp" in "stopped". Sets *line to the first such line. */
static bool names_word(const char *text, const char *word, int *line) {
    const size_t n = strlen(word);
    for (const char *p = text; (p = strcasestr(p, word)); p++) {
        const bool before = p > text && isalnum((unsigned char)p[-1]), after = isalnum((unsigned char)p[n]);
        if (before || after) continue;
        *line = 1;
        for (const char *q = text; q < p; q++) *line += *q == '\n';
        return true;
    }
    return false;
}

/* Every generic source file under root (harness, cases, receipts, reference, kernels outside kernels/host and
 * kernels/cuda), but a family's own files (named <family>_...) and the tables that list the families: the places
 * where one names a family (as its table row spells it, or as prose spells the built-in ones) into found. Returns how
 * many files it read. */
static int scan_generic(const char *root, char *found, size_t size) {
    static const char *const dirs[] = {"harness", "cases", "receipts", "reference", "kernels"};
    static const char *const tables[] = {"harness/families.c", "cases/case_families.c", "kernels/registry.c",
                                         "kernels/kp_registry.h", "kernels/kparity_kernel.h", "receipts/plot_families.c"};
    static const char *const prose[] = {"top-p", "top-k", "MoE", "MLA"};
    const char *words[32];
    int nwords = 0, files = 0;
    /* the built-in families (the test's own, "scale", is a word prose uses) */
    for (int i = 0; i < kp_families.nbuiltin && nwords < 28; i++) words[nwords++] = kp_family_at(i)->name;
    for (size_t i = 0; i < sizeof prose / sizeof *prose; i++) words[nwords++] = prose[i];
    size_t used = 0;
    found[0] = 0;
    for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++) {
        char *dir;
        cr_assert(asprintf(&dir, "%s/%s", root, dirs[d]) > 0);
        DIR *dh = opendir(dir);
        for (struct dirent *e; dh && (e = readdir(dh));) {
            const char *dot = strrchr(e->d_name, '.');
            if (!dot || (strcmp(dot, ".c") && strcmp(dot, ".h"))) continue;
            char rel[300];
            snprintf(rel, sizeof rel, "%s/%s", dirs[d], e->d_name);
            bool skip = false;
            for (size_t t = 0; t < sizeof tables / sizeof *tables; t++) skip |= !strcmp(rel, tables[t]);
            for (int i = 0; i < kp_families.nbuiltin; i++) {
                const char *f = kp_family_at(i)->name;
                skip |= !strncmp(e->d_name, f, strlen(f)) && e->d_name[strlen(f)] == '_';
            }
            if (skip) continue;
            char *path, *text;
            cr_assert(asprintf(&path, "%s/%s", dir, e->d_name) > 0);
            cr_assert_not_null(text = kpt_read(path, NULL), "%s", path);
            files++;
            for (int w = 0; w < nwords; w++) {
                int line;
                if (names_word(text, words[w], &line) && used < size)
                    used += (size_t)snprintf(found + used, size - used, " %s:%d (%s)", rel, line, words[w]);
            }
            free(text), free(path);
        }
        if (dh) closedir(dh);
        free(dir);
    }
    return files;
}

Test(family_seam, no_generic_file_names_a_family) {
    char found[4096];
    const int files = scan_generic(kpt_source_dir(), found, sizeof found);
    cr_assert_gt(files, 40, "the scan read only %d files", files);
    cr_assert_str_eq(found, "", "generic files naming a family:%s", found);
    /* the positive control: a generic file naming a family is caught, a family's own file and a table are not, and a
       family's name inside a word ("stopped") is no name */
    const char *planted[][2] = {{"harness/planted.c", "int a;\n/* the run stopped */\nint b; /* as kp_topk_args */\n"},
                                {"harness/topk_family.c", "/* topk */\n"},
                                {"harness/families.c", "/* topp */\n"}};
    char *root;
    cr_assert(asprintf(&root, "%s/scan", kpt_dir) > 0);
    char *harness_dir;
    cr_assert(asprintf(&harness_dir, "%s/harness", root) > 0);
    cr_assert(mkdir(root, 0700) == 0 && mkdir(harness_dir, 0700) == 0);
    free(harness_dir);
    for (size_t i = 0; i < sizeof planted / sizeof *planted; i++) {
        char *path;
        cr_assert(asprintf(&path, "%s/%s", root, planted[i][0]) > 0);
        cr_assert_eq(kpt_write(path, planted[i][1], strlen(planted[i][1])), 0, "%s", path);
        free(path);
    }
    cr_assert_eq(scan_generic(root, found, sizeof found), 1);
    cr_assert_str_eq(found, " harness/planted.c:3 (topk)");
    free(root);
}

/* ---- the budgets are upper bounds ----------------------------------------------------------------------------- */

/* scale.meter@host: scale.f32@host's run, after noting the heap in use (every glibc arena and mmapped chunk), the most
 * of its runs. It runs last in its case, each time after output_new made the run's output: when the case holds the
 * most at once. */
/* The heap in use: glibc's count, or under AddressSanitizer (whose allocator glibc's mallinfo2 never sees) its own. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KPT_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KPT_ASAN 1
#endif
#ifdef KPT_ASAN
#include <sanitizer/allocator_interface.h>
static size_t heap_in_use(void) { return __sanitizer_get_current_allocated_bytes(); }
#else
static size_t heap_in_use(void) {
    const struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}
#endif

static size_t g_heap_at_run;
static int meter_run(const void *args, char *message, size_t len) {
    const size_t now = heap_in_use();
    if (now > g_heap_at_run) g_heap_at_run = now;
    return kp_impl_find("scale.f32@host")->run(args, message, len);
}
static const kp_impl meter = {KP_ABI_VERSION, "scale", "scale.meter@host", KP_MEMORY_HOST, NULL, NULL, meter_run};

/* The heap the harness held at once while the metered impl ran (its most), and the estimate kp_config_load refused
 * budgets with, for a case of scale with these checks (the meter named last). */
static void metered(const char *name, const char *defaults, const char *checks, size_t *held, size_t *estimate) {
    kp_error err = {0};
    if (!kp_impl_find(meter.name)) cr_assert_eq(kp_impl_register_outside(&meter, "tests/test_family_seam.c", "0", 0, &err), 0);
    char *path, *body;
    cr_assert(asprintf(&path, "%s/%s.json", kpt_dir, name) > 0);
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"%s\",\"impls\":{\"candidate\":\"scale.f32@host\"},"
                       "\"defaults\":{%s},\"cases\":[{\"case\":\"scale(cols=32768,rows=32,seed=5)\",\"checks\":%s}]}",
                       name, defaults, checks) > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    kpt_scratch(path), kpt_scratch(body);
    kp_config cfg;
    cr_assert_eq(kp_config_load(path, &cfg, &err), 0, "%s", err.msg);
    *estimate = cfg.cases[0].host_bytes;
    char *bundle;
    cr_assert(asprintf(&bundle, "%s/%s_bundle", kpt_dir, name) > 0);
    kpt_scratch(bundle);
    kp_run_options opt = {.out_dir = bundle, .quiet = 1, .command = "run"};
    fflush(stdout);
    const size_t before = heap_in_use();
    g_heap_at_run = 0;
    cr_assert_eq(kp_run_config(&cfg, &opt, &err), 0, "%s", err.msg);
    kp_config_free(&cfg);
    cr_assert_gt(g_heap_at_run, before, "scale.meter@host did not run");
    *held = g_heap_at_run - before;
    cr_log_info("%s: held %zu bytes while the last impl ran; estimated %zu", name, *held, *estimate);
    cr_assert_gt(*held, *estimate / 2, "%s held %zu bytes, under half its estimate %zu: the meter misses the case", name,
                 *held, *estimate);
}

/* What the harness allocates for a case (launch.c's layout: inputs and their copy, each impl's slot and its full output
 * kept for the case, a repeat run's output and the pool's, the family's own bytes) stays within the estimate. Six impls'
 * outputs are kept when the sixth repeats (repeat checks: no rule judgements, whose allowance would hide them), so an
 * estimate that forgot the outputs kept per impl (counting only the one run's and the pool's) falls below what is held:
 * planted, 99.9 MB estimated against 115.7 MB held. */
Test(family_seam, the_host_estimate_bounds_what_a_case_holds_at_once) {
    size_t held, estimate;
    metered("outputs", "\"runs\":2",
            "[{\"check\":\"repeat\",\"impl\":\"candidate\"},{\"check\":\"repeat\",\"impl\":\"scale.twin@host\"},"
            "{\"check\":\"repeat\",\"impl\":\"scale.perturb@host\"},{\"check\":\"repeat\",\"impl\":\"scale.nanmove@host\"},"
            "{\"check\":\"repeat\",\"impl\":\"scale.batchy@host\"},{\"check\":\"repeat\",\"impl\":\"scale.meter@host\"}]",
            &held, &estimate);
    cr_assert_leq(held, estimate, "the case held %zu bytes at once, over its estimate %zu", held, estimate);
}

/* The same with the rule's judgements, which the harness keeps per output (rule.c) and the family sizes
 * (kp_shapes.judgement_bytes): five are held when the sixth impl runs, each as large as an output and more, so an
 * estimate that left them out falls below what is held. */
Test(family_seam, the_host_estimate_bounds_the_judgements_kept) {
    size_t held, estimate;
    metered("judged", "\"ulps\":100000",
            "[{\"check\":\"rule\",\"impl\":\"candidate\"},{\"check\":\"rule\",\"impl\":\"scale.twin@host\"},"
            "{\"check\":\"rule\",\"impl\":\"scale.varies@host\"},{\"check\":\"rule\",\"impl\":\"scale.perturb@host\"},"
            "{\"check\":\"rule\",\"impl\":\"scale.batchy@host\"},{\"check\":\"rule\",\"impl\":\"scale.meter@host\"}]",
            &held, &estimate);
    cr_assert_leq(held, estimate, "the case held %zu bytes at once, over its estimate %zu", held, estimate);
}

/* The scale family with its declaration bent: a dimension past any address space, or an output of another stride. */
static int huge_shapes(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err) {
    int rc = kpt_scale_family.shapes(c, extra_rows, s, err);
    s->inputs[0].shape[1] = (int64_t)1 << 62, s->inputs[0].row_stride = (int64_t)1 << 62;
    return rc;
}
static int restrided_shapes(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err) {
    int rc = kpt_scale_family.shapes(c, extra_rows, s, err);
    s->outputs[1].row_stride = s->outputs[1].shape[1] + 1;
    return rc;
}

/* A case spec of CASE with one exact check of f32 and twin, for fam: the scale family with this shapes hook. */
static kp_case_spec bent_case(kp_family *fam, int (*shapes)(const kp_case *, int64_t, kp_shapes *, kp_error *),
                              kp_check_spec *check) {
    *fam = kpt_scale_family;
    fam->shapes = shapes;
    kp_case_spec cs = {.fam = fam, .checks = check, .nchecks = 1};
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(CASE, &cs.c, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_case_normalize(&cs.c, &err), 0, "%s", err.msg);
    *check = (kp_check_spec){.kind = KP_CHECK_EXACT, .nimpl = 2,
                             .impl = {kp_impl_find("scale.f32@host"), kp_impl_find("scale.twin@host")}};
    return cs;
}

Test(family_seam, an_estimate_past_the_address_space_is_refused) {
    kp_family fam;
    kp_check_spec check;
    const kp_case_spec cs = bent_case(&fam, huge_shapes, &check);
    kp_case_bytes est;
    kp_error err = {0};
    cr_assert_eq(kp_launch_estimate(&cs, 0, &est, &err), KP_EXIT_USAGE);
    cr_assert(strstr(err.msg, "overflow the address space"), "%s", err.msg);
    fam.shapes = kpt_scale_family.shapes; /* the control: the declaration as it is */
    cr_assert_eq(kp_launch_estimate(&cs, 0, &est, &err), 0, "%s", err.msg);
    cr_assert_gt(est.host, 0);
}

/* The estimate is only as good as the declaration: the inputs and state are allocated from it (prepare cannot make
 * others), and a family whose shapes hook declares other outputs than its outputs hook gives is a programmer error:
 * kp_prepare stops on the first case it prepares. */
Test(family_seam, a_declaration_that_prepare_does_not_keep_to_stops_kparity, .signal = SIGABRT) {
    kp_family fam;
    kp_check_spec check;
    const kp_case_spec cs = bent_case(&fam, restrided_shapes, &check);
    kp_prepared p;
    kp_error err = {0};
    kp_prepare(&fam, &cs.c, 0, &p, &err);
}

Test(family_seam, a_declaration_that_prepare_keeps_to_prepares) { /* the control of the one above */
    kp_family fam;
    kp_check_spec check;
    const kp_case_spec cs = bent_case(&fam, kpt_scale_family.shapes, &check);
    kp_prepared p;
    kp_error err = {0};
    cr_assert_eq(kp_prepare(&fam, &cs.c, 5, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(p.v.rows_total, 11);
    kp_prepared_release(&p);
}
