/* test_sign.c: `kparity sign` and `verify --pubkey` on bundles from real gate runs: a signed bundle
 * verifies; a forgery that rewrites receipts, chain, reports and manifest consistently passes plain
 * verify and fails the signature check; wrong keys and tampered envelopes fail; key errors exit 2. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_json.h"
#include "../receipts/kp_report.h"
#include "../receipts/kp_sign.h"
#include "kp_test_util.h"

TestSuite(sign, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 300);

/* Scratch (kpt_scratch): freed when the test's folder is torn down. */
static char *path_in(const char *dir, const char *rel) {
    char *p = NULL;
    cr_assert(asprintf(&p, "%s/%s", dir, rel) > 0);
    return kpt_scratch(p);
}

/* Two small topp cases: the candidate passes an ordinary case; the incumbent's logit threshold
 * breaks the rule on the forced-logit case (the seed's incident), so the gate is INCORRECT (exit 1),
 * the verdict a forger wants to turn into PASSED. Two receipts, so the chain has a link to rewrite. */
static const char *gate_config =
    "{\"schema\":\"kparity.gate/v1\",\"name\":\"sign-test\",\"impls\":{\"incumbent\":\"topp.split_logit@host\","
    "\"candidate\":\"topp.split_prob@host\"},\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6},"
    "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=300)\",\"checks\":"
    "[{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
    "{\"case\":\"topp(batch=2,force_token=3,force_value=1e9,profile=forced,seed=4,top_p=0.95,vocab=1000)\","
    "\"checks\":[{\"check\":\"rule\",\"impl\":\"incumbent\"}]}]}";

/* One case, PASSED: the "untouched bundle from a real gate run" of the first test. */
static const char *passing_config =
    "{\"schema\":\"kparity.gate/v1\",\"name\":\"sign-pass\",\"impls\":{\"candidate\":\"topp.split_prob@host\"},"
    "\"cases\":[{\"case\":\"topp(batch=2,profile=ordinary,seed=1,top_p=0.9,vocab=300)\",\"checks\":"
    "[{\"check\":\"rule\",\"impl\":\"candidate\",\"tie_policy\":\"minimal_index\",\"band\":1e-6}]}]}";

static char *gate_bundle(const char *name, const char *config, int want_rc) {
    char *cfg, *bundle, *out, *err, *cname;
    cr_assert(asprintf(&cname, "%s.json", name) > 0);
    cfg = path_in(kpt_dir, cname);
    bundle = path_in(kpt_dir, name);
    cr_assert_eq(kpt_write(cfg, config, strlen(config)), 0);
    char *argv[] = {kpt_binary(), "gate", "--config", cfg, "--out", bundle, "--quiet", NULL};
    int rc = kpt_run(argv, &out, &err);
    cr_assert_eq(rc, want_rc, "gate exit %d: %s", rc, err);
    free(cname), free(out), free(err);
    return bundle;
}

/* An Ed25519 key pair made here with EVP_PKEY_keygen, as PEM files NAME.pem and NAME.pub.pem. */
static void write_pem_pair(EVP_PKEY *pkey, const char *name, char **priv, char **pub) {
    char *p, *q;
    cr_assert(asprintf(&p, "%s/%s.pem", kpt_dir, name) > 0);
    cr_assert(asprintf(&q, "%s/%s.pub.pem", kpt_dir, name) > 0);
    FILE *f = fopen(p, "w"), *g = fopen(q, "w");
    cr_assert(f && g);
    cr_assert_eq(PEM_write_PrivateKey(f, pkey, NULL, NULL, 0, NULL, NULL), 1);
    cr_assert_eq(PEM_write_PUBKEY(g, pkey), 1);
    fclose(f), fclose(g);
    *priv = kpt_scratch(p);
    *pub = kpt_scratch(q);
}

static void make_keypair(const char *name, const char *alg, char **priv, char **pub) {
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, alg, NULL);
    EVP_PKEY *pkey = NULL;
    cr_assert(ctx && EVP_PKEY_keygen_init(ctx) == 1, "no %s keygen", alg);
    if (!strcmp(alg, "RSA")) cr_assert_eq(EVP_PKEY_CTX_set_rsa_keygen_bits(ctx, 2048), 1);
    cr_assert(EVP_PKEY_keygen(ctx, &pkey) == 1 && pkey, "%s keygen failed", alg);
    write_pem_pair(pkey, name, priv, pub);
    EVP_PKEY_free(pkey);
    EVP_PKEY_CTX_free(ctx);
}

/* kparity's exit code; *err is what it printed on stderr, valid until the next call (which frees it). */
static int kp(char **err, char *a0, char *a1, char *a2, char *a3, char *a4) {
    static char *last_err;
    char *argv[] = {kpt_binary(), a0, a1, a2, a3, a4, NULL}, *out;
    free(last_err);
    int rc = kpt_run(argv, &out, &last_err);
    free(out);
    *err = last_err;
    return rc;
}
static int sign(const char *bundle, const char *key, char **err) {
    return kp(err, "sign", (char *)bundle, "--key", (char *)key, NULL);
}
static int verify_pub(const char *bundle, const char *pub, char **err) {
    return kp(err, "verify", (char *)bundle, "--pubkey", (char *)pub, NULL);
}
static int verify_plain(const char *bundle, char **err) { return kp(err, "verify", (char *)bundle, NULL, NULL, NULL); }

static char *envelope_path(const char *bundle) { return path_in(bundle, KP_SIGN_ENVELOPE); }

