/* test_receipts.c: Criterion tests (label cpu) for receipts/: exact JSON numbers, .npy files, and
 * bundles: every planted defect (a flipped byte, an added or removed file, a broken chain) must be caught. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_fileio.h"
#include "../receipts/kp_json.h"
#include "../receipts/kp_npy.h"
#include "../receipts/kp_verdict.h"
#include "../receipts/kp_verify.h"
#include "kp_test_util.h"

static char *path_in(const char *dir, const char *rel) {
    char *p = NULL;
    cr_assert(asprintf(&p, "%s/%s", dir, rel) > 0);
    return p;
}

static int same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ---------------------------------------------------------------- JSON */

Test(json, numbers_round_trip_exactly) {
    const double third = 0.1 + 0.2; /* 0.30000000000000004 */
    const int64_t even = (INT64_C(1) << 53) + 2, odd = (INT64_C(1) << 53) + 1, below = (INT64_C(1) << 53) - 1;
    cJSON *doc = cJSON_CreateObject();
    cr_assert(kp_json_add_double(doc, "third", third));
    cr_assert(kp_json_add_double(doc, "negzero", -0.0));
    cr_assert(kp_json_add_double(doc, "tiny", 1e-300));
    cr_assert(kp_json_add_int(doc, "even", even));
    cr_assert(kp_json_add_int(doc, "odd", odd));
    cr_assert(kp_json_add_int(doc, "below", below));
    cr_assert(kp_json_add_int(doc, "max", INT64_MAX));
    cr_assert(kp_json_add_int(doc, "min", INT64_MIN));
    cr_assert(kp_json_add_float(doc, "f", 0.1f));
    cr_assert(kp_json_add_f32_bits(doc, "bits", 1.0f));
    char *text = kp_json_print(doc);
    cr_assert(text);
    cr_assert(strstr(text, "0.30000000000000004"), "%s", text);
    cr_assert(strstr(text, "9007199254740994") && strstr(text, "9007199254740993"), "%s", text);
    cr_assert(strstr(text, "\"0x3f800000\""), "%s", text);

    cJSON *back = kp_json_parse(text, strlen(text), NULL);
    cr_assert(back);
    double d;
    int64_t i;
    float f;
    cr_assert(kp_json_get_double(back, "third", &d) == 0 && same_bits(d, third));
    cr_assert(kp_json_get_double(back, "negzero", &d) == 0 && d == 0.0 && signbit(d), "-0.0 lost its sign");
    cr_assert(kp_json_get_double(back, "tiny", &d) == 0 && same_bits(d, 1e-300));
    cr_assert(kp_json_get_int(back, "even", &i) == 0 && i == even);
    cr_assert(kp_json_get_int(back, "odd", &i) == 0 && i == odd);
    cr_assert(kp_json_get_int(back, "max", &i) == 0 && i == INT64_MAX);
    cr_assert(kp_json_get_int(back, "min", &i) == 0 && i == INT64_MIN);
    cr_assert(kp_json_get_float(back, "f", &f) == 0 && memcmp(&f, &(float){0.1f}, sizeof f) == 0);
    cr_assert(kp_json_get_int(back, "third", &i) != 0, "a fraction must not read as an int");

    /* Printing what was parsed gives the same text back: the kept number text is used. */
    char *again = kp_json_print(back);
    cr_assert_str_eq(again, text);

    /* Plain cJSON_Parse keeps only a double: exact for doubles and ints below 2^53; from 2^53 on an
     * int is refused, not rounded (2^53 + 1 would read as 2^53). */
    cJSON *plain = cJSON_Parse(text);
    cr_assert(kp_json_get_double(plain, "third", &d) == 0 && same_bits(d, third));
    cr_assert(kp_json_get_int(plain, "below", &i) == 0 && i == below);
    cr_assert(kp_json_get_int(plain, "odd", &i) != 0, "2^53+1 from a double must be refused, got %lld", (long long)i);
    cr_assert(kp_json_get_int(plain, "even", &i) != 0, "2^53+2 from a double must be refused, got %lld", (long long)i);

    /* Positive control: cJSON's own printing does round these (pinned for cJSON 1.7.15 to 1.7.19),
     * so the values above really tell exact printing from cJSON's. */
    cJSON *naive = cJSON_CreateObject();
    cJSON_AddNumberToObject(naive, "third", third);
    char *naive_text = cJSON_PrintUnformatted(naive);
    cJSON *naive_back = cJSON_Parse(naive_text);
    cr_assert(kp_json_get_double(naive_back, "third", &d) == 0 && !same_bits(d, third), "cJSON printed %s", naive_text);

    cJSON_free(text);
    cJSON_free(again);
    cJSON_free(naive_text);
    cJSON_Delete(doc);
    cJSON_Delete(back);
    cJSON_Delete(plain);
    cJSON_Delete(naive);
    cJSON_Delete(naive_back);
}

