/* test_judge.c: `kparity judge` (issue 19, part 1): outputs made outside kparity judged as if the impl had run
 * inside. An inside impl's exported output, judged, gets the same rule findings as the impl run inside; a NumPy
 * sort-based top-p (tests/fixtures/numpy_topp.py) on exported seed cases gets receipts that classify its mismatches;
 * one flipped element is caught at its row; two runs' files feed repeat, a first-N file feeds batch; a wrong dtype,
 * shape, a truncated or non-.npy file is exit 2 naming the file. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../cases/kp_sha256.h"
#include "../receipts/kp_npy.h"
#include "kp_test_util.h"

TestSuite(judge, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 300);

#define ORDINARY "topp(batch=4,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)"
#define FORCED "topp(batch=4,force_token=13,force_value=1e9,profile=forced,seed=58231,top_p=0.95,vocab=131072)"

static char *in_dir(const char *name) {
    char *p;
    cr_assert(asprintf(&p, "%s/%s", kpt_dir, name) > 0);
    return p;
}

static void export_case(const char *c, const char *dir, const char *impl) {
    char *d = in_dir(dir), *o, *e;
    char *argv[] = {kpt_binary(), "export", (char *)c, "--out", d, (char *)(impl ? "--impl" : NULL), (char *)impl, NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 0, "export: %s", e);
    free(d), free(o), free(e);
}

static char *write_config(void) {
    char *p = in_dir("judge.json");
    const char *body = "{\"schema\":\"kparity.gate/v1\",\"name\":\"judge-topp\",\"impls\":{\"candidate\":\"topp.split_prob@host\"},"
                       "\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6},\"check_sets\":{\"judge\":["
                       "{\"check\":\"rule\",\"impl\":\"outside\"},{\"check\":\"repeat\",\"impl\":\"outside\"},"
                       "{\"check\":\"batch\",\"impl\":\"outside\"}],"
                       "\"rule_only\":[{\"check\":\"rule\",\"impl\":\"outside\"}]},"
                       "\"cases\":[{\"case\":\"" FORCED "\",\"checks\":\"rule_only\"}]}";
    cr_assert_eq(kpt_write(p, body, strlen(body)), 0);
    return p;
}

/* kparity judge CASE with --impl arguments (NULL-terminated); returns the exit code and the bundle's first receipt. */
static int judge(const char *c, const char *out, const char *const *impls, cJSON **receipt, char **errout) {
    char *argv[32], *cfg = write_config(), *dir = in_dir(out), *o, *e;
    int k = 0;
    argv[k++] = kpt_binary(), argv[k++] = "judge", argv[k++] = (char *)c;
    for (int i = 0; impls[i]; i++) argv[k++] = "--impl", argv[k++] = (char *)impls[i];
    argv[k++] = "--config", argv[k++] = cfg, argv[k++] = "--out", argv[k++] = dir, argv[k++] = "--quiet", argv[k] = NULL;
    const int rc = kpt_run(argv, &o, &e);
    if (receipt) *receipt = rc <= 1 ? kpt_receipt(dir, 1) : NULL;
    if (errout) *errout = e;
    else free(e);
    free(o), free(cfg), free(dir);
    return rc;
}


static char *arg(const char *name, const char *path) {
    char *a;
    cr_assert(asprintf(&a, "%s=%s/%s", name, kpt_dir, path) > 0);
    return a;
}

/* The incumbent's exported output judged from its file reproduces the forced-logit defect with the very findings
 * the incumbent gets inside: judging classifies like an inside impl. */
Test(judge, an_exported_output_judged_gets_the_inside_impls_findings) {
    export_case(FORCED, "ex", "topp.split_logit@host");
    char *a = arg("outside", "ex/topp.split_logit@host.npy");
    const char *impls[] = {a, NULL};
    cJSON *rec;
    cr_assert_eq(judge(FORCED, "j", impls, &rec, NULL), 1, "rule_only: the incumbent breaks the rule");
    cr_assert_str_eq(kpt_at(rec, "checks.0.impl")->valuestring, "topp.judged_outside@file");
    cr_assert_str_eq(kpt_at(rec, "checks.0.result")->valuestring, "INCORRECT");
    cr_assert(strstr(kpt_at(rec, "checks.0.summary")->valuestring, "0/4 rows meet the rule; 4 strict"), "%s",
              kpt_at(rec, "checks.0.summary")->valuestring);
    cr_assert(cJSON_IsTrue(kpt_at(rec, "impls.0.judged")));
    cr_assert(strstr(kpt_at(rec, "impls.0.binary")->valuestring, "topp.split_logit@host.npy (sha256 "), "the file and its digest");
    /* the same case with the impl inside */
    char *cfg, *dir = in_dir("inside"), *o, *e;
    cr_assert(asprintf(&cfg, "%s/inside.json", kpt_dir) > 0);
    const char *body = "{\"schema\":\"kparity.gate/v1\",\"name\":\"inside\",\"impls\":{\"incumbent\":\"topp.split_logit@host\"},"
                       "\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6},\"cases\":[{\"case\":\"" FORCED "\","
                       "\"checks\":[{\"check\":\"rule\",\"impl\":\"incumbent\"}]}]}";
    cr_assert_eq(kpt_write(cfg, body, strlen(body)), 0);
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--out", dir, "--quiet", NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 1);
    cJSON *inside = kpt_receipt(dir, 1);
    char *fa = cJSON_PrintUnformatted(kpt_at(rec, "checks.0.findings")), *fb = cJSON_PrintUnformatted(kpt_at(inside, "checks.0.findings"));
    cr_assert_str_eq(fa, fb, "judged and inside findings differ");
    cr_assert_str_eq(kpt_at(rec, "impls.0.output_sha256")->valuestring, kpt_at(inside, "impls.0.output_sha256")->valuestring);
    free(fa), free(fb), free(cfg), free(dir), free(o), free(e), free(a);
    cJSON_Delete(rec), cJSON_Delete(inside);
}

