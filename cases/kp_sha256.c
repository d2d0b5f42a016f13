/* kp_sha256.c: SHA-256 over OpenSSL 3's EVP interface, but for the jobs and their checkpoints (kp_sha256_points),
 * which read and set SHA-256's chaining state: EVP keeps it out of reach, and the SHA256_CTX calls, deprecated in
 * OpenSSL 3 but kept, expose it (h[8], and the bit count in Nl, Nh); both run the same block code.
 * A digest failure inside OpenSSL is a broken environment, so it aborts with file and line. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include "kp_sha256.h"

#include <errno.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex_of(const unsigned char md[32], char hex[KP_SHA256_HEX_LEN]);

int kp_sha256_init(kp_sha256 *h, kp_error *err) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        return kp_fail(err, KP_EXIT_ENV, "OpenSSL could not start a SHA-256 digest");
    }
    h->md_ctx = ctx;
    return 0;
}

void kp_sha256_update(kp_sha256 *h, const void *data, size_t len) {
    KP_ASSERT(h->md_ctx);
    if (len && EVP_DigestUpdate(h->md_ctx, data, len) != 1) KP_ASSERT(!"EVP_DigestUpdate failed");
}

void kp_sha256_final_hex(kp_sha256 *h, char hex[KP_SHA256_HEX_LEN]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    KP_ASSERT(h->md_ctx);
    if (EVP_DigestFinal_ex(h->md_ctx, md, &n) != 1 || n != 32) KP_ASSERT(!"EVP_DigestFinal_ex failed");
    EVP_MD_CTX_free(h->md_ctx);
    h->md_ctx = NULL;
    hex_of(md, hex);
}

void kp_sha256_hex(const void *data, size_t len, char hex[KP_SHA256_HEX_LEN]) {
    kp_sha256 h = {0};
    kp_error err;
    if (kp_sha256_init(&h, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
    kp_sha256_update(&h, data, len);
    kp_sha256_final_hex(&h, hex);
}

int kp_sha256_file_hex(const char *path, char hex[KP_SHA256_HEX_LEN], kp_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kp_fail(err, KP_EXIT_USAGE, "%s: cannot read: %s", path, strerror(errno));
    kp_sha256 h = {0};
    if (kp_sha256_init(&h, err)) {
        fclose(f);
        return err->code;
    }
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) kp_sha256_update(&h, buf, n);
    int bad = ferror(f);
    fclose(f);
    kp_sha256_final_hex(&h, hex);
    if (bad) return kp_fail(err, KP_EXIT_USAGE, "%s: read error", path);
    return 0;
}

struct kp_sha256_job {
    pthread_t thread;
    int threaded;
    unsigned char *prefix;
    size_t prefix_len, nspans;
    kp_span *spans;
    char hex[KP_SHA256_HEX_LEN];
    kp_sha256_points points;
};

static void hex_of(const unsigned char md[32], char hex[KP_SHA256_HEX_LEN]) {
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = '\0';
}

void kp_sha256_points_free(kp_sha256_points *p) {
    free(p->h);
    memset(p, 0, sizeof *p);
}

static int64_t points_of(uint64_t len) { return len ? (int64_t)((len - 1) / KP_SHA256_POINT_BYTES) : 0; }

char *kp_sha256_points_hex(const kp_sha256_points *p) {
    char *hex = malloc((size_t)p->n * 64 + 1);
    if (!hex) KP_OUT_OF_MEMORY("for a digest's checkpoints");
    for (int64_t i = 0; i < 8 * p->n; i++) snprintf(hex + 8 * i, 9, "%08x", (unsigned)p->h[i]);
    hex[64 * p->n] = 0;
    return hex;
}

bool kp_sha256_points_parse(const char *hex, uint64_t len, kp_sha256_points *p) {
    memset(p, 0, sizeof *p);
    const int64_t n = points_of(len);
    if (!hex || strlen(hex) != (size_t)n * 64) return false;
    p->h = malloc(sizeof *p->h * (size_t)(8 * n + 1));
    if (!p->h) KP_OUT_OF_MEMORY("for a digest's checkpoints");
    for (int64_t i = 0; i < 8 * n; i++) {
        uint32_t w = 0;
        for (int d = 0; d < 8; d++) {
            const char c = hex[8 * i + d];
            const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (v < 0) return kp_sha256_points_free(p), false;
            w = w << 4 | (uint32_t)v;
        }
        p->h[i] = w;
    }
    p->len = len, p->n = n;
    return true;
}

/* The bytes [from, to) of prefix || spans, fed to c; start[i] is where span i begins in the stream. */
static void feed_range(SHA256_CTX *c, const unsigned char *prefix, size_t prefix_len, const kp_span *spans,
                       const uint64_t *start, size_t nspans, uint64_t from, uint64_t to) {
    if (from < prefix_len) {
        const uint64_t end = to < prefix_len ? to : prefix_len;
        SHA256_Update(c, prefix + from, (size_t)(end - from));
        from = end;
    }
    size_t lo = 0, hi = nspans; /* the last span starting at or before `from` */
    while (hi - lo > 1) {
        const size_t mid = lo + (hi - lo) / 2;
        if (start[mid] <= from) lo = mid;
        else hi = mid;
    }
    for (size_t i = lo; i < nspans && from < to; i++) {
        const uint64_t end = start[i] + spans[i].len < to ? start[i] + spans[i].len : to;
        if (end <= from) continue;
        SHA256_Update(c, (const unsigned char *)spans[i].data + (from - start[i]), (size_t)(end - from));
        from = end;
    }
    KP_ASSERT(from == to);
}

