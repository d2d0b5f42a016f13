/* test_harness.c: the gate end to end through the kparity binary, with planted defects from a test
 * plugin: each check must catch the defect it exists for, and a clean impl must pass. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_tensor.h"
#include "../harness/kp_checks.h"
#include "kp_test_util.h"

TestSuite(harness, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 300);

/* Build the defect plugin with one -D flag (or none) and a name; returns its path. */
static char *plugin(const char *flag, const char *name) {
    char *so, *src, *inc, *def;
    cr_assert(asprintf(&so, "%s/%s.so", kpt_dir, name) > 0);
    cr_assert(asprintf(&src, "%s/tests/fixtures/plugin_topp_defects.c", kpt_source_dir()) > 0);
    cr_assert(asprintf(&inc, "-I%s/kernels", kpt_source_dir()) > 0);
    cr_assert(asprintf(&def, "-DKPT_NAME=\"%s\"", name) > 0);
    char *argv[] = {"/usr/bin/cc", "-shared", "-fPIC", "-O1", inc, def, (char *)(flag ? flag : "-DKPT_CLEAN"), "-o", so, src,
                    "-lm", NULL};
    char *out, *err;
    int rc = kpt_run(argv, &out, &err);
    cr_assert_eq(rc, 0, "building the plugin failed: %s", err);
    free(out), free(err), free(src), free(inc), free(def);
    return kpt_scratch(so);
}

static char *write_config(const char *name, const char *body) {
    char *path;
    cr_assert(asprintf(&path, "%s/%s.json", kpt_dir, name) > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    return kpt_scratch(path);
}

/* A config with one plugin impl as "candidate" and the given checks on a small ordinary case. */
static char *config_for(const char *so, const char *impl, const char *checks, const char *cases) {
    char *body;
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"plugins\":[{\"path\":\"%s\"}],"
                       "\"impls\":{\"incumbent\":\"topp.split_logit@host\",\"candidate\":\"%s\"},"
                       "\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6,\"runs\":4},"
                       "\"cases\":[%s]}",
                       so, impl,
                       cases ? cases : "{\"case\":\"topp(batch=12,profile=flat,seed=3,stride=2053,top_p=0.9,vocab=2048)\",\"checks\":CHECKS}") > 0);
    char *full = NULL;
    const char *at = strstr(body, "CHECKS");
    if (at) {
        cr_assert(asprintf(&full, "%.*s%s%s", (int)(at - body), body, checks, at + 6) > 0);
        free(body);
        body = full;
    }
    char *path = write_config(impl, body);
    free(body);
    return path;
}

/* The gate's exit code; what it printed is scratch (kpt_scratch). */
static int gate(const char *config, const char *out, char **stdout_text, char **stderr_text) {
    int rc = kpt_gate(config, out, stdout_text, stderr_text);
    kpt_scratch(*stdout_text), kpt_scratch(*stderr_text);
    return rc;
}




static char *bundle_path(const char *name) {
    char *p;
    cr_assert(asprintf(&p, "%s/%s", kpt_dir, name) > 0);
    return kpt_scratch(p);
}

/* The gate on a defect plugin (built with `define`) as the candidate, one check on the default
 * case; asserts the exit code and returns case 1's receipt. */
static cJSON *gate_one_check(const char *define, const char *impl, const char *check, const char *tag, int want_rc) {
    char *checks;
    cr_assert(asprintf(&checks, "[{\"check\":\"%s\",\"impl\":\"candidate\"}]", check) > 0);
    char *so = plugin(define, impl), *cfg = config_for(so, impl, checks, NULL);
    char *out = bundle_path(tag), *o, *e;
    cr_assert_eq(gate(cfg, out, &o, &e), want_rc, "%s%s", o, e);
    free(checks);
    return kpt_receipt(out, 1);
}

#define CHECKS_ALL "[{\"check\":\"rule\",\"impl\":\"candidate\"},{\"check\":\"repeat\",\"impl\":\"candidate\"},{\"check\":\"batch\",\"impl\":\"candidate\"}]"