Test(json, non_finite_and_plain_numbers_print_exactly) {
    cJSON *doc = cJSON_CreateObject();
    kp_json_add_double(doc, "nan", NAN);
    kp_json_add_double(doc, "inf", INFINITY);
    kp_json_add_float(doc, "ninf", -INFINITY);
    cJSON_AddNumberToObject(doc, "plain", 0.1 + 0.2); /* a number someone added with cJSON directly */
    cJSON_AddNumberToObject(doc, "plain_nan", NAN);
    cJSON_AddNumberToObject(doc, "plain_int", 123456789012.0);
    char *text = kp_json_print(doc);
    cr_assert(strstr(text, "\"nan\"") && strstr(text, "\"inf\"") && strstr(text, "\"-inf\""), "%s", text);
    cr_assert(strstr(text, "123456789012") && !strstr(text, "e+"), "%s", text);
    cJSON *back = kp_json_parse(text, strlen(text), NULL);
    double d;
    int64_t i;
    cr_assert(kp_json_get_double(back, "nan", &d) == 0 && isnan(d));
    cr_assert(kp_json_get_double(back, "inf", &d) == 0 && d == INFINITY);
    cr_assert(kp_json_get_double(back, "ninf", &d) == 0 && d == -INFINITY);
    cr_assert(kp_json_get_double(back, "plain", &d) == 0 && same_bits(d, 0.1 + 0.2));
    cr_assert(kp_json_get_double(back, "plain_nan", &d) == 0 && isnan(d));
    cr_assert(kp_json_get_int(back, "plain_int", &i) == 0 && i == 123456789012);
    cr_assert(kp_json_get_double(back, "missing", &d) != 0);
    cJSON_free(text);
    cJSON_Delete(doc);
    cJSON_Delete(back);
}

Test(json, parse_rejects_trailing_text_and_drops_stale_number_text) {
    size_t at = 0;
    cr_assert_null(kp_json_parse("{\"a\": 1} x", 10, &at));
    cr_assert_eq(at, 9);
    cr_assert_null(kp_json_parse("{\"a\": 1}\0{", 10, &at), "text after a NUL must not be ignored");
    const char *src = "{\"s\": \"-12 e5\", \"a\": [5, -0, 1e2]}";
    cJSON *doc = kp_json_parse(src, strlen(src), NULL);
    cr_assert(doc);
    cJSON *five = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "a"), 0);
    cJSON_SetNumberValue(five, 7); /* stale kept text "5" must not win */
    int64_t i;
    cr_assert(kp_json_value_int(five, &i) == 0 && i == 7);
    char *text = kp_json_print(doc);
    cr_assert(strstr(text, "7") && !strstr(text, "5,") && strstr(text, "-0") && strstr(text, "1e2"), "%s", text);
    cJSON_free(text);
    cJSON_Delete(doc);
}

/* ---------------------------------------------------------------- npy */

Test(npy, header_is_numpy_format_1_0) {
    const int64_t values[5] = {3, -1, 154842, INT64_MAX, 0}, shape[1] = {5};
    unsigned char *buf;
    size_t len;
    kp_error err = {0};
    cr_assert(kp_npy_encode("<i8", 1, shape, values, sizeof values, &buf, &len, &err) == 0, "%s", err.msg);
    cr_assert(memcmp(buf, "\x93NUMPY\x01\x00", 8) == 0);
    size_t header_len = (size_t)buf[8] | (size_t)buf[9] << 8;
    cr_assert_eq((10 + header_len) % 64, 0, "header block is %zu bytes", 10 + header_len);
    const char *dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }";
    cr_assert(memcmp(buf + 10, dict, strlen(dict)) == 0, "%.*s", (int)header_len, buf + 10);
    for (size_t k = 10 + strlen(dict); k < 10 + header_len - 1; k++) cr_assert_eq(buf[k], ' ');
    cr_assert_eq(buf[10 + header_len - 1], '\n');
    cr_assert_eq(len, 10 + header_len + sizeof values);
    cr_assert(memcmp(buf + 10 + header_len, values, sizeof values) == 0);

    kp_npy_info info;
    cr_assert(kp_npy_decode(buf, len, &info, &err) == 0, "%s", err.msg);
    cr_assert_str_eq(info.descr, "<i8");
    cr_assert(info.ndim == 1 && info.shape[0] == 5 && info.data_bytes == sizeof values);
    /* Positive control: the decoder notices a file cut short. */
    cr_assert(kp_npy_decode(buf, len - 1, &info, &err) == KP_EXIT_USAGE);
    free(buf);

    const float scalar = 1.5f;
    cr_assert(kp_npy_encode("<f4", 0, NULL, &scalar, sizeof scalar, &buf, &len, &err) == 0, "%s", err.msg);
    /* memmem within the header: the file is not a C string (found by ASan's strict_string_checks: strstr read on
       past the data when the needle was absent) */
    cr_assert(memmem(buf + 10, len - 10, "'shape': (), }", 14));
    cr_assert(kp_npy_decode(buf, len, &info, &err) == 0 && info.ndim == 0 && info.data_bytes == 4);
    free(buf);

    const int64_t shape2[2] = {2, 3};
    const unsigned char bytes[6] = {1, 2, 3, 4, 5, 6};
    cr_assert(kp_npy_encode("|u1", 2, shape2, bytes, 6, &buf, &len, &err) == 0, "%s", err.msg);
    cr_assert(memmem(buf + 10, len - 10, "'shape': (2, 3), }", 18));
    cr_assert(kp_npy_decode(buf, len, &info, &err) == 0 && info.ndim == 2 && info.shape[1] == 3);
    free(buf);

    cr_assert(kp_npy_encode("<i8", 1, shape, values, sizeof values - 8, &buf, &len, &err) == KP_EXIT_USAGE,
              "a shape that does not match the data must be refused");
    cr_assert(kp_npy_encode(">f4", 1, shape, values, 20, &buf, &len, &err) == KP_EXIT_USAGE);
}

