/* test_cli.c: the command line on bad input (exit 2, naming the field or path, never a crash),
 * verify on tampered bundles (exit 1, naming the file), verify --replay on forged receipts (exit 1, naming
 * the case and the digest that does not regenerate), list and export, bench's case selection and its rows printed
 * as they finish. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "../cases/kp_sha256.h"
#include "../harness/kp_harness.h"
#include "../receipts/kp_bundle.h"
#include "../receipts/kp_json.h"
#include "../receipts/kp_verify.h"
#include "kp_test_util.h"

TestSuite(cli, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 300);

static const char *good_case = "topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=300)";

/* A config whose one case is `case_json` (an object) with `extra` members spliced in at the top. */
static char *config(const char *name, const char *text) {
    char *path;
    cr_assert(asprintf(&path, "%s/%s.json", kpt_dir, name) > 0);
    cr_assert_eq(kpt_write(path, text, strlen(text)), 0);
    return path;
}

/* kpt_run, with what it printed kept as scratch (kpt_scratch) for the test's assertions. */
static int run_cli(char *const argv[], char **out, char **err) {
    int rc = kpt_run(argv, out, err);
    kpt_scratch(*out), kpt_scratch(*err);
    return rc;
}

static void expect_usage(const char *text, const char *needle) {
    char *cfg = config("bad", text), *out, *err, *bundle;
    cr_assert(asprintf(&bundle, "%s/never", kpt_dir) > 0);
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--out", bundle, "--quiet", NULL};
    int rc = kpt_run(argv, &out, &err);
    cr_assert_eq(rc, 2, "exit %d for %s\n%s", rc, text, err);
    cr_assert(strstr(err, needle), "message does not name '%s': %s", needle, err);
    struct stat st;
    cr_assert_neq(stat(bundle, &st), 0, "a config error must not leave a bundle");
    free(cfg), free(out), free(err), free(bundle);
}

#define HEAD "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"impls\":{\"candidate\":\"topp.split_prob@host\"},"
#define RULE "[{\"check\":\"rule\",\"impl\":\"candidate\",\"tie_policy\":\"minimal_index\",\"band\":1e-6}]"

Test(cli, bad_configs_exit_2_naming_the_field) {
    expect_usage("{\"schema\": \"kparity.gate/v1\", \"name\": ", "malformed JSON");
    expect_usage(HEAD "\"cases\":[{\"case\":\"nosuch(batch=1)\",\"checks\":" RULE "}]}", "'nosuch' is unknown");
    expect_usage(HEAD "\"cases\":[{\"family\":\"nosuch\",\"params\":{},\"checks\":" RULE "}]}", "cases[0].family");
    expect_usage("{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"impls\":{\"candidate\":\"topp.magic@host\"},\"cases\":[]}",
                 "impls.candidate: impl 'topp.magic@host' is unknown");
    expect_usage(HEAD "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=300)\",\"checks\":"
                      "[{\"check\":\"fuzzy\",\"impl\":\"candidate\"}]}]}", "cases[0].checks[0].check");
    expect_usage(HEAD "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=300)\",\"checks\":"
                      "[{\"check\":\"rule\",\"impl\":\"candidate\",\"band\":1e-6}]}]}", "cases[0].checks[0].tie_policy");
    expect_usage(HEAD "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=300)\",\"checks\":"
                      "[{\"check\":\"rule\",\"impl\":\"candidate\",\"tie_policy\":\"minimal_index\",\"band\":\"small\"}]}]}",
                 "cases[0].checks[0].band: expected a number");
    expect_usage(HEAD "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=0)\",\"checks\":" RULE "}]}",
                 "'vocab'");
    expect_usage(HEAD "\"cases\":[{\"family\":\"topp\",\"params\":{\"batch\":1099511627776,\"profile\":\"ordinary\",\"seed\":1,"
                      "\"top_p\":0.9,\"vocab\":300},\"checks\":" RULE "}]}", "'batch'");
    expect_usage(HEAD "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=-0.5,vocab=300)\",\"checks\":" RULE "}]}",
                 "'top_p'");
    expect_usage(HEAD "\"cases\":[{\"family\":\"topp\",\"params\":{\"batch\":2,\"profile\":\"ordinary\",\"seed\":1,\"top_p\":\"nan\","
                      "\"vocab\":300},\"checks\":" RULE "}]}", "'top_p'");
    expect_usage(HEAD "\"cases\":[{\"family\":\"topp\",\"params\":{\"batch\":2,\"profile\":\"ordinary\",\"seed\":1,\"top_p\":0.9,"
                      "\"vocab\":[300]},\"checks\":" RULE "}]}", "cases[0].params.vocab");
    expect_usage(HEAD "\"cases\":[{\"family\":\"topp\",\"params\":{\"batch\":2,\"profile\":\"ordinary\",\"seed\":1,\"top_p\":0.9},"
                      "\"checks\":" RULE "}]}", "'vocab' is required");
    expect_usage(HEAD "\"budget\":{\"host_bytes\":1048576},\"cases\":[{\"case\":\"topp(batch=64,profile=ordinary,seed=1,top_p=0.9,"
                      "vocab=154856)\",\"checks\":" RULE "}]}", "over the budget");
    /* found by fuzz/fuzz_config.c: a budget past 2^64 was converted to an integer (undefined; UBSan stops there) */
    expect_usage(HEAD "\"budget\":{\"host_bytes\":8.58993e101},\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,"
                      "top_p=0.9,vocab=300)\",\"checks\":" RULE "}]}", "budget.host_bytes: 8.58993e+101 is past 2^64 bytes");
    expect_usage(HEAD "\"budget\":{\"device_bytes\":1.8446744073709552e19},\"cases\":[{\"case\":\"topp(batch=2,"
                      "profile=ordinary,seed=1,top_p=0.9,vocab=300)\",\"checks\":" RULE "}]}", "budget.device_bytes");
    expect_usage(HEAD "\"colour\":1,\"cases\":[]}", "'colour' is unknown");
    expect_usage("[1,2]", "top level must be an object");
}