static cJSON *read_json(const char *path) {
    cJSON *doc = NULL;
    kp_error e = {0};
    cr_assert_eq(kp_bundle_read_json(path, &doc, &e), 0, "%s", e.msg);
    return doc;
}

static void write_json(const char *path, const cJSON *doc) {
    char *printed = kp_json_print(doc), *text;
    cr_assert(printed && asprintf(&text, "%s\n", printed) > 0);
    cr_assert_eq(kpt_write(path, text, strlen(text)), 0);
    cJSON_free(printed);
    free(text);
}

static unsigned char *unbase64(const char *text, size_t *len) {
    size_t n = strlen(text);
    unsigned char *out = malloc(n / 4 * 3 + 1);
    int got = EVP_DecodeBlock(out, (const unsigned char *)text, (int)n);
    cr_assert(got >= 0 && n % 4 == 0, "not base64: %s", text);
    *len = (size_t)got - (n && text[n - 1] == '=') - (n > 1 && text[n - 2] == '=');
    out[*len] = '\0';
    return out;
}

static char *base64(const void *data, size_t len) {
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    EVP_EncodeBlock((unsigned char *)out, data, (int)len);
    return out;
}

/* The envelope's statement, decoded here without kparity's code. */
static char *signed_statement(const char *bundle, size_t *len) {
    char *path = envelope_path(bundle);
    cJSON *env = read_json(path);
    const char *payload = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(env, "payload"));
    cr_assert_not_null(payload, "envelope without payload");
    char *statement = (char *)unbase64(payload, len);
    cJSON_Delete(env);
    return statement;
}

/* Replace one string member of the envelope and write it back. */
static void set_envelope_string(const char *bundle, const char *key, const char *value, int in_signature) {
    char *path = envelope_path(bundle);
    cJSON *env = read_json(path);
    cJSON *where = in_signature ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(env, "signatures"), 0) : env;
    cr_assert(cJSON_ReplaceItemInObjectCaseSensitive(where, key, cJSON_CreateString(value)));
    write_json(path, env);
    cJSON_Delete(env);
}

/* manifest.sha256 rewritten over the bundle as it is, with the envelope set aside, as a forger
 * who has kparity's own code and no signing key would do it. */
static void rewrite_manifest(const char *bundle) {
    char *env = envelope_path(bundle), *aside = path_in(kpt_dir, "envelope-aside");
    cr_assert_eq(rename(env, aside), 0);
    kp_error e = {0};
    cr_assert_eq(kp_bundle_write_manifest(bundle, &e), 0, "%s", e.msg);
    cr_assert_eq(rename(aside, env), 0);
}

/* ------------------------------------------------------------------------------------------ */

Test(sign, a_signed_gate_bundle_verifies_with_its_public_key) {
    char *b = gate_bundle("pass", passing_config, 0), *key, *pub, *err, *out;
    make_keypair("signer", "ED25519", &key, &pub);
    cr_assert_eq(sign(b, key, &err), 0, "%s", err);
    char *argv[] = {kpt_binary(), "verify", b, "--pubkey", pub, NULL};
    cr_assert_eq(kpt_run(argv, &out, &err), 0, "%s", err);
    cr_assert(strstr(out, "signed by") && strstr(out, pub), "%s", out);
    free(out), free(err);
    /* the envelope lies outside the manifest: plain verify must not count it as an added file */
    cr_assert_eq(verify_plain(b, &err), 0, "%s", err);
    /* and --replay still runs beside --pubkey */
    char *argv2[] = {kpt_binary(), "verify", b, "--pubkey", pub, "--replay", NULL};
    cr_assert_eq(kpt_run(argv2, &out, &err), 0, "%s", err);
    cr_assert(strstr(out, "regenerated"), "%s", out);
    free(out), free(err);
}