Test(npy, write_is_atomic_and_loads_in_numpy_when_present) {
    char *dir = kpt_tempdir(), *path = path_in(dir, "a.npy");
    const double values[3] = {0.1 + 0.2, -0.0, 1e-300};
    const int64_t shape[1] = {3};
    kp_error err = {0};
    cr_assert(kp_npy_write(path, "<f8", 1, shape, values, sizeof values, &err) == 0, "%s", err.msg);
    size_t len;
    char *file = kpt_read(path, &len);
    kp_npy_info info;
    cr_assert(kp_npy_decode((unsigned char *)file, len, &info, &err) == 0, "%s", err.msg);
    cr_assert(memcmp(file + info.data_offset, values, sizeof values) == 0);
    struct stat st;
    cr_assert(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644);
    char **names;
    size_t n;
    cr_assert(kp_bundle_list_files(dir, &names, &n, &err) == 0);
    cr_assert_eq(n, 1, "a temporary file was left behind");
    kp_bundle_free_list(names, n);

    char *cmd = NULL, *out = NULL, *errout = NULL;
    cr_assert(asprintf(&cmd, "\"$0\" -c 'import numpy' 2>/dev/null || exit 77; \"$0\" -c 'import numpy as np, sys; "
                             "a = np.load(sys.argv[1]); print(a.dtype, a.shape, repr(a.tolist()))' %s", path) > 0);
    char *argv[] = {"/bin/sh", "-c", cmd, kpt_python(), NULL};
    int rc = kpt_run(argv, &out, &errout);
    free(cmd), free(file), free(path);
    kpt_rmtree(dir);
    free(dir);
    if (rc == 77) cr_skip_test("python3 with numpy is not installed; the pure-C header check above still ran");
    cr_assert_eq(rc, 0, "numpy could not load it: %s", errout);
    cr_assert(strstr(out, "float64 (3,) [0.30000000000000004, -0.0, 1e-300]"), "numpy read: %s", out);
    free(out), free(errout);
}

/* ---------------------------------------------------------------- bundles */

static cJSON *check(const char *kind, const char *label, const char *impl, const char *result, const char *summary) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "check", kind);
    cJSON_AddStringToObject(c, "label", label);
    cJSON_AddStringToObject(c, "impl", impl);
    cJSON_AddStringToObject(c, "result", result);
    cJSON_AddStringToObject(c, "summary", summary);
    return c;
}

static cJSON *receipt(const char *name, const char *result) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "schema", "kparity.receipt/v1");
    cJSON *c = cJSON_AddObjectToObject(r, "case");
    cJSON_AddStringToObject(c, "name", name);
    cJSON_AddStringToObject(r, "result", result);
    kp_json_add_double(r, "duration_s", 0.1 + 0.2);
    cJSON_AddArrayToObject(r, "reasons");
    cJSON_AddArrayToObject(r, "checks");
    return r;
}

#define CASE2 "topp(batch=64,force_token=154842,force_value=1e9,profile=forced,seed=58231,top_p=0.95,vocab=154856)"

/* 3 receipts (PASSED with 2 artifacts; INCORRECT; FAILED), 6 checks, finished FAILED (the worst wins). */
static char *build_bundle(char **root) {
    *root = kpt_tempdir();
    char *dir = path_in(*root, "bundle");
    kp_bundle *b;
    kp_error err = {0};
    cr_assert(kp_bundle_open(&b, dir, &err) == 0, "%s", err.msg);
    const int64_t idx[5] = {7, 11, 13, 154842, 154855}, shape1[1] = {5}, shape2[2] = {2, 3};
    const float mass[6] = {0.25f, 0.5f, 0.125f, 1e-9f, 0.0f, 1.0f};
    char d1[KP_SHA256_HEX_LEN], d2[KP_SHA256_HEX_LEN], rel1[128], rel2[128];
    cr_assert(kp_bundle_add_artifact(b, "<i8", 1, shape1, idx, sizeof idx, d1, rel1, &err) == 0, "%s", err.msg);
    cr_assert(kp_bundle_add_artifact(b, "<f4", 2, shape2, mass, sizeof mass, d2, rel2, &err) == 0, "%s", err.msg);

    cJSON *r1 = receipt("topp(batch=2,seed=1,vocab=7)", "PASSED");
    cJSON *c1 = check("exact", "exact", "topp.split_logit@cpu", "PASSED", "0 of 14 tokens differ");
    cJSON_AddItemToArray(cJSON_GetObjectItem(r1, "checks"), c1);
    cJSON *arts = cJSON_AddArrayToObject(r1, "artifacts");
    const char *files[2] = {rel1, rel2}, *shas[2] = {d1, d2};
    for (int k = 0; k < 2; k++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "name", k ? "kept_mass" : "mismatch_indices");
        cJSON_AddStringToObject(a, "file", files[k]);
        cJSON_AddStringToObject(a, "sha256", shas[k]);
        cJSON_AddItemToArray(arts, a);
    }
    cr_assert(kp_bundle_add_receipt(b, r1, &err) == 0, "%s", err.msg);

    cJSON *r2 = receipt(CASE2, "INCORRECT");
    cJSON_AddItemToArray(cJSON_GetObjectItem(r2, "checks"), check("exact", "exact", "topp.split_logit@cuda", "PASSED", "bitwise equal"));
    cJSON_AddItemToArray(cJSON_GetObjectItem(r2, "checks"),
                         check("rule", "rule | strict", "topp.split_logit@cuda", "INCORRECT", "64 rows <all -inf> & \"NaN\""));
    cr_assert(kp_bundle_add_receipt(b, r2, &err) == 0, "%s", err.msg);

    cJSON *r3 = receipt("moe(experts=288,rows=33,seed=3)", "FAILED");
    cJSON_AddItemToArray(cJSON_GetObjectItem(r3, "checks"), check("repeat", "repeat", "moe.marlin@cuda", "FAILED", "launch error"));
    cJSON_AddItemToArray(cJSON_GetObjectItem(r3, "checks"), check("batch", "batch", "moe.marlin@cuda", "NOT_RUN", "no device"));
    cJSON_AddItemToArray(cJSON_GetObjectItem(r3, "checks"),
                         check("tolerance", "tolerance", "moe.gemv@cpu", "NOT_SUPPORTED", "rows > 32"));
    cr_assert(kp_bundle_add_receipt(b, r3, &err) == 0, "%s", err.msg);

    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "config_sha256", "ab");
    cr_assert(kp_bundle_finish(b, "FAILED", KP_EXIT_ENV, meta, &err) == 0, "%s", err.msg);
    kp_bundle_free(b);
    return dir;
}

