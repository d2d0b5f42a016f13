/* kp_fileio.c: the file I/O under receipts and bundles: atomic whole-file writes, whole-file reads,
 * and the sorted recursive file list that the manifest and verify share. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "kp_fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

/* KPARITY_FAULT, read once: -1 not yet read, 0 unset, else the fault armed. */
static int fault_kind = -1;
static long fault_at, fault_ops;
static pid_t fault_also;
enum { FAULT_KILL = 1, FAULT_ENOSPC, FAULT_EACCES };

void kp_fault_also_kill(pid_t pid) { fault_also = pid; }

_Noreturn static void fault_kill(void) {
    if (fault_also > 0) kill(fault_also, SIGKILL);
    raise(SIGKILL);
    _exit(137); /* not reached: SIGKILL cannot be caught */
}

static void fault_read(void) {
    const char *v = getenv("KPARITY_FAULT");
    fault_kind = 0;
    if (!v || !*v) return;
    static const struct {
        const char *name;
        int kind;
    } kinds[] = {{"kill@", FAULT_KILL}, {"enospc@", FAULT_ENOSPC}, {"eacces@", FAULT_EACCES}};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        size_t n = strlen(kinds[i].name);
        char *end;
        if (strncmp(v, kinds[i].name, n) != 0) continue;
        long at = strtol(v + n, &end, 10);
        if (end == v + n || *end || at < 1) break;
        fault_kind = kinds[i].kind, fault_at = at;
        return;
    }
    /* A test that set a fault it did not get would pass for nothing: refuse loudly. */
    kp_abort(__FILE__, __LINE__, "KPARITY_FAULT='%s': expected kill@N, enospc@N or eacces@N with N >= 1", v);
}

int kp_fault_armed(void) {
    if (fault_kind < 0) fault_read();
    return fault_kind != 0;
}

/* The fault for the next operation: 0, FAULT_KILL or an errno. */
static int fault_next(int in_folder) {
    if (__builtin_expect(fault_kind == 0, 1)) return 0;
    if (fault_kind < 0) {
        fault_read();
        if (fault_kind == 0) return 0;
    }
    if (++fault_ops < fault_at) return 0;
    if (fault_kind == FAULT_KILL) return -1;
    /* From the Nth operation on: a full disk stays full, an unwritable folder stays so (and only
     * what adds or renames an entry in a folder needs it writable). */
    if (fault_kind == FAULT_ENOSPC) return ENOSPC;
    return in_folder ? EACCES : 0;
}

int kp_fault_point(int in_folder) {
    int f = fault_next(in_folder);
    if (f < 0) fault_kill();
    return f;
}

/* One step of the atomic writer: 0, or -1 with errno set as the failing call would set it. */
static int fault_step(int in_folder) {
    int f = kp_fault_point(in_folder);
    if (f) errno = f;
    return f ? -1 : 0;
}

/* A missing or unwritable folder is the caller's path (usage); a full disk, a failed write or sync is
 * the disk or the system (environment). kp_bundle makes every failure past kp_bundle_open environment:
 * it made and checked the folder itself, so a change under it is the machine's. */
static int create_failure_code(int e) {
    return e == ENOENT || e == ENOTDIR || e == EACCES || e == EPERM || e == EROFS || e == ENAMETOOLONG ? KP_EXIT_USAGE
                                                                                                      : KP_EXIT_ENV;
}

int kp_sync_folder(const char *folder, const char *what, kp_error *err) {
    int dfd = fault_step(0) ? -1 : open(folder, O_RDONLY | O_DIRECTORY);
    int rc = 0;
    if (dfd < 0 || fsync(dfd) != 0) rc = kp_fail(err, KP_EXIT_ENV, "%s: cannot sync folder %s: %s", what, folder, strerror(errno));
    if (dfd >= 0) close(dfd);
    return rc;
}

int kp_write_file_atomic(const char *path, const void *data, size_t len, kp_error *err) {
    return kp_write_file_atomic_in(path, data, len, true, err);
}

int kp_write_file_atomic_in(const char *path, const void *data, size_t len, bool sync_folder, kp_error *err) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    char *folder = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    char *tmp = NULL;
    if (!folder || asprintf(&tmp, "%s/.%s.tmp-XXXXXX", folder, base) < 0) {
        free(folder);
        return kp_fail(err, KP_EXIT_ENV, "%s: out of memory", path);
    }
    int rc = 0;
    int fd = fault_step(1) ? -1 : mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        rc = kp_fail(err, create_failure_code(e), "%s: cannot create a file in %s: %s", path, folder, strerror(e));
        goto out;
    }
    /* mkstemp makes 0600; bundles are meant to be read by others (CI uploads, reviewers). */
    fchmod(fd, 0644);
    const unsigned char *p = data;
    size_t left = len;
    int f = fault_next(0);
    if (f < 0) { /* die with the temporary file half written: the torn file a crash leaves */
        if (write(fd, p, left / 2) < 0) {}
        fault_kill();
    }
    while (left > 0) {
        ssize_t n = f ? (errno = f, -1) : write(fd, p, left);
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
    if (fault_step(0) || fsync(fd) != 0) {
        rc = kp_fail(err, KP_EXIT_ENV, "%s: sync failed: %s", path, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    int injected = fault_step(0);
    if (injected || close(fd) != 0) {
        rc = kp_fail(err, KP_EXIT_ENV, "%s: close failed: %s", path, strerror(errno));
        if (injected) close(fd); /* never close twice: after a failed close the descriptor is gone */
        unlink(tmp);
        goto out;
    }
    if (fault_step(1) || rename(tmp, path) != 0) {
        int e = errno;
        rc = kp_fail(err, create_failure_code(e), "%s: cannot rename the finished file into place: %s", path, strerror(e));
        unlink(tmp);
        goto out;
    }
    /* The rename lives in the folder: sync it too, or a crash may forget the new entry. */
    if (sync_folder) rc = kp_sync_folder(folder, path, err);
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

int kp_bundle_is_temp_name(const char *name) {
    const char *mark = strstr(name, ".tmp-");
    return name[0] == '.' && mark && mark > name + 1 && strlen(mark) == 11;
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