Test(harness, clean_impl_passes_every_check_and_the_bundle_verifies) {
    char *so = plugin(NULL, "topp.sorted@host"), *cfg = config_for(so, "topp.sorted@host", CHECKS_ALL, NULL);
    char *out = bundle_path("clean"), *o, *e;
    int rc = gate(cfg, out, &o, &e);
    cr_assert_eq(rc, 0, "exit %d\n%s\n%s", rc, o, e);
    cJSON *rec = kpt_receipt(out, 1);
    cr_assert_str_eq(kpt_str(rec, "result"), "PASSED");
    for (int k = 0; k < 3; k++) cr_assert_str_eq(kpt_str(kpt_check(rec, k), "result"), "PASSED", "check %d", k);
    char *argv[] = {kpt_binary(), "verify", out, "--replay", NULL};
    cr_assert_eq(kpt_run(argv, NULL, NULL), 0);
    cJSON_Delete(rec);
}

Test(harness, rule_catches_one_dropped_token_and_names_it) {
    cJSON *rec = gate_one_check("-DKPT_FLIP_ONE", "topp.flip@host", "rule", "flip", 1);
    const cJSON *chk = kpt_check(rec, 0);
    cr_assert_str_eq(kpt_str(chk, "result"), "INCORRECT");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(chk, "findings");
    cr_assert_eq(kpt_num(f, "strict"), 12, "one strict index per row");
    cr_assert_eq(kpt_num(f, "rows_meeting_rule"), 0);
    cJSON_Delete(rec);
}

Test(harness, exact_names_differing_rows_and_who_meets_the_rule) {
    char *clean = plugin(NULL, "topp.sorted@host"), *flip = plugin("-DKPT_FLIP_ONE", "topp.flip@host");
    char *body;
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"plugins\":[{\"path\":\"%s\"},{\"path\":\"%s\"}],"
                       "\"impls\":{\"incumbent\":\"topp.flip@host\",\"candidate\":\"topp.sorted@host\"},"
                       "\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6},"
                       "\"cases\":[{\"case\":\"topp(batch=3,profile=ordinary,seed=3,top_p=0.9,vocab=4096)\","
                       "\"checks\":[{\"check\":\"exact\",\"impls\":[\"incumbent\",\"candidate\"]}]}]}",
                       clean, flip) > 0);
    char *cfg = write_config("exact", body), *out = bundle_path("exact"), *o, *e;
    cr_assert_eq(gate(cfg, out, &o, &e), 1, "%s%s", o, e);
    cJSON *rec = kpt_receipt(out, 1);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(kpt_check(rec, 0), "findings");
    cr_assert_eq(kpt_num(f, "rows_differ"), 3);
    cr_assert_eq(kpt_num(f, "elements_differ"), 3);
    const cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(f, "per_row"), 0);
    cr_assert_str_eq(kpt_str(row, "meets_rule"), "topp.sorted@host");
    const cJSON *flip_row = cJSON_GetObjectItemCaseSensitive(row, "topp.flip@host");
    cr_assert_not_null(flip_row);
    cr_assert_eq(kpt_num(cJSON_GetObjectItemCaseSensitive(flip_row, "strict"), "count"), 1);
    cJSON_Delete(rec);
    free(body);
}

Test(harness, repeat_catches_run_to_run_variation) {
    cJSON *rec = gate_one_check("-DKPT_RUN_VARIES", "topp.varies@host", "repeat", "repeat", 1);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(kpt_check(rec, 0), "findings");
    cr_assert_eq(kpt_num(f, "distinct_outputs"), 4);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(f, "rows_varying")), 12);
    cJSON_Delete(rec);
}

Test(harness, batch_catches_batch_dependence) {
    cJSON *rec = gate_one_check("-DKPT_BATCH_VARIES", "topp.batchy@host", "batch", "batch", 1);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(kpt_check(rec, 0), "findings");
    /* the full batch (12) and the 63-, 64- and 65-row probes drop a token; alone (1) and the halves (6) do not */
    cr_assert_eq(kpt_num(f, "row_differences"), 12 + 12);
    cr_assert_eq(kpt_num(f, "vacuous_probes"), 0);
    cJSON_Delete(rec);
}