static void drop_scratch(char *root, char *dir) {
    kpt_rmtree(root);
    free(root);
    free(dir);
}

static int verify(const char *dir, kp_error *err) {
    memset(err, 0, sizeof *err);
    return kp_bundle_verify(dir, err);
}

/* The bundle's files, found without kparity's own lister, so a file it missed is still flipped. */
static char *found[64];
static size_t n_found, root_len;

static int collect(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)ftw;
    if (flag == FTW_F && n_found < 64) found[n_found++] = strdup(path + root_len + 1);
    return 0;
}

static void flip(const char *dir, const char *rel, size_t at) {
    char *p = path_in(dir, rel);
    size_t len;
    char *data = kpt_read(p, &len);
    cr_assert(data && at < len, "%s: %zu bytes", rel, len);
    data[at] ^= 0x01;
    cr_assert(kpt_write(p, data, len) == 0);
    free(data);
    free(p);
}

static int run_sh(const char *fmt, const char *dir) {
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, fmt, dir) > 0);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    int rc = kpt_run(argv, NULL, NULL);
    free(cmd);
    return rc;
}

#define SHA256SUM_CHECK "cd '%s' && sha256sum -c --strict --quiet manifest.sha256"

Test(bundle, intact_bundle_verifies_and_sha256sum_agrees) {
    char *root, *dir = build_bundle(&root);
    kp_error err;
    cr_assert(verify(dir, &err) == 0, "%s", err.msg);
    cr_assert_eq(run_sh(SHA256SUM_CHECK, dir), 0, "sha256sum -c --strict rejected the manifest");
    /* Positive control: sha256sum does notice a changed byte. */
    flip(dir, "summary.md", 3);
    cr_assert_neq(run_sh(SHA256SUM_CHECK, dir), 0);
    drop_scratch(root, dir);
}

/* Artifacts are written together before the receipt that names them (on several threads): every one is there, whole
 * and named by its digest, when the receipt is; the same bytes twice are one file; and a write that fails fails that
 * receipt, naming the artifact, with the bundle left unfinished. */
Test(bundle, artifacts_are_written_before_the_receipt_that_names_them) {
    char *root = kpt_tempdir(), *dir = path_in(root, "bundle");
    kp_bundle *b;
    kp_error err = {0};
    cr_assert(kp_bundle_open(&b, dir, &err) == 0, "%s", err.msg);
    enum { N = 300 };
    char digest[N + 1][KP_SHA256_HEX_LEN + 1], rel[N + 1][128];
    cJSON *r = receipt("topp(batch=2,seed=1,vocab=7)", "PASSED"), *arts = cJSON_AddArrayToObject(r, "artifacts");
    for (int i = 0; i <= N; i++) {
        int64_t idx[40];
        for (int k = 0; k < 40; k++) idx[k] = (i % N) * 100 + k; /* the last is the first again */
        const int64_t shape[1] = {40};
        cr_assert(kp_bundle_add_artifact(b, "<i8", 1, shape, idx, sizeof idx, digest[i], rel[i], &err) == 0, "%s", err.msg);
        digest[i][KP_SHA256_HEX_LEN] = 0;
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "name", "list");
        cJSON_AddStringToObject(a, "file", rel[i]);
        cJSON_AddStringToObject(a, "sha256", digest[i]);
        cJSON_AddItemToArray(arts, a);
    }
    cr_assert_str_eq(digest[N], digest[0]);
    cr_assert(kp_bundle_add_receipt(b, r, &err) == 0, "%s", err.msg);
    char *folder = path_in(dir, "artifacts");
    DIR *d = opendir(folder);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) files += e->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(files, N, "%d files for %d distinct artifacts", files, N);
    cr_assert(kp_bundle_finish(b, "NOT_RUN", 77, NULL, &err) == 0, "%s", err.msg); /* a receipt without checks */
    kp_bundle_free(b);
    cr_assert(verify(dir, &err) == 0, "%s", err.msg);

    /* one artifact's name taken by a folder (its rename fails, the folder's sync does not): the receipt after it is
       refused, naming that artifact; and with the whole artifacts folder gone, naming one */
    for (int broken = 0; broken < 2; broken++) {
        char *dir2 = path_in(root, broken ? "no_folder" : "name_taken");
        cr_assert(kp_bundle_open(&b, dir2, &err) == 0, "%s", err.msg);
        for (int i = 0; i < 8; i++) {
            int64_t idx[3] = {i, i + 1, i + 2};
            const int64_t shape[1] = {3};
            cr_assert(kp_bundle_add_artifact(b, "<i8", 1, shape, idx, sizeof idx, digest[i], rel[i], &err) == 0, "%s", err.msg);
        }
        char *art2 = path_in(dir2, "artifacts"), *taken = path_in(dir2, rel[5]), *inside = path_in(taken, "x");
        if (broken) {
            cr_assert_eq(rmdir(art2), 0);
            cr_assert_eq(kpt_write(art2, "x", 1), 0);
        } else {
            cr_assert_eq(mkdir(taken, 0755), 0);
            cr_assert_eq(kpt_write(inside, "x", 1), 0);
        }
        memset(&err, 0, sizeof err);
        cr_assert_eq(kp_bundle_add_receipt(b, receipt("topp(batch=2,seed=1,vocab=7)", "PASSED"), &err), KP_EXIT_ENV);
        cr_assert(strstr(err.msg, broken ? "artifacts/" : rel[5]) && strstr(err.msg, "unfinished"), "%s", err.msg);
        kp_bundle_free(b);
        free(art2), free(taken), free(inside), free(dir2);
    }
    free(folder), free(dir);
    kpt_rmtree(root);
    free(root);
}