/* judge writes its one-case config under $TMPDIR (else /tmp): a TMPDIR that is not there is an environment error
 * naming TMPDIR and the reason, and the same judge with TMPDIR a real folder runs and leaves nothing in it. */
Test(judge, its_judging_config_goes_under_tmpdir) {
    export_case(FORCED, "ex", "topp.split_logit@host");
    char *a = arg("outside", "ex/topp.split_logit@host.npy"), *missing = in_dir("no-such-dir"), *tmp = in_dir("tmp"), *e;
    const char *impls[] = {a, NULL};
    cr_assert_eq(setenv("TMPDIR", missing, 1), 0);
    const int rc = judge(FORCED, "j1", impls, NULL, &e);
    cr_assert(rc > 1, "a missing TMPDIR gave exit %d", rc);
    cr_assert(strstr(e, "TMPDIR") && strstr(e, missing) && strstr(e, "No such file"), "%s", e);
    free(e);
    cr_assert_eq(mkdir(tmp, 0700), 0);
    cr_assert_eq(setenv("TMPDIR", tmp, 1), 0);
    cr_assert_eq(judge(FORCED, "j2", impls, NULL, NULL), 1, "rule_only: the incumbent breaks the rule");
    DIR *d = opendir(tmp);
    int left = 0;
    for (struct dirent *ent; (ent = readdir(d));) left += ent->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(left, 0, "judge left its config in TMPDIR");
    unsetenv("TMPDIR");
    free(a), free(missing), free(tmp);
}

/* Run the NumPy top-p on an export; path of the output under kpt_dir. */
static void numpy_topp(const char *export_dir, const char *out) {
    char *script, *src = in_dir(export_dir), *dst = in_dir(out), *o, *e;
    cr_assert(asprintf(&script, "%s/tests/fixtures/numpy_topp.py", kpt_source_dir()) > 0);
    char *argv[] = {kpt_python(), script, src, dst, NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 0, "numpy_topp.py (python3 with numpy; scripts/setup.sh installs it): %s", e);
    free(script), free(src), free(dst), free(o), free(e);
}

/* Load a whole .npy file (its header checked); the data starts at buf + info->data_offset. */
static char *load_npy(const char *name, kp_npy_info *info, size_t *len) {
    char *path = in_dir(name), *buf = kpt_read(path, len);
    cr_assert_not_null(buf, "%s", path);
    kp_error kerr = {0};
    cr_assert_eq(kp_npy_decode((const unsigned char *)buf, *len, info, &kerr), 0, "%s: %s", path, kerr.msg);
    free(path);
    return buf;
}

/* A NumPy top-p on the seed's ordinary case, judged. Its float32 cumulative sum keeps one token too many on one row
 * (on this case: row 2, 7,022 kept where the rule keeps 7,021); which row and token is found here from the files
 * alone (its mask against the reference's keep mask that export writes), and the receipt must name exactly that:
 * the row, both kept counts, the one strict index, every other row meeting the rule. Repeat (the same file twice)
 * passes; batch (row 0 alone, from the batch-1 case's run) compares that probe only, so it is NOT_RUN; a kept
 * element of another row dropped is caught at its row and token; two different runs make repeat INCORRECT. */