Test(harness, guard_regions_catch_an_out_of_bounds_write) {
    cJSON *rec = gate_one_check("-DKPT_OOB", "topp.oob@host", "rule", "oob", 3);
    cr_assert_str_eq(kpt_str(kpt_check(rec, 0), "result"), "FAILED");
    cr_assert(strstr(kpt_str(kpt_check(rec, 0), "summary"), "guard region after buffer 'out'"), "%s", kpt_str(kpt_check(rec, 0), "summary"));
    cJSON_Delete(rec);
}

Test(harness, a_write_into_row_padding_fails_the_case) {
    cJSON *rec = gate_one_check("-DKPT_PAD", "topp.pad@host", "rule", "pad", 3);
    cr_assert(strstr(kpt_str(kpt_check(rec, 0), "summary"), "row padding"), "%s", kpt_str(kpt_check(rec, 0), "summary"));
    cJSON_Delete(rec);
}

Test(harness, expect_reports_loudly_when_a_known_defect_does_not_reproduce) {
    char *so = plugin(NULL, "topp.sorted@host");
    const char *cases = "{\"case\":\"topp(batch=2,force_token=5,force_value=1e9,profile=forced,seed=1,top_p=0.95,vocab=1000)\","
                        "\"checks\":[{\"check\":\"expect\",\"impl\":\"candidate\",\"of\":\"rule\",\"result\":\"INCORRECT\","
                        "\"defect\":\"all_neginf\"},{\"check\":\"expect\",\"impl\":\"incumbent\",\"of\":\"rule\","
                        "\"result\":\"INCORRECT\",\"defect\":\"all_neginf\"}]}";
    char *cfg = config_for(so, "topp.sorted@host", NULL, cases);
    char *out = bundle_path("expect"), *o, *e;
    cr_assert_eq(gate(cfg, out, &o, &e), 1, "%s%s", o, e);
    cr_assert(strstr(e, "KNOWN DEFECT DID NOT REPRODUCE"), "%s", e);
    cJSON *rec = kpt_receipt(out, 1);
    cr_assert_str_eq(kpt_str(kpt_check(rec, 0), "result"), "INCORRECT");
    cr_assert_str_eq(kpt_str(kpt_check(rec, 1), "result"), "PASSED", "the real incumbent does mask every forced row");
    cJSON_Delete(rec);
}

/* The defect matcher's negative control: flip drops one kept token per row, so its rule check is INCORRECT, but
 * every row keeps finite tokens: expecting all_neginf of it is a defect that did not reproduce (INCORRECT, loudly,
 * naming the defect), though expecting INCORRECT alone of it holds. The positive control: the incumbent on a forced
 * case masks every row, all_neginf on 2/2. */
