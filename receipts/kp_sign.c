/* kp_sign.c: `kparity sign` and `kparity verify --pubkey`: an in-toto statement over every file of a
 * bundle, in a DSSE envelope with an Ed25519 signature made and checked through OpenSSL EVP. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "kp_sign.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "kp_bundle.h"
#include "kp_fileio.h"
#include "kp_json.h"

#define ED25519_SIG_BYTES 64

struct kp_sign_key {
    EVP_PKEY *pkey;
    char *path;
    int is_private;
    char keyid[KP_SHA256_HEX_LEN];
};

static char *join(const char *dir, const char *rel) {
    char *p = NULL;
    return asprintf(&p, "%s/%s", dir, rel) < 0 ? NULL : p;
}

static const char *str_at(const cJSON *obj, const char *key) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, key));
}

static const char *or_none(const char *s) { return s ? s : "(none)"; }

/* Never prompt on the terminal for a passphrase: a gate runs unattended. */
static int no_passphrase(char *buf, int size, int rwflag, void *user) {
    (void)buf, (void)size, (void)rwflag, (void)user;
    return -1;
}

/* Why a PEM file gave no key of the wanted kind, from its armour lines. */
static const char *why_no_key(const char *text, int want_private) {
    if (strstr(text, "-----BEGIN ENCRYPTED PRIVATE KEY-----"))
        return "an encrypted private key; kparity reads unencrypted PEM only, since a gate cannot type a passphrase "
               "(hint: keep the key where only the signer can read it)";
    if (!want_private && strstr(text, "PRIVATE KEY-----"))
        return "holds a private key, where verify wants the public one (hint: openssl pkey -in KEY.pem -pubout -out "
               "PUB.pem, and pass PUB.pem)";
    if (want_private && strstr(text, "-----BEGIN PUBLIC KEY-----"))
        return "holds a public key; signing needs the private key (hint: openssl genpkey -algorithm ed25519 -out key.pem)";
    return want_private ? "no PEM private key in it (expected '-----BEGIN PRIVATE KEY-----', as openssl genpkey writes)"
                        : "no PEM public key in it (expected '-----BEGIN PUBLIC KEY-----', as openssl pkey -pubout writes)";
}

int kp_sign_key_load(const char *path, int want_private, kp_sign_key **out, kp_error *err) {
    *out = NULL;
    const char *role = want_private ? "signing key" : "public key";
    char *text = NULL;
    size_t len = 0;
    if (kp_read_file(path, &text, &len, err)) {
        kp_error_prefix(err, "%s ", role);
        return err->code;
    }
    BIO *bio = len <= INT_MAX ? BIO_new_mem_buf(text, (int)len) : NULL;
    EVP_PKEY *pkey = !bio ? NULL
                     : want_private ? PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL)
                                    : PEM_read_bio_PUBKEY(bio, NULL, no_passphrase, NULL);
    BIO_free(bio);
    ERR_clear_error(); /* the queue holds PEM's parse trail; our message says what went wrong */
    int rc = 0;
    kp_sign_key *key = NULL;
    unsigned char *der = NULL;
    int der_len = 0;
    if (!pkey) {
        rc = kp_fail(err, KP_EXIT_USAGE, "%s %s: %s", role, path, why_no_key(text, want_private));
    } else if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_ED25519) {
        const char *alg = EVP_PKEY_get0_type_name(pkey);
        rc = kp_fail(err, KP_EXIT_USAGE, "%s %s: is a %s key; kparity signs and verifies with Ed25519 only (hint: "
                     "openssl genpkey -algorithm ed25519 -out key.pem)", role, path, alg ? alg : "non-Ed25519");
    } else if ((der_len = i2d_PUBKEY(pkey, &der)) <= 0 || !(key = calloc(1, sizeof *key)) || !(key->path = strdup(path))) {
        rc = kp_fail(err, KP_EXIT_ENV, "%s %s: out of memory", role, path);
    } else {
        kp_sha256_hex(der, (size_t)der_len, key->keyid);
        key->pkey = pkey;
        key->is_private = want_private;
        pkey = NULL;
        *out = key;
        key = NULL;
    }
    OPENSSL_free(der);
    EVP_PKEY_free(pkey);
    kp_sign_key_free(key);
    free(text);
    return rc;
}

