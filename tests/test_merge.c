/* test_merge.c: a CI matrix over shapes (issue 19, part 3): `kparity run --shard I/N` and `kparity merge`. The seed
 * gate run as four shards and merged gives the receipts (per case: name, input, reference and output digests, every
 * check's result, in config order) and the verdict of one run, a bundle that verifies and one JUnit file; parts of
 * another config, a missing or repeated shard, a part that does not verify and bad --shard values are refused with
 * exit 2 naming what is wrong. The seed gate is run with its vocabularies cut (seed_gate below): sharding and merging
 * do not depend on a case's size, and the cut gate keeps its 12 cases, check sets and mixed verdict. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_json.h"
#include "../receipts/kp_verdict.h"
#include "kp_test_util.h"

TestSuite(merge, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 300);

#define SEED_GATE "ci/gates/glm-split-topp.json"

static char *path_in(const char *name) {
    char *p;
    cr_assert(asprintf(&p, "%s/%s", kpt_dir, name) > 0);
    return p;
}

/* The seed gate as written to kpt_dir/seed.json: SEED_GATE with every case's vocabulary cut from 131072 and 154856
 * to 16384 and 19357 (its forced token 154842, the 15th from the end, to 19343, still the 15th). Its cases, check
 * sets, expect controls and defaults are the seed gate's own; on these sizes too the incumbent breaks the rule on
 * ordinary rows of the 64-row cases, so one run's verdict is INCORRECT made of PASSED and INCORRECT receipts. The
 * full vocabularies cost 8 times the time and show the merge nothing more. */
static char *seed_gate(void) {
    char *src, *text;
    cr_assert(asprintf(&src, "%s/%s", kpt_source_dir(), SEED_GATE) > 0);
    cr_assert_not_null(text = kpt_read(src, NULL), "%s", src);
    static const char *const cuts[][2] = {
        {"vocab=131072", "vocab=16384"}, {"vocab=154856", "vocab=19357"}, {"force_token=154842", "force_token=19343"}};
    size_t cut = 0;
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        const size_t from = strlen(cuts[i][0]), to = strlen(cuts[i][1]);
        cr_assert_geq(from, to);
        for (char *at; (at = strstr(text, cuts[i][0])); cut++) {
            memcpy(at, cuts[i][1], to);
            memmove(at + to, at + from, strlen(at + from) + 1);
        }
    }
    cr_assert_eq(cut, 12 + 4, "every case's vocabulary and every forced token of the last vocabulary cut");
    char *path = path_in("seed.json");
    cr_assert_eq(kpt_write(path, text, strlen(text)), 0);
    free(src), free(text);
    return path;
}

/* kparity run on a config into kpt_dir/out, as shard `shard` (or the whole). */
static int run_config(const char *cfg, const char *shard, const char *out, char **errout) {
    char *dir = path_in(out), *o, *e;
    char *argv[] = {kpt_binary(), "run", "--config", (char *)cfg, "--out", dir, "--quiet", (char *)(shard ? "--shard" : NULL),
                    (char *)shard, NULL};
    const int rc = kpt_run(argv, &o, &e);
    free(dir), free(o);
    if (errout) *errout = e;
    else free(e);
    return rc;
}

static int merge(const char *const *parts, int n, const char *out, char **errout) {
    char *argv[16], *o, *e;
    int k = 0;
    argv[k++] = kpt_binary();
    argv[k++] = "merge";
    for (int i = 0; i < n; i++) argv[k++] = path_in(parts[i]);
    argv[k++] = "--out";
    argv[k++] = path_in(out);
    argv[k] = NULL;
    const int rc = kpt_run(argv, &o, &e);
    for (int i = 2; i < k; i++)
        if (strcmp(argv[i], "--out")) free(argv[i]);
    free(o);
    if (errout) *errout = e;
    else free(e);
    return rc;
}

