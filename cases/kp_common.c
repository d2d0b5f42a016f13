/* kp_common.c: error recording, allocation with reported failures, a small parallel-for.
 * Every stage uses these; they must stay free of anything family-specific. */
#define _GNU_SOURCE
#include "kp_common.h"

#include <pthread.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const result_names[KP_RESULT_COUNT] = {"PASSED", "NOT_SUPPORTED", "NOT_RUN", "INCORRECT", "FAILED"};

const char *kp_result_name(kp_result r) { return r >= 0 && r < KP_RESULT_COUNT ? result_names[r] : "FAILED"; }

int kp_result_parse(const char *name) {
    for (int r = 0; name && r < KP_RESULT_COUNT; r++)
        if (strcmp(name, result_names[r]) == 0) return r;
    return -1;
}

static const char *row_name(const void *row) { return *(const char *const *)row; }

int kp_table_count(const kp_table *t) { return t->nbuiltin + t->nadded; }

const void *kp_table_at(const kp_table *t, int i) {
    if (i < 0 || i >= kp_table_count(t)) return NULL;
    return i < t->nbuiltin ? t->builtin[i] : t->added[i - t->nbuiltin];
}

const void *kp_table_find(const kp_table *t, const char *name) {
    for (int i = 0; name && i < kp_table_count(t); i++)
        if (!strcmp(row_name(kp_table_at(t, i)), name)) return kp_table_at(t, i);
    return NULL;
}

void kp_table_names(const kp_table *t, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < kp_table_count(t) && at < len; i++) {
        int n = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", row_name(kp_table_at(t, i)));
        if (n < 0) break;
        at += (size_t)n;
    }
}

int kp_table_add(kp_table *t, const void *row, const char *what, kp_error *err) {
    if (kp_table_find(t, row_name(row))) return kp_fail(err, KP_EXIT_USAGE, "%s '%s' is already known", what, row_name(row));
    if (t->nadded == KP_TABLE_ADDED_MAX)
        return kp_fail(err, KP_EXIT_USAGE, "%s '%s': at most %d can be added", what, row_name(row), KP_TABLE_ADDED_MAX);
    t->added[t->nadded++] = row;
    return 0;
}

int kp_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int kp_fail(kp_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void kp_error_prefix(kp_error *err, const char *fmt, ...) {
    if (!err) return;
    char head[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t hl = strlen(head);
    if (hl >= sizeof err->msg) hl = sizeof err->msg - 1;
    memcpy(err->msg, head, hl); /* the tail of a long message is cut, never the head */
    size_t ol = strnlen(old, sizeof err->msg - 1 - hl);
    memcpy(err->msg + hl, old, ol);
    err->msg[hl + ol] = '\0';
}

_Noreturn void kp_abort(const char *file, int line, const char *fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "kparity: BUG: %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

_Noreturn void kp_out_of_memory(const char *file, int line, const char *fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "kparity: out of host memory ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (%s:%d)\nhint: free host memory, or run fewer cases or threads at once (KPARITY_THREADS)\n", file, line);
    fflush(stderr);
    _exit(KP_EXIT_ENV);
}

void *kp_alloc(size_t bytes, const char *what, kp_error *err) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) kp_fail(err, KP_EXIT_ENV, "out of host memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *kp_calloc(size_t count, size_t size, const char *what, kp_error *err) {
    size_t bytes;
    if (!kp_mul_size(count, size, &bytes)) {
        kp_fail(err, KP_EXIT_ENV, "size overflow allocating %zu x %zu bytes for %s", count, size, what);
        return NULL;
    }
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) kp_fail(err, KP_EXIT_ENV, "out of host memory allocating %zu bytes for %s", bytes, what);
    return p;
}