Test(judge, a_numpy_top_p_is_judged_and_a_flipped_element_is_caught) {
    export_case(ORDINARY, "ex", NULL);
    export_case("topp(batch=1,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)", "ex1", NULL);
    numpy_topp("ex", "np.npy");
    numpy_topp("ex1", "np1.npy");
    /* what differs from the rule, from the files: NumPy's kept set against the reference's */
    kp_npy_info info, kinfo;
    size_t len, klen;
    char *buf = load_npy("np.npy", &info, &len), *kbuf = load_npy("ex/reference_keep.npy", &kinfo, &klen);
    cr_assert_eq(kinfo.ndim, 2);
    cr_assert_eq(kinfo.shape[0], info.shape[0]);
    cr_assert_eq(kinfo.shape[1], info.shape[1]);
    cr_assert_str_eq(kinfo.descr, "|u1");
    const int64_t rows = info.shape[0], vocab = info.shape[1];
    const float *x = (const float *)(buf + info.data_offset);
    const uint8_t *keep = (const uint8_t *)(kbuf + kinfo.data_offset);
    int64_t diff_row = -1, diff_token = -1, diffs = 0, np_kept[8] = {0}, ref_kept[8] = {0};
    cr_assert_leq(rows, 8);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < vocab; j++) {
            const int mine = !isinf(x[r * vocab + j]), rule = keep[r * vocab + j] != 0;
            np_kept[r] += mine, ref_kept[r] += rule;
            if (mine != rule) diffs++, diff_row = r, diff_token = j;
        }
    cr_assert_eq(diffs, 1, "NumPy's float32 filter differs from the rule in %lld tokens (this case has shown one)", (long long)diffs);
    cr_assert_eq(np_kept[diff_row], ref_kept[diff_row] + 1, "it keeps the extra token (row %lld: %lld against %lld)",
                 (long long)diff_row, (long long)np_kept[diff_row], (long long)ref_kept[diff_row]);

    char *a = arg("outside", "np.npy"), *b = arg("outside@1", "np1.npy");
    const char *impls[] = {a, a, b, NULL};
    cJSON *rec;
    char *err;
    cr_assert_eq(judge(ORDINARY, "np", impls, &rec, &err), 1, "%s", err);
    const cJSON *rule = kpt_at(rec, "checks.0"), *rep = kpt_at(rec, "checks.1"), *bat = kpt_at(rec, "checks.2");
    cr_assert_str_eq(kpt_at(rule, "check")->valuestring, "rule");
    cr_assert_str_eq(kpt_at(rule, "result")->valuestring, "INCORRECT");
    cr_assert_eq(kpt_at(rule, "findings.rows_meeting_rule")->valuedouble, (double)(rows - 1));
    cr_assert_eq(kpt_at(rule, "findings.strict")->valuedouble, 1);
    cr_assert_eq(kpt_at(rule, "findings.tie")->valuedouble, 0);
    cr_assert_eq(kpt_at(rule, "findings.band")->valuedouble, 0);
    for (int64_t r = 0; r < rows; r++) {
        char key[64];
        snprintf(key, sizeof key, "findings.per_row.%lld", (long long)r);
        const cJSON *pr = kpt_at(rule, key);
        cr_assert_eq(kpt_at(pr, "row")->valuedouble, (double)r);
        cr_assert_eq(kpt_at(pr, "reference.kept")->valuedouble, (double)ref_kept[r], "row %lld: the rule's kept count", (long long)r);
        cr_assert_eq(kpt_at(pr, "impl.kept")->valuedouble, (double)np_kept[r], "row %lld: NumPy's kept count", (long long)r);
        cr_assert_eq(cJSON_IsTrue(kpt_at(pr, "impl.meets_rule")), r != diff_row, "row %lld", (long long)r);
    }
    char key[64];
    snprintf(key, sizeof key, "findings.per_row.%lld.impl", (long long)diff_row);
    const cJSON *bad = kpt_at(rule, key);
    cr_assert_eq(kpt_at(bad, "strict.count")->valuedouble, 1);
    cr_assert_eq(kpt_at(bad, "strict.first.0")->valuedouble, (double)diff_token, "the strict index is the extra token");
    cr_assert(cJSON_IsFalse(kpt_at(bad, "conformance.minimal")), "a token too many: not minimal");
    cr_assert_str_eq(kpt_at(rep, "result")->valuestring, "PASSED", "%s", kpt_at(rep, "summary")->valuestring);
    cr_assert_eq(kpt_at(rep, "params.runs")->valuedouble, 2, "repeat runs = the files given");
    /* only alone.row0 was given: its agreement is no verdict on the probes that were not */
    cr_assert_str_eq(kpt_at(bat, "result")->valuestring, "NOT_RUN", "%s", kpt_at(bat, "summary")->valuestring);
    cr_assert(strstr(kpt_at(bat, "summary")->valuestring, "had no outputs given: no verdict on the rest"), "%s",
              kpt_at(bat, "summary")->valuestring);
    cr_assert_eq(kpt_at(bat, "findings.probes_compared")->valuedouble, 1, "%s", kpt_at(bat, "summary")->valuestring);
    cr_assert_eq(kpt_at(bat, "findings.probes.0.rows_probed")->valuedouble, 1, "alone.row0 was compared");
    cJSON_Delete(rec), free(err);

    /* drop one kept element of a row NumPy got right: the rule check names that row and token as well */
    const int64_t other = diff_row == 0 ? 1 : 0;
    float *row = (float *)(buf + info.data_offset) + other * vocab;
    int64_t j = 0;
    while (j < vocab && isinf(row[j])) j++;
    cr_assert_lt(j, vocab);
    row[j] = -INFINITY;
    char *flipped = in_dir("flipped.npy");
    cr_assert_eq(kpt_write(flipped, buf, len), 0);
    char *c = arg("outside", "flipped.npy");
    const char *impls2[] = {c, c, NULL};
    cr_assert_eq(judge(ORDINARY, "flip", impls2, &rec, NULL), 1);
    snprintf(key, sizeof key, "checks.0.findings.per_row.%lld", (long long)other);
    const cJSON *pr = kpt_at(rec, key);
    cr_assert(cJSON_IsFalse(kpt_at(pr, "impl.meets_rule")), "row %lld breaks the rule", (long long)other);
    cr_assert_eq(kpt_at(pr, "impl.strict.count")->valuedouble, 1, "the dropped token is strict");
    cr_assert_eq(kpt_at(pr, "impl.strict.first.0")->valuedouble, (double)j, "it names the token");
    cr_assert_eq(kpt_at(rec, "checks.0.findings.strict")->valuedouble, 2, "NumPy's own extra token and the dropped one");
    cJSON_Delete(rec);
    /* two different runs: repeat sees two distinct outputs */
    const char *impls3[] = {a, c, NULL};
    cr_assert_eq(judge(ORDINARY, "rep", impls3, &rec, NULL), 1);
    cr_assert_eq(kpt_at(rec, "checks.1.findings.distinct_outputs")->valuedouble, 2);
    cJSON_Delete(rec);
    free(a), free(b), free(c), free(flipped), free(buf), free(kbuf);
}