/* The statement checked field by field against the bundle, read here without kparity's code. */
Test(sign, the_statement_names_every_file_and_the_verdict) {
    char *b = gate_bundle("g", gate_config, 1), *key, *pub, *err;
    make_keypair("signer", "ED25519", &key, &pub);
    cr_assert_eq(sign(b, key, &err), 0, "%s", err);
    size_t len;
    char *text = signed_statement(b, &len);
    cJSON *st = cJSON_Parse(text);
    cr_assert_not_null(st, "statement is not JSON: %s", text);
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(st, "_type")), "https://in-toto.io/Statement/v1");
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(st, "predicateType")),
                     "https://kparity.dev/gate-verdict/v1");
    /* subjects: the manifest's lines plus manifest.sha256 itself, in sorted order, digests of the files */
    char *mpath = path_in(b, "manifest.sha256");
    char *manifest = kpt_read(mpath, NULL);
    const cJSON *subjects = cJSON_GetObjectItemCaseSensitive(st, "subject"), *s;
    int n = 0, listed = 0;
    const char *prev = "";
    cJSON_ArrayForEach(s, subjects) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "name"));
        const char *sha = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s, "digest"), "sha256"));
        cr_assert(name && sha && strlen(sha) == 64, "subject %d malformed", n);
        cr_assert_gt(strcmp(name, prev), 0, "subjects out of order at %s", name);
        cr_assert_str_neq(name, KP_SIGN_ENVELOPE, "the envelope cannot name itself");
        char *file = path_in(b, name), hex[KP_SHA256_HEX_LEN];
        size_t flen;
        char *data = kpt_read(file, &flen);
        cr_assert_not_null(data, "subject %s is not a file", name);
        kp_sha256_hex(data, flen, hex);
        cr_assert_str_eq(sha, hex, "subject %s: digest", name);
        char line[512];
        snprintf(line, sizeof line, "%s  %s\n", sha, name);
        if (strstr(manifest, line)) listed++;
        else cr_assert_str_eq(name, "manifest.sha256", "%s is a subject but not in the manifest", name);
        prev = name;
        n++;
        free(data);
    }
    int lines = 0;
    for (const char *p = manifest; *p; p++) lines += *p == '\n';
    cr_assert_eq(listed, lines, "every manifest line is a subject");
    cr_assert_eq(n, lines + 1, "the manifest's files and the manifest");
    /* the predicate repeats bundle.json: verdict, exit code, config digest, version, environment, chain head */
    char *bpath = path_in(b, "bundle.json");
    cJSON *bundle = read_json(bpath);
    const cJSON *pred = cJSON_GetObjectItemCaseSensitive(st, "predicate");
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pred, "verdict")), "INCORRECT");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(pred, "exit_code")->valueint, 1);
    const char *cfg_sha = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(bundle, "config"), "sha256"));
    cr_assert_not_null(cfg_sha);
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pred, "config"), "sha256")), cfg_sha);
    char *cfg_path = path_in(kpt_dir, "g.json"), cfg_hex[KP_SHA256_HEX_LEN];
    size_t cfg_len;
    char *cfg_text = kpt_read(cfg_path, &cfg_len);
    kp_sha256_hex(cfg_text, cfg_len, cfg_hex);
    cr_assert_str_eq(cfg_sha, cfg_hex, "config.sha256 is the digest of the config file the gate ran");
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pred, "chain_head")),
                     cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(bundle, "chain_head")));
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pred, "kparity_version")), KPARITY_VERSION);
    char *env_signed = kp_json_print(cJSON_GetObjectItemCaseSensitive(pred, "environment"));
    char *env_bundle = kp_json_print(cJSON_GetObjectItemCaseSensitive(bundle, "environment"));
    cr_assert(env_signed && env_bundle);
    cr_assert_str_eq(env_signed, env_bundle);
    cJSON_Delete(st), cJSON_Delete(bundle);
    cJSON_free(env_signed), cJSON_free(env_bundle);
    free(text), free(manifest), free(cfg_text);
}

/* The envelope read as DSSE defines it, with PAE built and the signature checked here through EVP
 * directly, so a format kparity only agrees with itself on would fail. */
Test(sign, the_envelope_is_dsse_with_ed25519_over_pae) {
    size_t len;
    char *pae = kp_dsse_pae("application/example", "hello", 5, &len);
    cr_assert_str_eq(pae, "DSSEv1 19 application/example 5 hello"); /* the DSSE spec's worked example */
    cr_assert_eq(len, strlen("DSSEv1 19 application/example 5 hello"));
    free(pae);
    pae = kp_dsse_pae("", "", 0, &len);
    cr_assert_str_eq(pae, "DSSEv1 0  0 ");
    free(pae);

    char *b = gate_bundle("pass", passing_config, 0), *key, *pub, *err;
    make_keypair("signer", "ED25519", &key, &pub);
    cr_assert_eq(sign(b, key, &err), 0, "%s", err);
    char *path = envelope_path(b);
    cJSON *env = read_json(path);
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(env, "payloadType")), "application/vnd.in-toto+json");
    const cJSON *sigs = cJSON_GetObjectItemCaseSensitive(env, "signatures");
    cr_assert_eq(cJSON_GetArraySize(sigs), 1);
    const cJSON *one = cJSON_GetArrayItem(sigs, 0);
    size_t stmt_len, sig_len;
    char *stmt = signed_statement(b, &stmt_len);
    unsigned char *sig = unbase64(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(one, "sig")), &sig_len);
    cr_assert_eq(sig_len, 64, "an Ed25519 signature is 64 bytes");
    const char *type = "application/vnd.in-toto+json";
    char *mine;
    int head = asprintf(&mine, "DSSEv1 %zu %s %zu ", strlen(type), type, stmt_len);
    cr_assert(head > 0);
    mine = realloc(mine, (size_t)head + stmt_len);
    memcpy(mine + head, stmt, stmt_len);
    FILE *f = fopen(pub, "r");
    EVP_PKEY *pk = PEM_read_PUBKEY(f, NULL, NULL, NULL);
    fclose(f);
    cr_assert_not_null(pk);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    cr_assert_eq(EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, pk), 1);
    cr_assert_eq(EVP_DigestVerify(ctx, sig, sig_len, (unsigned char *)mine, (size_t)head + stmt_len), 1,
                 "the signature is not Ed25519 over PAE(payloadType, statement)");
    EVP_MD_CTX_free(ctx);
    /* keyid: SHA-256 of the public key's DER SubjectPublicKeyInfo */
    unsigned char *der = NULL;
    int der_len = i2d_PUBKEY(pk, &der);
    char hex[KP_SHA256_HEX_LEN];
    kp_sha256_hex(der, (size_t)der_len, hex);
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(one, "keyid")), hex);
    OPENSSL_free(der);
    EVP_PKEY_free(pk);
    cJSON_Delete(env);
    free(mine), free(stmt), free(sig);
}

/* A forger without the key turns an INCORRECT gate into PASSED and rewrites everything plain verify
 * checks, end to end: the receipt, the chain after it, bundle.json's digests, verdict and chain head,
 * the reports and the manifest. Plain verify passes the forgery; the signature does not. */