/* A case's host estimate is the line its budget is drawn at: a budget of exactly the estimate runs the case, one byte
 * less refuses it at load, naming the case and the field, before anything is allocated (exit 2, no bundle). The
 * estimate is read the way kparity reads it (kp_config_load in this process: topp's host impls and a batch check,
 * so the probes' filler rows, every impl's output and slot, and the pool are in it). */
Test(cli, a_budget_at_the_host_estimate_runs_and_one_byte_less_is_refused) {
    const char *cases = "\"cases\":[{\"case\":\"topp(batch=4,profile=ordinary,seed=1,top_p=0.9,vocab=65536)\",\"checks\":["
                        "{\"check\":\"exact\",\"impls\":[\"candidate\",\"topp.split_logit@host\"]},"
                        "{\"check\":\"batch\",\"impl\":\"candidate\"}]}]}";
    char *text;
    cr_assert(asprintf(&text, HEAD "%s", cases) > 0);
    kp_config cfg;
    kp_error kerr = {0};
    cr_assert_eq(kp_config_load(kpt_scratch(config("estimate", text)), &cfg, &kerr), 0, "%s", kerr.msg);
    const size_t estimate = cfg.cases[0].host_bytes;
    kp_config_free(&cfg);
    free(text);
    cr_assert_gt(estimate, (size_t)1 << 20, "budgets start at 1 MiB");
    for (int below = 0; below < 2; below++) {
        cr_assert(asprintf(&text, HEAD "\"budget\":{\"host_bytes\":%zu},%s", estimate - (size_t)below, cases) > 0);
        char *cfg_path = kpt_scratch(config(below ? "below" : "at", text)), *bundle, *out, *err;
        cr_assert(asprintf(&bundle, "%s/%s", kpt_dir, below ? "below_bundle" : "at_bundle") > 0);
        char *argv[] = {kpt_binary(), "gate", "--config", cfg_path, "--out", kpt_scratch(bundle), "--quiet", NULL};
        const int rc = run_cli(argv, &out, &err);
        free(text);
        struct stat st;
        if (!below) {
            cr_assert_eq(rc, 0, "a budget of exactly the estimate (%zu bytes): exit %d\n%s", estimate, rc, err);
            continue;
        }
        cr_assert_eq(rc, 2, "a budget one byte under the estimate: exit %d\n%s", rc, err);
        cr_assert(strstr(err, "cases[0]: case topp(batch=4,") && strstr(err, "(budget.host_bytes); nothing was allocated"),
                  "the refusal names the case and the field: %s", err);
        cr_assert(strstr(err, "its largest tensor, which the case's fields size: input 'logits' [4, "),
                  "the refusal names what the case's fields made large: %s", err);
        cr_assert_neq(stat(bundle, &st), 0, "a refused case leaves no bundle");
    }
}

Test(cli, unwritable_output_folder_exits_2_naming_the_path) {
    char *cfg, *text;
    cr_assert(asprintf(&text, HEAD "\"cases\":[{\"case\":\"%s\",\"checks\":" RULE "}]}", good_case) > 0);
    cfg = config("ok", text);
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--out", "/proc/version/bundle", "--quiet", NULL};
    char *out, *err;
    cr_assert_eq(run_cli(argv, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "/proc/version/bundle"), "%s", err);
    /* a non-empty folder is refused too: receipts are never mixed with older files */
    char *argv2[] = {kpt_binary(), "gate", "--config", cfg, "--out", kpt_dir, "--quiet", NULL};
    cr_assert_eq(run_cli(argv2, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, kpt_dir), "%s", err);
    free(cfg), free(text);
}

Test(cli, a_filter_that_matches_nothing_is_refused_without_a_bundle) {
    char *cfg, *text, *bundle, *out, *err;
    cr_assert(asprintf(&text, HEAD "\"cases\":[{\"case\":\"%s\",\"checks\":" RULE "}]}", good_case) > 0);
    cfg = config("filter", text);
    cr_assert(asprintf(&bundle, "%s/none", kpt_dir) > 0);
    char *argv[] = {kpt_binary(), "run", "--config", cfg, "--filter", "vocab=999)", "--out", bundle, NULL};
    cr_assert_eq(run_cli(argv, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "matches no case"), "%s", err);
    struct stat st;
    cr_assert_neq(stat(bundle, &st), 0, "no bundle for a run that ran nothing");
    free(cfg), free(text), free(bundle);
}

Test(cli, missing_config_and_unknown_options_are_usage_errors) {
    char *out, *err;
    char *a1[] = {kpt_binary(), "gate", "--config", "/nonexistent/x.json", NULL};
    cr_assert_eq(run_cli(a1, &out, &err), 2);
    cr_assert(strstr(err, "/nonexistent/x.json"), "%s", err);
    char *a2[] = {kpt_binary(), "gate", "--frobnicate", NULL};
    cr_assert_eq(run_cli(a2, &out, &err), 2);
    char *a6[] = {kpt_binary(), "gate", "--config", "x.json", "--filter", "topp", NULL};
    cr_assert_eq(run_cli(a6, &out, &err), 2, "a gate must run its whole config");
    cr_assert(strstr(err, "--filter"), "%s", err);
    char *a3[] = {kpt_binary(), "launch", NULL};
    cr_assert_eq(run_cli(a3, &out, &err), 2);
    char *a4[] = {kpt_binary(), "export", "topp(batch=2,profile=ordinary,seed=1,top_p=2,vocab=300)", "--out", kpt_dir, NULL};
    cr_assert_eq(run_cli(a4, &out, &err), 2);
    cr_assert(strstr(err, "'top_p'"), "%s", err);
    char *a5[] = {kpt_binary(), "verify", "/nonexistent-bundle", NULL};
    cr_assert_eq(run_cli(a5, &out, &err), 2);
}