Test(harness, expect_of_a_defect_the_incorrect_result_does_not_show_did_not_reproduce) {
    char *so = plugin("-DKPT_FLIP_ONE", "topp.flip@host");
    const char *cases =
        "{\"case\":\"topp(batch=12,profile=flat,seed=3,stride=2053,top_p=0.9,vocab=2048)\",\"checks\":["
        "{\"check\":\"expect\",\"impl\":\"candidate\",\"of\":\"rule\",\"result\":\"INCORRECT\",\"defect\":\"all_neginf\"},"
        "{\"check\":\"expect\",\"impl\":\"candidate\",\"of\":\"rule\",\"result\":\"INCORRECT\"}]},"
        "{\"case\":\"topp(batch=2,force_token=5,force_value=1e9,profile=forced,seed=1,top_p=0.95,vocab=1000)\",\"checks\":"
        "[{\"check\":\"expect\",\"impl\":\"incumbent\",\"of\":\"rule\",\"result\":\"INCORRECT\",\"defect\":\"all_neginf\"}]}";
    char *cfg = config_for(so, "topp.flip@host", NULL, cases);
    char *out = bundle_path("defect"), *o, *e;
    cr_assert_eq(gate(cfg, out, &o, &e), 1, "%s%s", o, e);
    cr_assert(strstr(e, "KNOWN DEFECT DID NOT REPRODUCE: rule topp.flip@host was INCORRECT; defect all_neginf"), "%s", e);
    cJSON *rec = kpt_receipt(out, 1), *rec2 = kpt_receipt(out, 2);
    const cJSON *named = kpt_check(rec, 0), *plain = kpt_check(rec, 1), *control = kpt_check(rec2, 0);
    cr_assert_str_eq(kpt_str(cJSON_GetObjectItemCaseSensitive(named, "inner"), "result"), "INCORRECT", "flip breaks the rule");
    cr_assert_str_eq(kpt_str(named, "result"), "INCORRECT", "%s", kpt_str(named, "summary"));
    cr_assert(strstr(kpt_str(named, "summary"), "DID NOT REPRODUCE"), "%s", kpt_str(named, "summary"));
    cr_assert_eq(kpt_num(cJSON_GetObjectItemCaseSensitive(named, "findings"), "rows_with_defect"), 0);
    cr_assert_str_eq(kpt_str(plain, "result"), "PASSED", "%s", kpt_str(plain, "summary"));
    cr_assert_str_eq(kpt_str(control, "result"), "PASSED", "%s", kpt_str(control, "summary"));
    cr_assert(strstr(kpt_str(control, "summary"), "known defect reproduced: all_neginf on 2/2 rows"), "%s", kpt_str(control, "summary"));
    cr_assert_eq(kpt_num(cJSON_GetObjectItemCaseSensitive(control, "findings"), "rows_with_defect"), 2);
    cJSON_Delete(rec), cJSON_Delete(rec2);
}

Test(harness, gate_execs_the_command_only_when_it_passes) {
    char *good = plugin(NULL, "topp.sorted@host"), *bad = plugin("-DKPT_FLIP_ONE", "topp.flip@host");
    const char *checks = "[{\"check\":\"rule\",\"impl\":\"candidate\"}]";
    char *cfg_good = config_for(good, "topp.sorted@host", checks, NULL), *cfg_bad = config_for(bad, "topp.flip@host", checks, NULL);
    char *out1 = bundle_path("exec1"), *out2 = bundle_path("exec2"), *o, *e;
    char *argv1[] = {kpt_binary(), "gate", "--config", cfg_good, "--out", out1, "--quiet", "--", "/bin/echo", "serving-started", NULL};
    cr_assert_eq(kpt_run(argv1, &o, &e), 0, "%s", e);
    kpt_scratch(o), kpt_scratch(e);
    cr_assert(strstr(o, "serving-started"), "%s", o);
    char *argv2[] = {kpt_binary(), "gate", "--config", cfg_bad, "--out", out2, "--quiet", "--", "/bin/echo", "serving-started", NULL};
    cr_assert_eq(kpt_run(argv2, &o, &e), 1);
    kpt_scratch(o), kpt_scratch(e);
    cr_assert_null(strstr(o, "serving-started"), "the command ran although the gate failed");
    cr_assert(strstr(e, "not starting"), "%s", e);
}

Test(harness, a_timeout_exits_4_with_a_verifiable_bundle) {
    char *so = plugin(NULL, "topp.sorted@host");
    const char *cases = "{\"case\":\"topp(batch=4,profile=ordinary,seed=1,top_p=0.9,vocab=20000)\",\"checks\":[{\"check\":\"repeat\",\"impl\":\"candidate\",\"runs\":50}]},"
                        "{\"case\":\"topp(batch=4,profile=ordinary,seed=2,top_p=0.9,vocab=20000)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]}";
    char *cfg = config_for(so, "topp.sorted@host", NULL, cases);
    char *out = bundle_path("timeout"), *o, *e;
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--out", out, "--timeout", "0.01", "--quiet", NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 4, "%s%s", o, e);
    kpt_scratch(o), kpt_scratch(e);
    cJSON *rec = kpt_receipt(out, 2);
    cr_assert_str_eq(kpt_str(rec, "result"), "NOT_RUN");
    char *vargv[] = {kpt_binary(), "verify", out, NULL};
    cr_assert_eq(kpt_run(vargv, NULL, NULL), 0);
    /* the NOT_RUN case never got inputs: --replay lists it as not replayed (not an error, never silent) */
    char *rargv[] = {kpt_binary(), "verify", out, "--replay", NULL};
    cr_assert_eq(kpt_run(rargv, &o, &e), 0, "%s%s", o, e);
    kpt_scratch(o), kpt_scratch(e);
    cr_assert(strstr(o, "not replayed, ") && strstr(o, "\nreceipts/0002.json (topp(batch=4,profile=ordinary,seed=2,top_p=0.9,"
                                                         "vocab=20000)): NOT_RUN\n"), "%s", o);
    cJSON_Delete(rec);
}