Test(sign, a_consistent_rewrite_passes_plain_verify_but_not_the_signature) {
    char *b = gate_bundle("g", gate_config, 1), *key, *pub, *err;
    make_keypair("signer", "ED25519", &key, &pub);
    cr_assert_eq(sign(b, key, &err), 0, "%s", err);
    cr_assert_eq(verify_pub(b, pub, &err), 0, "%s", err);

    char *bpath = path_in(b, "bundle.json");
    cJSON *bundle = read_json(bpath), *rows = cJSON_CreateArray();
    cJSON *entries = cJSON_GetObjectItemCaseSensitive(bundle, "receipts"), *entry;
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(bundle, "verdict")), "INCORRECT");
    char prev[KP_SHA256_HEX_LEN] = KP_ZERO_DIGEST;
    int forged = 0;
    cJSON_ArrayForEach(entry, entries) {
        const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(entry, "file"));
        char *rpath = path_in(b, file);
        cJSON *r = read_json(rpath), *chk;
        if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "result")), "INCORRECT")) {
            cJSON_ReplaceItemInObjectCaseSensitive(r, "result", cJSON_CreateString("PASSED"));
            cJSON_ReplaceItemInObjectCaseSensitive(r, "reasons", cJSON_CreateArray());
            cJSON_ArrayForEach(chk, cJSON_GetObjectItemCaseSensitive(r, "checks")) {
                cJSON_ReplaceItemInObjectCaseSensitive(chk, "result", cJSON_CreateString("PASSED"));
                cJSON_ReplaceItemInObjectCaseSensitive(chk, "summary", cJSON_CreateString("2/2 rows meet the rule"));
            }
            cJSON_ReplaceItemInObjectCaseSensitive(entry, "result", cJSON_CreateString("PASSED"));
            forged++;
        }
        cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "chain"), "prev", cJSON_CreateString(prev));
        write_json(rpath, r);
        size_t len;
        char *text = kpt_read(rpath, &len);
        kp_sha256_hex(text, len, prev);
        cJSON_ReplaceItemInObjectCaseSensitive(entry, "sha256", cJSON_CreateString(prev));
        /* the reports' rows as the bundle makes them, from the forged receipt as written (verify renders them again) */
        cJSON *written = read_json(rpath);
        cr_assert_eq(kp_bundle_add_row(rows, file, prev, written), 0);
        cJSON_Delete(written);
        cJSON_Delete(r);
        free(text);
    }
    cr_assert_eq(forged, 1, "the forced case's receipt was not INCORRECT: the forgery would change nothing");
    cJSON_ReplaceItemInObjectCaseSensitive(bundle, "chain_head", cJSON_CreateString(prev));
    cJSON_ReplaceItemInObjectCaseSensitive(bundle, "verdict", cJSON_CreateString("PASSED"));
    cJSON_ReplaceItemInObjectCaseSensitive(bundle, "exit_code", kp_json_int(0));
    write_json(bpath, bundle);
    const char *reports[] = {"junit.xml", "summary.md", "report.html"};
    char *rendered[] = {kp_report_junit(rows), kp_report_summary_md(rows, "PASSED", 0), kp_report_html(rows, "PASSED", 0)};
    for (int i = 0; i < 3; i++) {
        char *p = path_in(b, reports[i]);
        cr_assert(rendered[i] && kpt_write(p, rendered[i], strlen(rendered[i])) == 0);
        free(rendered[i]);
    }
    rewrite_manifest(b);

    /* the forgery is complete as far as the unsigned evidence goes */
    cr_assert_eq(verify_plain(b, &err), 0, "the forgery is not consistent, so this test proves nothing: %s", err);
    char *summary_path = path_in(b, "summary.md");
    char *summary = kpt_read(summary_path, NULL);
    cr_assert(strstr(summary, "PASSED") && !strstr(summary, "INCORRECT"), "%s", summary);
    free(summary);
    /* the signature still vouches for the old bytes: the first changed file in path order is named */
    cr_assert_eq(verify_pub(b, pub, &err), 1, "the forged bundle passed verify --pubkey: %s", err);
    cr_assert(strstr(err, "bundle.json") && strstr(err, "changed after signing"), "%s", err);

    /* re-signing with the forger's own key: the envelope is valid, but not under the trusted key */
    char *fkey, *fpub;
    make_keypair("forger", "ED25519", &fkey, &fpub);
    cr_assert_eq(sign(b, fkey, &err), 0, "%s", err);
    cr_assert_eq(verify_pub(b, fpub, &err), 0, "the control: under the forger's own key it verifies: %s", err);
    cr_assert_eq(verify_pub(b, pub, &err), 1);
    cr_assert(strstr(err, "signature does not verify"), "%s", err);
    cJSON_Delete(bundle), cJSON_Delete(rows);
}