/* Where each span starts in the stream (after the prefix), and the stream's length. */
static uint64_t *span_starts(size_t prefix_len, const kp_span *spans, size_t nspans, uint64_t *len) {
    uint64_t *start = malloc(sizeof *start * (nspans + 1));
    if (!start) KP_OUT_OF_MEMORY("for a digest's spans");
    uint64_t at = prefix_len;
    for (size_t i = 0; i < nspans; i++) start[i] = at, at += spans[i].len;
    *len = at;
    return start;
}

static void state_start(SHA256_CTX *c, const uint32_t *h, uint64_t bytes) {
    SHA256_Init(c);
    if (!h) return;
    memcpy(c->h, h, sizeof c->h);
    const uint64_t bits = bytes * 8;
    c->Nl = (SHA_LONG)(bits & 0xffffffffu), c->Nh = (SHA_LONG)(bits >> 32);
}

/* The job's digest, and its points on the way. */
static void job_hash(kp_sha256_job *job) {
    uint64_t len;
    uint64_t *start = span_starts(job->prefix_len, job->spans, job->nspans, &len);
    kp_sha256_points *p = &job->points;
    p->len = len, p->n = points_of(len);
    p->h = malloc(sizeof *p->h * (size_t)(8 * p->n + 1));
    if (!p->h) KP_OUT_OF_MEMORY("for a digest's checkpoints");
    SHA256_CTX c;
    state_start(&c, NULL, 0);
    for (int64_t i = 0; i <= p->n; i++) {
        const uint64_t from = (uint64_t)i * KP_SHA256_POINT_BYTES, to = i < p->n ? from + KP_SHA256_POINT_BYTES : len;
        feed_range(&c, job->prefix, job->prefix_len, job->spans, start, job->nspans, from, to);
        if (i < p->n) {
            KP_ASSERT(c.num == 0);
            memcpy(p->h + 8 * i, c.h, sizeof c.h);
        }
    }
    unsigned char md[32];
    SHA256_Final(md, &c);
    hex_of(md, job->hex);
    free(start);
}