Test(judge, bad_files_are_refused_naming_the_file) {
    export_case(ORDINARY, "ex", "topp.split_prob@host");
    char *good = in_dir("ex/topp.split_prob@host.npy");
    size_t len;
    char *buf = kpt_read(good, &len);
    cr_assert_not_null(buf);
    kp_npy_info info;
    kp_error kerr = {0};
    cr_assert_eq(kp_npy_decode((const unsigned char *)buf, len, &info, &kerr), 0);
    char *trunc = in_dir("trunc.npy"), *notnpy = in_dir("notnpy.npy"), *f64 = in_dir("f64.npy"), *shape = in_dir("shape.npy");
    cr_assert_eq(kpt_write(trunc, buf, len - 100), 0);
    cr_assert_eq(kpt_write(notnpy, "hello, not a numpy file\n", 24), 0);
    const int64_t s2[2] = {info.shape[0], info.shape[1]}, s3[2] = {info.shape[0] - 1, info.shape[1]};
    double *d = calloc((size_t)(s2[0] * s2[1]), sizeof *d);
    cr_assert_eq(kp_npy_write(f64, "<f8", 2, s2, d, sizeof *d * (size_t)(s2[0] * s2[1]), &kerr), 0);
    cr_assert_eq(kp_npy_write(shape, "<f4", 2, s3, buf + info.data_offset, 4 * (size_t)(s3[0] * s3[1]), &kerr), 0);
    const struct {
        const char *file, *needle;
    } bad[] = {
        {"trunc.npy", "trunc.npy: not a readable .npy file for output 'out'"},
        {"notnpy.npy", "notnpy.npy: not a readable .npy file"},
        {"f64.npy", "f64.npy: dtype <f8; the family's output 'out' is <f4"},
        {"shape.npy", "shape.npy: shape [3, 131072]; the family's output 'out' of 4 rows is [4, 131072]"},
        {"missing.npy", "missing.npy: cannot read"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *a = arg("outside", bad[i].file), *err;
        const char *impls[] = {a, NULL};
        char out[16];
        snprintf(out, sizeof out, "bad%zu", i);
        cr_assert_eq(judge(ORDINARY, out, impls, NULL, &err), 2, "%s", bad[i].file);
        cr_assert(strstr(err, bad[i].needle), "%s: %s", bad[i].file, err);
        free(a), free(err);
    }
    char *a = arg("outside", "ex/topp.split_prob@host.npy"), *err;
    const char *one_run[] = {a, NULL};
    cr_assert_eq(judge(ORDINARY, "onerun", one_run, NULL, &err), 2, "repeat needs two runs' files");
    cr_assert(strstr(err, "repeat on outside needs at least two runs' outputs"), "%s", err);
    free(err), free(a), free(d), free(buf), free(good), free(trunc), free(notnpy), free(f64), free(shape);
}

/* An empty array may declare any shape: (0, 2^63 - 1, ...) over 8 dimensions passes the .npy reader (no bytes to
 * hold) and overran the 96-byte buffer the judge wrote the shape into for its message (found by
 * fuzz/fuzz_judge_output.c; under ASan a stack-buffer-overflow). It is refused as a wrong shape, named whole. */
Test(judge, an_empty_array_of_a_huge_shape_is_refused_naming_the_whole_shape) {
    char *path = in_dir("huge.npy");
    int64_t shape[8] = {0};
    char want[256] = "huge.npy: shape [0";
    for (int d = 1; d < 8; d++) shape[d] = INT64_MAX, strcat(want, ", 9223372036854775807");
    strcat(want, "]; the family's output 'out' of 4 rows is [4, 131072]");
    kp_error kerr = {0};
    cr_assert_eq(kp_npy_write(path, "<f4", 8, shape, NULL, 0, &kerr), 0, "%s", kerr.msg);
    char *a = arg("outside", "huge.npy"), *err;
    const char *impls[] = {a, NULL};
    cr_assert_eq(judge(ORDINARY, "huge", impls, NULL, &err), 2, "%s", err);
    cr_assert(strstr(err, want), "%s", err);
    free(a), free(err), free(path);
}

/* ---- an mla case judged: bf16 bits as <i2, outputs declared absent ---------------------------------------------- */

/* Small (two TOPK_BLOCKs of 64 over 256 tokens): what is judged here is dtypes and outputs left out, not a size. */
#define MLA_SHAPE "h_q=64,profile=uniform,s_kv=256,scale=pow2,seed=1,topk=128"
#define MLA_CASE "mla(batch=2," MLA_SHAPE ")"
#define MLA_EXPORT "mx/mla.split_size@host."

/* kparity judge MLA_CASE with `checks` (a JSON array) under FlashMLA's decode tolerances (ci/gates/sparse-mla.json),
 * the candidate mla.split_size@host as role "candidate", and the arguments args (NULL-terminated); the exit code,
 * the first receipt (exit 0 or 1) and stderr. */
static int judge_mla(const char *checks, const char *out, const char *const *args, cJSON **receipt, char **errout) {
    char *cfg = in_dir("judge-mla.json"), *dir = in_dir(out), *argv[40], *o, *e, *body;
    cr_assert(asprintf(&body, "{\"schema\":\"kparity.gate/v1\",\"name\":\"judge-mla\",\"impls\":{\"candidate\":"
                       "\"mla.split_size@host\"},\"defaults\":{\"tensors\":{"
                       "\"out\":{\"atol\":0.001,\"rtol\":0.015703125,\"cosine\":5e-06,\"element_rule\":\"both\","
                       "\"round_reference\":true},"
                       "\"lse\":{\"atol\":1e-06,\"rtol\":0.0001222229,\"element_rule\":\"both\",\"round_reference\":true},"
                       "\"max_logits\":{\"atol\":1e-06,\"rtol\":0.0001222229,\"element_rule\":\"both\",\"round_reference\":"
                       "true}}},\"cases\":[{\"case\":\"" MLA_CASE "\",\"checks\":%s}]}", checks) > 0);
    cr_assert_eq(kpt_write(cfg, body, strlen(body)), 0);
    int k = 0;
    argv[k++] = kpt_binary(), argv[k++] = "judge", argv[k++] = MLA_CASE;
    for (int i = 0; args[i]; i++) argv[k++] = (char *)args[i];
    argv[k++] = "--config", argv[k++] = cfg, argv[k++] = "--out", argv[k++] = dir, argv[k++] = "--quiet", argv[k] = NULL;
    const int rc = kpt_run(argv, &o, &e);
    if (receipt) *receipt = rc <= 1 || rc == 77 ? kpt_receipt(dir, 1) : NULL;
    if (errout) *errout = e;
    else free(e);
    free(o), free(cfg), free(dir), free(body);
    return rc;
}

/* The exported file of output `name` rewritten under kpt_dir as `to` with dtype `descr` (2 bytes an element: the
 * same bits from a 2-byte dtype, an int32 narrowed), or with every element times `scale` (f32, descr NULL). */
static char *rewrite_npy(const char *name, const char *descr, float scale, const char *to) {
    char from[128];
    snprintf(from, sizeof from, MLA_EXPORT "%s.npy", name);
    kp_npy_info info;
    size_t len;
    char *buf = load_npy(from, &info, &len), *path = in_dir(to);
    unsigned char *data = (unsigned char *)buf + info.data_offset;
    const size_t n = info.data_bytes / info.itemsize;
    kp_error kerr = {0};
    if (descr) {
        int16_t *narrow = malloc(2 * n + 2);
        cr_assert_not_null(narrow);
        for (size_t i = 0; i < n; i++) {
            int32_t v;
            if (info.itemsize == 2) memcpy(&narrow[i], data + 2 * i, 2);
            else memcpy(&v, data + 4 * i, 4), narrow[i] = (int16_t)v;
        }
        cr_assert_eq(kp_npy_write(path, descr, info.ndim, info.shape, narrow, 2 * n, &kerr), 0, "%s", kerr.msg);
        free(narrow);
    } else {
        cr_assert_str_eq(info.descr, "<f4");
        for (size_t i = 0; i < n; i++) ((float *)data)[i] *= scale;
        cr_assert_eq(kp_npy_write(path, "<f4", info.ndim, info.shape, data, info.data_bytes, &kerr), 0, "%s", kerr.msg);
    }
    free(buf);
    return path;
}

/* "NAME=FILE,FILE..." of exported outputs (names separated by ','), and files under kpt_dir given whole. */
static char *files_arg(const char *role, const char *outputs) {
    char *text = NULL, *list = strdup(outputs), *save = NULL;
    cr_assert(asprintf(&text, "%s=", role) > 0);
    for (char *o = strtok_r(list, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
        char *grown;
        const int whole = strchr(o, '.') != NULL; /* a file of the test's own */
        cr_assert(asprintf(&grown, "%s%s%s/%s%s%s", text, text[strlen(text) - 1] == '=' ? "" : ",", kpt_dir,
                           whole ? "" : MLA_EXPORT, o, whole ? "" : ".npy") > 0);
        free(text), text = grown;
    }
    free(list);
    return kpt_scratch(text);
}

/* torch's natural view of bf16 bits is int16 (t.view(torch.int16).numpy() saves <i2): judge takes a bf16 output as
 * <u2 or <i2, the same bytes judged the same; an i32 output narrowed to <i2 is still refused. */
Test(judge, bf16_bits_saved_as_int16_are_judged_like_uint16) {
    export_case(MLA_CASE, "mx", "mla.split_size@host");
    kpt_scratch(rewrite_npy("out", "<i2", 1, "out_i2.npy")), kpt_scratch(rewrite_npy("splits", "<i2", 1, "splits_i2.npy"));
    const char *checks = "[{\"check\":\"tolerance\",\"impl\":\"outside\"}]";
    const char *u2[] = {"--impl", files_arg("outside", "out,lse,max_logits"), NULL};
    const char *i2[] = {"--impl", files_arg("outside", "out_i2.npy,lse,max_logits"), NULL};
    const char *bad[] = {"--impl", files_arg("outside", "out,lse,max_logits,splits_i2.npy"), NULL};
    cJSON *a, *b;
    char *err;
    cr_assert_eq(judge_mla(checks, "u2", u2, &a, NULL), 0, "<u2");
    cr_assert_eq(judge_mla(checks, "i2", i2, &b, &err), 0, "<i2: %s", err);
    free(err);
    cr_assert_str_eq(kpt_at(b, "checks.0.result")->valuestring, "PASSED", "%s", kpt_at(b, "checks.0.summary")->valuestring);
    char *fa = cJSON_PrintUnformatted(kpt_at(a, "checks.0.findings")), *fb = cJSON_PrintUnformatted(kpt_at(b, "checks.0.findings"));
    cr_assert_str_eq(fa, fb, "<u2 and <i2 bits judged differently");
    cr_assert_str_eq(kpt_at(a, "impls.0.output_sha256")->valuestring, kpt_at(b, "impls.0.output_sha256")->valuestring);
    cr_assert_eq(judge_mla(checks, "bad", bad, NULL, &err), 2, "an int32 output as <i2: %s", err);
    cr_assert(strstr(err, "splits_i2.npy: dtype <i2; the family's output 'splits' is <i4"), "%s", err);
    free(fa), free(fb), free(err);
    cJSON_Delete(a), cJSON_Delete(b);
}

/* FlashMLA's decode gives no max_logits: declared absent (--absent outside=max_logits), out and lse from kparity's
 * own candidate are judged and max_logits is never compared with the stand-in judge fills in; tolerance is PASSED
 * over out and lse with max_logits NOT_RUN and named, and lse scaled by 0.9 is still caught. repeat and exact leave it
 * out and say so; the receipt's impl entry lists it. Without the declaration a missing max_logits file is refused,
 * and a name that is no output of mla is exit 2 naming it. Every compared output absent: NOT_RUN. */
Test(judge, an_output_declared_absent_is_left_out_and_named) {
    export_case(MLA_CASE, "mx", "mla.split_size@host");
    kpt_scratch(rewrite_npy("lse", NULL, 0.9f, "lse_scaled.npy"));
    const char *checks = "[{\"check\":\"tolerance\",\"impl\":\"outside\"},{\"check\":\"repeat\",\"impl\":\"outside\"},"
                         "{\"check\":\"exact\",\"impls\":[\"outside\",\"candidate\"]},"
                         "{\"check\":\"tolerance\",\"impl\":\"scaled\"},{\"check\":\"batch\",\"impl\":\"outside\"}]";
    char *two = files_arg("outside", "out,lse");
    const char *args[] = {"--absent", "outside=max_logits", "--impl", two, "--impl", two, "--absent", "scaled=max_logits",
                          "--impl", files_arg("scaled", "out,lse_scaled.npy"), NULL};
    cJSON *rec;
    char *err;
    cr_assert_eq(judge_mla(checks, "absent", args, &rec, &err), 1, "scaled's lse is INCORRECT: %s", err);
    free(err);
    const char *why = "max_logits: declared absent by mla.judged_outside@file, not judged";
    const cJSON *tol = kpt_at(rec, "checks.0");
    cr_assert_str_eq(kpt_at(tol, "result")->valuestring, "PASSED", "%s", kpt_at(tol, "summary")->valuestring);
    cr_assert_str_eq(kpt_at(tol, "findings.tensors.0.tensor")->valuestring, "out");
    cr_assert_str_eq(kpt_at(tol, "findings.tensors.0.result")->valuestring, "PASSED");
    cr_assert_str_eq(kpt_at(tol, "findings.tensors.1.tensor")->valuestring, "lse");
    cr_assert_str_eq(kpt_at(tol, "findings.tensors.1.result")->valuestring, "PASSED");
    cr_assert_str_eq(kpt_at(tol, "findings.tensors.2.tensor")->valuestring, "max_logits");
    cr_assert_str_eq(kpt_at(tol, "findings.tensors.2.result")->valuestring, "NOT_RUN");
    cr_assert_str_eq(kpt_at(tol, "findings.tensors.2.reason")->valuestring, why);
    cr_assert(strstr(kpt_at(tol, "summary")->valuestring, why), "%s", kpt_at(tol, "summary")->valuestring);
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(kpt_at(tol, "findings.tensors.2"), "metrics"), "never compared");
    for (int c = 1; c <= 2; c++) { /* repeat and exact: left out, said so */
        char key[32];
        snprintf(key, sizeof key, "checks.%d", c);
        const cJSON *chk = kpt_at(rec, key);
        cr_assert_str_eq(kpt_at(chk, "result")->valuestring, "PASSED", "%s: %s", kpt_at(chk, "check")->valuestring,
                         kpt_at(chk, "summary")->valuestring);
        cr_assert_str_eq(kpt_at(chk, "findings.absent.0")->valuestring,
                         "max_logits: declared absent by mla.judged_outside@file, left out");
        cr_assert(strstr(kpt_at(chk, "summary")->valuestring, "max_logits: declared absent"), "%s", kpt_at(chk, "summary")->valuestring);
    }
    const cJSON *scaled = kpt_at(rec, "checks.3");
    cr_assert_str_eq(kpt_at(scaled, "result")->valuestring, "INCORRECT", "%s", kpt_at(scaled, "summary")->valuestring);
    cr_assert_str_eq(kpt_at(scaled, "findings.tensors.0.result")->valuestring, "PASSED");
    cr_assert_str_eq(kpt_at(scaled, "findings.tensors.1.result")->valuestring, "INCORRECT", "lse at 0.9x");
    cr_assert_str_eq(kpt_at(scaled, "findings.tensors.2.result")->valuestring, "NOT_RUN");
    /* batch: no sub-batch given, so no probe compared (NOT_RUN), and max_logits named as left out all the same */
    cr_assert_str_eq(kpt_at(rec, "checks.4.result")->valuestring, "NOT_RUN", "%s", kpt_at(rec, "checks.4.summary")->valuestring);
    cr_assert_str_eq(kpt_at(rec, "checks.4.findings.absent.0")->valuestring,
                     "max_logits: declared absent by mla.judged_outside@file, left out");
    cr_assert_str_eq(kpt_at(rec, "impls.0.name")->valuestring, "mla.judged_outside@file");
    cr_assert_str_eq(kpt_at(rec, "impls.0.absent_outputs.0")->valuestring, "max_logits");
    cr_assert_eq(cJSON_GetArraySize(kpt_at(rec, "impls.0.absent_outputs")), 1);
    /* its output digest is of out, lse and splits (not given: judge's -1s) row by row, not of judge's stand-in for
       max_logits */
    kp_npy_info oi, li;
    size_t len;
    char *ob = load_npy(MLA_EXPORT "out.npy", &oi, &len), *lb = load_npy(MLA_EXPORT "lse.npy", &li, &len), hex[KP_SHA256_HEX_LEN];
    kp_sha256 h;
    kp_error kerr = {0};
    cr_assert_eq(kp_sha256_init(&h, &kerr), 0);
    for (int64_t r = 0; r < oi.shape[0]; r++) {
        kp_sha256_update(&h, ob + oi.data_offset + r * (oi.data_bytes / (size_t)oi.shape[0]), oi.data_bytes / (size_t)oi.shape[0]);
        kp_sha256_update(&h, lb + li.data_offset + r * (li.data_bytes / (size_t)li.shape[0]), li.data_bytes / (size_t)li.shape[0]);
        kp_sha256_update(&h, &(int32_t){-1}, 4);
    }
    kp_sha256_final_hex(&h, hex);
    cr_assert_str_eq(kpt_at(rec, "impls.0.output_sha256")->valuestring, hex);
    free(ob), free(lb);
    cr_assert_str_eq(kpt_at(rec, "impls.1.name")->valuestring, "mla.split_size@host");
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(kpt_at(rec, "impls.1"), "absent_outputs"), "the candidate gives every output");
    cJSON_Delete(rec);

    /* without the declaration, a missing max_logits file is refused */
    const char *undeclared[] = {"--impl", two, "--impl", two, NULL};
    cr_assert_eq(judge_mla(checks, "undeclared", undeclared, NULL, &err), 2, "%s", err);
    cr_assert(strstr(err, "2 files; mla outputs are, in order: out, lse, max_logits, splits (may be left out)"), "%s", err);
    free(err);
    /* a name that is not an output of mla */
    const char *unknown[] = {"--absent", "outside=max_logit", "--impl", two, "--impl", two, NULL};
    cr_assert_eq(judge_mla(checks, "unknown", unknown, NULL, &err), 2, "%s", err);
    cr_assert(strstr(err, "'max_logit' is not an output of mla (its outputs: out, lse, max_logits, splits)"), "%s", err);
    free(err);
    /* every output of the answer absent (only splits given): tolerance and exact have nothing to compare */
    const char *none[] = {"--absent", "outside=out,lse,max_logits", "--impl", files_arg("outside", "splits"), NULL};
    cr_assert_eq(judge_mla("[{\"check\":\"tolerance\",\"impl\":\"outside\"},{\"check\":\"exact\",\"impls\":[\"outside\","
                           "\"candidate\"]}]", "none", none, &rec, &err), 77, "%s", err);
    free(err);
    for (int c = 0; c < 2; c++) {
        const cJSON *chk = cJSON_GetArrayItem(kpt_at(rec, "checks"), c);
        cr_assert_str_eq(kpt_at(chk, "result")->valuestring, "NOT_RUN", "%s: %s", kpt_at(chk, "check")->valuestring,
                         kpt_at(chk, "summary")->valuestring);
    }
    cr_assert(strstr(kpt_at(rec, "checks.1.summary")->valuestring, "nothing to compare"), "%s", kpt_at(rec, "checks.1.summary")->valuestring);
    cJSON_Delete(rec);
}