Test(sign, a_file_added_or_removed_under_a_rewritten_manifest_is_named) {
    char *b = gate_bundle("g", gate_config, 1), *key, *pub, *err;
    make_keypair("signer", "ED25519", &key, &pub);
    cr_assert_eq(sign(b, key, &err), 0, "%s", err);
    /* added: without a new manifest plain verify already catches it; with one, only the signature does */
    char *extra = path_in(b, "notes.txt");
    cr_assert_eq(kpt_write(extra, "ok\n", 3), 0);
    cr_assert_eq(verify_plain(b, &err), 1, "%s", err);
    rewrite_manifest(b);
    cr_assert_eq(verify_plain(b, &err), 0, "%s", err);
    cr_assert_eq(verify_pub(b, pub, &err), 1);
    cr_assert(strstr(err, "notes.txt") && strstr(err, "added"), "%s", err);
    remove(extra);
    rewrite_manifest(b);
    cr_assert_eq(verify_pub(b, pub, &err), 0, "restored: %s", err);
    /* removed: plain verify catches this one too, since a finished bundle has the reports its receipts give */
    char *report = path_in(b, "report.html");
    size_t len;
    char *saved = kpt_read(report, &len);
    remove(report);
    rewrite_manifest(b);
    cr_assert_eq(verify_plain(b, &err), 1, "%s", err);
    cr_assert(strstr(err, "report.html") && strstr(err, "missing"), "%s", err);
    cr_assert_eq(verify_pub(b, pub, &err), 1);
    cr_assert(strstr(err, "report.html") && strstr(err, "missing"), "%s", err);
    kpt_write(report, saved, len);
    rewrite_manifest(b);
    cr_assert_eq(verify_pub(b, pub, &err), 0, "restored: %s", err);
    /* an envelope that the manifest lists is held to the manifest like any other file */
    kp_error e = {0};
    cr_assert_eq(kp_bundle_write_manifest(b, &e), 0, "%s", e.msg);
    cr_assert_eq(verify_plain(b, &err), 0, "%s", err);
    cr_assert_eq(verify_pub(b, pub, &err), 1, "the manifest changed after signing");
    cr_assert(strstr(err, "manifest.sha256"), "%s", err);
    char *env = envelope_path(b);
    size_t env_len;
    char *env_text = kpt_read(env, &env_len);
    env_text = realloc(env_text, env_len + 1);
    env_text[env_len] = '\n'; /* the same envelope to a JSON reader, other bytes to the manifest */
    kpt_write(env, env_text, env_len + 1);
    cr_assert_eq(verify_plain(b, &err), 1);
    cr_assert(strstr(err, KP_SIGN_ENVELOPE), "%s", err);
    free(saved), free(env_text);
}

