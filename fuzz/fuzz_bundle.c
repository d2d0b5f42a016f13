/* fuzz_bundle.c: libFuzzer target for the bundle verifier (kp_bundle_verify, and kp_sign_check when a public key
 * is given) on a real bundle with one file replaced by the input. The input's first byte picks the file (its low 7
 * bits, in sorted path order, the manifest and a signature envelope included), the rest is its new content; the
 * manifest is then rewritten to the new digest, as a forger would, so the bytes reach bundle.json's, the receipts'
 * and the envelope's parsers rather than stopping at the digest check (an input for manifest.sha256 replaces it
 * raw). With the byte's high bit set the file is removed instead (no manifest: an unfinished run's bundle).
 * Beyond "no crash": the bundle's own bytes verify; a damaged or unfinished bundle is exit 1 with a message; a
 * signature check passes only when every signed file is as it was; a missing envelope is an unsigned bundle.
 *
 * Environment: KP_FUZZ_BUNDLE, the seed bundle (scripts/fuzz.sh makes it from fuzz/seed-gate.json, signed);
 * KP_FUZZ_PUBKEY, its public key (optional); KP_FUZZ_WRITE_SEEDS=DIR writes one seed per file into DIR. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_sign.h"
#include "forged_bundle.h"

static forged g_bundle;
static kp_sign_key *g_key;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *seed = getenv("KP_FUZZ_BUNDLE"), *pub = getenv("KP_FUZZ_PUBKEY"), *seeds_out = getenv("KP_FUZZ_WRITE_SEEDS");
    if (!seed) kp_abort(__FILE__, __LINE__, "KP_FUZZ_BUNDLE is not set; hint: run it through scripts/fuzz.sh, which makes one");
    kp_error err = {0};
    if (pub && kp_sign_key_load(pub, 0, &g_key, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
    forged_load(&g_bundle, seed, seeds_out);
    if (seeds_out) exit(0);
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
    else if (rc) KP_ASSERT(rc == KP_EXIT_INCORRECT && err.msg[0]);
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