/* A rule check reads the whole answer: a top-k output without its values is NOT_RUN, not judged on the indices; exact
 * compares the indices alone, saying so. */
Test(judge, a_rule_check_of_an_absent_output_is_not_run) {
    const char *tk = "topk(k=16,profile=randn,rows=4,seed=1,width=100)";
    export_case(tk, "tx", "topk.radix_exact@host");
    char *cfg = in_dir("topk.json"), *dir = in_dir("tj"), *impl, *o, *e;
    const char *body = "{\"schema\":\"kparity.gate/v1\",\"name\":\"judge-topk\",\"impls\":{\"candidate\":"
                       "\"topk.radix_exact@host\"},\"cases\":[{\"case\":\"topk(k=16,profile=randn,rows=4,seed=1,width=100)\","
                       "\"checks\":[{\"check\":\"rule\",\"impl\":\"outside\",\"ties\":\"lowest_index\",\"order\":\"any\"},"
                       "{\"check\":\"exact\",\"impls\":[\"outside\",\"candidate\"]}]}]}";
    cr_assert_eq(kpt_write(cfg, body, strlen(body)), 0);
    cr_assert(asprintf(&impl, "outside=%s/tx/topk.radix_exact@host.indices.npy", kpt_dir) > 0);
    char *argv[] = {kpt_binary(), "judge", (char *)tk, "--absent", "outside=values", "--impl", impl, "--config", cfg,
                    "--out", dir, "--quiet", NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 77, "a check NOT_RUN and none broken: %s", e);
    cJSON *rec = kpt_receipt(dir, 1);
    cr_assert_str_eq(kpt_at(rec, "checks.0.result")->valuestring, "NOT_RUN", "%s", kpt_at(rec, "checks.0.summary")->valuestring);
    cr_assert(strstr(kpt_at(rec, "checks.0.summary")->valuestring, "values: declared absent by topk.judged_outside@file"), "%s",
              kpt_at(rec, "checks.0.summary")->valuestring);
    cr_assert_str_eq(kpt_at(rec, "checks.1.result")->valuestring, "PASSED", "%s", kpt_at(rec, "checks.1.summary")->valuestring);
    cr_assert_str_eq(kpt_at(rec, "checks.1.findings.absent.0")->valuestring,
                     "values: declared absent by topk.judged_outside@file, left out");
    free(cfg), free(dir), free(impl), free(o), free(e);
    cJSON_Delete(rec);
}

