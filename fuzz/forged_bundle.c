/* forged_bundle.c: a bundle copy a fuzz input forges one file of (forged_bundle.h). */
#define _GNU_SOURCE
#include "forged_bundle.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_fileio.h"
#include "../receipts/kp_verify.h"

static void put(const forged *f, const char *rel, const void *bytes, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", f->dir, rel);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) kp_abort(__FILE__, __LINE__, "%s: cannot be written", path);
    KP_ASSERT(len == 0 || write(fd, bytes, len) == (ssize_t)len);
    close(fd);
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    return remove(path);
}

/* The copies to remove at exit (a target may hold more than one). */
static char g_made[4][256];
static int g_nmade;
static void remove_copies(void) {
    for (int i = 0; i < g_nmade; i++) nftw(g_made[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* manifest.sha256 with line `line` naming digest `hex` (the rest as in the seed), into a malloc'd buffer. */
static char *manifest_with(const forged *f, int line, const char *hex, size_t *len) {
    const forged_file *m = &f->files[f->manifest];
    char *out = malloc(m->len + 1);
    KP_ASSERT(out);
    memcpy(out, m->bytes, m->len);
    char *at = out;
    for (int i = 0; i < line; i++) at = strchr(at, '\n') + 1;
    memcpy(at, hex, 64);
    *len = m->len;
    return out;
}

void forged_load(forged *f, const char *seed, const char *seeds_out) {
    memset(f, 0, sizeof *f);
    kp_error err = {0};
    char **paths = NULL;
    if (kp_bundle_verify(seed, &err) || kp_bundle_list_files(seed, &paths, &f->nfiles, &err))
        kp_abort(__FILE__, __LINE__, "seed bundle %s: %s", seed, err.msg);
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(f->dir, sizeof f->dir, "%s/kparity-fuzz-bundle-XXXXXX", tmp);
    KP_ASSERT(mkdtemp(f->dir) && g_nmade < 4);
    if (g_nmade == 0) atexit(remove_copies);
    snprintf(g_made[g_nmade++], sizeof g_made[0], "%s", f->dir);
    f->files = calloc(f->nfiles, sizeof *f->files);
    f->manifest = (size_t)-1;
    KP_ASSERT(f->files);
    for (size_t i = 0; i < f->nfiles; i++) {
        char src[512];
        snprintf(src, sizeof src, "%s/%s", seed, paths[i]);
        f->files[i].path = strdup(paths[i]);
        if (kp_read_file(src, &f->files[i].bytes, &f->files[i].len, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
        if (!strcmp(paths[i], "manifest.sha256")) f->manifest = i;
        char sub[512], *slash = strrchr(strcpy(sub, paths[i]), '/');
        if (slash) {
            char dir[600];
            *slash = '\0';
            snprintf(dir, sizeof dir, "%s/%s", f->dir, sub);
            mkdir(dir, 0755);
        }
        put(f, paths[i], f->files[i].bytes, f->files[i].len);
        if (seeds_out) {
            char name[600];
            snprintf(name, sizeof name, "%s/file-%02zu", seeds_out, i);
            FILE *out = fopen(name, "wb");
            KP_ASSERT(out && fputc((int)i, out) != EOF && fwrite(f->files[i].bytes, 1, f->files[i].len, out) == f->files[i].len);
            fclose(out);
        }
    }
    kp_bundle_free_list(paths, f->nfiles);
    KP_ASSERT(f->manifest != (size_t)-1);
    const forged_file *m = &f->files[f->manifest];
    for (size_t i = 0; i < f->nfiles; i++) {
        f->files[i].manifest_line = -1;
        int line = 0;
        for (const char *at = m->bytes; at < m->bytes + m->len; line++) {
            const char *eol = memchr(at, '\n', (size_t)(m->bytes + m->len - at));
            KP_ASSERT(eol);
            if ((size_t)(eol - at) == 66 + strlen(f->files[i].path) && !memcmp(at + 66, f->files[i].path, strlen(f->files[i].path)))
                f->files[i].manifest_line = line;
            at = eol + 1;
        }
    }
}

void forged_apply(forged *f, const uint8_t *data, size_t size) {
    KP_ASSERT(size >= 1);
    f->changed = &f->files[(data[0] & 0x7F) % f->nfiles];
    f->removed = data[0] & 0x80;
    const unsigned char *bytes = data + 1;
    const size_t len = size - 1;
    f->same = !f->removed && len == f->changed->len && !memcmp(bytes, f->changed->bytes, len);
    if (f->removed) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", f->dir, f->changed->path);
        KP_ASSERT(remove(path) == 0);
        return;
    }
    put(f, f->changed->path, bytes, len);
    if (f->changed->manifest_line >= 0) {
        char hex[KP_SHA256_HEX_LEN];
        size_t mlen;
        kp_sha256_hex(bytes, len, hex);
        f->manifest_bytes = manifest_with(f, f->changed->manifest_line, hex, &mlen);
        put(f, "manifest.sha256", f->manifest_bytes, mlen);
    }
}

void forged_restore(forged *f) {
    put(f, f->changed->path, f->changed->bytes, f->changed->len);
    if (f->manifest_bytes) put(f, "manifest.sha256", f->files[f->manifest].bytes, f->files[f->manifest].len);
    free(f->manifest_bytes);
    f->manifest_bytes = NULL;
}