/* Run a small gate into kpt_dir/name and return the bundle path. */
static char *make_bundle(const char *name) {
    char *text, *bundle;
    cr_assert(asprintf(&text,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"impls\":{\"incumbent\":\"topp.split_logit@host\","
                       "\"candidate\":\"topp.split_prob@host\"},\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6},"
                       "\"cases\":[{\"case\":\"topp(batch=3,profile=ordinary,seed=4,top_p=0.95,vocab=40000)\",\"checks\":"
                       "[{\"check\":\"exact\",\"impls\":[\"incumbent\",\"candidate\"]},{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
                       "{\"case\":\"topp(batch=2,force_token=3,force_value=1e9,profile=forced,seed=4,top_p=0.95,vocab=1000)\","
                       "\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
                       "{\"case\":\"topp(batch=2,profile=ties,seed=4,tie_count=300,top_p=0.5,vocab=1000)\","
                       "\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]}]}") > 0);
    char *cfg = config(name, text);
    cr_assert(asprintf(&bundle, "%s/%s", kpt_dir, name) > 0);
    char *argv[] = {kpt_binary(), "run", "--config", cfg, "--out", bundle, "--quiet", NULL};
    char *out, *err;
    int rc = kpt_run(argv, &out, &err);
    cr_assert(rc == 0 || rc == 1, "run exit %d: %s", rc, err);
    free(text), free(cfg), free(out), free(err);
    return kpt_scratch(bundle);
}

static int verify(const char *bundle, char **err) {
    char *argv[] = {kpt_binary(), "verify", (char *)bundle, NULL};
    char *out;
    static char *last_err; /* *err stays valid until the next call */
    free(last_err);
    int rc = kpt_run(argv, &out, &last_err);
    free(out);
    *err = last_err;
    return rc;
}

Test(cli, verify_names_the_file_after_any_tampering) {
    char *b = make_bundle("b"), *err;
    cr_assert_eq(verify(b, &err), 0, "%s", err);
    const char *files[] = {"bundle.json", "receipts/0001.json", "receipts/0002.json", "receipts/0003.json", "junit.xml",
                           "summary.md", "report.html"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *path;
        size_t len;
        cr_assert(asprintf(&path, "%s/%s", b, files[i]) > 0);
        char *text = kpt_read(path, &len);
        cr_assert_not_null(text, "%s", path);
        size_t at = len / 2;
        text[at] ^= 0x01; /* one bit of one byte */
        kpt_write(path, text, len);
        int rc = verify(b, &err);
        cr_assert_eq(rc, 1, "a flipped byte in %s went unnoticed", files[i]);
        cr_assert(strstr(err, files[i]), "message does not name %s: %s", files[i], err);
        text[at] ^= 0x01;
        kpt_write(path, text, len);
        cr_assert_eq(verify(b, &err), 0, "restoring %s: %s", files[i], err);
        free(text), free(path);
    }
    char *added;
    cr_assert(asprintf(&added, "%s/receipts/0004.json", b) > 0);
    kpt_write(added, "{}", 2);
    cr_assert_eq(verify(b, &err), 1);
    cr_assert(strstr(err, "receipts/0004.json"), "%s", err);
    remove(added);
    char *removed;
    cr_assert(asprintf(&removed, "%s/receipts/0002.json", b) > 0);
    remove(removed);
    cr_assert_eq(verify(b, &err), 1);
    cr_assert(strstr(err, "receipts/0002.json"), "%s", err);
    free(added), free(removed);
}

Test(cli, verify_replay_regenerates_inputs_and_reference) {
    char *b = make_bundle("r");
    char *argv[] = {kpt_binary(), "verify", b, "--replay", NULL}, *out, *err;
    cr_assert_eq(run_cli(argv, &out, &err), 0, "%s", err);
    cr_assert(strstr(out, "regenerated to the same digests in every receipt that records them (3), the reference in "
                          "every one that records it (3)"), "%s", out);
    cr_assert_null(strstr(out, "not replayed"), "%s", out);
}

/* kp_json_print's text of `doc` plus a newline, as the bundle writes a receipt or bundle.json. */
static void write_json(const char *path, const cJSON *doc) {
    char *printed = kp_json_print(doc), *text;
    cr_assert(printed && asprintf(&text, "%s\n", printed) > 0);
    cr_assert_eq(kpt_write(path, text, strlen(text)), 0);
    cJSON_free(printed), free(text);
}

/* A forger's edit of receipt `index` (1-based), made consistent with kparity's own code: every receipt rewritten
 * with the chain.prev its predecessor's new bytes give, bundle.json's receipt digests and chain head to match, and
 * manifest.sha256 rewritten. Plain verify passes the result (asserted), so only a replay can tell. Returns the
 * edited receipt's case name (scratch). */