Test(bundle, one_flipped_byte_in_any_file_is_caught_and_named) {
    char *root, *dir = build_bundle(&root);
    kp_error err;
    root_len = strlen(dir);
    n_found = 0;
    nftw(dir, collect, 16, FTW_PHYS);
    /* 3 receipts, 2 artifacts, junit.xml, summary.md, report.html, bundle.json, manifest.sha256 */
    cr_assert_eq(n_found, 10, "found %zu files", n_found);
    for (size_t k = 0; k < n_found; k++) {
        if (strcmp(found[k], "manifest.sha256") == 0) continue;
        size_t len;
        char *p = path_in(dir, found[k]);
        free(kpt_read(p, &len));
        for (size_t at = 0; at < len; at += len / 3 + 1) { /* the first byte, and two further in */
            flip(dir, found[k], at);
            cr_assert_eq(verify(dir, &err), KP_EXIT_INCORRECT, "%s byte %zu changed, verify said: %s", found[k], at, err.msg);
            cr_assert(strstr(err.msg, found[k]), "message does not name %s: %s", found[k], err.msg);
            flip(dir, found[k], at);
            cr_assert(verify(dir, &err) == 0, "restoring %s: %s", found[k], err.msg);
        }
        free(p);
    }
    /* The manifest: a digest digit, a path character, the separator, a newline. */
    char *mp = path_in(dir, "manifest.sha256");
    char *manifest = kpt_read(mp, NULL);
    size_t second_line = (size_t)(strchr(manifest, '\n') - manifest) + 1;
    const size_t spots[] = {0, 64, 70, second_line - 1, second_line + 5};
    for (size_t s = 0; s < sizeof spots / sizeof spots[0]; s++) {
        flip(dir, "manifest.sha256", spots[s]);
        cr_assert_eq(verify(dir, &err), KP_EXIT_INCORRECT, "manifest byte %zu: %s", spots[s], err.msg);
        cr_assert(strstr(err.msg, "manifest.sha256"), "manifest byte %zu: %s", spots[s], err.msg);
        flip(dir, "manifest.sha256", spots[s]);
    }
    /* A changed digest digit must also name the file on that line. */
    char first_path[128];
    cr_assert(sscanf(manifest + 66, "%127s", first_path) == 1);
    flip(dir, "manifest.sha256", 0);
    verify(dir, &err);
    cr_assert(strstr(err.msg, first_path), "should name %s: %s", first_path, err.msg);
    flip(dir, "manifest.sha256", 0);
    cr_assert(verify(dir, &err) == 0, "%s", err.msg);
    for (size_t k = 0; k < n_found; k++) free(found[k]);
    free(manifest), free(mp);
    drop_scratch(root, dir);
}

Test(bundle, added_and_removed_files_are_named) {
    char *root, *dir = build_bundle(&root);
    kp_error err;
    const char *added[] = {"notes.txt", "artifacts/extra.npy", "receipts/0004.json", ".hidden"};
    for (size_t k = 0; k < 4; k++) {
        char *p = path_in(dir, added[k]);
        cr_assert(kpt_write(p, "x", 1) == 0);
        cr_assert_eq(verify(dir, &err), KP_EXIT_INCORRECT, "added %s: %s", added[k], err.msg);
        cr_assert(strstr(err.msg, added[k]), "should name %s: %s", added[k], err.msg);
        unlink(p);
        free(p);
    }
    cr_assert(verify(dir, &err) == 0, "%s", err.msg);
    char *p = path_in(dir, "receipts/0002.json");
    cr_assert(unlink(p) == 0);
    cr_assert_eq(verify(dir, &err), KP_EXIT_INCORRECT);
    cr_assert(strstr(err.msg, "receipts/0002.json"), "%s", err.msg);
    free(p);
    drop_scratch(root, dir);
}

/* Edit `rel` and repair every digest that covers it (bundle.json's entry for a receipt, the
 * manifest lines), without kparity's writer, so only the planted defect remains. */
