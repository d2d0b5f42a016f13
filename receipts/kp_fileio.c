/* kp_fileio.c: the file I/O under receipts and bundles: atomic whole-file writes, whole-file reads,
 * and the sorted recursive file list that the manifest and verify share. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kp_bundle.h"
#include "kp_npy.h"

/* Creating the file is where a wrong path shows (usage); a failed write or sync after that is the
 * disk or the system (environment). */
int kp_write_file_atomic(const char *path, const void *data, size_t len, kp_error *err) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    char *folder = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    char *tmp = NULL;
    if (!folder || asprintf(&tmp, "%s/.%s.tmp-XXXXXX", folder, base) < 0) {
        free(folder);
        return kp_fail(err, KP_EXIT_ENV, "%s: out of memory", path);
    }
    int rc = 0;
    int fd = mkstemp(tmp);
    if (fd < 0) {
        rc = kp_fail(err, KP_EXIT_USAGE, "%s: cannot create a file in %s: %s", path, folder, strerror(errno));
        goto out;
    }
    /* mkstemp makes 0600; bundles are meant to be read by others (CI uploads, reviewers). */
    fchmod(fd, 0644);
    const unsigned char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            rc = kp_fail(err, KP_EXIT_ENV, "%s: write failed: %s", path, n < 0 ? strerror(errno) : "no progress");
            close(fd);
            unlink(tmp);
            goto out;
        }
        p += n;
        left -= (size_t)n;
    }
    /* fsync before rename: otherwise a crash can leave the new name pointing at an empty file. */
    if (fsync(fd) != 0) {
        rc = kp_fail(err, KP_EXIT_ENV, "%s: sync failed: %s", path, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    if (close(fd) != 0) {
        rc = kp_fail(err, KP_EXIT_ENV, "%s: close failed: %s", path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        rc = kp_fail(err, KP_EXIT_USAGE, "%s: cannot rename the finished file into place: %s", path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    /* The rename lives in the folder: sync it too, or a crash may forget the new entry. */
    int dfd = open(folder, O_RDONLY | O_DIRECTORY);
    if (dfd < 0 || fsync(dfd) != 0) rc = kp_fail(err, KP_EXIT_ENV, "%s: cannot sync folder %s: %s", path, folder, strerror(errno));
    if (dfd >= 0) close(dfd);
out:
    free(tmp);
    free(folder);
    return rc;
}

int kp_read_file(const char *path, char **buf, size_t *len, kp_error *err) {
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kp_fail(err, KP_EXIT_USAGE, "%s: cannot read: %s", path, strerror(errno));
    size_t cap = 1 << 14, n = 0;
    char *data = malloc(cap + 1);
    while (data) {
        n += fread(data + n, 1, cap - n, f);
        if (n < cap) break;
        char *bigger = cap <= SIZE_MAX / 2 - 1 ? realloc(data, 2 * cap + 1) : NULL;
        if (!bigger) {
            free(data);
            data = NULL;
            break;
        }
        data = bigger;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!data) return kp_fail(err, KP_EXIT_ENV, "%s: out of memory reading it", path);
    if (bad) {
        free(data);
        return kp_fail(err, KP_EXIT_USAGE, "%s: read error", path);
    }
    data[n] = '\0';
    *buf = data;
    *len = n;
    return 0;
}

typedef struct {
    char **paths;
    size_t count, cap;
} path_list;

static int push_path(path_list *l, char *path, kp_error *err) {
    if (l->count == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 32;
        char **p = realloc(l->paths, cap * sizeof *p);
        if (!p) {
            free(path);
            return kp_fail(err, KP_EXIT_ENV, "out of memory listing files");
        }
        l->paths = p;
        l->cap = cap;
    }
    l->paths[l->count++] = path;
    return 0;
}

/* A manifest line is "<hex>  <path>\n" with no escaping (sha256sum escapes names holding a
 * backslash or newline, and then the line no longer reads as written). */
static int name_fits_manifest(const char *name) {
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p == 0x7F || *p == '\\') return 0;
    return 1;
}

static int walk(const char *root, const char *rel, path_list *l, kp_error *err) {
    char *abs_path = NULL;
    if (asprintf(&abs_path, "%s%s%s", root, *rel ? "/" : "", rel) < 0) return kp_fail(err, KP_EXIT_ENV, "out of memory");
    DIR *d = opendir(abs_path);
    if (!d) {
        kp_fail(err, KP_EXIT_USAGE, "%s: cannot list folder: %s", abs_path, strerror(errno));
        free(abs_path);
        return err->code;
    }
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char *child = NULL, *child_abs = NULL;
        if (asprintf(&child, "%s%s%s", rel, *rel ? "/" : "", e->d_name) < 0 ||
            asprintf(&child_abs, "%s/%s", abs_path, e->d_name) < 0) {
            free(child);
            rc = kp_fail(err, KP_EXIT_ENV, "out of memory listing files");
            break;
        }
        struct stat st;
        if (lstat(child_abs, &st) != 0) rc = kp_fail(err, KP_EXIT_USAGE, "%s: cannot stat: %s", child, strerror(errno));
        else if (!name_fits_manifest(e->d_name))
            rc = kp_fail(err, KP_EXIT_USAGE, "%s: name has a control character or backslash, which a manifest line cannot hold", child);
        else if (S_ISDIR(st.st_mode)) rc = walk(root, child, l, err);
        else if (!S_ISREG(st.st_mode)) rc = kp_fail(err, KP_EXIT_USAGE, "%s: not a regular file or folder", child);
        else {
            rc = push_path(l, child, err);
            child = NULL;
        }
        free(child);
        free(child_abs);
    }
    closedir(d);
    free(abs_path);
    return rc;
}

static int cmp_path(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int kp_bundle_list_files(const char *dir, char ***paths, size_t *count, kp_error *err) {
    path_list l = {0};
    *paths = NULL;
    *count = 0;
    if (walk(dir, "", &l, err)) {
        kp_bundle_free_list(l.paths, l.count);
        return err->code;
    }
    /* strcmp is unsigned byte order, the same order as LC_ALL=C sort. */
    if (l.count) qsort(l.paths, l.count, sizeof *l.paths, cmp_path);
    *paths = l.paths;
    *count = l.count;
    return 0;
}

void kp_bundle_free_list(char **paths, size_t count) {
    for (size_t i = 0; i < count; i++) free(paths[i]);
    free(paths);
}