static const char *forge_receipt(const char *b, int index, void (*edit)(cJSON *receipt)) {
    char *bpath, *name = NULL;
    cr_assert(asprintf(&bpath, "%s/bundle.json", b) > 0);
    cJSON *bundle, *entry;
    kp_error e = {0};
    cr_assert_eq(kp_bundle_read_json(bpath, &bundle, &e), 0, "%s", e.msg);
    char prev[KP_SHA256_HEX_LEN] = KP_ZERO_DIGEST;
    int i = 0;
    cJSON_ArrayForEach(entry, cJSON_GetObjectItemCaseSensitive(bundle, "receipts")) {
        char *rpath;
        cr_assert(asprintf(&rpath, "%s/%s", b, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(entry, "file"))) > 0);
        cJSON *r;
        cr_assert_eq(kp_bundle_read_json(rpath, &r, &e), 0, "%s", e.msg);
        if (++i == index) {
            edit(r);
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(r, "case");
            name = kpt_scratch(strdup(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "name"))));
        }
        cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "chain"), "prev", cJSON_CreateString(prev));
        write_json(rpath, r);
        cr_assert_eq(kp_sha256_file_hex(rpath, prev, &e), 0, "%s", e.msg);
        cJSON_ReplaceItemInObjectCaseSensitive(entry, "sha256", cJSON_CreateString(prev));
        cJSON_Delete(r);
        free(rpath);
    }
    cr_assert(name, "the bundle has no receipt %d", index);
    cJSON_ReplaceItemInObjectCaseSensitive(bundle, "chain_head", cJSON_CreateString(prev));
    write_json(bpath, bundle);
    cr_assert_eq(kp_bundle_write_manifest(b, &e), 0, "%s", e.msg);
    cr_assert_eq(kp_bundle_verify(b, &e), 0, "the forgery is not consistent, so a replay failing proves nothing: %s", e.msg);
    cJSON_Delete(bundle);
    free(bpath);
    return name;
}

/* One hex digit of a digest changed (a digest of other bytes, as far as anyone reading it can tell). */
static void change_digest(cJSON *obj) {
    cJSON *sha = cJSON_GetObjectItemCaseSensitive(obj, "sha256");
    cr_assert(cJSON_IsString(sha) && strlen(sha->valuestring) == 64, "no digest to change");
    char forged[KP_SHA256_HEX_LEN];
    memcpy(forged, sha->valuestring, sizeof forged);
    forged[7] = forged[7] == '0' ? '1' : '0';
    cJSON_ReplaceItemInObjectCaseSensitive(obj, "sha256", cJSON_CreateString(forged));
}
static void forge_logits(cJSON *r) {
    change_digest(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "inputs"), "logits"));
}
static void forge_reference(cJSON *r) { change_digest(cJSON_GetObjectItemCaseSensitive(r, "reference")); }
static void drop_inputs(cJSON *r) {
    cr_assert(cJSON_GetObjectItemCaseSensitive(r, "inputs"));
    cJSON_DeleteItemFromObjectCaseSensitive(r, "inputs");
}

/* verify --replay's exit code; what it printed is scratch. */
static int replay(const char *b, char **out, char **err) {
    char *argv[] = {kpt_binary(), "verify", (char *)b, "--replay", NULL};
    return run_cli(argv, out, err);
}

/* Receipt `index` of a fresh bundle forged by `edit` (re-chained, manifest rewritten): verify --replay must be exit 1
 * with a message that begins "receipts/NNNN.json (CASE): " followed by `what`, and holds `also` (when not NULL). */
static void replay_refuses(const char *tag, int index, void (*edit)(cJSON *receipt), const char *what, const char *also) {
    char *b = make_bundle(tag), *out, *err;
    const char *name = forge_receipt(b, index, edit);
    cr_assert_eq(replay(b, &out, &err), 1, "a forged receipt %d replayed: %s%s", index, out, err);
    char want[600];
    snprintf(want, sizeof want, "receipts/%04d.json (%s): %s", index, name, what);
    cr_assert(strstr(err, want) && (!also || strstr(err, also)), "%s", err);
}

/* An input digest that does not regenerate: exit 1 naming the receipt's file, its case and the tensor. */
Test(cli, replay_fails_an_input_digest_that_does_not_regenerate) {
    replay_refuses("fi", 2, forge_logits, "input 'logits' regenerates to ", ", the receipt records ");
}

/* A reference digest that does not regenerate (the inputs do): exit 1 naming the receipt's file and its case. */
Test(cli, replay_fails_a_reference_digest_that_does_not_regenerate) {
    replay_refuses("fr", 3, forge_reference, "the reference regenerates to ", ", the receipt records ");
}

/* A receipt whose checks ran but that records no inputs cannot be replayed: an error naming it, not a skip. */
Test(cli, replay_fails_a_receipt_of_checks_that_ran_without_inputs) {
    replay_refuses("ni", 1, drop_inputs, "the receipt records no inputs, yet its result is ", NULL);
}

/* ---- files derived from the receipts that contradict them (issue 26, point 8) ----
 * A gate bundle whose verdict is INCORRECT (the incumbent's logit threshold breaks the rule on the forced case), one
 * file derived from its receipts edited to say otherwise and its manifest line rewritten to match, as a forger
 * would: `sha256sum -c` passes, verify must not. Each of these verified "intact" on 1294f26. */
static char *incorrect_bundle(const char *name) {
    char *cfg = config(name, "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"impls\":{\"incumbent\":\"topp.split_logit@host\","
                             "\"candidate\":\"topp.split_prob@host\"},\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6},"
                             "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=300)\",\"checks\":"
                             "[{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
                             "{\"case\":\"topp(batch=2,force_token=3,force_value=1e9,profile=forced,seed=4,top_p=0.95,vocab=1000)\","
                             "\"checks\":[{\"check\":\"rule\",\"impl\":\"incumbent\"}]}]}");
    char *bundle, *out, *err;
    cr_assert(asprintf(&bundle, "%s/%s", kpt_dir, name) > 0);
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--out", bundle, "--quiet", NULL};
    int rc = kpt_run(argv, &out, &err);
    cr_assert_eq(rc, 1, "the gate should be INCORRECT (exit 1): exit %d: %s", rc, err);
    free(cfg), free(out), free(err);
    return kpt_scratch(bundle);
}