/* ---- top-k's NaN rank: a rule parameter ------------------------------------------------------------------------ */

#define NAN_CASE "topk(k=16,profile=nan,rows=8,seed=5,width=100)"

static const float *g_scores; /* the row being ordered, for nan_first */
/* torch.topk's order, written here from its documentation: NaN above every number (every NaN one value, so by
 * index), then value descending (-0 == +0), then index ascending. */
static int nan_first(const void *a, const void *b) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const float x = g_scores[i], y = g_scores[j];
    if (isnan(x) != isnan(y)) return isnan(x) ? -1 : 1;
    if (!isnan(x) && x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}
static int ascending(const void *a, const void *b) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    return (i > j) - (i < j);
}

/* An output that ranks NaN above every number, as torch.topk does, is held to the rule under nan: "above" and
 * breaks it under the default "below" on exactly the rows whose window holds NaN, which the check names; kparity's
 * own candidate (NaN below) is the other way round. */
Test(judge, nan_ranked_above_passes_under_nan_above_and_fails_below_naming_the_nan_rows) {
    export_case(NAN_CASE, "nx", "topk.radix_exact@host");
    kp_npy_info si, ii, vi;
    size_t len;
    char *sbuf = load_npy("nx/scores.npy", &si, &len), *ibuf = load_npy("nx/topk.radix_exact@host.indices.npy", &ii, &len);
    char *vbuf = load_npy("nx/topk.radix_exact@host.values.npy", &vi, &len);
    const int64_t rows = si.shape[0], width = si.shape[1], k = ii.shape[1];
    const float *x = (const float *)(sbuf + si.data_offset);
    int32_t *idx = (int32_t *)(ibuf + ii.data_offset), order[100];
    float *val = (float *)(vbuf + vi.data_offset);
    cr_assert_eq(width, 100);
    int nan_row[8] = {0}, nnan = 0;
    for (int64_t r = 0; r < rows; r++) { /* the full window [0, 100): NaN ranked first, the first k by index */
        for (int64_t i = 0; i < width; i++) nan_row[r] |= isnan(x[r * width + i]), order[i] = (int32_t)i;
        nnan += nan_row[r];
        g_scores = x + r * width;
        qsort(order, (size_t)width, sizeof *order, nan_first);
        qsort(order, (size_t)k, sizeof *order, ascending);
        for (int64_t q = 0; q < k; q++) idx[r * k + q] = order[q], val[r * k + q] = g_scores[order[q]];
    }
    cr_assert(nnan > 0 && nnan < rows, "some rows hold NaN and some do not (%d of %lld)", nnan, (long long)rows);
    kp_error kerr = {0};
    char *ti = in_dir("torch_indices.npy"), *tv = in_dir("torch_values.npy"), *cfg = in_dir("nan.json"), *dir = in_dir("nj");
    cr_assert_eq(kp_npy_write(ti, "<i4", 2, ii.shape, idx, ii.data_bytes, &kerr), 0, "%s", kerr.msg);
    cr_assert_eq(kp_npy_write(tv, "<f4", 2, vi.shape, val, vi.data_bytes, &kerr), 0, "%s", kerr.msg);
    const char *body = "{\"schema\":\"kparity.gate/v1\",\"name\":\"nan\",\"impls\":{},\"defaults\":{\"ties\":\"lowest_index\","
                       "\"order\":\"any\"},\"cases\":[{\"case\":\"" NAN_CASE "\",\"checks\":["
                       "{\"check\":\"rule\",\"impl\":\"torch\"},{\"check\":\"rule\",\"impl\":\"torch\",\"nan\":\"above\"},"
                       "{\"check\":\"rule\",\"impl\":\"mine\",\"nan\":\"below\"},{\"check\":\"rule\",\"impl\":\"mine\",\"nan\":"
                       "\"above\"}]}]}";
    cr_assert_eq(kpt_write(cfg, body, strlen(body)), 0);
    char *torch, *mine, *o, *e;
    cr_assert(asprintf(&torch, "torch=%s,%s", ti, tv) > 0);
    cr_assert(asprintf(&mine, "mine=%s/nx/topk.radix_exact@host.indices.npy,%s/nx/topk.radix_exact@host.values.npy", kpt_dir,
                       kpt_dir) > 0);
    char *argv[] = {kpt_binary(), "judge", NAN_CASE, "--impl", torch, "--impl", mine, "--config", cfg, "--out", dir,
                    "--quiet", NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 1, "%s", e);
    cJSON *rec = kpt_receipt(dir, 1);
    const char *want[4] = {"INCORRECT", "PASSED", "PASSED", "INCORRECT"}, *rank[4] = {"below", "above", "below", "above"};
    for (int c = 0; c < 4; c++) {
        const cJSON *chk = cJSON_GetArrayItem(kpt_at(rec, "checks"), c);
        const char *summary = kpt_at(chk, "summary")->valuestring;
        cr_assert_str_eq(kpt_at(chk, "params.nan")->valuestring, rank[c], "the receipt records the NaN rank");
        cr_assert_str_eq(kpt_at(chk, "result")->valuestring, want[c], "check %d: %s", c, summary);
        if (!strcmp(want[c], "PASSED")) continue;
        /* it names exactly the rows with NaN, in its findings and its summary */
        const cJSON *named = kpt_at(chk, "findings.rows_failing_with_nan");
        cr_assert_eq(cJSON_GetArraySize(named), nnan, "%s", summary);
        char list[128] = "";
        int i = 0;
        for (int64_t r = 0; r < rows; r++) {
            const size_t n = strlen(list);
            if (nan_row[r]) snprintf(list + n, sizeof list - n, " %lld", (long long)r);
            cr_assert_eq(!cJSON_IsTrue(kpt_at(cJSON_GetArrayItem(kpt_at(chk, "findings.per_row"), (int)r), "impl.meets_rule")),
                         nan_row[r], "check %d row %lld", c, (long long)r);
            if (nan_row[r]) cr_assert_eq(cJSON_GetArrayItem(named, i++)->valuedouble, (double)r);
        }
        char needle[200];
        snprintf(needle, sizeof needle, "rows failing with NaN in their window (NaN ranked %s every number):%s", rank[c], list);
        cr_assert(strstr(summary, needle), "%s\nlooked for: %s", summary, needle);
    }
    cJSON_Delete(rec);
    free(sbuf), free(ibuf), free(vbuf), free(ti), free(tv), free(cfg), free(dir), free(torch), free(mine), free(o), free(e);
}