/* What a case's receipt says, run-independent: its name, digests and results (timings and the chain left out). */
static char *case_key(const cJSON *r) {
    cJSON *k = cJSON_CreateObject();
    const char *keep[] = {"index", "case", "inputs", "result"};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
        cJSON_AddItemToObject(k, keep[i], cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(r, keep[i]), 1));
    cJSON_AddItemToObject(k, "reference",
                          cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "reference"), "sha256"), 1));
    cJSON *impls = cJSON_AddArrayToObject(k, "impls"), *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(r, "impls")) {
        cJSON *i = cJSON_CreateObject();
        cJSON_AddItemToObject(i, "name", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(x, "name"), 1));
        cJSON_AddItemToObject(i, "output", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(x, "output_sha256"), 1));
        cJSON_AddItemToArray(impls, i);
    }
    cJSON *checks = cJSON_AddArrayToObject(k, "checks");
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(r, "checks")) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToObject(c, "label", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(x, "label"), 1));
        cJSON_AddItemToObject(c, "result", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(x, "result"), 1));
        cJSON_AddItemToArray(checks, c);
    }
    char *s = cJSON_PrintUnformatted(k);
    cJSON_Delete(k);
    return s;
}

static cJSON *bundle_json(const char *name) {
    char *p, *text;
    cr_assert(asprintf(&p, "%s/%s/bundle.json", kpt_dir, name) > 0);
    cr_assert_not_null(text = kpt_read(p, NULL), "%s", p);
    cJSON *doc = cJSON_Parse(text);
    free(p), free(text);
    cr_assert_not_null(doc);
    return doc;
}

Test(merge, four_shards_of_the_seed_gate_merge_into_the_one_runs_receipts_and_verdict) {
    char *seed = seed_gate();
    const int whole = run_config(seed, NULL, "one", NULL);
    cr_assert_eq(whole, 1, "one run of the seed gate: INCORRECT, of PASSED and INCORRECT receipts");
    const char *parts[] = {"s1", "s2", "s3", "s4"};
    int sizes = 0;
    for (int i = 0; i < 4; i++) {
        char shard[8];
        snprintf(shard, sizeof shard, "%d/4", i + 1);
        cr_assert_leq(run_config(seed, shard, parts[i], NULL), 1, "shard %s", shard);
        cJSON *doc = bundle_json(parts[i]);
        const int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "receipts"));
        cr_assert(n >= 1 && n <= 3, "shard %s ran %d cases", shard, n);
        sizes += n;
        cJSON_Delete(doc);
    }
    char *err;
    const int merged = merge(parts, 4, "merged", &err);
    cr_assert_eq(merged, whole, "the merged verdict's exit %d, one run's %d: %s", merged, whole, err);
    free(err);
    cJSON *one = bundle_json("one"), *m = bundle_json("merged");
    const int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(one, "receipts"));
    cr_assert_eq(n, 12);
    cr_assert_eq(sizes, n, "the shards split the config's cases");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(m, "verdict")->valuestring,
                     cJSON_GetObjectItemCaseSensitive(one, "verdict")->valuestring);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "merged_from")), 4);
    for (int i = 1; i <= n; i++) {
        char *a_dir = path_in("one"), *b_dir = path_in("merged");
        cJSON *a = kpt_receipt(a_dir, i), *b = kpt_receipt(b_dir, i);
        char *ka = case_key(a), *kb = case_key(b);
        cr_assert_str_eq(ka, kb, "receipt %d differs", i);
        free(ka), free(kb), free(a_dir), free(b_dir);
        cJSON_Delete(a), cJSON_Delete(b);
    }
    cJSON_Delete(one), cJSON_Delete(m);
    char *dir = path_in("merged"), *o, *e, *junit;
    char *argv[] = {kpt_binary(), "verify", dir, NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 0, "the merged bundle verifies: %s", e);
    cr_assert(asprintf(&junit, "%s/junit.xml", dir) > 0);
    char *text = kpt_read(junit, NULL);
    cr_assert(text && strstr(text, "tests=\"") , "one JUnit file");
    free(o), free(e), free(dir), free(junit), free(text), free(seed);
}