/* bundle/rel given `text`, and its line in manifest.sha256 the new digest. */
static void put_with_manifest(const char *bundle, const char *rel, const char *text) {
    char *path, *mpath, hex[KP_SHA256_HEX_LEN], needle[128];
    cr_assert(asprintf(&path, "%s/%s", bundle, rel) > 0 && asprintf(&mpath, "%s/manifest.sha256", bundle) > 0);
    cr_assert_eq(kpt_write(path, text, strlen(text)), 0);
    kp_sha256_hex(text, strlen(text), hex);
    char *manifest = kpt_read(mpath, NULL), *line;
    snprintf(needle, sizeof needle, "  %s\n", rel);
    cr_assert(manifest && (line = strstr(manifest, needle)) && line - manifest >= 64, "%s is not in the manifest", rel);
    memcpy(line - 64, hex, 64);
    cr_assert_eq(kpt_write(mpath, manifest, strlen(manifest)), 0);
    free(path), free(mpath), free(manifest);
}

/* bundle/rel with the text between `from` and `until` (the first such span; `until` NULL: `from` alone) replaced by
 * `to`, as put_with_manifest; returns the old text (scratch). */
static char *forge(const char *bundle, const char *rel, const char *from, const char *until, const char *to) {
    char *path, *forged;
    cr_assert(asprintf(&path, "%s/%s", bundle, rel) > 0);
    char *text = kpt_read(path, NULL), *start = text ? strstr(text, from) : NULL;
    cr_assert(start, "%s does not hold '%s'", rel, from);
    char *end = until ? strstr(start, until) : start;
    cr_assert(end, "%s does not hold '%s' after '%s'", rel, until, from);
    end += strlen(until ? until : from);
    cr_assert(asprintf(&forged, "%.*s%s%s", (int)(start - text), text, to, end) > 0);
    put_with_manifest(bundle, rel, forged);
    free(path), free(forged);
    return kpt_scratch(text);
}

/* The forgery: refused (exit 1) naming `rel` and saying `says`; the manifest was consistent, so only the
 * contradiction with the receipts can have been caught. Then the control: the old bytes back, it verifies. */
static void refused_then_restored(const char *bundle, const char *rel, const char *old_text, const char *says) {
    char *err, *cmd;
    cr_assert(asprintf(&cmd, "cd '%s' && sha256sum -c --strict --quiet manifest.sha256", bundle) > 0);
    char *sh[] = {"/bin/sh", "-c", cmd, NULL};
    cr_assert_eq(kpt_run(sh, NULL, NULL), 0, "the forger's manifest does not match: the test would prove nothing");
    cr_assert_eq(verify(bundle, &err), 1, "a forged %s verified: %s", rel, err);
    cr_assert(strstr(err, rel) && strstr(err, says), "the message should name %s and say '%s': %s", rel, says, err);
    put_with_manifest(bundle, rel, old_text);
    cr_assert_eq(verify(bundle, &err), 0, "restoring %s: %s", rel, err);
    free(cmd);
}

Test(cli, verify_refuses_a_summary_that_says_passed_for_an_incorrect_bundle) {
    char *b = incorrect_bundle("g"), *err;
    cr_assert_eq(verify(b, &err), 0, "the control, untouched: %s", err);
    char *old = forge(b, "summary.md", "# kparity verdict: INCORRECT (exit code 1)", NULL, "# kparity verdict: PASSED (exit code 0)");
    refused_then_restored(b, "summary.md", old, "does not match what the receipts give");
}

Test(cli, verify_refuses_a_junit_with_a_failure_removed) {
    char *b = incorrect_bundle("g"), *err;
    cr_assert_eq(verify(b, &err), 0, "the control, untouched: %s", err);
    /* the failing testcase closed empty (a pass to CI), the counts made to agree */
    char *old = forge(b, "junit.xml", "\">\n      <failure ", "</testcase>\n", "\"/>\n");
    forge(b, "junit.xml", "tests=\"2\" failures=\"1\"", NULL, "tests=\"2\" failures=\"0\"");
    forge(b, "junit.xml", "tests=\"2\" failures=\"1\"", NULL, "tests=\"2\" failures=\"0\"");
    refused_then_restored(b, "junit.xml", old, "does not match what the receipts give");
}

Test(cli, verify_refuses_an_edited_report_html) {
    char *b = incorrect_bundle("g"), *err;
    cr_assert_eq(verify(b, &err), 0, "the control, untouched: %s", err);
    char *old = forge(b, "report.html", "<title>kparity: INCORRECT</title>", NULL, "<title>kparity: PASSED</title>");
    refused_then_restored(b, "report.html", old, "does not match what the receipts give");
}

Test(cli, verify_refuses_a_bundle_json_verdict_changed_to_passed) {
    char *b = incorrect_bundle("g"), *err;
    cr_assert_eq(verify(b, &err), 0, "the control, untouched: %s", err);
    char *old = forge(b, "bundle.json", "\"verdict\":\t\"INCORRECT\",\n\t\"exit_code\":\t1,", NULL,
                      "\"verdict\":\t\"PASSED\",\n\t\"exit_code\":\t0,");
    refused_then_restored(b, "bundle.json", old, "verdict PASSED (exit 0) is not what the receipts give: INCORRECT (exit 1)");
    /* a second verdict member: kparity reads the first, jq and Python the last */
    forge(b, "bundle.json", "\n}\n", NULL, ",\n\t\"verdict\":\t\"PASSED\",\n\t\"exit_code\":\t0\n}\n");
    refused_then_restored(b, "bundle.json", old, "member 'verdict' appears twice");
}