void kp_sign_key_free(kp_sign_key *key) {
    if (!key) return;
    EVP_PKEY_free(key->pkey);
    free(key->path);
    free(key);
}

const char *kp_sign_keyid(const kp_sign_key *key) { return key->keyid; }

char *kp_dsse_pae(const char *payload_type, const void *body, size_t body_len, size_t *len) {
    char *head = NULL;
    int head_len = asprintf(&head, "DSSEv1 %zu %s %zu ", strlen(payload_type), payload_type, body_len);
    if (head_len < 0) return NULL;
    char *pae = body_len < SIZE_MAX - (size_t)head_len - 1 ? malloc((size_t)head_len + body_len + 1) : NULL;
    if (pae) {
        memcpy(pae, head, (size_t)head_len);
        if (body_len) memcpy(pae + head_len, body, body_len);
        pae[head_len + body_len] = '\0';
        *len = (size_t)head_len + body_len;
    }
    free(head);
    return pae;
}

/* Standard base64 with padding, no line breaks. */
static char *b64_encode(const void *data, size_t len) {
    if (len > (size_t)INT_MAX / 4 * 3 - 3) return NULL; /* EVP_EncodeBlock counts in int */
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    if (out) EVP_EncodeBlock((unsigned char *)out, data, (int)len);
    return out;
}

/* Only the canonical form b64_encode writes: decoding, encoding again and comparing refuses line
 * breaks, whitespace, missing padding and non-zero padding bits, which EVP_DecodeBlock lets through. */
static unsigned char *b64_decode(const char *text, size_t *len) {
    size_t n = strlen(text);
    if (n % 4 != 0 || n > INT_MAX) return NULL;
    unsigned char *out = malloc(n / 4 * 3 + 1);
    int got = out ? EVP_DecodeBlock(out, (const unsigned char *)text, (int)n) : -1;
    size_t pad = n >= 2 && text[n - 1] == '=' ? (text[n - 2] == '=' ? 2 : 1) : 0;
    char *again = got >= (int)pad ? b64_encode(out, (size_t)got - pad) : NULL;
    if (!again || strcmp(again, text) != 0) {
        free(again);
        free(out);
        return NULL;
    }
    free(again);
    *len = (size_t)got - pad;
    out[*len] = '\0';
    return out;
}

/* ------------------------------------------------------------------ the statement */

/* bundle.json's account of the run. The predicate only repeats it (bundle.json is a subject too),
 * so a reader of the statement alone sees the verdict it vouches for. */
static cJSON *predicate_of(const char *dir, const cJSON *bundle, kp_error *err) {
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(bundle, "config");
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(bundle, "environment");
    const char *verdict = str_at(bundle, "verdict"), *config_sha = str_at(config, "sha256");
    const char *config_name = str_at(config, "name"), *version = str_at(env, "kparity_version");
    const char *chain_head = str_at(bundle, "chain_head");
    int64_t exit_code = 0;
    if (!verdict || !config_sha || kp_json_get_int(bundle, "exit_code", &exit_code) != 0) {
        kp_fail(err, KP_EXIT_USAGE, "bundle %s: bundle.json: no %s; a statement vouches for a verdict, a config digest "
                "and an exit code (was this bundle written by kparity run or gate?)", dir,
                !verdict ? "verdict" : !config_sha ? "config.sha256" : "exit_code");
        return NULL;
    }
    cJSON *p = cJSON_CreateObject(), *c = NULL;
    int ok = p && cJSON_AddStringToObject(p, "verdict", verdict) && kp_json_add_int(p, "exit_code", exit_code) &&
             (c = cJSON_AddObjectToObject(p, "config")) && (!config_name || cJSON_AddStringToObject(c, "name", config_name)) &&
             cJSON_AddStringToObject(c, "sha256", config_sha) &&
             (!version || cJSON_AddStringToObject(p, "kparity_version", version));
    if (ok && env) {
        cJSON *copy = cJSON_Duplicate(env, 1); /* keeps each number's text as parsed */
        ok = copy && cJSON_AddItemToObject(p, "environment", copy);
        if (!ok) cJSON_Delete(copy);
    }
    if (ok && chain_head) ok = cJSON_AddStringToObject(p, "chain_head", chain_head) != NULL;
    if (!ok) {
        cJSON_Delete(p);
        kp_fail(err, KP_EXIT_ENV, "out of memory building the statement of %s", dir);
        return NULL;
    }
    return p;
}