Test(sign, a_wrong_key_or_a_tampered_envelope_does_not_verify) {
    char *b = gate_bundle("pass", passing_config, 0), *key, *pub, *other_key, *other_pub, *err;
    make_keypair("signer", "ED25519", &key, &pub);
    make_keypair("other", "ED25519", &other_key, &other_pub);
    cr_assert_eq(sign(b, key, &err), 0, "%s", err);
    cr_assert_eq(verify_pub(b, pub, &err), 0, "%s", err);

    cr_assert_eq(verify_pub(b, other_pub, &err), 1, "another Ed25519 key verified the signature");
    cr_assert(strstr(err, "signature does not verify") && strstr(err, "another key"), "%s", err);

    char *path = envelope_path(b);
    size_t env_len;
    char *original = kpt_read(path, &env_len);
    cJSON *env = read_json(path);
    const cJSON *one = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(env, "signatures"), 0);
    size_t sig_len, stmt_len;
    unsigned char *sig = unbase64(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(one, "sig")), &sig_len);
    for (size_t bit = 0; bit < 8 * sig_len; bit += 8 * sig_len / 4 + 1) { /* bits in both halves, R and S */
        sig[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        char *s = base64(sig, sig_len);
        set_envelope_string(b, "sig", s, 1);
        cr_assert_eq(verify_pub(b, pub, &err), 1, "signature bit %zu flipped went unnoticed", bit);
        cr_assert(strstr(err, "signature does not verify"), "%s", err);
        sig[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        free(s);
    }
    kpt_write(path, original, env_len);
    cr_assert_eq(verify_pub(b, pub, &err), 0, "restored: %s", err);

    /* the statement: the verdict changed to one of the same length, then one byte of a digest */
    char *stmt = signed_statement(b, &stmt_len), *at = strstr(stmt, "\"PASSED\"");
    cr_assert_not_null(at);
    memcpy(at, "\"FAILED\"", 8);
    char *p64 = base64(stmt, stmt_len);
    set_envelope_string(b, "payload", p64, 0);
    cr_assert_eq(verify_pub(b, pub, &err), 1, "a changed verdict in the statement went unnoticed");
    cr_assert(strstr(err, "signature does not verify"), "%s", err);
    free(p64), free(stmt);
    kpt_write(path, original, env_len);
    stmt = signed_statement(b, &stmt_len);
    at = strstr(stmt, "\"sha256\":");
    cr_assert_not_null(at);
    at = strchr(at + 9, '"') + 1;
    *at = *at == '0' ? '1' : '0';
    p64 = base64(stmt, stmt_len);
    set_envelope_string(b, "payload", p64, 0);
    cr_assert_eq(verify_pub(b, pub, &err), 1, "a changed subject digest went unnoticed");
    cr_assert(strstr(err, "signature does not verify"), "%s", err);
    free(p64);
    /* the payload type is signed too (PAE), and not base64 or not JSON is named as the envelope's fault */
    kpt_write(path, original, env_len);
    set_envelope_string(b, "payloadType", "application/json", 0);
    cr_assert_eq(verify_pub(b, pub, &err), 1);
    cr_assert(strstr(err, "payloadType"), "%s", err);
    kpt_write(path, original, env_len);
    set_envelope_string(b, "payload", "not base64!", 0);
    cr_assert_eq(verify_pub(b, pub, &err), 1);
    cr_assert(strstr(err, KP_SIGN_ENVELOPE) && strstr(err, "base64"), "%s", err);
    kpt_write(path, "{\"payload", 9);
    cr_assert_eq(verify_pub(b, pub, &err), 1);
    cr_assert(strstr(err, KP_SIGN_ENVELOPE), "%s", err);
    kpt_write(path, original, env_len);
    cr_assert_eq(verify_pub(b, pub, &err), 0, "restored: %s", err);
    cJSON_Delete(env);
    free(sig), free(stmt), free(original);
}

/* Sign `statement` with the PEM private key at `key_path` here, through EVP over PAE built here,
 * and write it as the bundle's envelope: a signer that vouches for whatever it is given. */
static void sign_here(const char *bundle, const char *key_path, const char *statement) {
    FILE *f = fopen(key_path, "r");
    EVP_PKEY *pk = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    cr_assert_not_null(pk);
    char *pae;
    int n = asprintf(&pae, "DSSEv1 %zu %s %zu %s", strlen(KP_SIGN_PAYLOAD_TYPE), KP_SIGN_PAYLOAD_TYPE, strlen(statement),
                     statement);
    cr_assert(n > 0);
    unsigned char sig[64];
    size_t sig_len = sizeof sig;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    cr_assert(EVP_DigestSignInit(ctx, NULL, NULL, NULL, pk) == 1 &&
              EVP_DigestSign(ctx, sig, &sig_len, (unsigned char *)pae, (size_t)n) == 1);
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(pk);
    char *p64 = base64(statement, strlen(statement)), *s64 = base64(sig, sig_len);
    cJSON *env = cJSON_CreateObject(), *sigs = cJSON_AddArrayToObject(env, "signatures"), *one = cJSON_CreateObject();
    cJSON_AddStringToObject(env, "payloadType", KP_SIGN_PAYLOAD_TYPE);
    cJSON_AddStringToObject(env, "payload", p64);
    cJSON_AddStringToObject(one, "sig", s64);
    cJSON_AddItemToArray(sigs, one);
    char *path = envelope_path(bundle);
    write_json(path, env);
    cJSON_Delete(env);
    free(pae), free(p64), free(s64);
}

/* What verify checks after the signature: a validly signed statement can still be wrong about the
 * bundle (a buggy or careless signer). Each statement below is signed by the trusted key. */
Test(sign, a_signed_statement_that_disagrees_with_the_bundle_fails) {
    char *b = gate_bundle("g", gate_config, 1), *key, *pub, *err, *statement;
    make_keypair("signer", "ED25519", &key, &pub);
    size_t len;
    kp_error e = {0};
    cr_assert_eq(kp_sign_statement(b, &statement, &len, &e), 0, "%s", e.msg);
    sign_here(b, key, statement);
    cr_assert_eq(verify_pub(b, pub, &err), 0, "the control: this test's own signer is accepted: %s", err);

    cJSON *st = kp_json_parse(statement, len, NULL);
    cr_assert_not_null(st);
    /* the verdict it vouches for is not bundle.json's */
    cJSON *copy = cJSON_Duplicate(st, 1);
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(copy, "predicate"), "verdict",
                                           cJSON_CreateString("PASSED"));
    char *text = kp_json_print(copy);
    sign_here(b, key, text);
    cr_assert_eq(verify_pub(b, pub, &err), 1, "a signed PASSED over an INCORRECT bundle.json was accepted");
    cr_assert(strstr(err, "predicate") && strstr(err, "PASSED") && strstr(err, "INCORRECT"), "%s", err);
    cJSON_free(text), cJSON_Delete(copy);
    /* subjects repeated: every file is still named, but not in the one form the signer writes */
    copy = cJSON_Duplicate(st, 1);
    cJSON *subjects = cJSON_GetObjectItemCaseSensitive(copy, "subject");
    int last = cJSON_GetArraySize(subjects) - 1;
    cr_assert(cJSON_AddItemToArray(subjects, cJSON_Duplicate(cJSON_GetArrayItem(subjects, last), 1)));
    text = kp_json_print(copy);
    sign_here(b, key, text);
    cr_assert_eq(verify_pub(b, pub, &err), 1, "a repeated subject was accepted");
    cr_assert(strstr(err, "out of order or repeated"), "%s", err);
    cJSON_free(text), cJSON_Delete(copy);
    /* another predicate type: a statement about something else */
    copy = cJSON_Duplicate(st, 1);
    cJSON_ReplaceItemInObjectCaseSensitive(copy, "predicateType", cJSON_CreateString("https://slsa.dev/provenance/v1"));
    text = kp_json_print(copy);
    sign_here(b, key, text);
    cr_assert_eq(verify_pub(b, pub, &err), 1, "a statement of another predicate type was accepted");
    cr_assert(strstr(err, "predicate type"), "%s", err);
    cJSON_free(text), cJSON_Delete(copy), cJSON_Delete(st);
    free(statement);
}

/* Found by fuzz/fuzz_bundle.c: bundle.json damaged after signing, the manifest rewritten to match, made the
 * signature check exit 2 (a usage error: "was this bundle written by kparity run or gate?") instead of 1. Through
 * the CLI (plain verify first) a bundle.json that still verifies but no longer says its verdict; through
 * kp_sign_check itself the fuzzer's input, a bundle.json that is not JSON. (Since issue 26, point 8, plain verify
 * refuses the first too: the verdict is one of the things it derives from the receipts.) */