Test(cli, export_writes_npy_files_numpy_can_open) {
    char *out, *err, *path;
    char *argv[] = {kpt_binary(), "export", (char *)good_case, "--out", kpt_dir, NULL};
    cr_assert_eq(run_cli(argv, &out, &err), 0, "%s", err);
    const char *names[] = {"logits.npy", "top_p.npy", "reference_keep.npy", "reference_prob.npy", "topp.split_logit@host.npy",
                           "topp.split_prob@host.npy"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        cr_assert(asprintf(&path, "%s/%s", kpt_dir, names[i]) > 0);
        size_t len;
        char *data = kpt_read(path, &len);
        cr_assert_not_null(data, "%s missing", names[i]);
        cr_assert(len > 128 && !memcmp(data, "\x93NUMPY\x01\x00", 8), "%s is not .npy 1.0", names[i]);
        unsigned header = (unsigned char)data[8] | (unsigned char)data[9] << 8;
        cr_assert_eq((10 + header) % 64, 0, "%s: header not padded to 64", names[i]);
        if (!strcmp(names[i], "logits.npy")) {
            cr_assert(strstr(data + 10, "'shape': (2, 300)"), "%.*s", (int)header, data + 10);
            cr_assert_eq(len, 10 + header + 2 * 300 * 4);
        }
        free(data), free(path);
    }
}

Test(cli, list_shows_impls_and_a_configs_cases) {
    char *out, *err;
    char *a1[] = {kpt_binary(), "list", NULL};
    cr_assert_eq(run_cli(a1, &out, &err), 0);
    cr_assert(strstr(out, "topp.split_logit@host") && strstr(out, "topp.split_prob@host"), "%s", out);
    char *cfg;
    cr_assert(asprintf(&cfg, "%s/ci/gates/glm-split-topp.json", kpt_source_dir()) > 0);
    char *a2[] = {kpt_binary(), "list", "--config", cfg, NULL};
    cr_assert_eq(run_cli(a2, &out, &err), 0, "%s", err);
    int cases = 0;
    for (const char *p = out; (p = strstr(p, "\ntopp(")); p++) cases++;
    cr_assert_eq(cases, 12, "the seed's contract has 12 cases:\n%s", out);
    free(cfg);
}

/* One parser per field: a fractional run count is refused wherever it is given, naming the field. */
Test(cli, runs_must_be_an_integer_in_every_check_that_reads_it) {
    expect_usage(HEAD "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=300)\",\"checks\":"
                      "[{\"check\":\"repeat\",\"impl\":\"candidate\",\"runs\":2.5}]}]}",
                 "cases[0].checks[0].runs: 2.5 must be an integer");
    expect_usage(HEAD "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=300)\",\"checks\":"
                      "[{\"check\":\"expect\",\"impl\":\"candidate\",\"of\":\"repeat\",\"result\":\"INCORRECT\",\"runs\":2.5}]}]}",
                 "cases[0].checks[0].runs: 2.5 must be an integer");
    expect_usage(HEAD "\"defaults\":{\"runs\":2.5},\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,"
                      "vocab=300)\",\"checks\":[{\"check\":\"expect\",\"impl\":\"candidate\",\"of\":\"repeat\",\"result\":"
                      "\"INCORRECT\"}]}]}",
                 "cases[0].checks[0].runs: 2.5 must be an integer");
    expect_usage(HEAD "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=300)\",\"checks\":"
                      "[{\"check\":\"repeat\",\"impl\":\"candidate\",\"runs\":\"3\"}]}]}",
                 "cases[0].checks[0].runs: expected an integer");
}

/* exact is bitwise: it needs no tie policy or band; it explains differences with the family's defaults
 * and says so in the receipt. */
Test(cli, exact_runs_without_rule_parameters) {
    char *cfg = config("exact", "{\"schema\":\"kparity.gate/v1\",\"name\":\"t\",\"impls\":{\"incumbent\":"
                                "\"topp.split_logit@host\",\"candidate\":\"topp.split_prob@host\"},\"cases\":[{\"case\":"
                                "\"topp(batch=3,profile=ordinary,seed=4,top_p=0.95,vocab=40000)\",\"checks\":[{\"check\":"
                                "\"exact\",\"impls\":[\"incumbent\",\"candidate\"]}]}]}");
    char *bundle, *out, *err;
    cr_assert(asprintf(&bundle, "%s/b", kpt_dir) > 0);
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--out", bundle, "--quiet", NULL};
    int rc = run_cli(argv, &out, &err);
    cr_assert(rc == 0 || rc == 1, "exit %d: %s", rc, err);
    cJSON *rec = kpt_receipt(bundle, 1);
    const cJSON *chk = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(rec, "checks"), 0);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(chk, "params");
    cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(params, "params_source")), "defaults not recorded as such");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(params, "tie_policy")->valuestring, "minimal_index");
    cr_assert_str_neq(cJSON_GetObjectItemCaseSensitive(chk, "result")->valuestring, "FAILED");
    cJSON_Delete(rec);
    free(cfg), free(bundle);
}

Test(cli, every_subcommand_prints_its_usage_on_help) {
    const char *cmds[] = {"list", "run", "gate", "verify", "export", "bench"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char *out, *err;
        char *argv[] = {kpt_binary(), (char *)cmds[i], "--help", NULL};
        cr_assert_eq(kpt_run(argv, &out, &err), 0, "kparity %s --help: %s", cmds[i], err);
        char want[32];
        snprintf(want, sizeof want, "kparity %s", cmds[i]);
        cr_assert(strstr(out, want), "kparity %s --help printed: %s", cmds[i], out);
        free(out), free(err);
    }
}

/* A case field's error names its JSON path once. */
Test(cli, a_case_field_error_names_its_path_once) {
    char *cfg = config("prefix", HEAD "\"cases\":[{\"family\":\"topp\",\"params\":{\"batch\":2,\"profile\":\"forced\","
                                      "\"seed\":1,\"top_p\":0.9,\"vocab\":300,\"force_token\":3,\"force_value\":true},"
                                      "\"checks\":" RULE "}]}");
    char *out, *err;
    char *argv[] = {kpt_binary(), "list", "--config", cfg, NULL};
    cr_assert_eq(run_cli(argv, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "cases[0].params.force_value: expected a string or a number"), "%s", err);
    cr_assert_null(strstr(err, "force_value: cases[0]"), "the path is given twice: %s", err);
    free(cfg);
}

