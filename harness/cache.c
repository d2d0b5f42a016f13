/* cache.c: the cache folder and its entry files (kp_cache.h). What an entry means and how it is checked is
 * harness/prepared.c's; here an entry is bytes that are either read whole as written, or refused with the reason. */
#define _GNU_SOURCE
#include "kp_cache.h"

#include <errno.h>
#include <stdatomic.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "KPCACHE2"
#define MAGIC_LEN 8
#define TAIL_LEN (8 + 8 + 64) /* the metadata's offset and length, its SHA-256 hex */
#define META_MAX (16u << 20)

static char g_dir[3072];
static bool g_have;
static double g_run_start; /* the wall clock when the folder was configured: entries used since are this run's */
static void read_write_rate(void);
static _Atomic double g_write_rate; /* the folder's, 0 while not yet known (a released case's writer sets it) */

/* mkdir -p: every missing folder of path; 0, or errno. */
static int make_dirs(const char *path) {
    char buf[sizeof g_dir + 64];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return ENAMETOOLONG;
    for (char *p = buf + 1;; p++) {
        const char c = *p;
        if (c != '/' && c) continue;
        *p = 0;
        if (mkdir(buf, 0777) && errno != EEXIST) return errno;
        *p = c;
        if (!c) break;
    }
    struct stat st;
    if (stat(buf, &st)) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

/* Whether dir can hold entries: it (and its v1 folder) made, writable. */
static int usable(const char *dir, char *why, size_t len) {
    char v1[sizeof g_dir + 8];
    if (snprintf(v1, sizeof v1, "%s/v1", dir) >= (int)sizeof v1) return snprintf(why, len, "the path is too long"), -1;
    const int e = make_dirs(v1);
    if (e) return snprintf(why, len, "%s", strerror(e)), -1;
    if (access(v1, W_OK | X_OK)) return snprintf(why, len, "%s", strerror(errno)), -1;
    return 0;
}

int kp_cache_configure(const char *dir, bool off, kp_error *err) {
    g_have = false;
    if (off) return 0;
    const char *env = getenv("KPARITY_CACHE"), *named_by = dir ? "--cache" : NULL;
    char def[sizeof g_dir];
    if (!dir && env && *env) {
        if (!strcmp(env, "off")) return 0;
        dir = env, named_by = "KPARITY_CACHE";
    }
    if (!dir) {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg == '/') snprintf(def, sizeof def, "%s/kparity", xdg);
        else if (home && *home == '/') snprintf(def, sizeof def, "%s/.cache/kparity", home);
        else return 0; /* nowhere to put one: run without */
        dir = def;
    }
    char why[256];
    if (strlen(dir) >= sizeof g_dir - 128) snprintf(why, sizeof why, "the path is longer than %zu bytes", sizeof g_dir - 128);
    else if (!usable(dir, why, sizeof why)) {
        snprintf(g_dir, sizeof g_dir, "%s", dir);
        g_have = true;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g_run_start = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - 1; /* a second's slack for coarse file times */
        g_write_rate = 0; /* this folder's, once known */
        read_write_rate();
        return 0;
    }
    if (named_by) return kp_fail(err, KP_EXIT_USAGE, "%s: the cache folder '%s' cannot be used: %s", named_by, dir, why);
    fprintf(stderr, "kparity: note: running without a cache (the default folder %s cannot be used: %s)\n", dir, why);
    return 0;
}

const char *kp_cache_dir(void) { return g_have ? g_dir : NULL; }


/* The folder's write rate, as the last process that wrote a large entry measured it (<dir>/write_rate, a number):
 * so a run's first entries are judged by this disk's rate, not the default. */