/* A small config (two topp cases) written to kpt_dir/other.json: parts of it do not join the seed gate's. */
static char *other_config(void) {
    char *p = path_in("other.json");
    const char *body = "{\"schema\":\"kparity.gate/v1\",\"name\":\"other\",\"impls\":{\"candidate\":\"topp.split_prob@host\"},"
                       "\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6},\"cases\":["
                       "{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=1000)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
                       "{\"case\":\"topp(batch=2,profile=ordinary,seed=2,top_p=0.9,vocab=1000)\",\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]}]}";
    cr_assert_eq(kpt_write(p, body, strlen(body)), 0);
    return p;
}

Test(merge, parts_that_do_not_make_one_run_are_refused) {
    char *cfg = other_config(), *o, *e;
    char *out1 = path_in("o1"), *out2 = path_in("o2");
    char *a1[] = {kpt_binary(), "run", "--config", cfg, "--out", out1, "--quiet", "--shard", "1/2", NULL};
    char *a2[] = {kpt_binary(), "run", "--config", cfg, "--out", out2, "--quiet", "--shard", "2/2", NULL};
    cr_assert_eq(kpt_run(a1, &o, &e), 0, "%s", e);
    free(o), free(e);
    cr_assert_eq(kpt_run(a2, &o, &e), 0, "%s", e);
    free(o), free(e);
    char *seed = seed_gate();
    cr_assert_leq(run_config(seed, "2/2", "seed2", NULL), 1);
    free(seed);
    const struct {
        const char *parts[3];
        int n;
        const char *needle;
    } bad[] = {
        {{"o1", "seed2"}, 2, "parts of different configs do not make one run"},
        {{"o1"}, 1, "shard 2/2 is missing"},
        {{"o1", "o1", "o2"}, 3, "shard 1/2 is given twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *err;
        char name[16];
        snprintf(name, sizeof name, "bad%zu", i);
        cr_assert_eq(merge(bad[i].parts, bad[i].n, name, &err), 2, "case %zu", i);
        cr_assert(strstr(err, bad[i].needle), "case %zu: %s", i, err);
        free(err);
    }
    /* a part rewritten after the run does not verify, and is refused before anything is written */
    char *receipt;
    cr_assert(asprintf(&receipt, "%s/receipts/0001.json", out2) > 0);
    size_t len;
    char *text = kpt_read(receipt, &len);
    cr_assert_not_null(text);
    char *at = strstr(text, "PASSED");
    cr_assert_not_null(at);
    memcpy(at, "FAILED", 6);
    cr_assert_eq(kpt_write(receipt, text, len), 0);
    const char *parts[] = {"o1", "o2"};
    char *err;
    cr_assert_eq(merge(parts, 2, "tampered", &err), 2);
    cr_assert(strstr(err, "o2 does not verify"), "%s", err);
    free(err), free(text), free(receipt), free(cfg), free(out1), free(out2);
}

Test(merge, bad_shard_values_are_refused) {
    const char *bad[] = {"0/4", "5/4", "1/0", "x/4", "1/4x", "2"};
    char *cfg, *o, *e;
    cr_assert(asprintf(&cfg, "%s/%s", kpt_source_dir(), SEED_GATE) > 0);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *err;
        cr_assert_eq(run_config(cfg, bad[i], "never", &err), 2, "--shard %s", bad[i]);
        cr_assert(strstr(err, "--shard: expected I/N"), "%s: %s", bad[i], err);
        free(err);
    }
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--shard", "1/2", NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 2, "a gate runs the whole config");
    cr_assert(strstr(e, "--filter and --shard are for `kparity run`"), "%s", e);
    free(cfg), free(o), free(e);
}

