/* fuzz_merge.c: libFuzzer target for `kparity merge` (kp_cmd_merge) on the two shard bundles of a real run, one of
 * them forged: the input's first byte picks the part (even: shard 1, odd: shard 2), the rest replaces or removes one
 * of its files with the manifest rewritten to match (forged_bundle.h), so the bytes reach what merge reads after
 * the part verifies: bundle.json's shard, config and version, its receipt list, each receipt's config index, the
 * artifacts it copies. Beyond "no crash": merge exits with a verdict's code or 2/3; the seed's own parts merge to
 * the seed run's verdict; a verdict's exit leaves a merged bundle that verifies; a refusal leaves no manifest.sha256,
 * nothing that reads as a finished bundle.
 *
 * merge reports every refusal on stderr: scripts/fuzz.sh runs this target with -close_fd_mask=3 (libFuzzer keeps
 * its own output and the sanitizers' reports; rerun an input alone to read merge's words).
 *
 * Environment: KP_FUZZ_PART1 and KP_FUZZ_PART2, `kparity run --shard 1/2` and `2/2` of one config (scripts/fuzz.sh
 * makes them from fuzz/seed-gate.json); KP_FUZZ_WRITE_SEEDS=DIR writes one seed per file of each part into DIR. */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../harness/kp_runner.h"
#include "../receipts/kp_bundle.h"
#include "../receipts/kp_verify.h"
#include "forged_bundle.h"

static forged g_parts[2];
static char g_out[300];
static int g_seed_rc = -1;

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    return remove(path);
}

static void remove_out(void) { nftw(g_out, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static int merge_parts(void) {
    nftw(g_out, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    char *argv[] = {g_parts[0].dir, g_parts[1].dir, "--out", g_out, NULL};
    return kp_cmd_merge(4, argv);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *p1 = getenv("KP_FUZZ_PART1"), *p2 = getenv("KP_FUZZ_PART2"), *seeds_out = getenv("KP_FUZZ_WRITE_SEEDS");
    if (!p1 || !p2) kp_abort(__FILE__, __LINE__, "KP_FUZZ_PART1 or KP_FUZZ_PART2 is not set; hint: run it through scripts/fuzz.sh");
    forged_load(&g_parts[0], p1, NULL);
    forged_load(&g_parts[1], p2, NULL);
    if (seeds_out) { /* "part byte, file byte, bytes": the parts' files as they are */
        for (int p = 0; p < 2; p++)
            for (size_t i = 0; i < g_parts[p].nfiles; i++) {
                char name[600];
                snprintf(name, sizeof name, "%s/part%d-file-%02zu", seeds_out, p + 1, i);
                FILE *f = fopen(name, "wb");
                const forged_file *ff = &g_parts[p].files[i];
                KP_ASSERT(f && fputc(p, f) != EOF && fputc((int)i, f) != EOF && fwrite(ff->bytes, 1, ff->len, f) == ff->len);
                fclose(f);
            }
        exit(0);
    }
    snprintf(g_out, sizeof g_out, "%s.merged", g_parts[0].dir);
    atexit(remove_out);
    g_seed_rc = merge_parts();
    kp_error err = {0};
    if (g_seed_rc == KP_EXIT_USAGE || g_seed_rc == KP_EXIT_ENV || kp_bundle_verify(g_out, &err))
        kp_abort(__FILE__, __LINE__, "the seed parts do not merge to a bundle that verifies (merge exit %d): %s", g_seed_rc, err.msg);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    forged *f = &g_parts[data[0] & 1];
    forged_apply(f, data + 1, size - 1);
    const int rc = merge_parts();
    KP_ASSERT(rc == 0 || rc == KP_EXIT_INCORRECT || rc == KP_EXIT_USAGE || rc == KP_EXIT_ENV || rc == KP_EXIT_TIMEOUT ||
              rc == KP_EXIT_SKIP);
    if (f->same) KP_ASSERT(rc == g_seed_rc);
    char manifest[400];
    snprintf(manifest, sizeof manifest, "%s/manifest.sha256", g_out);
    struct stat st;
    const int finished = stat(manifest, &st) == 0;
    /* a refusal never leaves what reads as a finished bundle; a verdict (3 is FAILED's, or a write that failed)
     * leaves a whole one, and whatever is finished verifies */
    if (rc == KP_EXIT_USAGE) KP_ASSERT(!finished);
    else if (rc != KP_EXIT_ENV) KP_ASSERT(finished);
    kp_error err = {0};
    if (finished) KP_ASSERT(kp_bundle_verify(g_out, &err) == 0);
    forged_restore(f);
    return 0;
}