static void read_write_rate(void) {
    char path[sizeof g_dir + 16], text[64];
    snprintf(path, sizeof path, "%s/write_rate", g_dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *end;
    const double r = strtod(text, &end);
    if (end != text && (*end == '\n' || !*end) && r >= 1e6 && r <= 1e12) g_write_rate = r;
}

static void record_write_rate(double rate) {
    g_write_rate = rate;
    char path[sizeof g_dir + 16], tmp[sizeof path + 32];
    snprintf(path, sizeof path, "%s/write_rate", g_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    const bool ok = fprintf(f, "%.6g\n", rate) > 0;
    if (!fclose(f) && ok && !rename(tmp, path)) return;
    unlink(tmp);
}

double kp_cache_write_rate(void) { return g_write_rate; }

double kp_cache_hash_rate(void) {
    static double rate;
    if (rate > 0) return rate;
    enum { N = 16 << 20 };
    unsigned char *buf = calloc(N, 1);
    if (!buf) KP_OUT_OF_MEMORY("measuring the hash rate");
    char hex[KP_SHA256_HEX_LEN];
    for (int i = 0; i < 2; i++) {
        const double t0 = kp_now();
        kp_sha256_hex(buf, N, hex);
        const double r = N / (kp_now() - t0 + 1e-9);
        rate = r > rate ? r : rate;
    }
    free(buf);
    return rate;
}

bool kp_cache_worth(double bytes, double seconds) {
    return seconds * kp_cache_hash_rate() * kp_thread_count() >= bytes &&
           (!g_write_rate || seconds * KP_CACHE_PAYBACK_HITS * g_write_rate >= bytes);
}

void kp_cache_key(const char *key_text, char key[KP_SHA256_HEX_LEN]) { kp_sha256_hex(key_text, strlen(key_text), key); }

static int entry_path(const char *kind, const char *key, char *path, size_t len, bool make) {
    char dir[sizeof g_dir + 128];
    snprintf(dir, sizeof dir, "%s/v1/%s/%.2s", g_dir, kind, key);
    if (make && make_dirs(dir)) return -1;
    return snprintf(path, len, "%s/%s", dir, key) >= (int)len ? -1 : 0;
}

/* Bytes of `slices` slices of t as they lie in memory. */
static uint64_t stored_bytes(const kp_tensor *t, int64_t slices) { return (uint64_t)kp_tensor_slice_bytes(t) * (uint64_t)slices; }
static uint64_t align64(uint64_t n) { return (n + 63) & ~(uint64_t)63; }

/* The SHA-256 of every row's padding past its last logical element, rows in order, into hex; false for a tensor without
 * padding. The receipts' digests leave padding out, yet it is part of a case's inputs (a generator may put a sentinel
 * there that no impl may read), so an entry records it and a hit must give it back unchanged. */
static bool padding_digest(const kp_tensor *t, int64_t slices, char hex[KP_SHA256_HEX_LEN]) {
    if (t->ndim < 2 || t->row_stride == 0 || t->row_stride == t->shape[t->ndim - 1]) return false;
    const size_t es = kp_dtype_size(t->dtype), stride = (size_t)t->row_stride * es, used = (size_t)t->shape[t->ndim - 1] * es;
    const int64_t rows = (int64_t)(stored_bytes(t, slices) / stride);
    kp_sha256 h;
    kp_error err = {0};
    if (kp_sha256_init(&h, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
    for (int64_t r = 0; r < rows; r++) kp_sha256_update(&h, (const unsigned char *)t->data + (size_t)r * stride + used, stride - used);
    kp_sha256_final_hex(&h, hex);
    return true;
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- the folder's size: least recently used entries go past the cap ------------------------------------------ */

typedef struct file_seen {
    char *path;
    double bytes, used; /* used: mtime, which a hit renews */
} file_seen;

static void scan(const char *dir, file_seen **files, int *n, int *cap) {
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char *p;
        struct stat st;
        if (asprintf(&p, "%s/%s", dir, e->d_name) < 0) KP_OUT_OF_MEMORY("the cache folder's listing");
        if (!lstat(p, &st) && S_ISDIR(st.st_mode)) {
            scan(p, files, n, cap);
            free(p);
            continue;
        }
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 256;
            if (!(*files = realloc(*files, sizeof **files * (size_t)*cap))) KP_OUT_OF_MEMORY("the cache folder's listing");
        }
        (*files)[(*n)++] = (file_seen){p, (double)st.st_size, (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec};
    }
    if (d) closedir(d);
}

static int older_first(const void *a, const void *b) {
    const double x = ((const file_seen *)a)->used, y = ((const file_seen *)b)->used;
    return (x > y) - (x < y);
}

double kp_cache_cap_bytes(void) {
    const char *v = getenv("KPARITY_CACHE_MAX_GB");
    char *end;
    const double gb = v && *v ? strtod(v, &end) : 0;
    /* whole bytes: 0.01610459 GB is 16104590 bytes, though 0.01610459 * 1e9 is 16104589.999999998 (an entry filling
       such a cap exactly was refused) */
    return v && *v && !*end && gb > 0 ? nearbyint(gb * 1e9) : 20e9;
}

static bool this_runs(const file_seen *f) { return f->used >= g_run_start; }

/* The folder's entries, and the bytes of those this run has used (read or written). */
static file_seen *listing(int *n, double *mine) {
    char v1[sizeof g_dir + 8];
    snprintf(v1, sizeof v1, "%s/v1", g_dir);
    file_seen *files = NULL;
    int cap = 0;
    *n = 0, *mine = 0;
    scan(v1, &files, n, &cap);
    for (int i = 0; i < *n; i++)
        if (this_runs(&files[i]) && !strstr(files[i].path, ".tmp.")) *mine += files[i].bytes;
    return files;
}

static void listing_free(file_seen *files, int n) {
    for (int i = 0; i < n; i++) free(files[i].path);
    free(files);
}

bool kp_cache_fits(double bytes) {
    int n;
    double mine;
    file_seen *files = listing(&n, &mine);
    listing_free(files, n);
    return mine + bytes <= kp_cache_cap_bytes();
}

/* Past the cap, remove the least recently used entries that this run has not used (so a run whose entries pass the cap
 * keeps the first it wrote, rather than evicting its own as it goes and finding none the next time), and any temporary
 * file an interrupted run left over an hour ago. */
static void prune(void) {
    int n;
    double mine;
    file_seen *files = listing(&n, &mine);
    double total = 0;
    const double now = (double)time(NULL), limit = kp_cache_cap_bytes();
    for (int i = 0; i < n; i++) {
        if (strstr(files[i].path, ".tmp.") && now - files[i].used > 3600 && !unlink(files[i].path)) files[i].bytes = 0;
        total += files[i].bytes;
    }
    qsort(files, (size_t)n, sizeof *files, older_first);
    for (int i = 0; i < n && total > limit; i++)
        if (!this_runs(&files[i]) && !strstr(files[i].path, ".tmp.") && !unlink(files[i].path)) total -= files[i].bytes;
    listing_free(files, n);
}

/* One piece of an entry file at its offset; the pieces of one entry, written by kp_parallel_for. */
typedef struct {
    const void *data;
    uint64_t offset, bytes;
} write_part;
typedef struct {
    int fd;
    write_part *parts;
    size_t n;
    atomic_int error; /* the first errno, 0 while every piece went whole */
} write_job;

static void write_one(void *ctx, int64_t i) {
    write_job *job = ctx;
    const write_part *w = &job->parts[i];
    for (uint64_t done = 0; done < w->bytes && !atomic_load(&job->error);) {
        const ssize_t k = pwrite(job->fd, (const unsigned char *)w->data + done, w->bytes - done, (off_t)(w->offset + done));
        if (k > 0) {
            done += (uint64_t)k;
            continue;
        }
        int expected = 0;
        atomic_compare_exchange_strong(&job->error, &expected, k < 0 && errno ? errno : EIO);
    }
}

int kp_cache_put(const char *kind, const char *key_text, cJSON *meta, const kp_cache_tensor *tensors, int n, kp_error *err) {
    static atomic_uint counter;
    char key[KP_SHA256_HEX_LEN], path[sizeof g_dir + 256], tmp[sizeof path + 64];
    if (!g_have) return kp_fail(err, KP_EXIT_ENV, "no cache folder");
    kp_cache_key(key_text, key);
    if (entry_path(kind, key, path, sizeof path, true))
        return kp_fail(err, KP_EXIT_ENV, "cache: cannot make the folder for %s/%s: %s", kind, key, strerror(errno));
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1));
    cJSON_AddStringToObject(meta, "key", key_text);
    cJSON *list = cJSON_AddArrayToObject(meta, "tensors");
    uint64_t at = MAGIC_LEN, offsets[2 * KP_MAX_TENSORS];
    KP_ASSERT(n <= 2 * KP_MAX_TENSORS);
    for (int i = 0; i < n; i++) {
        const kp_tensor *t = tensors[i].t;
        at = offsets[i] = align64(at);
        at += stored_bytes(t, tensors[i].slices);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddStringToObject(o, "dtype", kp_dtype_name(t->dtype));
        cJSON *s = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(s, kp_json_int(t->shape[d]));
        kp_json_add_int(o, "row_stride", t->row_stride);
        kp_json_add_int(o, "slices", tensors[i].slices);
        kp_json_add_int(o, "offset", (int64_t)offsets[i]);
        char pad[KP_SHA256_HEX_LEN];
        if (padding_digest(t, tensors[i].slices, pad)) cJSON_AddStringToObject(o, "padding_sha256", pad);
        cJSON_AddItemToArray(list, o);
    }
    char *text = cJSON_PrintUnformatted(meta);
    if (!text) KP_OUT_OF_MEMORY("a cache entry's metadata");
    const size_t mlen = strlen(text);
    if (!kp_cache_fits((double)(at + mlen + TAIL_LEN))) {
        free(text);
        return kp_fail(err, KP_EXIT_ENV, "cache: %s entry %.16s... not written: beside this run's entries it would pass "
                       "the cap (%.3g GB, $KPARITY_CACHE_MAX_GB)", kind, key, kp_cache_cap_bytes() / 1e9);
    }
    unsigned char tail[TAIL_LEN];
    put_u64(tail, at), put_u64(tail + 8, mlen);
    char hex[KP_SHA256_HEX_LEN];
    kp_sha256_hex(text, mlen, hex);
    memcpy(tail + 16, hex, 64);
    /* the pieces at their offsets (the gaps stay the zeros the file was extended with), tensors in 64 MB parts
     * written on every thread: a large entry is mostly copying into the page cache, which one thread does at a few GB/s */
    enum { PART = 64 << 20 };
    size_t nparts = 3;
    for (int i = 0; i < n; i++) nparts += (stored_bytes(tensors[i].t, tensors[i].slices) + PART - 1) / PART;
    write_job job = {.parts = malloc(nparts * sizeof *job.parts)};
    if (!job.parts) KP_OUT_OF_MEMORY("a cache entry's write plan");
    job.parts[job.n++] = (write_part){MAGIC, 0, MAGIC_LEN};
    for (int i = 0; i < n; i++) {
        const unsigned char *data = tensors[i].t->data;
        const uint64_t bytes = stored_bytes(tensors[i].t, tensors[i].slices);
        for (uint64_t o = 0; o < bytes; o += PART)
            job.parts[job.n++] = (write_part){data + o, offsets[i] + o, bytes - o < PART ? bytes - o : PART};
    }
    job.parts[job.n++] = (write_part){text, at, mlen};
    job.parts[job.n++] = (write_part){tail, at + mlen, TAIL_LEN};
    const double t0 = kp_now();
    job.fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    bool ok = job.fd >= 0 && !ftruncate(job.fd, (off_t)(at + mlen + TAIL_LEN));
    if (ok) {
        atomic_init(&job.error, 0);
        kp_parallel_for((int64_t)job.n, write_one, &job);
        ok = !atomic_load(&job.error);
        if (!ok) errno = atomic_load(&job.error);
    }
    const int saved = errno;
    if (job.fd >= 0 && close(job.fd)) ok = false;
    free(job.parts);
    free(text);
    if (ok && !rename(tmp, path)) {
        const double seconds = kp_now() - t0;
        if (seconds > 0 && at > (64u << 20)) record_write_rate((double)at / seconds); /* small ones say little */
        prune();
        return 0;
    }
    const int e = ok ? errno : saved;
    if (job.fd >= 0) unlink(tmp);
    return kp_fail(err, KP_EXIT_ENV, "cache: could not write %s: %s", path, strerror(e ? e : EIO));
}

static int dtype_of(const char *name) {
    for (int d = 0; d < KP_DTYPE_COUNT; d++)
        if (!strcmp(kp_dtype_name((kp_dtype)d), name)) return d;
    return -1;
}

/* A tensor as the metadata declares it (data not set); false when malformed. */
static bool declared(const cJSON *o, kp_tensor *t, int64_t *slices, uint64_t *offset) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name"), *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape"), *rs = cJSON_GetObjectItemCaseSensitive(o, "row_stride");
    const cJSON *sl = cJSON_GetObjectItemCaseSensitive(o, "slices"), *off = cJSON_GetObjectItemCaseSensitive(o, "offset");
    if (!cJSON_IsString(name) || strlen(name->valuestring) >= sizeof t->name || !cJSON_IsString(dt) ||
        dtype_of(dt->valuestring) < 0 || !cJSON_IsArray(shape) || !cJSON_IsNumber(rs) || !cJSON_IsNumber(sl) ||
        !cJSON_IsNumber(off))
        return false;
    const int nd = cJSON_GetArraySize(shape);
    if (nd < 1 || nd > KP_MAX_DIMS) return false;
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name->valuestring);
    t->dtype = (kp_dtype)dtype_of(dt->valuestring), t->ndim = nd;
    for (int d = 0; d < nd; d++) {
        const cJSON *x = cJSON_GetArrayItem(shape, d);
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0 && x->valuedouble < 0x1p40)) return false;
        t->shape[d] = (int64_t)x->valuedouble;
    }
    if (!(rs->valuedouble >= 0 && rs->valuedouble < 0x1p40) || !(sl->valuedouble >= 0 && sl->valuedouble < 0x1p40) ||
        !(off->valuedouble >= 0 && off->valuedouble < 0x1p50))
        return false;
    t->row_stride = (int64_t)rs->valuedouble, *slices = (int64_t)sl->valuedouble, *offset = (uint64_t)off->valuedouble;
    if (t->row_stride != 0 && (nd < 2 || t->row_stride < t->shape[nd - 1])) return false;
    double bytes = (double)*slices * (double)kp_dtype_size(t->dtype) * (double)(t->row_stride > 0 ? t->row_stride : 1);
    for (int d = 1; d < nd; d++) bytes *= (double)(d == nd - 1 && t->row_stride > 0 ? 1 : t->shape[d]);
    return bytes < 0x1p50; /* so the sizes below fit in 64 bits */
}