int kp_sign_is_leftover(const char *path) {
    static const char prefix[] = "." KP_SIGN_ENVELOPE ".tmp-";
    return !strncmp(path, prefix, sizeof prefix - 1) && kp_bundle_is_temp_name(path);
}

int kp_sign_leftovers(const char *dir, char *names, size_t len, kp_error *err) {
    if (len) names[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) {
        kp_fail(err, KP_EXIT_USAGE, "%s: cannot read the folder: %s", dir, strerror(errno));
        return -1;
    }
    int found = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!kp_sign_is_leftover(e->d_name)) continue;
        const size_t used = strlen(names);
        if (used < len) snprintf(names + used, len - used, "%s%s", found ? ", " : "", e->d_name);
        found++;
    }
    closedir(d);
    return found;
}

/* Every file but the envelope and what an unfinished write of it left, sorted as kp_bundle_list_files sorts (strcmp). */
static int add_subjects(cJSON *list, const char *dir, size_t *count, kp_error *err) {
    char **paths = NULL;
    size_t n = 0;
    *count = 0;
    if (kp_bundle_list_files(dir, &paths, &n, err)) {
        kp_error_prefix(err, "bundle %s: ", dir);
        return err->code;
    }
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        if (strcmp(paths[i], KP_SIGN_ENVELOPE) == 0 || kp_sign_is_leftover(paths[i])) continue;
        char *full = join(dir, paths[i]), hex[KP_SHA256_HEX_LEN];
        cJSON *s = NULL, *d = NULL;
        if (!full) rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
        else if (!(rc = kp_sha256_file_hex(full, hex, err)) &&
                 (!(s = cJSON_CreateObject()) || !cJSON_AddItemToArray(list, s) || !cJSON_AddStringToObject(s, "name", paths[i]) ||
                  !(d = cJSON_AddObjectToObject(s, "digest")) || !cJSON_AddStringToObject(d, "sha256", hex)))
            rc = kp_fail(err, KP_EXIT_ENV, "out of memory building the statement of %s", dir);
        if (!rc) (*count)++;
        free(full);
    }
    kp_bundle_free_list(paths, n);
    return rc;
}

static int statement_doc(const char *dir, cJSON **out, size_t *count, kp_error *err) {
    *out = NULL;
    char *path = join(dir, "bundle.json");
    cJSON *bundle = NULL, *doc = NULL, *subjects = NULL, *predicate = NULL;
    int rc = path ? kp_bundle_read_json(path, &bundle, err) : kp_fail(err, KP_EXIT_ENV, "out of memory");
    free(path);
    if (rc) return rc;
    if (!(predicate = predicate_of(dir, bundle, err))) rc = err->code;
    else if (!(doc = cJSON_CreateObject()) || !cJSON_AddStringToObject(doc, "_type", KP_SIGN_STATEMENT_TYPE) ||
             !(subjects = cJSON_AddArrayToObject(doc, "subject")))
        rc = kp_fail(err, KP_EXIT_ENV, "out of memory building the statement of %s", dir);
    else if (!(rc = add_subjects(subjects, dir, count, err))) {
        if (!cJSON_AddStringToObject(doc, "predicateType", KP_SIGN_PREDICATE_TYPE) ||
            !cJSON_AddItemToObject(doc, "predicate", predicate))
            rc = kp_fail(err, KP_EXIT_ENV, "out of memory building the statement of %s", dir);
        else predicate = NULL;
    }
    cJSON_Delete(predicate);
    cJSON_Delete(bundle);
    if (rc) cJSON_Delete(doc);
    else *out = doc;
    return rc;
}