/* An order output declared absent (mla's splits): a batch probe does not describe the work order from the stand-in
 * judge fills in (no "splits" in its entry), where an order output merely not given is still described (from -1s,
 * as before); the answer's rows are compared as usual. */
Test(judge, a_batch_probe_reads_no_order_output_declared_absent) {
    export_case(MLA_CASE, "mx", "mla.split_size@host");
    export_case("mla(batch=1," MLA_SHAPE ")", "m1", "mla.split_size@host");
    const char *checks = "[{\"check\":\"batch\",\"impl\":\"outside\"}]";
    char *one;
    cr_assert(asprintf(&one, "outside@1=%s/m1/mla.split_size@host.out.npy,%s/m1/mla.split_size@host.lse.npy", kpt_dir, kpt_dir) > 0);
    const char *declared[] = {"--absent", "outside=max_logits,splits", "--impl", files_arg("outside", "out,lse"), "--impl", one,
                              NULL};
    char *with_ml;
    cr_assert(asprintf(&with_ml, "%s,%s/m1/mla.split_size@host.max_logits.npy", one, kpt_dir) > 0);
    const char *not_given[] = {"--impl", files_arg("outside", "out,lse,max_logits"), "--impl", with_ml, NULL};
    for (int v = 0; v < 2; v++) {
        cJSON *rec;
        char *err;
        cr_assert_eq(judge_mla(checks, v ? "ng" : "decl", v ? not_given : declared, &rec, &err), 77, "%s", err);
        const cJSON *probe = kpt_at(rec, "checks.0.findings.probes.0");
        cr_assert_str_eq(kpt_at(probe, "probe")->valuestring, "alone.row0");
        cr_assert_eq(kpt_at(probe, "rows_probed")->valuedouble, 1, "compared");
        cr_assert_eq(cJSON_GetArraySize(kpt_at(probe, "rows_differ")), 0);
        cr_assert_eq(cJSON_HasObjectItem(probe, "splits"), v == 1, "%s", v ? "not given: described" : "absent: not described");
        cJSON_Delete(rec), free(err);
    }
    free(one), free(with_ml);
}