Test(sign, bundle_json_damaged_after_signing_is_incorrect_not_a_usage_error) {
    char *b = gate_bundle("g", gate_config, 1), *key, *pub, *err;
    make_keypair("signer", "ED25519", &key, &pub);
    cr_assert_eq(sign(b, key, &err), 0, "%s", err);
    char *bpath = path_in(b, "bundle.json");
    size_t seed_len;
    char *seed = kpt_read(bpath, &seed_len);
    cJSON *bundle = read_json(bpath);
    cJSON_DeleteItemFromObjectCaseSensitive(bundle, "verdict");
    write_json(bpath, bundle);
    cJSON_Delete(bundle);
    rewrite_manifest(b);
    /* plain verify reads the verdict too now (issue 26, point 8), and says the same */
    cr_assert_eq(verify_plain(b, &err), 1, "a bundle.json without its verdict verified: %s", err);
    cr_assert(strstr(err, "bundle.json") && strstr(err, "verdict"), "%s", err);
    cr_assert_eq(verify_pub(b, pub, &err), 1, "%s", err);
    cr_assert(strstr(err, "bundle.json") && strstr(err, "verdict"), "%s", err);

    const char *not_json = "0000000000000000000000000000000000000000000000000000000000000000  artifacts\n";
    cr_assert_eq(kpt_write(bpath, not_json, strlen(not_json)), 0);
    rewrite_manifest(b);
    kp_sign_key *pk = NULL;
    kp_error e = {0};
    cr_assert_eq(kp_sign_key_load(pub, 0, &pk, &e), 0, "%s", e.msg);
    cr_assert_eq(kp_sign_check(b, pk, NULL, &e), KP_EXIT_INCORRECT, "%s", e.msg);
    cr_assert(strstr(e.msg, "bundle.json"), "%s", e.msg);
    /* the positive control: the signed bytes back, and the same check passes */
    cr_assert_eq(kpt_write(bpath, seed, seed_len), 0);
    rewrite_manifest(b);
    cr_assert_eq(kp_sign_check(b, pk, NULL, &e), 0, "%s", e.msg);
    kp_sign_key_free(pk);
    free(seed);
}

Test(sign, key_and_signature_file_problems_exit_2_naming_the_file) {
    char *b = gate_bundle("pass", passing_config, 0), *key, *pub, *rsa, *rsa_pub, *err;
    make_keypair("signer", "ED25519", &key, &pub);
    make_keypair("rsa", "RSA", &rsa, &rsa_pub);
    char *missing = path_in(kpt_dir, "no-such-key.pem"), *garbage = path_in(kpt_dir, "garbage.pem");
    kpt_write(garbage, "not a key\n", 10);
    char *env = envelope_path(b);
    struct stat st;

    /* unsigned bundle: --pubkey names the signature file it looked for */
    cr_assert_eq(verify_pub(b, pub, &err), 2);
    cr_assert(strstr(err, KP_SIGN_ENVELOPE) && strstr(err, "missing"), "%s", err);
    /* sign: missing, RSA, a public key, garbage; nothing written */
    cr_assert_eq(sign(b, missing, &err), 2);
    cr_assert(strstr(err, missing), "%s", err);
    cr_assert_eq(sign(b, rsa, &err), 2);
    cr_assert(strstr(err, rsa) && strstr(err, "RSA") && strstr(err, "Ed25519"), "%s", err);
    cr_assert_eq(sign(b, pub, &err), 2);
    cr_assert(strstr(err, pub) && strstr(err, "public key"), "%s", err);
    cr_assert_eq(sign(b, garbage, &err), 2);
    cr_assert(strstr(err, garbage), "%s", err);
    cr_assert_neq(stat(env, &st), 0, "a refused key must not leave an envelope");
    char *nob = path_in(kpt_dir, "no-bundle");
    cr_assert_eq(sign(nob, key, &err), 2);
    cr_assert(strstr(err, nob), "%s", err);
    cr_assert_eq(kp(&err, "sign", b, NULL, NULL, NULL), 2, "sign without --key");
    cr_assert_eq(kp(&err, "sign", b, "--pubkey", pub, NULL), 2);
    cr_assert_eq(kp(&err, "verify", b, "--key", key, NULL), 2);

    cr_assert_eq(sign(b, key, &err), 0, "%s", err);
    /* verify: missing, RSA, the private key, garbage */
    cr_assert_eq(verify_pub(b, missing, &err), 2);
    cr_assert(strstr(err, missing), "%s", err);
    cr_assert_eq(verify_pub(b, rsa_pub, &err), 2);
    cr_assert(strstr(err, rsa_pub) && strstr(err, "RSA"), "%s", err);
    cr_assert_eq(verify_pub(b, key, &err), 2);
    cr_assert(strstr(err, key) && strstr(err, "private key"), "%s", err);
    cr_assert_eq(verify_pub(b, garbage, &err), 2);
    cr_assert(strstr(err, garbage), "%s", err);
    cr_assert_eq(verify_pub(nob, pub, &err), 2);
    cr_assert(strstr(err, nob), "%s", err);
    /* the signature file removed again: exit 2, not a pass and not a mismatch */
    remove(env);
    cr_assert_eq(verify_pub(b, pub, &err), 2);
    cr_assert(strstr(err, KP_SIGN_ENVELOPE), "%s", err);
    /* a damaged bundle is not signed: the signature must never vouch for bytes verify refuses */
    char *summary = path_in(b, "summary.md");
    kpt_write(summary, "# edited\n", 9);
    cr_assert_eq(sign(b, key, &err), 1);
    cr_assert(strstr(err, "summary.md") && strstr(err, "not signing"), "%s", err);
    cr_assert_neq(stat(env, &st), 0, "a damaged bundle was signed");
}