/* --impl without --case benches that impl's family's default shapes for this machine (the host shapes without a GPU)
 * and makes no other family's inputs or reference. Before, every family's cases were made and only the impl rows
 * filtered, so each other family's reference row was printed: the planted defect this catches. */
Test(cli, bench_impl_makes_only_its_familys_cases) {
    const kp_family *topk = kp_family_find("topk");
    cr_assert(topk);
    const char *const *want = kpt_gpu_available() ? topk->bench_cases : topk->bench_cases_host;
    cr_assert(want && want[0], "topk declares no default bench shapes for this machine");
    char *out, *err;
    char *argv[] = {kpt_binary(), "bench", "--impl", "topk.radix_exact@host", "--reps", "1", NULL};
    cr_assert_eq(run_cli(argv, &out, &err), 0, "%s%s", out, err);
    int n = 0;
    for (; want[n]; n++) {
        char impl_row[KP_CASE_NAME_MAX + 64], ref_row[KP_CASE_NAME_MAX + 64];
        snprintf(impl_row, sizeof impl_row, "topk.radix_exact@host      %s", want[n]);
        snprintf(ref_row, sizeof ref_row, "reference.topk@host        %s", want[n]);
        cr_assert(strstr(out, impl_row) && strstr(out, ref_row), "no impl or reference row for %s:\n%s", want[n], out);
    }
    char last[32];
    snprintf(last, sizeof last, "[%d/%d] timed", n, n);
    cr_assert(strstr(err, last), "progress does not end at %s (a case of another family was made?):\n%s", last, err);
    const char *others[] = {"topp(", "moe(", "mla(", "reference.topp", "reference.moe", "reference.mla"};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++)
        cr_assert_null(strstr(out, others[i]), "another family's case was made (%s):\n%s", others[i], out);
    /* a --case no --impl given is of: refused before anything is made, naming it */
    char *bad[] = {kpt_binary(), "bench", "--impl", "topk.radix_exact@host", "--case", (char *)good_case, NULL};
    cr_assert_eq(run_cli(bad, &out, &err), 2, "%s%s", out, err);
    cr_assert(strstr(err, "no --impl given is of family topp"), "%s", err);
    cr_assert_null(strstr(out, "reference.topp"), "its reference was made: %s", out);
}

/* bench's header counts the impls that run: with no --impl, a --case of one family runs that family's impls only, so
 * the --json bench line's "impls" equals its impl rows (reference rows aside). Before, it counted every impl of the
 * machine's kind (9 on the H200 for a top-k case with 2 rows). */
Test(cli, bench_header_counts_the_impls_that_run) {
    char *out, *err;
    char *argv[] = {kpt_binary(), "bench", "--case", "topk(k=16,profile=randn,rows=4,seed=1,width=100)", "--reps", "1",
                    "--json", "--quiet", NULL};
    cr_assert_eq(run_cli(argv, &out, &err), 0, "%s%s", out, err);
    const char *head = strstr(out, "\"impls\":");
    cr_assert(head, "%s", out);
    int rows = 0;
    const char *row = "{\"event\":\"row\",\"impl\":\"";
    for (const char *at = out; (at = strstr(at, row)); at++) rows += strncmp(at + strlen(row), "reference.", 10) != 0;
    cr_assert_gt(rows, 0, "%s", out);
    cr_assert_eq(atoi(head + 8), rows, "the header's impls differ from the impl rows:\n%s", out);
}

/* bench times the float64 reference once a case, on the case its impls ran on (it timed three fresh preparations, which
 * was most of a bench's wall time on the large MoE cases), and not at all with --no-reference; the flag is bench's
 * alone. Two cases: one reference row each, "runs": 1; none with the flag, the impl rows unchanged. */
Test(cli, bench_times_the_reference_once_a_case_or_not_at_all) {
    char *out, *err;
    char *argv[] = {kpt_binary(), "bench", "--case", "topk(k=16,profile=randn,rows=4,seed=1,width=100)", "--case",
                    "topk(k=8,profile=randn,rows=2,seed=2,width=64)", "--reps", "1", "--json", "--quiet", NULL, NULL};
    for (int flag = 0; flag < 2; flag++) {
        argv[10] = flag ? "--no-reference" : NULL;
        cr_assert_eq(run_cli(argv, &out, &err), 0, "%s%s", out, err);
        int refs = 0, once = 0, impl_rows = 0;
        const char *row = "{\"event\":\"row\",\"impl\":\"";
        for (const char *at = out; (at = strstr(at, row)); at++) {
            const char *nl = strchr(at, '\n');
            if (strncmp(at + strlen(row), "reference.", 10)) {
                impl_rows++;
                continue;
            }
            refs++;
            const char *runs = strstr(at, "\"runs\":1,");
            once += runs && (!nl || runs < nl);
        }
        cr_assert_eq(refs, flag ? 0 : 2, "%s reference rows:\n%s", flag ? "--no-reference:" : "", out);
        cr_assert_eq(once, refs, "a reference row timed more than one run:\n%s", out);
        cr_assert_gt(impl_rows, 0, "%s", out);
    }
    char *gate[] = {kpt_binary(), "gate", "--config", "ci/gates/default.json", "--no-reference", NULL};
    cr_assert_eq(run_cli(gate, &out, &err), 2, "%s%s", out, err);
    cr_assert(strstr(err, "--no-reference is for bench"), "%s", err);
}