static void edit_consistently(const char *dir, const char *rel, const char *from, const char *to) {
    char old_hex[KP_SHA256_HEX_LEN], new_hex[KP_SHA256_HEX_LEN];
    kp_error err;
    char *p = path_in(dir, rel), *text = kpt_read(p, NULL), *hit = strstr(text, from);
    cr_assert(hit, "%s does not contain %s", rel, from);
    cr_assert(kp_sha256_file_hex(p, old_hex, &err) == 0);
    char *edited = NULL;
    cr_assert(asprintf(&edited, "%.*s%s%s", (int)(hit - text), text, to, hit + strlen(from)) > 0);
    cr_assert(kpt_write(p, edited, strlen(edited)) == 0);
    cr_assert(kp_sha256_file_hex(p, new_hex, &err) == 0);
    if (strncmp(rel, "receipts/", 9) == 0) edit_consistently(dir, "bundle.json", old_hex, new_hex);
    const char *lines[] = {rel, "bundle.json"};
    char *mp = path_in(dir, "manifest.sha256"), *m = kpt_read(mp, NULL);
    for (int k = 0; k < 2; k++) {
        char *fp = path_in(dir, lines[k]), hex[KP_SHA256_HEX_LEN], needle[200];
        cr_assert(kp_sha256_file_hex(fp, hex, &err) == 0);
        snprintf(needle, sizeof needle, "  %s\n", lines[k]);
        char *line = strstr(m, needle);
        cr_assert(line && line - m >= 64);
        memcpy(line - 64, hex, 64);
        free(fp);
    }
    cr_assert(kpt_write(mp, m, strlen(m)) == 0);
    free(m), free(mp), free(edited), free(text), free(p);
}

static char *prev_of(const char *dir, const char *rel) {
    cJSON *r;
    kp_error err;
    char *p = path_in(dir, rel);
    cr_assert(kp_bundle_read_json(p, &r, &err) == 0, "%s", err.msg);
    char *prev = strdup(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "chain"), "prev")->valuestring);
    cJSON_Delete(r);
    free(p);
    return prev;
}

Test(bundle, a_consistently_broken_chain_is_named) {
    char *root, *dir = build_bundle(&root);
    kp_error err;
    char *prev = prev_of(dir, "receipts/0002.json"), forged[KP_SHA256_HEX_LEN];
    memcpy(forged, prev, KP_SHA256_HEX_LEN);
    forged[10] = forged[10] == 'a' ? 'b' : 'a';
    edit_consistently(dir, "receipts/0002.json", prev, forged);
    /* Control: every digest is right again, so only the chain can fail. */
    cr_assert_eq(run_sh(SHA256SUM_CHECK, dir), 0, "the edit left a stale digest");
    cr_assert_eq(verify(dir, &err), KP_EXIT_INCORRECT, "%s", err.msg);
    cr_assert(strstr(err.msg, "receipts/0002.json") && strstr(err.msg, "chain"), "%s", err.msg);
    free(prev);
    drop_scratch(root, dir);
}

Test(bundle, consistent_edits_of_head_index_and_artifact_digest_are_named) {
    struct {
        const char *file, *from, *to, *named;
    } cases[] = {
        {"bundle.json", "\"chain_head\":\t\"", "\"chain_head\":\t\"0", "chain_head"},
        {"receipts/0003.json", "\"index\":\t3", "\"index\":\t4", "receipts/0003.json"},
        {"receipts/0001.json", "\"sha256\":\t\"", "\"sha256\":\t\"f", "receipts/0001.json"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *root, *dir = build_bundle(&root);
        kp_error err;
        cr_assert(verify(dir, &err) == 0, "%s", err.msg);
        edit_consistently(dir, cases[k].file, cases[k].from, cases[k].to);
        cr_assert_eq(run_sh(SHA256SUM_CHECK, dir), 0, "edit %zu left a stale digest", k);
        cr_assert_eq(verify(dir, &err), KP_EXIT_INCORRECT, "edit %zu passed verify", k);
        cr_assert(strstr(err.msg, cases[k].named), "edit %zu: %s", k, err.msg);
        drop_scratch(root, dir);
    }
}

Test(bundle, files_say_what_the_receipts_say) {
    char *root, *dir = build_bundle(&root);
    char *p = path_in(dir, "junit.xml"), *junit = kpt_read(p, NULL);
    free(p);
    size_t testcases = 0;
    for (char *s = junit; (s = strstr(s, "<testcase ")); s++) testcases++;
    cr_assert_eq(testcases, 6, "%s", junit);
    cr_assert(strstr(junit, "failures=\"1\" errors=\"1\" skipped=\"2\""), "%s", junit);
    cr_assert(strstr(junit, "classname=\"" CASE2 "\" name=\"rule | strict\">\n      <failure message=\"64 rows &lt;all -inf&gt; &amp; &quot;NaN&quot;\""),
              "%s", junit);
    cr_assert(strstr(junit, "<error message=\"launch error\" type=\"FAILED\"") && strstr(junit, "<skipped message=\"no device\""));
    char *argv[] = {"/bin/sh", "-c", "command -v python3 >/dev/null || exit 77; python3 -c 'import sys, xml.etree.ElementTree as E; "
                                     "E.parse(sys.argv[1])' \"$0\"", NULL, NULL};
    argv[3] = path_in(dir, "junit.xml");
    int rc = kpt_run(argv, NULL, NULL);
    cr_assert(rc == 0 || rc == 77, "junit.xml is not well-formed XML");

    p = path_in(dir, "summary.md");
    char *md = kpt_read(p, NULL);
    free(p);
    cr_assert(strncmp(md, "# kparity verdict: FAILED (exit code 3)\n", 40) == 0, "%s", md);
    cr_assert(strstr(md, "| case | impl | check | result | key figure |"));
    cr_assert(strstr(md, "| rule \\| strict | INCORRECT | 64 rows \\<all -inf\\> & \"NaN\" |"), "%s", md);
    cr_assert(strstr(md, "| exact | PASSED | 0 of 14 tokens differ |"), "the check's summary is its key figure: %s", md);
    size_t rows = 0;
    for (char *s = md; (s = strstr(s, "\n| ")); s++) rows++;
    cr_assert_eq(rows, 2 + 6, "header, rule and 6 check rows: %s", md);

    p = path_in(dir, "report.html");
    char *html = kpt_read(p, NULL);
    free(p);
    cr_assert(strstr(html, "<svg") && strstr(html, "INCORRECT") && strstr(html, "&lt;all -inf&gt;"));
    cr_assert(!strstr(html, "<script") && !strstr(html, "<link") && !strstr(html, "src=") && !strstr(html, "https:"),
              "report.html must load nothing from outside");

    cJSON *doc;
    kp_error err;
    p = path_in(dir, "bundle.json");
    cr_assert(kp_bundle_read_json(p, &doc, &err) == 0, "%s", err.msg);
    free(p);
    char head[KP_SHA256_HEX_LEN];
    p = path_in(dir, "receipts/0003.json");
    cr_assert(kp_sha256_file_hex(p, head, &err) == 0);
    free(p);
    int64_t code;
    cr_assert_str_eq(cJSON_GetObjectItem(doc, "schema")->valuestring, "kparity.bundle/v1");
    cr_assert_str_eq(cJSON_GetObjectItem(doc, "chain_head")->valuestring, head);
    cr_assert_str_eq(cJSON_GetObjectItem(doc, "config_sha256")->valuestring, "ab");
    cr_assert(kp_json_get_int(doc, "exit_code", &code) == 0 && code == 3);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "receipts")), 3);
    char *first_prev = prev_of(dir, "receipts/0001.json");
    cr_assert_str_eq(first_prev, "0000000000000000000000000000000000000000000000000000000000000000");
    free(first_prev);
    cJSON_Delete(doc);
    free(junit), free(md), free(html), free(argv[3]);
    drop_scratch(root, dir);
}