Test(harness, the_watchdog_ends_a_hung_case_as_failed_and_keeps_the_bundle_intact) {
    char *so = plugin("-DKPT_HANG", "topp.hang@host");
    const char *cases = "{\"case\":\"topp(batch=2,profile=flat,seed=1,top_p=0.9,vocab=100)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
                        "{\"case\":\"topp(batch=2,profile=flat,seed=2,top_p=0.9,vocab=100)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]}";
    char *cfg = config_for(so, "topp.hang@host", NULL, cases);
    char *out = bundle_path("hang"), *o, *e;
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--out", out, "--timeout", "1", "--quiet", "--", "/bin/echo", "started", NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 4, "%s%s", o, e);
    kpt_scratch(o), kpt_scratch(e);
    cr_assert_null(strstr(o, "started"));
    cJSON *rec = kpt_receipt(out, 1);
    cr_assert_str_eq(kpt_str(rec, "result"), "FAILED");
    const cJSON *reason = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(rec, "reasons"), 0);
    cr_assert(cJSON_IsString(reason) && strstr(reason->valuestring, "timeout"), "%s", cJSON_IsString(reason) ? reason->valuestring : "");
    cJSON *rec2 = kpt_receipt(out, 2);
    cr_assert_str_eq(kpt_str(rec2, "result"), "NOT_RUN");
    char *vargv[] = {kpt_binary(), "verify", out, NULL};
    cr_assert_eq(kpt_run(vargv, NULL, &e), 0, "%s", e);
    free(e);
    cJSON_Delete(rec), cJSON_Delete(rec2);
}

/* A probe that keeps every row at its place in a batch of the same size tests nothing. */
Test(harness, a_batch_probe_that_moves_no_row_is_vacuous) {
    kp_case_spec cs = {.fam = kp_family_find("topp")};
    kp_error err = {0};
    cr_assert_eq(kp_case_parse("topp(batch=4,profile=ordinary,seed=1,top_p=0.9,vocab=512)", &cs.c, &err), 0);
    cr_assert_eq(kp_case_normalize(&cs.c, &err), 0);
    kp_case_format(&cs.c, cs.name, sizeof cs.name);
    kp_evidence ev = {.artifacts = cJSON_CreateArray(), .inline_limit = 16};
    cJSON *rec = cJSON_CreateObject();
    kp_case_ctx ctx;
    cr_assert_eq(kp_case_ctx_open(&ctx, &cs, &ev, rec, &err), 0, "%s", err.msg);
    int64_t rows[4] = {0, 1, 2, 3};
    kp_output *full = NULL;
    cr_assert_eq(kp_run_rows(&ctx.prep, &kp_topp_split_prob_host, rows, 4, &full, NULL, &err), KP_PASSED);
    cJSON *probes = cJSON_CreateArray();
    kp_probe_result pr;
    cr_assert_eq(kp_batch_probe(&ctx, &kp_topp_split_prob_host, full, "identity", rows, 4, 1, probes, &pr), KP_PASSED);
    cr_assert(pr.vacuous, "an identity probe must be reported vacuous");
    int64_t reversed[4] = {3, 2, 1, 0};
    cr_assert_eq(kp_batch_probe(&ctx, &kp_topp_split_prob_host, full, "reversed", reversed, 4, 1, probes, &pr), KP_PASSED);
    cr_assert(!pr.vacuous && pr.rows_moved == 4 && pr.rows_differ == 0);
    /* a probe that must move more rows than it can (the whole-batch probe asks for a tenth) is vacuous too */
    cr_assert_eq(kp_batch_probe(&ctx, &kp_topp_split_prob_host, full, "reversed", reversed, 4, 5, probes, &pr), KP_PASSED);
    cr_assert(pr.vacuous && pr.rows_moved == 4, "a probe that moved 4 of the 5 rows it must move was not vacuous");
    kp_output_free(full);
    kp_case_ctx_close(&ctx);
    cJSON_Delete(rec), cJSON_Delete(probes), cJSON_Delete(ev.artifacts);
}

