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
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_npy.h"
#include "../receipts/kp_sign.h"

typedef struct bundle_file {
    char *path;  /* relative */
    char *bytes; /* the seed's content */
    size_t len;
    int manifest_line; /* its line in manifest.sha256 (0-based), -1 when not listed */
} bundle_file;

static char g_dir[256];
static bundle_file *g_files;
static size_t g_nfiles, g_manifest = (size_t)-1;
static kp_sign_key *g_key;

static void put(const char *rel, const void *bytes, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) kp_abort(__FILE__, __LINE__, "%s: cannot be written", path);
    KP_ASSERT(len == 0 || write(fd, bytes, len) == (ssize_t)len);
    close(fd);
}

/* manifest.sha256 with line `line` naming digest `hex` (the rest as in the seed), into a malloc'd buffer. */
static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    return remove(path);
}
static void remove_copy(void) { nftw(g_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static char *manifest_with(int line, const char *hex, size_t *len) {
    const bundle_file *m = &g_files[g_manifest];
    char *out = malloc(m->len + 1);
    KP_ASSERT(out);
    memcpy(out, m->bytes, m->len);
    char *at = out;
    for (int i = 0; i < line; i++) at = strchr(at, '\n') + 1;
    memcpy(at, hex, 64);
    *len = m->len;
    return out;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *seed = getenv("KP_FUZZ_BUNDLE"), *pub = getenv("KP_FUZZ_PUBKEY"), *seeds_out = getenv("KP_FUZZ_WRITE_SEEDS");
    if (!seed) kp_abort(__FILE__, __LINE__, "KP_FUZZ_BUNDLE is not set; hint: run it through scripts/fuzz.sh, which makes one");
    kp_error err = {0};
    char **paths = NULL;
    if (kp_bundle_verify(seed, &err) || kp_bundle_list_files(seed, &paths, &g_nfiles, &err))
        kp_abort(__FILE__, __LINE__, "seed bundle %s: %s", seed, err.msg);
    if (pub && kp_sign_key_load(pub, 0, &g_key, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
    /* a private copy (on tmpfs when there is one): fuzzing writes into it */
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/kparity-fuzz-bundle-XXXXXX", tmp);
    KP_ASSERT(mkdtemp(g_dir));
    atexit(remove_copy);
    g_files = calloc(g_nfiles, sizeof *g_files);
    KP_ASSERT(g_files);
    for (size_t i = 0; i < g_nfiles; i++) {
        char src[512];
        snprintf(src, sizeof src, "%s/%s", seed, paths[i]);
        g_files[i].path = strdup(paths[i]);
        if (kp_read_file(src, &g_files[i].bytes, &g_files[i].len, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
        if (!strcmp(paths[i], "manifest.sha256")) g_manifest = i;
        char sub[512], *slash = strrchr(strcpy(sub, paths[i]), '/');
        if (slash) {
            char dir[600];
            *slash = '\0';
            snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
            mkdir(dir, 0755);
        }
        put(paths[i], g_files[i].bytes, g_files[i].len);
        if (seeds_out) {
            char name[600];
            snprintf(name, sizeof name, "%s/file-%02zu", seeds_out, i);
            FILE *f = fopen(name, "wb");
            KP_ASSERT(f && fputc((int)i, f) != EOF && fwrite(g_files[i].bytes, 1, g_files[i].len, f) == g_files[i].len);
            fclose(f);
        }
    }
    kp_bundle_free_list(paths, g_nfiles);
    KP_ASSERT(g_manifest != (size_t)-1);
    for (size_t i = 0; i < g_nfiles; i++) {
        g_files[i].manifest_line = -1;
        const bundle_file *m = &g_files[g_manifest];
        int line = 0;
        for (const char *at = m->bytes; at < m->bytes + m->len; line++) {
            const char *eol = memchr(at, '\n', (size_t)(m->bytes + m->len - at));
            KP_ASSERT(eol);
            if ((size_t)(eol - at) == 66 + strlen(g_files[i].path) && !memcmp(at + 66, g_files[i].path, strlen(g_files[i].path)))
                g_files[i].manifest_line = line;
            at = eol + 1;
        }
    }
    if (seeds_out) exit(0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const bundle_file *f = &g_files[(data[0] & 0x7F) % g_nfiles];
    const int removed = data[0] & 0x80, envelope = !strcmp(f->path, KP_SIGN_ENVELOPE);
    const unsigned char *bytes = data + 1;
    const size_t len = size - 1;
    const int same = !removed && len == f->len && !memcmp(bytes, f->bytes, len);
    char *manifest = NULL;
    if (removed) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", g_dir, f->path);
        KP_ASSERT(remove(path) == 0);
    } else {
        put(f->path, bytes, len);
    }
    if (!removed && f->manifest_line >= 0) {
        char hex[KP_SHA256_HEX_LEN];
        size_t mlen;
        kp_sha256_hex(bytes, len, hex);
        manifest = manifest_with(f->manifest_line, hex, &mlen);
        put("manifest.sha256", manifest, mlen);
    }
    kp_error err = {0};
    int rc = kp_bundle_verify(g_dir, &err);
    if (same || (removed && envelope)) KP_ASSERT(rc == 0);
    else if (removed) KP_ASSERT(rc == KP_EXIT_INCORRECT && err.msg[0]);
    else if (rc) KP_ASSERT(rc == KP_EXIT_INCORRECT && err.msg[0]);
    if (g_key) {
        kp_error e2 = {0};
        size_t subjects = 0;
        int sc = kp_sign_check(g_dir, g_key, &subjects, &e2);
        /* only the envelope itself can change (its JSON spelling) and still verify */
        if (same) KP_ASSERT(sc == 0);
        else if (removed && envelope) KP_ASSERT(sc == KP_EXIT_USAGE); /* not signed */
        else if (!envelope) KP_ASSERT(sc == KP_EXIT_INCORRECT && e2.msg[0]);
    }
    /* back to the seed's bytes for the next input */
    put(f->path, f->bytes, f->len);
    if (manifest) put("manifest.sha256", g_files[g_manifest].bytes, g_files[g_manifest].len);
    free(manifest);
    return 0;
}