/* rows of receipts, each "RESULT" or "RESULT:CHECK,CHECK..." (its checks' results) */
static cJSON *rows_of(const char *const *spec, int n) {
    cJSON *rows = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        char result[64], *colon;
        snprintf(result, sizeof result, "%s", spec[i]);
        if ((colon = strchr(result, ':'))) *colon = '\0';
        cJSON *r = receipt("x()", result);
        for (char *c = colon ? strtok(colon + 1, ",") : NULL; c; c = strtok(NULL, ","))
            cJSON_AddItemToArray(cJSON_GetObjectItem(r, "checks"), check("rule", "rule", "i", c, ""));
        cr_assert_eq(kp_bundle_add_row(rows, "receipts/0001.json", KP_ZERO_DIGEST, r), 0);
        cJSON_Delete(r);
    }
    return rows;
}

Test(bundle, the_verdict_a_bundle_may_record_follows_its_receipts) {
    struct {
        const char *rows[3];
        int n;
        const char *verdict;
        int code;
    } given[] = {
        {{"PASSED:PASSED", "INCORRECT:PASSED,INCORRECT"}, 2, "INCORRECT", 1},
        {{"PASSED:PASSED", "FAILED:FAILED", "INCORRECT:INCORRECT"}, 3, "FAILED", 3},
        {{"PASSED:PASSED", "NOT_SUPPORTED:NOT_SUPPORTED"}, 2, "NOT_SUPPORTED", 77},
        {{"PASSED:PASSED", "NOT_SUPPORTED:NOT_SUPPORTED", "NOT_RUN:NOT_RUN"}, 3, "NOT_RUN", 77}, /* NOT_RUN outranks */
        {{"NOT_RUN:NOT_RUN", "NOT_RUN:NOT_RUN"}, 2, "NOT_RUN", 77},
        {{"PASSED"}, 1, "NOT_RUN", 77}, /* no check ran */
        {{"PASSED:PASSED", "MAYBE:PASSED"}, 2, "FAILED", 3}, /* a result outside the vocabulary never passes */
        {{"PASSED:PASSED", "PASSED:PASSED"}, 2, "PASSED", 0},
    };
    char why[300];
    for (size_t k = 0; k < sizeof given / sizeof *given; k++) {
        cJSON *rows = rows_of(given[k].rows, given[k].n);
        int code = -1;
        cr_assert_str_eq(kp_bundle_rows_verdict(rows, 0, 0, &code), given[k].verdict, "rows %zu", k);
        cr_assert_eq(code, given[k].code, "rows %zu", k);
        cr_assert(kp_bundle_verdict_fits(rows, given[k].verdict, given[k].code, why, sizeof why), "rows %zu: %s", k, why);
        /* what receipts cannot show outranks them: a timeout, a lost device */
        cr_assert(kp_bundle_verdict_fits(rows, "TIMEOUT", 4, why, sizeof why), "rows %zu: %s", k, why);
        cr_assert(kp_bundle_verdict_fits(rows, "FAILED", 3, why, sizeof why), "rows %zu: %s", k, why);
        cr_assert_str_eq(kp_bundle_rows_verdict(rows, 1, 0, &code), "TIMEOUT");
        cr_assert_eq(code, 4);
        cr_assert_str_eq(kp_bundle_rows_verdict(rows, 0, 1, &code), "FAILED");
        cr_assert_eq(code, 3);
        /* and nothing else: every other verdict, and a verdict's name with another exit code */
        const char *other[] = {"PASSED", "INCORRECT", "NOT_RUN", "NOT_SUPPORTED"};
        const int other_code[] = {0, 1, 77, 77};
        for (int v = 0; v < 4; v++)
            if (strcmp(other[v], given[k].verdict))
                cr_assert(!kp_bundle_verdict_fits(rows, other[v], other_code[v], why, sizeof why), "rows %zu may say %s", k, other[v]);
        cr_assert(!kp_bundle_verdict_fits(rows, given[k].verdict, given[k].code == 1 ? 0 : 1, why, sizeof why));
        cr_assert(strstr(why, "does not go with"), "%s", why);
        cr_assert(!kp_bundle_verdict_fits(rows, "PASSED!", 0, why, sizeof why) && !kp_bundle_verdict_fits(rows, NULL, 0, why, sizeof why));
        cJSON_Delete(rows);
    }
}