/* bench's table shows TFLOP/s by FlashMLA's formula (2 h_q x attended tokens x (576 + 512) a query row) from the
 * median the row shows, so an mla row compares with FlashMLA's own figures; a family with no FLOP count (top-k) shows
 * "-". The figure is checked against the formula on the printed median, to the printed precision: a column computed
 * from another median or another count fails it. */
Test(cli, bench_shows_mla_tflops_by_flashmlas_formula) {
    char *out, *err;
    char *argv[] = {kpt_binary(), "bench", "--impl", "mla.split_size@host", "--impl", "topk.radix_exact@host", "--case",
                    "mla(batch=2,h_q=64,profile=uniform,s_kv=1024,s_q=2,seed=1,topk=640)", "--case",
                    "topk(k=16,profile=randn,rows=4,seed=1,width=100)", "--reps", "1", "--no-reference", "--quiet", NULL};
    cr_assert_eq(run_cli(argv, &out, &err), 0, "%s%s", out, err);
    cr_assert(strstr(out, "TFLOP/s"), "no TFLOP/s column:\n%s", out);
    const char *mla = strstr(out, "\nmla.split_size@host "), *topk = strstr(out, "\ntopk.radix_exact@host ");
    cr_assert(mla && topk, "a row is missing:\n%s", out);
    double med = 0, tf = 0;
    char tail[64] = "";
    cr_assert_eq(sscanf(mla + 1, "%*s %*s %lf %*s %*s %*s %lf", &med, &tf), 2, "unparsed row:\n%s", out);
    const double want = 2.0 * (2 * 2 * 64) * 640.0 * (576 + 512) / (med * 1e-6) / 1e12; /* rows x heads, tokens */
    cr_assert(med > 0 && fabs(tf - want) <= 5e-4 * want + 0.05 * want / med, "TFLOP/s %g, the formula gives %g at %g us:\n%s",
              tf, want, med, out);
    cr_assert_eq(sscanf(topk + 1, "%*s %*s %*s %*s %*s %*s %63s", tail), 1, "unparsed row:\n%s", out);
    cr_assert_str_eq(tail, "-", "top-k has no FLOP count:\n%s", out);
}

/* Each row is printed as it finishes, and each case's progress line (with the time left) after its rows: stdout and
 * stderr into one file, the rows of case 1 come before "[1/2]" and those of case 2 between it and "[2/2]". A bench
 * that buffered its rows to the end (stdout to a file or pipe is fully buffered unless flushed) printed them after
 * both progress lines, so a bench killed part way had printed nothing: the planted defect this catches. */
Test(cli, bench_prints_each_row_as_it_finishes) {
    const char *a = "topk(k=512,profile=randn,rows=5,seed=3,width=4000)", *b = "topk(k=64,profile=randn,rows=3,seed=4,width=999)";
    char *script, *out, *err;
    cr_assert(asprintf(&script, "exec \"$0\" bench --impl topk.radix_exact@host --reps 1 --case '%s' --case '%s' 2>&1", a,
                       b) > 0);
    char *argv[] = {"/bin/sh", "-c", script, kpt_binary(), NULL};
    cr_assert_eq(run_cli(argv, &out, &err), 0, "%s%s", out, err);
    char row_a[KP_CASE_NAME_MAX + 64], row_b[KP_CASE_NAME_MAX + 64];
    snprintf(row_a, sizeof row_a, "topk.radix_exact@host      %s", a);
    snprintf(row_b, sizeof row_b, "topk.radix_exact@host      %s", b);
    const char *at_a = strstr(out, row_a), *first = strstr(out, "[1/2] timed"), *at_b = strstr(out, row_b),
               *second = strstr(out, "[2/2] timed");
    cr_assert(at_a && first && at_b && second, "a row or a progress line is missing:\n%s", out);
    cr_assert(at_a < first && first < at_b && at_b < second, "rows were not printed as their case finished:\n%s", out);
    cr_assert(strstr(first, "left ~") && strstr(first, a), "the progress line has no estimate or case:\n%s", out);
    free(script);
}

/* bundle.json takes the kernels stage apart (kernels_parts_s): one full run for the rule and two more for a repeat of
 * three, the parts within the stage they divide. */
Test(cli, bundle_json_takes_the_kernels_stage_apart) {
    char *cfg = config("parts", HEAD "\"defaults\":{\"runs\":3},\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,"
                                     "top_p=0.9,vocab=300)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\","
                                     "\"tie_policy\":\"minimal_index\",\"band\":1e-6},{\"check\":\"repeat\",\"impl\":"
                                     "\"candidate\"}]}]}");
    char *bundle, *path, *out, *err;
    cr_assert(asprintf(&bundle, "%s/parts-b", kpt_dir) > 0);
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--out", bundle, NULL};
    cr_assert_eq(run_cli(argv, &out, &err), 0, "%s", err);
    cr_assert(strstr(err, "kernels: 3 runs; setup "), "stderr: %s", err);
    cr_assert(asprintf(&path, "%s/bundle.json", bundle) > 0);
    char *text = kpt_read(path, NULL);
    cJSON *b = cJSON_Parse(text);
    cr_assert_eq(kpt_num(b, "kernels_parts_s.runs"), 3);
    double sum = 0;
    const char *parts[] = {"setup", "output_blocks", "launch", "wait_and_guards", "compare", "copies_back"};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        char key[64];
        snprintf(key, sizeof key, "kernels_parts_s.%s", parts[i]);
        cr_assert_geq(kpt_num(b, key), 0, "%s", key);
        sum += kpt_num(b, key);
    }
    cr_assert_gt(kpt_num(b, "kernels_parts_s.launch"), 0);
    cr_assert_leq(sum, kpt_num(b, "stages_s.kernels") + 1e-6, "the parts %.6f s pass the stage", sum);
    cJSON_Delete(b);
    free(text), free(path), free(bundle), free(cfg);
}