int kp_mul_size(size_t a, size_t b, size_t *out) {
    if (a && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* This machine's online cores, asked once: glibc reads /sys for it on every call. */
static int online_cores(void) {
    static atomic_int online;
    int cores = atomic_load_explicit(&online, memory_order_relaxed);
    if (!cores) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        cores = n >= 1 ? (int)(n > 256 ? 256 : n) : 1;
        atomic_store_explicit(&online, cores, memory_order_relaxed);
    }
    return cores;
}

int kp_thread_count(void) {
    const char *env = getenv("KPARITY_THREADS");
    if (env && *env) {
        long n = strtol(env, NULL, 10);
        if (n >= 1 && n <= 1024) return (int)n;
    }
    return online_cores();
}

struct pf_state {
    atomic_llong next;
    int64_t n;
    void (*fn)(void *, int64_t);
    void *ctx;
};

static void *pf_worker(void *arg) {
    struct pf_state *s = arg;
    for (;;) {
        int64_t i = atomic_fetch_add(&s->next, 1);
        if (i >= s->n) return NULL;
        s->fn(s->ctx, i);
    }
}

/* A pool of a thread a core but one, made at the first loop and kept: starting and joining 15 threads a loop cost about
 * half a millisecond on a 16-core machine, and a gate runs thousands of small loops (judging's per-check work). One
 * loop uses it at a time; a loop that finds it in use (another thread's, or one inside a loop's body), that asks for
 * more threads than it has (KPARITY_THREADS above the cores) or that runs in a forked child starts threads of its own,
 * as every loop did before. */
static struct {
    pthread_mutex_t use; /* held by the loop the pool runs */
    pthread_mutex_t m;   /* guards the fields below */
    pthread_cond_t go, done;
    uint64_t gen; /* a new loop for the workers */
    int size, active, pending;
    struct pf_state *job;
    pid_t pid;
} pool = {.use = PTHREAD_MUTEX_INITIALIZER, .m = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void *pool_worker(void *arg) {
    const int me = (int)(intptr_t)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool.m);
    for (;;) {
        while (pool.gen == seen) pthread_cond_wait(&pool.go, &pool.m);
        seen = pool.gen;
        if (me >= pool.active) continue; /* the loop asked for fewer threads */
        struct pf_state *s = pool.job;
        pthread_mutex_unlock(&pool.m);
        pf_worker(s);
        pthread_mutex_lock(&pool.m);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

static void pool_start(void) {
    pool.pid = getpid();
    pthread_attr_t attr;
    if (pthread_attr_init(&attr)) return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    const int want = online_cores() - 1;
    for (int t = 0; t < want; t++) {
        pthread_t tid;
        if (pthread_create(&tid, &attr, pool_worker, (void *)(intptr_t)t)) break; /* fewer workers: only speed */
        pool.size++;
    }
    pthread_attr_destroy(&attr);
}

void kp_parallel_for(int64_t n, void (*fn)(void *ctx, int64_t i), void *ctx) {
    struct pf_state s = {.n = n, .fn = fn, .ctx = ctx};
    atomic_init(&s.next, 0);
    int threads = kp_thread_count();
    if (threads > n) threads = (int)(n > 0 ? n : 1);
    if (threads <= 1) {
        pf_worker(&s);
        return;
    }
    pthread_once(&pool_once, pool_start);
    if (pool.pid == getpid() && threads - 1 <= pool.size && pthread_mutex_trylock(&pool.use) == 0) {
        pthread_mutex_lock(&pool.m);
        pool.job = &s;
        pool.active = pool.pending = threads - 1;
        pool.gen++;
        pthread_cond_broadcast(&pool.go);
        pthread_mutex_unlock(&pool.m);
        pf_worker(&s); /* the caller works too */
        pthread_mutex_lock(&pool.m);
        while (pool.pending) pthread_cond_wait(&pool.done, &pool.m);
        pthread_mutex_unlock(&pool.m);
        pthread_mutex_unlock(&pool.use);
        return;
    }
    pthread_t tid[256];
    int started = 0;
    for (int t = 1; t < threads && started < 256; t++)
        if (pthread_create(&tid[started], NULL, pf_worker, &s) == 0) started++;
    pf_worker(&s); /* the caller works too, so a failed pthread_create only costs speed */
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
}

double kp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