Test(bundle, empty_bundle_is_valid_and_refuses_bad_input) {
    char *root = kpt_tempdir(), *dir = path_in(root, "b");
    kp_bundle *b;
    kp_error err = {0};
    cr_assert(kp_bundle_open(&b, dir, &err) == 0, "%s", err.msg);
    cr_assert_eq(kp_bundle_add_receipt(b, receipt("x()", "MAYBE"), &err), KP_EXIT_USAGE, "a result outside the vocabulary");
    cJSON *r = receipt("x()", "PASSED"), *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "file", "artifacts/00.npy");
    cJSON_AddStringToObject(a, "sha256", "00");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "artifacts"), a);
    cr_assert_eq(kp_bundle_add_receipt(b, r, &err), KP_EXIT_USAGE, "an artifact the bundle does not hold");
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "verdict", "PASSED");
    cr_assert_eq(kp_bundle_finish(b, "NOT_RUN", KP_EXIT_SKIP, meta, &err), KP_EXIT_USAGE, "meta must not overwrite the verdict");
    cr_assert(strstr(err.msg, "meta member 'verdict'"), "%s", err.msg);
    /* no receipt, so nothing ran: a verdict its receipts do not give is refused before anything is written */
    cr_assert_eq(kp_bundle_finish(b, "PASSED", KP_EXIT_OK, NULL, &err), KP_EXIT_USAGE, "an empty run cannot pass");
    cr_assert(strstr(err.msg, "verdict PASSED (exit 0) is not what the receipts give: NOT_RUN (exit 77)"), "%s", err.msg);
    cr_assert(kp_bundle_finish(b, "NOT_RUN", KP_EXIT_SKIP, NULL, &err) == 0, "%s", err.msg);
    kp_bundle_free(b);
    cr_assert(verify(dir, &err) == 0, "%s", err.msg);
    cr_assert_eq(run_sh(SHA256SUM_CHECK, dir), 0);
    cr_assert_eq(verify(root, &err), KP_EXIT_USAGE, "a folder without manifest.sha256 is not a bundle");
    cr_assert(strstr(err.msg, root));
    drop_scratch(root, dir);
}

Test(bundle, open_refuses_unusable_paths_naming_them) {
    char *root = kpt_tempdir(), *file = path_in(root, "plain_file"), *full = path_in(root, "full");
    cr_assert(kpt_write(file, "x", 1) == 0);
    cr_assert(mkdir(full, 0755) == 0);
    char *inside = path_in(full, "keep.txt");
    cr_assert(kpt_write(inside, "x", 1) == 0);
    char *under_file = path_in(file, "sub"), *no_parent = path_in(root, "missing/sub");
    /* Tests run as root, which ignores permissions, so unwritable means "under a regular file". */
    const char *bad[] = {under_file, no_parent, "/etc/hostname/sub", file, full};
    for (size_t k = 0; k < 5; k++) {
        kp_bundle *b = NULL;
        kp_error err = {0};
        cr_assert_eq(kp_bundle_open(&b, bad[k], &err), KP_EXIT_USAGE, "%s was accepted", bad[k]);
        cr_assert_null(b);
        cr_assert(strstr(err.msg, bad[k]), "message does not name %s: %s", bad[k], err.msg);
    }
    /* Positive control: an empty existing folder is fine. */
    char *empty = path_in(root, "empty");
    cr_assert(mkdir(empty, 0755) == 0);
    kp_bundle *b;
    kp_error err;
    cr_assert(kp_bundle_open(&b, empty, &err) == 0, "%s", err.msg);
    kp_bundle_free(b);
    free(file), free(full), free(inside), free(under_file), free(no_parent), free(empty);
    drop_scratch(root, NULL);
}

Test(bundle, read_json_names_file_and_line) {
    char *root = kpt_tempdir(), *p = path_in(root, "r.json");
    cr_assert(kpt_write(p, "{\n\"a\": 1,\n\"b\": ]\n}\n", 19) == 0);
    cJSON *doc;
    kp_error err = {0};
    cr_assert_eq(kp_bundle_read_json(p, &doc, &err), KP_EXIT_USAGE);
    cr_assert(strstr(err.msg, p) && strstr(err.msg, "line 3"), "%s", err.msg);
    free(p);
    p = path_in(root, "absent.json");
    cr_assert_eq(kp_bundle_read_json(p, &doc, &err), KP_EXIT_USAGE);
    cr_assert(strstr(err.msg, p), "%s", err.msg);
    free(p);
    drop_scratch(root, NULL);
}