static bool all_zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

void kp_cache_close(kp_cache_entry *e) {
    if (e->map) munmap(e->map, e->len);
    cJSON_Delete(e->meta);
    memset(e, 0, sizeof *e);
}

/* The entry's layout and metadata checked; NULL, or what is wrong. */
static const char *check_entry(kp_cache_entry *e, const char *key_text) {
    const unsigned char *m = e->map;
    if (e->len < MAGIC_LEN + TAIL_LEN) return "truncated";
    if (memcmp(m, MAGIC, MAGIC_LEN)) return "not a kparity cache entry (its first bytes)";
    const unsigned char *tail = m + e->len - TAIL_LEN;
    /* compared without sums: an offset near 2^64 and a length past the body wrap onto the right one */
    const uint64_t moff = get_u64(tail), mlen = get_u64(tail + 8), body = e->len - TAIL_LEN;
    if (moff < MAGIC_LEN || moff > body || mlen == 0 || mlen > META_MAX || mlen != body - moff) return "truncated";
    char hex[KP_SHA256_HEX_LEN], *text = malloc(mlen + 1);
    if (!text) KP_OUT_OF_MEMORY("reading a cache entry");
    memcpy(text, m + moff, mlen);
    text[mlen] = 0;
    kp_sha256_hex(text, mlen, hex);
    if (memcmp(hex, tail + 16, 64)) return free(text), "its metadata does not match its digest (a changed byte)";
    e->meta = cJSON_Parse(text);
    free(text);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(e->meta, "key"), *list = cJSON_GetObjectItemCaseSensitive(e->meta, "tensors");
    if (!cJSON_IsString(k) || strcmp(k->valuestring, key_text)) return "it holds another key's entry";
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) > 2 * KP_MAX_TENSORS) return "malformed metadata";
    uint64_t pos = MAGIC_LEN;
    e->ntensors = cJSON_GetArraySize(list);
    for (int i = 0; i < e->ntensors; i++) {
        uint64_t off;
        kp_tensor *t = &e->tensors[i];
        if (!declared(cJSON_GetArrayItem(list, i), t, &e->slices[i], &off) || off != align64(pos)) return "malformed metadata";
        const uint64_t bytes = stored_bytes(t, e->slices[i]);
        if (off + bytes > moff) return "truncated";
        if (!all_zero(m + pos, off - pos)) return "a changed byte between its tensors";
        t->data = (unsigned char *)e->map + off;
        char pad[KP_SHA256_HEX_LEN];
        if (padding_digest(t, e->slices[i], pad)) {
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(list, i), "padding_sha256");
            if (!cJSON_IsString(want)) return "malformed metadata (no digest of a tensor's row padding)";
            if (strcmp(want->valuestring, pad)) return "a changed byte in a row's padding";
        }
        pos = off + bytes;
    }
    return pos == moff ? NULL : "longer than its tensors";
}

