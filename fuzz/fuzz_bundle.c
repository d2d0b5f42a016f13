/* fuzz_bundle.c: libFuzzer target for the bundle verifier (kp_bundle_verify, and kp_sign_check when a public key
 * is given) on a real bundle with one file replaced by the input. The input's first byte picks the file (its low 7
 * bits, in sorted path order, the manifest and a signature envelope included), the rest is its new content; the
 * manifest is then rewritten to the new digest, as a forger would, so the bytes reach bundle.json's, the receipts'
 * and the envelope's parsers rather than stopping at the digest check (an input for manifest.sha256 replaces it
 * raw). With the byte's high bit set the file is removed instead (no manifest: an unfinished run's bundle).
 * Beyond "no crash": the bundle's own bytes verify; a damaged or unfinished bundle is exit 1 with a message; a
 * file verify derives from the receipts (junit.xml, summary.md, report.html) never verifies with other bytes, nor
 * does a bundle.json whose derived content differs (derived_content_kept); a signature check passes only when every
 * signed file is as it was; a missing envelope is an unsigned bundle.
 *
 * Environment: KP_FUZZ_BUNDLE, the seed bundle (scripts/fuzz.sh makes it from fuzz/seed-gate.json, signed);
 * KP_FUZZ_PUBKEY, its public key (optional); KP_FUZZ_WRITE_SEEDS=DIR writes one seed per file into DIR. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_sign.h"
#include "../receipts/kp_verify.h"
#include "forged_bundle.h"

static forged g_bundle;
static kp_sign_key *g_key;
static cJSON *g_seed_doc; /* the seed's bundle.json, read with plain cJSON */

/* The reports: verify renders them again from the receipts and compares bytes. */
static int is_report(const char *path) {
    return !strcmp(path, "junit.xml") || !strcmp(path, "summary.md") || !strcmp(path, "report.html");
}

/* What verify holds bundle.json to (kp_verify.c check_derived): its content, not its spelling. Its members schema,
 * verdict, exit_code, receipts and chain_head, each there once and equal (cJSON_Compare, an oracle apart from
 * verify's own checks) to the seed's; its other members (config, environment, timings) are no function of the
 * receipts, so new bytes there, or new whitespace, may verify. A second "verdict" anywhere at the top counts as
 * changed content: jq and Python read the last one. */
static int derived_content_kept(const uint8_t *bytes, size_t len) {
    static const char *const derived[] = {"schema", "verdict", "exit_code", "receipts", "chain_head"};
    cJSON *doc = cJSON_ParseWithLength((const char *)bytes, len);
    int kept = cJSON_IsObject(doc);
    for (size_t k = 0; kept && k < sizeof derived / sizeof *derived; k++) {
        int seen = 0;
        for (const cJSON *x = doc->child; kept && x; x = x->next)
            if (x->string && !strcmp(x->string, derived[k]))
                kept = !seen++ && cJSON_Compare(x, cJSON_GetObjectItemCaseSensitive(g_seed_doc, derived[k]), 1);
        kept &= seen == 1;
    }
    cJSON_Delete(doc);
    return kept;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *seed = getenv("KP_FUZZ_BUNDLE"), *pub = getenv("KP_FUZZ_PUBKEY"), *seeds_out = getenv("KP_FUZZ_WRITE_SEEDS");
    if (!seed) kp_abort(__FILE__, __LINE__, "KP_FUZZ_BUNDLE is not set; hint: run it through scripts/fuzz.sh, which makes one");
    kp_error err = {0};
    if (pub && kp_sign_key_load(pub, 0, &g_key, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
    forged_load(&g_bundle, seed, seeds_out);
    if (seeds_out) exit(0);
    for (size_t i = 0; i < g_bundle.nfiles; i++)
        if (!strcmp(g_bundle.files[i].path, "bundle.json"))
            g_seed_doc = cJSON_ParseWithLength(g_bundle.files[i].bytes, g_bundle.files[i].len);
    KP_ASSERT(cJSON_IsObject(g_seed_doc));
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    forged *f = &g_bundle;
    forged_apply(f, data, size);
    const int removed = f->removed, same = f->same, envelope = !strcmp(f->changed->path, KP_SIGN_ENVELOPE);
    kp_error err = {0};
    int rc = kp_bundle_verify(f->dir, &err);
    if (same || (removed && envelope)) KP_ASSERT(rc == 0);
    else if (removed) KP_ASSERT(rc == KP_EXIT_INCORRECT && err.msg[0]);
    else if (is_report(f->changed->path) || (!strcmp(f->changed->path, "bundle.json") && !derived_content_kept(data + 1, size - 1)))
        KP_ASSERT(rc == KP_EXIT_INCORRECT && err.msg[0]); /* a contradiction of the receipts never verifies */
    else if (rc) KP_ASSERT(rc == KP_EXIT_INCORRECT && err.msg[0]); /* the envelope, a receipt or artifact, the manifest */
    if (g_key) {
        kp_error e2 = {0};
        size_t subjects = 0;
        int sc = kp_sign_check(f->dir, g_key, &subjects, &e2);
        /* only the envelope itself can change (its JSON spelling) and still verify */
        if (same) KP_ASSERT(sc == 0);
        else if (removed && envelope) KP_ASSERT(sc == KP_EXIT_USAGE); /* not signed */
        else if (!envelope) KP_ASSERT(sc == KP_EXIT_INCORRECT && e2.msg[0]);
    }
    forged_restore(f); /* back to the seed's bytes for the next input */
    return 0;
}