/* The one place statement bytes are made, for signing and for kp_sign_statement alike. */
static int statement_text(const char *dir, char **text, size_t *count, kp_error *err) {
    *text = NULL;
    cJSON *doc;
    if (statement_doc(dir, &doc, count, err)) return err->code;
    char *printed = kp_json_print(doc);
    cJSON_Delete(doc);
    *text = printed ? strdup(printed) : NULL; /* malloc'd, as kp_sign.h promises, not cJSON_malloc'd */
    cJSON_free(printed);
    return *text ? 0 : kp_fail(err, KP_EXIT_ENV, "out of memory printing the statement of %s", dir);
}

int kp_sign_statement(const char *dir, char **text, size_t *len, kp_error *err) {
    size_t count;
    *len = 0;
    if (statement_text(dir, text, &count, err)) return err->code;
    *len = strlen(*text);
    return 0;
}

/* ------------------------------------------------------------------ signing */

int kp_sign_bundle(const char *dir, const kp_sign_key *key, size_t *subjects, kp_error *err) {
    if (!key->is_private)
        return kp_fail(err, KP_EXIT_USAGE, "signing key %s: loaded as a public key; signing needs the private key", key->path);
    size_t count = 0, pae_len = 0, sig_len = ED25519_SIG_BYTES;
    char *statement = NULL;
    if (statement_text(dir, &statement, &count, err)) return err->code;
    unsigned char sig[ED25519_SIG_BYTES];
    char *pae = kp_dsse_pae(KP_SIGN_PAYLOAD_TYPE, statement, strlen(statement), &pae_len);
    char *payload_b64 = b64_encode(statement, strlen(statement)), *sig_b64 = NULL;
    char *printed = NULL, *text = NULL, *path = join(dir, KP_SIGN_ENVELOPE);
    cJSON *env = NULL, *sigs = NULL, *one = NULL;
    int rc = 0;
    if (!pae || !payload_b64 || !path) {
        rc = kp_fail(err, KP_EXIT_ENV, "out of memory signing %s", dir);
        goto out;
    }
    /* Ed25519 is pure: EVP_DigestSign with no digest signs the whole message, and the same key and
     * message give the same signature, so signing a bundle twice writes the same envelope. */
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int signed_ok = ctx && EVP_DigestSignInit(ctx, NULL, NULL, NULL, key->pkey) == 1 &&
                    EVP_DigestSign(ctx, sig, &sig_len, (const unsigned char *)pae, pae_len) == 1 && sig_len == ED25519_SIG_BYTES;
    EVP_MD_CTX_free(ctx);
    if (!signed_ok) {
        unsigned long e = ERR_get_error();
        ERR_clear_error();
        rc = kp_fail(err, KP_EXIT_ENV, "signing %s with %s failed in OpenSSL: %s", dir, key->path,
                     e && ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "no reason given");
        goto out;
    }
    if (!(sig_b64 = b64_encode(sig, sig_len)) || !(env = cJSON_CreateObject()) ||
        !cJSON_AddStringToObject(env, "payloadType", KP_SIGN_PAYLOAD_TYPE) || !cJSON_AddStringToObject(env, "payload", payload_b64) ||
        !(sigs = cJSON_AddArrayToObject(env, "signatures")) || !(one = cJSON_CreateObject()) || !cJSON_AddItemToArray(sigs, one) ||
        !cJSON_AddStringToObject(one, "keyid", key->keyid) || !cJSON_AddStringToObject(one, "sig", sig_b64) ||
        !(printed = kp_json_print(env)) || asprintf(&text, "%s\n", printed) < 0) {
        text = NULL;
        rc = kp_fail(err, KP_EXIT_ENV, "out of memory writing %s/%s", dir, KP_SIGN_ENVELOPE);
        goto out;
    }
    /* the bundle verified, so the only temporary files at its top are what an unfinished sign left */
    if ((rc = kp_bundle_drop_temp_files(dir, err))) goto out;
    if (!(rc = kp_write_file_atomic(path, text, strlen(text), err)) && subjects) *subjects = count;
out:
    free(statement);
    cJSON_free(printed);
    cJSON_Delete(env);
    free(pae), free(payload_b64), free(sig_b64), free(text), free(path);
    return rc;
}

/* ------------------------------------------------------------------ verifying */