/* Receipts' digests are hashed on worker threads (kp_digest_start) and land at settle: the same hex as
 * hashing the same bytes directly, in the caller's buffer and in every JSON place recorded for it,
 * before or after settle; never a hex-looking placeholder before. 40 at once (the registry grows),
 * of 0.24 to 1.7 MB (below and above KP_SHA256_JOB_THREAD_BYTES: inline and threaded jobs). */
Test(harness, worker_digests_match_direct_ones_and_land_where_recorded) {
    enum { N = 40, COLS = 60000, ROWS = 7, STRIDE = 60001 };
    cr_assert((size_t)COLS * 4 < KP_SHA256_JOB_THREAD_BYTES && (size_t)ROWS * COLS * 4 > KP_SHA256_JOB_THREAD_BYTES);
    float *buf = malloc(sizeof *buf * ROWS * STRIDE);
    cr_assert(buf);
    for (int i = 0; i < ROWS * STRIDE; i++) buf[i] = (float)((i * 2654435761u) % 1000003u) * 0.5f;
    static char direct[N][KP_SHA256_HEX_LEN], later[N][KP_SHA256_HEX_LEN];
    cJSON *obj = cJSON_CreateObject(), *again = cJSON_CreateObject();
    for (int k = 0; k < N; k++) { /* digest k: the buffer's first k + 1 rows, as a tensor */
        const int64_t shape[2] = {k % ROWS + 1, COLS};
        kp_buffer_digest(KP_F32, 2, shape, STRIDE, buf, direct[k]);
        unsigned char prefix[KP_TENSOR_PREFIX_MAX];
        kp_span *rows;
        size_t nrows;
        const size_t n = kp_buffer_digest_parts(KP_F32, 2, shape, STRIDE, buf, prefix, &rows, &nrows);
        char key[16];
        snprintf(key, sizeof key, "d%d", k);
        kp_digest_start(prefix, n, rows, nrows, later[k], obj, key);
        free(rows);
        kp_digest_record(again, key, later[k]); /* a second place, recorded while pending */
        const char *now = cJSON_GetObjectItemCaseSensitive(obj, key)->valuestring;
        cr_assert(strlen(now) != 64, "a pending digest reads like a digest: %s", now);
    }
    kp_digests_settle();
    for (int k = 0; k < N; k++) {
        char key[16];
        snprintf(key, sizeof key, "d%d", k);
        cr_assert_str_eq(later[k], direct[k], "digest %d in the caller's buffer", k);
        cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(obj, key)->valuestring, direct[k], "digest %d in its place", k);
        cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(again, key)->valuestring, direct[k], "digest %d, second place", k);
    }
    cJSON *after = cJSON_CreateObject(); /* recorded after settle: the hex at once */
    kp_digest_record(after, "d0", later[0]);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(after, "d0")->valuestring, direct[0]);
    /* the same bytes through kp_sha256 directly, in one span */
    char one[KP_SHA256_HEX_LEN], split[KP_SHA256_HEX_LEN];
    kp_sha256_hex(buf, sizeof *buf * ROWS * STRIDE, one);
    const kp_span parts[1] = {{buf + 11, sizeof *buf * (ROWS * STRIDE - 11)}};
    kp_digest_start(buf, sizeof *buf * 11, parts, 1, split, NULL, NULL);
    kp_digests_settle();
    cr_assert_str_eq(split, one, "a prefix and a span hash as the bytes they join");
    cJSON_Delete(obj), cJSON_Delete(again), cJSON_Delete(after);
    free(buf);
}