void kp_cache_touch(const char *kind, const char *key_text) {
    char key[KP_SHA256_HEX_LEN], path[sizeof g_dir + 256];
    if (!g_have) return;
    kp_cache_key(key_text, key);
    if (!entry_path(kind, key, path, sizeof path, false)) utimensat(AT_FDCWD, path, NULL, 0); /* absent: nothing to keep */
}

int kp_cache_open(const char *kind, const char *key_text, kp_cache_entry *e, char *why, size_t why_len) {
    char key[KP_SHA256_HEX_LEN], path[sizeof g_dir + 256];
    memset(e, 0, sizeof *e);
    snprintf(why, why_len, "absent");
    if (!g_have) return 0;
    kp_cache_key(key_text, key);
    if (entry_path(kind, key, path, sizeof path, false)) return 0;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        return snprintf(why, why_len, "unreadable: %s", strerror(errno)), -1;
    }
    struct stat st;
    const char *bad = fstat(fd, &st) ? "unreadable" : st.st_size < MAGIC_LEN + TAIL_LEN ? "truncated" : NULL;
    if (!bad) {
        e->len = (size_t)st.st_size;
        /* private and writable: the harness may hand these pages to code that writes, never to the file */
        e->map = mmap(NULL, e->len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        if (e->map == MAP_FAILED) e->map = NULL, bad = "cannot be mapped";
    }
    if (!bad) bad = check_entry(e, key_text);
    if (!bad) futimens(fd, NULL); /* used now: the last to go past the cap */
    close(fd);
    if (!bad) return why[0] = 0, 1;
    snprintf(why, why_len, "%s", bad);
    kp_cache_close(e);
    return -1;
}