static int sig_verifies(const kp_sign_key *key, const char *sig_b64, const char *pae, size_t pae_len) {
    size_t sig_len = 0;
    unsigned char *sig = sig_b64 ? b64_decode(sig_b64, &sig_len) : NULL;
    EVP_MD_CTX *ctx = sig ? EVP_MD_CTX_new() : NULL;
    int ok = ctx && sig_len == ED25519_SIG_BYTES && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, key->pkey) == 1 &&
             EVP_DigestVerify(ctx, sig, sig_len, (const unsigned char *)pae, pae_len) == 1;
    EVP_MD_CTX_free(ctx);
    ERR_clear_error();
    free(sig);
    return ok;
}

/* The signature over PAE(payloadType, payload); on success *statement holds the payload's bytes. */
static int check_envelope(const char *dir, const kp_sign_key *key, const cJSON *env, char **statement, size_t *len,
                          kp_error *err) {
    const char *f = KP_SIGN_ENVELOPE, *type = str_at(env, "payloadType"), *payload = str_at(env, "payload");
    const cJSON *sigs = cJSON_GetObjectItemCaseSensitive(env, "signatures"), *s;
    *statement = NULL;
    if (!type || strcmp(type, KP_SIGN_PAYLOAD_TYPE) != 0)
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: payloadType is '%s', expected '%s'", dir, f,
                       or_none(type), KP_SIGN_PAYLOAD_TYPE);
    if (!cJSON_IsArray(sigs) || cJSON_GetArraySize(sigs) < 1)
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: no signatures", dir, f);
    unsigned char *body = payload ? b64_decode(payload, len) : NULL;
    if (!body) return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: payload is not canonical base64", dir, f);
    size_t pae_len = 0;
    char *pae = kp_dsse_pae(type, body, *len, &pae_len);
    if (!pae) {
        free(body);
        return kp_fail(err, KP_EXIT_ENV, "out of memory");
    }
    /* DSSE: the envelope passes when any one of its signatures verifies with a trusted key. */
    int verified = 0;
    const char *other = NULL;
    cJSON_ArrayForEach(s, sigs) {
        if ((verified = sig_verifies(key, str_at(s, "sig"), pae, pae_len))) break;
        const char *keyid = str_at(s, "keyid");
        if (keyid && strcmp(keyid, key->keyid) != 0) other = keyid;
    }
    free(pae);
    if (!verified) {
        free(body);
        if (other)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: signature does not verify with public key %s: the "
                           "envelope names keyid %s, this key is %s (signed with another key?)", dir, f, key->path, other,
                           key->keyid);
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: signature does not verify with public key %s (keyid %s): "
                       "the statement or the signature changed after signing", dir, f, key->path, key->keyid);
    }
    *statement = (char *)body;
    return 0;
}

static const char *subject_digest(const cJSON *s) {
    return str_at(cJSON_GetObjectItemCaseSensitive(s, "digest"), "sha256");
}

/* The signed subjects against the bundle's files now, both sorted. A file added or removed is
 * named before any changed one: adding a file under a rewritten manifest changes manifest.sha256
 * too, and the added file is the news. Otherwise the first changed file in path order is named. */
static int check_subjects(const char *dir, const cJSON *signed_list, const cJSON *disk_list, kp_error *err) {
    const cJSON *s = signed_list ? signed_list->child : NULL, *d = disk_list ? disk_list->child : NULL;
    const cJSON *changed_signed = NULL, *changed_disk = NULL;
    const char *prev = NULL;
    while (s || d) {
        const char *sname = s ? str_at(s, "name") : NULL, *dname = d ? str_at(d, "name") : NULL;
        if (s && (!sname || !subject_digest(s) || (prev && strcmp(prev, sname) >= 0)))
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: the signed statement's subject after '%s' is malformed, "
                           "out of order or repeated", dir, KP_SIGN_ENVELOPE, prev ? prev : "(start)");
        int c = !s ? 1 : !d ? -1 : strcmp(sname, dname);
        if (c < 0)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: named in the signed statement but missing", dir, sname);
        if (c > 0)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: present but not in the signed statement (an added file)",
                           dir, dname);
        if (!changed_signed && strcmp(subject_digest(s), subject_digest(d)) != 0) {
            changed_signed = s;
            changed_disk = d;
        }
        prev = sname;
        s = s->next;
        d = d->next;
    }
    if (changed_signed)
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: SHA-256 %s is not the signed digest %s (changed after "
                       "signing)", dir, str_at(changed_disk, "name"), subject_digest(changed_disk),
                       subject_digest(changed_signed));
    return 0;
}