/* Freeing or reusing a buffer waits only for the digests that read it (kp_digests_settle_reading): a digest of that
 * buffer is complete, with the bytes it had, before the caller overwrites them; a digest of another buffer is still
 * pending (a large input goes on hashing while the case's outputs come and go). */
Test(harness, settling_a_buffer_waits_for_its_digests_alone) {
    enum { BYTES = 64 << 20 };
    cr_assert(BYTES > KP_SHA256_JOB_THREAD_BYTES);
    unsigned char *a = malloc(BYTES), *b = malloc(BYTES);
    cr_assert(a && b);
    for (size_t i = 0; i < BYTES; i++) a[i] = (unsigned char)(i * 31u), b[i] = (unsigned char)(i * 7u + 1);
    char want_a[KP_SHA256_HEX_LEN], want_b[KP_SHA256_HEX_LEN], got_a[KP_SHA256_HEX_LEN], got_b[KP_SHA256_HEX_LEN];
    kp_sha256_hex(a, BYTES, want_a);
    kp_sha256_hex(b, BYTES, want_b);
    cJSON *obj = cJSON_CreateObject();
    const kp_span sa[2] = {{a, BYTES / 2}, {a + BYTES / 2, BYTES / 2}}, sb[1] = {{b, BYTES}};
    kp_digest_start(NULL, 0, sb, 1, got_b, obj, "b"); /* many times a's work: still going when a is settled */
    kp_digest_start(NULL, 0, sb, 1, NULL, obj, "b2");
    kp_digest_start(NULL, 0, sb, 1, NULL, obj, "b3");
    kp_digest_start(NULL, 0, sa, 2, got_a, obj, "a");
    kp_digests_settle_reading(a + BYTES - 1, 1); /* its last byte: the digest reading it is done */
    cr_assert_str_eq(got_a, want_a);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(obj, "a")->valuestring, want_a);
    memset(a, 0, BYTES); /* the caller reuses it */
    cr_assert(strlen(cJSON_GetObjectItemCaseSensitive(obj, "b3")->valuestring) != 64, "b's digests were waited for too");
    kp_digests_settle_reading(a, BYTES); /* nothing left reads it: nothing waited for */
    cr_assert(strlen(cJSON_GetObjectItemCaseSensitive(obj, "b3")->valuestring) != 64);
    kp_digests_settle();
    cr_assert_str_eq(got_b, want_b);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(obj, "b3")->valuestring, want_b);
    cJSON_Delete(obj);
    free(a), free(b);
}

/* A digest of spans in separate allocations reads those, not what lies between them: freeing a block allocated
 * between two tensors (a run's fresh output) must not wait for it. Before, one range from the lowest span to the
 * highest took in the middle, and a cold gate's runs waited there for the inputs' digests. */
Test(harness, settling_memory_between_a_digests_spans_does_not_wait_for_it) {
    enum { PART = 8 << 20 };
    unsigned char *m = malloc(3 * (size_t)PART);
    cr_assert_not_null(m);
    for (size_t i = 0; i < 3 * (size_t)PART; i++) m[i] = (unsigned char)(i * 13u);
    cJSON *obj = cJSON_CreateObject();
    const kp_span s[2] = {{m, PART}, {m + 2 * (size_t)PART, PART}};
    kp_digest_start(NULL, 0, s, 2, NULL, obj, "d");
    kp_digests_settle_reading(m + PART, PART); /* between the spans */
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(obj, "d")->valuestring, "(digest pending)", "settled for memory it never reads");
    kp_digests_settle_reading(m + 3 * (size_t)PART - 1, 1); /* the second span's last byte */
    cr_assert_eq(strlen(cJSON_GetObjectItemCaseSensitive(obj, "d")->valuestring), 64);
    cJSON_Delete(obj);
    free(m);
}