/* ci/matrix/<family>.json loads for every family there is, and the workflow runs each as shards and merges it. */
Test(merge, the_matrix_configs_load_and_the_workflow_shards_and_merges_each) {
    char *wf_path, *o, *e;
    cr_assert(asprintf(&wf_path, "%s/ci/github-actions/kparity-matrix.yml", kpt_source_dir()) > 0);
    char *wf = kpt_read(wf_path, NULL);
    cr_assert_not_null(wf, "%s", wf_path);
    cr_assert(strstr(wf, "--shard ${{ matrix.shard }}/${{ env.SHARDS }}") && strstr(wf, "kparity merge bundle-"), "%s", wf);
    cr_assert(strstr(wf, "uses: actions/cache@") && strstr(wf, "path: .kparity-cache") && strstr(wf, "--cache .kparity-cache"),
              "each shard keeps its cache folder between runs: %s", wf);
    const char *families[] = {"topp", "topk", "moe", "mla"};
    for (size_t i = 0; i < sizeof families / sizeof *families; i++) {
        char *cfg;
        cr_assert(asprintf(&cfg, "%s/ci/matrix/%s.json", kpt_source_dir(), families[i]) > 0);
        char *argv[] = {kpt_binary(), "list", "--config", cfg, NULL};
        cr_assert_eq(kpt_run(argv, &o, &e), 0, "%s: %s", cfg, e);
        char prefix[16];
        snprintf(prefix, sizeof prefix, "\n%s(", families[i]);
        cr_assert(strstr(o, prefix), "%s lists %s cases: %s", cfg, families[i], o);
        free(o), free(e), free(cfg);
    }
    cr_assert(strstr(wf, "config: [topp, topk, moe, mla]"), "the workflow's matrix names every family's config");
    free(wf), free(wf_path);
}

/* A shard bundle made with the bundle API (what `run --shard I/2` writes, as far as merge reads it): one case, config
 * case `index`, its one check's result `result`, finished with the verdict one run of it gives. */
static void shard_part(const char *name, int index, const char *result) {
    char *dir = path_in(name);
    kp_bundle *b;
    kp_error err = {0};
    cr_assert_eq(kp_bundle_open(&b, dir, &err), 0, "%s", err.msg);
    cJSON *r = cJSON_CreateObject(), *c = cJSON_AddObjectToObject(r, "case"), *chk = cJSON_CreateObject();
    char case_name[64];
    snprintf(case_name, sizeof case_name, "topp(batch=1,seed=%d,vocab=7)", index);
    cJSON_AddStringToObject(c, "name", case_name);
    kp_json_add_int(c, "config_index", index);
    cJSON_AddStringToObject(chk, "check", "rule");
    cJSON_AddStringToObject(chk, "label", "rule");
    cJSON_AddStringToObject(chk, "result", result);
    cJSON_AddStringToObject(chk, "summary", "");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "checks"), chk);
    cJSON_AddStringToObject(r, "result", result);
    cJSON_AddArrayToObject(r, "reasons");
    cr_assert_eq(kp_bundle_add_receipt(b, r, &err), 0, "%s", err.msg);
    cJSON *meta = cJSON_CreateObject(), *shard = cJSON_AddObjectToObject(meta, "shard");
    kp_json_add_int(shard, "index", index + 1);
    kp_json_add_int(shard, "count", 2);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(meta, "config"), "sha256", "ab");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(meta, "environment"), "kparity_version", "test");
    int code;
    const char *verdict = kp_bundle_rows_verdict(kp_bundle_rows(b), 0, 0, &code);
    cr_assert_eq(kp_bundle_finish(b, verdict, code, meta, &err), 0, "%s", err.msg);
    kp_bundle_free(b);
    free(dir);
}

/* One shard passed, the other ran nothing: one run of both cases says NOT_RUN (exit 77: NOT_RUN outranks a pass),
 * and so does their merge. Before merge took the runner's rule over the merged receipts it said NOT_SUPPORTED, a
 * result no receipt had, from the parts' verdicts. */
Test(merge, a_passed_and_a_not_run_shard_merge_to_what_one_run_says) {
    shard_part("p1", 0, "PASSED");
    shard_part("p2", 1, "NOT_RUN");
    const char *parts[] = {"p1", "p2"};
    char *err;
    cr_assert_eq(merge(parts, 2, "m", &err), 77, "%s", err);
    free(err);
    cJSON *doc = bundle_json("m");
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "verdict")), "NOT_RUN");
    cJSON_Delete(doc);
    char *m = path_in("m"), *argv[] = {kpt_binary(), "verify", m, NULL};
    cr_assert_eq(kpt_run(argv, NULL, NULL), 0, "the merged bundle does not verify");
    free(m);
}