static int check_statement(const char *dir, const char *text, size_t len, size_t *subjects, kp_error *err) {
    const char *f = KP_SIGN_ENVELOPE;
    cJSON *signed_doc = kp_json_parse(text, len, NULL), *now = NULL;
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(signed_doc, "subject");
    const char *type = str_at(signed_doc, "_type"), *ptype = str_at(signed_doc, "predicateType");
    int rc = 0;
    size_t count = 0;
    char *a = NULL, *b = NULL;
    if (!signed_doc)
        rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: the signed payload is not JSON", dir, f);
    else if (!type || strcmp(type, KP_SIGN_STATEMENT_TYPE) != 0 || !ptype || strcmp(ptype, KP_SIGN_PREDICATE_TYPE) != 0 ||
             !cJSON_IsArray(list))
        rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: the signed payload is not a %s statement of predicate type %s "
                     "with a subject list (_type '%s', predicateType '%s')", dir, f, KP_SIGN_STATEMENT_TYPE,
                     KP_SIGN_PREDICATE_TYPE, or_none(type), or_none(ptype));
    else if ((rc = statement_doc(dir, &now, &count, err))) {
        /* The signer read a whole bundle.json and listed every file: one that cannot be read or listed now
         * was damaged after signing, not misnamed by the user (as kp_bundle_verify classes it). */
        if (rc == KP_EXIT_USAGE) rc = err->code = KP_EXIT_INCORRECT;
    } else if (!(rc = check_subjects(dir, list, cJSON_GetObjectItemCaseSensitive(now, "subject"), err))) {
        /* Both printed by today's printer, so only content can differ. bundle.json's bytes matched
         * already; a mismatch here means the signer vouched for something bundle.json does not say. */
        a = kp_json_print(cJSON_GetObjectItemCaseSensitive(signed_doc, "predicate"));
        b = kp_json_print(cJSON_GetObjectItemCaseSensitive(now, "predicate"));
        if (!a || !b || strcmp(a, b) != 0)
            rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: the signed predicate (verdict %s) does not match "
                         "bundle.json (verdict %s)", dir, f,
                         or_none(str_at(cJSON_GetObjectItemCaseSensitive(signed_doc, "predicate"), "verdict")),
                         or_none(str_at(cJSON_GetObjectItemCaseSensitive(now, "predicate"), "verdict")));
    }
    if (!rc && subjects) *subjects = count;
    cJSON_free(a);
    cJSON_free(b);
    cJSON_Delete(now);
    cJSON_Delete(signed_doc);
    return rc;
}

int kp_sign_check(const char *dir, const kp_sign_key *key, size_t *subjects, kp_error *err) {
    char *path = join(dir, KP_SIGN_ENVELOPE), *text = NULL, *statement = NULL;
    size_t len = 0, statement_len = 0;
    struct stat st;
    if (!path) return kp_fail(err, KP_EXIT_ENV, "out of memory");
    int rc = 0;
    if (stat(path, &st) != 0)
        rc = kp_fail(err, KP_EXIT_USAGE, "bundle %s: %s: %s; the bundle is not signed (hint: kparity sign %s --key KEY.pem)",
                     dir, KP_SIGN_ENVELOPE, errno == ENOENT ? "missing" : strerror(errno), dir);
    else if (!(rc = kp_read_file(path, &text, &len, err))) {
        cJSON *env = kp_json_parse(text, len, NULL);
        if (!env) rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: not valid JSON", dir, KP_SIGN_ENVELOPE);
        else if (!(rc = check_envelope(dir, key, env, &statement, &statement_len, err)))
            rc = check_statement(dir, statement, statement_len, subjects, err);
        cJSON_Delete(env);
    }
    free(statement);
    free(text);
    free(path);
    return rc;
}