Test(sign, signing_the_same_bundle_twice_gives_the_same_bytes) {
    char *b = gate_bundle("g", gate_config, 1), *key, *pub, *other_key, *other_pub, *err;
    make_keypair("signer", "ED25519", &key, &pub);
    make_keypair("other", "ED25519", &other_key, &other_pub);
    char *path = envelope_path(b);
    size_t n1, n2, s1, s2;
    cr_assert_eq(sign(b, key, &err), 0, "%s", err);
    char *first = kpt_read(path, &n1), *stmt1 = signed_statement(b, &s1);
    cr_assert_eq(sign(b, key, &err), 0, "%s", err); /* over a signed bundle: the old envelope is not a subject */
    char *second = kpt_read(path, &n2), *stmt2 = signed_statement(b, &s2);
    cr_assert(s1 == s2 && memcmp(stmt1, stmt2, s1) == 0, "the statement changed between two signings");
    cr_assert(n1 == n2 && memcmp(first, second, n1) == 0, "the envelope changed between two signings (Ed25519 is deterministic)");
    /* the library's statement is the signed one, byte for byte */
    char *lib;
    size_t lib_len;
    kp_error e = {0};
    cr_assert_eq(kp_sign_statement(b, &lib, &lib_len, &e), 0, "%s", e.msg);
    cr_assert(lib_len == s1 && memcmp(lib, stmt1, s1) == 0);
    free(lib);
    /* controls: another key, same statement, another signature; another run, another statement */
    cr_assert_eq(sign(b, other_key, &err), 0, "%s", err);
    char *third = kpt_read(path, &n2), *stmt3 = signed_statement(b, &s2);
    cr_assert(s1 == s2 && memcmp(stmt1, stmt3, s1) == 0);
    cr_assert(n1 != n2 || memcmp(first, third, n1) != 0, "two keys gave the same envelope");
    char *b2 = gate_bundle("g2", gate_config, 1);
    cr_assert_eq(sign(b2, key, &err), 0, "%s", err);
    char *stmt4 = signed_statement(b2, &s2);
    cr_assert(s1 != s2 || memcmp(stmt1, stmt4, s1) != 0, "another run's bundle gave the same statement");
    free(first), free(second), free(third), free(stmt1), free(stmt2), free(stmt3), free(stmt4);
}

/* The leftovers of envelope writes in a bundle's top folder. */
static int leftovers_in(const char *bundle) {
    DIR *d = opendir(bundle);
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) n += kp_sign_is_leftover(e->d_name);
    closedir(d);
    return n;
}

/* `kparity sign` killed at each file operation of its envelope write (KPARITY_FAULT=kill@N: SIGKILL there, a write
 * half done), on an unsigned bundle and on one signed before: the bundle still verifies (a leftover temporary file
 * is passed over and named, never called an added file), verify --pubkey is either the old signature, the new one
 * or "not signed" (exit 2), never a broken one, and the next sign removes the leftover and finishes. The control: a
 * stray file named like a temporary file of another file is still an added file. */
Test(sign, a_sign_killed_at_any_point_leaves_a_bundle_that_verifies_and_the_next_sign_finishes) {
    char *key, *pub, *err;
    make_keypair("signer", "ED25519", &key, &pub);
    int kills = 0;
    for (int before = 0; before < 2; before++)
        for (int n = 1;; n++) {
            char name[32];
            snprintf(name, sizeof name, "k%d-%d", before, n);
            char *b = gate_bundle(name, passing_config, 0);
            if (before) cr_assert_eq(sign(b, key, &err), 0, "%s", err);
            char fault[32];
            snprintf(fault, sizeof fault, "kill@%d", n);
            setenv("KPARITY_FAULT", fault, 1);
            const int rc = sign(b, key, &err);
            unsetenv("KPARITY_FAULT");
            if (rc == 0) break; /* past its last file operation */
            cr_assert_eq(rc, 128 + 9, "%s: sign exited %d, not killed: %s", fault, rc, err);
            kills++;
            char *argv[] = {kpt_binary(), "verify", b, NULL}, *out, *verr;
            cr_assert_eq(kpt_run(argv, &out, &verr), 0, "%s: verify after the kill: %s", fault, verr);
            if (leftovers_in(b)) cr_assert(strstr(out, "passed over .attestation.dsse.json.tmp-"), "%s: %s", fault, out);
            free(out), free(verr);
            const int vrc = verify_pub(b, pub, &err);
            cr_assert(vrc == 0 || (vrc == 2 && !before), "%s (signed before: %d): verify --pubkey exit %d: %s", fault,
                      before, vrc, err);
            cr_assert_eq(sign(b, key, &err), 0, "%s: signing again: %s", fault, err);
            cr_assert_eq(leftovers_in(b), 0, "%s: the next sign left the leftover", fault);
            cr_assert_eq(verify_pub(b, pub, &err), 0, "%s: %s", fault, err);
        }
    cr_assert_geq(kills, 6, "only %d kill points: the fault hook did not reach sign's write", kills);

    char *b = gate_bundle("stray", passing_config, 0), *stray = path_in(b, ".summary.md.tmp-abcdef");
    cr_assert_eq(kpt_write(stray, "x", 1), 0);
    cr_assert_eq(verify_plain(b, &err), 1, "%s", err);
    cr_assert(strstr(err, ".summary.md.tmp-abcdef") && strstr(err, "an added file"), "%s", err);
}

Test(sign, sign_prints_its_usage_on_help) {
    char *out, *err;
    char *argv[] = {kpt_binary(), "sign", "--help", NULL};
    cr_assert_eq(kpt_run(argv, &out, &err), 0, "%s", err);
    cr_assert(strstr(out, "kparity sign DIR --key KEY.pem"), "%s", out);
    free(out), free(err);
    char *argv2[] = {kpt_binary(), "verify", "--help", NULL};
    cr_assert_eq(kpt_run(argv2, &out, &err), 0, "%s", err);
    cr_assert(strstr(out, "--pubkey PUB.pem"), "%s", out);
    free(out), free(err);
}
