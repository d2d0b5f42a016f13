/* forged_bundle.h: a private copy of a real bundle in which a fuzz input replaces (or removes) one file and the
 * manifest is rewritten to match, as a forger would; shared by fuzz_bundle.c and fuzz_merge.c. */
#ifndef KP_FORGED_BUNDLE_H
#define KP_FORGED_BUNDLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct forged_file {
    char *path;        /* relative */
    char *bytes;       /* the seed's content */
    size_t len;
    int manifest_line; /* its line in manifest.sha256 (0-based), -1 when not listed */
} forged_file;

typedef struct forged {
    char dir[256]; /* the copy (on /dev/shm when it can be) */
    forged_file *files;
    size_t nfiles, manifest;
    const forged_file *changed; /* the file the last input replaced or removed */
    int removed, same;          /* it was removed; its new bytes are the seed's */
    char *manifest_bytes;       /* the rewritten manifest while one is in place */
} forged;

/* Copy the verified bundle `seed` to a fresh folder (removed at exit). With seeds_out, write there one seed input
 * per file ("file-NN": its index byte, then its bytes). Aborts on any failure: a fuzz target without its seed
 * bundle would fuzz nothing. */
void forged_load(forged *f, const char *seed, const char *seeds_out);

/* Apply one input (size >= 1): its first byte picks the file (low 7 bits, in sorted path order, modulo the count),
 * with the high bit set that file is removed, else the rest of the input is its new content and its manifest line
 * gets the new digest (an input for manifest.sha256 replaces it raw). */
void forged_apply(forged *f, const uint8_t *data, size_t size);

/* Put the changed file (and the manifest) back to the seed's bytes. */
void forged_restore(forged *f);

#endif