void kp_sha256_spans_hex(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans,
                         char hex[KP_SHA256_HEX_LEN]) {
    kp_sha256 h = {0};
    kp_error err;
    if (kp_sha256_init(&h, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
    kp_sha256_update(&h, prefix, prefix_len);
    for (size_t i = 0; i < nspans; i++) kp_sha256_update(&h, spans[i].data, spans[i].len);
    kp_sha256_final_hex(&h, hex);
}

static void *job_main(void *arg) {
    job_hash(arg);
    return NULL;
}

kp_sha256_job *kp_sha256_job_start(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans) {
    kp_sha256_job *job = calloc(1, sizeof *job);
    if (!job) KP_OUT_OF_MEMORY("for a digest job");
    job->prefix = malloc(prefix_len ? prefix_len : 1);
    job->spans = malloc(sizeof *spans * (nspans ? nspans : 1));
    if (!job->prefix || !job->spans) KP_OUT_OF_MEMORY("for a digest job");
    if (prefix_len) memcpy(job->prefix, prefix, prefix_len);
    if (nspans) memcpy(job->spans, spans, sizeof *spans * nspans);
    job->prefix_len = prefix_len;
    job->nspans = nspans;
    size_t bytes = prefix_len;
    for (size_t i = 0; i < nspans; i++) bytes += spans[i].len;
    /* a small digest costs less than a thread; where no thread can be made, the same digest, now */
    job->threaded = bytes >= KP_SHA256_JOB_THREAD_BYTES && pthread_create(&job->thread, NULL, job_main, job) == 0;
    if (!job->threaded) job_main(job);
    return job;
}

void kp_sha256_job_join_points(kp_sha256_job *job, char hex[KP_SHA256_HEX_LEN], kp_sha256_points *points) {
    if (job->threaded && pthread_join(job->thread, NULL) != 0) kp_abort(__FILE__, __LINE__, "joining a digest thread");
    memcpy(hex, job->hex, KP_SHA256_HEX_LEN);
    if (points) *points = job->points;
    else kp_sha256_points_free(&job->points);
    free(job->prefix);
    free(job->spans);
    free(job);
}

void kp_sha256_job_join(kp_sha256_job *job, char hex[KP_SHA256_HEX_LEN]) { kp_sha256_job_join_points(job, hex, NULL); }

/* kp_sha256_check's work: stretch s of claim c, for every claim and stretch, in one list. */
typedef struct check_work {
    kp_sha256_claim *claims;
    uint64_t **start;
    int64_t *first; /* claim c's stretches are items first[c] .. first[c + 1] - 1 */
    int n;
    atomic_bool *bad;
} check_work;

static void check_stretch(void *ctx, int64_t item) {
    const check_work *w = ctx;
    int c = 0;
    while (item >= w->first[c + 1]) c++;
    const kp_sha256_claim *cl = &w->claims[c];
    const kp_sha256_points *p = cl->points;
    const int64_t i = item - w->first[c];
    if (atomic_load(&w->bad[c])) return;
    const uint64_t from = (uint64_t)i * KP_SHA256_POINT_BYTES, to = i < p->n ? from + KP_SHA256_POINT_BYTES : p->len;
    SHA256_CTX s;
    state_start(&s, i ? p->h + 8 * (i - 1) : NULL, from);
    feed_range(&s, cl->prefix, cl->prefix_len, cl->spans, w->start[c], cl->nspans, from, to);
    bool ok;
    if (i < p->n) {
        ok = !memcmp(s.h, p->h + 8 * i, sizeof s.h);
    } else {
        unsigned char md[32];
        char hex[KP_SHA256_HEX_LEN];
        SHA256_Final(md, &s);
        hex_of(md, hex);
        ok = !strcmp(hex, cl->hex);
    }
    if (!ok) atomic_store(&w->bad[c], true);
}

void kp_sha256_check(kp_sha256_claim *claims, int n) {
    check_work w = {.claims = claims, .n = n};
    w.start = calloc((size_t)n + 1, sizeof *w.start);
    w.first = calloc((size_t)n + 1, sizeof *w.first);
    w.bad = calloc((size_t)n + 1, sizeof *w.bad);
    if (!w.start || !w.first || !w.bad) KP_OUT_OF_MEMORY("for checking digests");
    for (int c = 0; c < n; c++) {
        uint64_t len;
        w.start[c] = span_starts(claims[c].prefix_len, claims[c].spans, claims[c].nspans, &len);
        const kp_sha256_points *p = claims[c].points;
        const bool fits = p && p->len == len && p->n == points_of(len) && (p->n == 0 || p->h) && claims[c].hex;
        atomic_init(&w.bad[c], !fits);
        w.first[c + 1] = w.first[c] + (fits ? p->n + 1 : 0);
    }
    kp_parallel_for(w.first[n], check_stretch, &w);
    for (int c = 0; c < n; c++) {
        claims[c].ok = !atomic_load(&w.bad[c]);
        free(w.start[c]);
    }
    free(w.start), free(w.first), free(w.bad);
}
