/* test_parallel.c: kp_parallel_for, the loop every parallel stage runs on (judging, digests, the cache's checks, the
 * host references): each index exactly once and done by the time it returns, at any thread count, with loops inside
 * a loop's body and loops started from two threads at once (its kept pool is used by one loop at a time; the others
 * start threads of their own). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "../cases/kp_common.h"

TestSuite(parallel, .timeout = 120);

typedef struct counts {
    atomic_int *n;
    int sleep_us;         /* a slow body: a loop that returned before its workers finished leaves an index uncounted */
    pthread_t who[64];    /* the threads that ran indices (a slow body's loop: at most 64 indices) */
    atomic_int nwho;
    pthread_mutex_t lock; /* over who */
} counts;

static void count_one(void *ctx, int64_t i) {
    counts *c = ctx;
    if (c->sleep_us) {
        usleep((useconds_t)c->sleep_us);
        pthread_mutex_lock(&c->lock);
        int seen = 0;
        for (int k = 0; k < c->nwho; k++) seen |= pthread_equal(c->who[k], pthread_self());
        if (!seen && c->nwho < 64) c->who[c->nwho++] = pthread_self();
        pthread_mutex_unlock(&c->lock);
    }
    atomic_fetch_add(&c->n[i], 1);
}

/* Returns how many threads ran the loop's indices when the body is slow (sleep_us), else 0. */
static int expect_each_once(int64_t n, int sleep_us, const char *threads) {
    counts c = {.n = calloc((size_t)n + 1, sizeof(atomic_int)), .sleep_us = sleep_us, .lock = PTHREAD_MUTEX_INITIALIZER};
    cr_assert(c.n && (!sleep_us || n <= 64));
    kp_parallel_for(n, count_one, &c);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(atomic_load(&c.n[i]), 1, "KPARITY_THREADS=%s, n %lld: index %lld ran %d times", threads, (long long)n,
                     (long long)i, atomic_load(&c.n[i]));
    free(c.n);
    return c.nwho;
}

Test(parallel, every_index_runs_once_and_before_the_loop_returns_at_any_thread_count) {
    /* 300: more than the 256 threads a loop starts itself (its thread array held 256: past it, a write out of bounds) */
    const char *threads[] = {"1", "2", "3", "17", "300", NULL};
    const int64_t sizes[] = {0, 1, 2, 5, 64, 1000, 65536};
    for (int t = 0; threads[t]; t++) {
        cr_assert_eq(setenv("KPARITY_THREADS", threads[t], 1), 0);
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) expect_each_once(sizes[k], 0, threads[t]);
        const int ran = expect_each_once(64, 300, threads[t]), asked = atoi(threads[t]);
        cr_assert_leq(ran, asked, "KPARITY_THREADS=%s: %d threads ran the loop", threads[t], ran);
        if (asked <= 3) /* 64 indices of 0.3 ms: every thread asked for takes some, whatever the machine's cores */
            cr_assert_eq(ran, asked, "KPARITY_THREADS=%s: %d threads ran the loop", threads[t], ran);
    }
    unsetenv("KPARITY_THREADS");
    for (int rep = 0; rep < 200; rep++) expect_each_once(rep % 7 + 1, rep % 3 ? 0 : 50, "(cores)");
}

/* An outer loop's body runs a loop of its own: the inner loops find the pool in use and start their own threads. */
#define INNER 300 /* past the 256 threads a loop starts itself, with KPARITY_THREADS=300 (its array held 256) */
typedef struct nested {
    atomic_int *n; /* [8][INNER] */
} nested;
typedef struct inner {
    atomic_int *row;
} inner;
static void inner_one(void *ctx, int64_t i) { atomic_fetch_add(&((inner *)ctx)->row[i], 1); }
static void outer_one(void *ctx, int64_t i) {
    inner in = {((nested *)ctx)->n + INNER * i};
    kp_parallel_for(INNER, inner_one, &in);
}

static void *many_loops(void *arg) {
    atomic_int *n = arg; /* [257], each index counted once a loop, 100 loops */
    counts c = {.n = n, .lock = PTHREAD_MUTEX_INITIALIZER};
    for (int rep = 0; rep < 100; rep++) kp_parallel_for(257, count_one, &c);
    return NULL;
}

static void expect_nested(int reps, const char *threads) {
    nested o = {calloc(8 * INNER, sizeof(atomic_int))};
    cr_assert(o.n);
    for (int rep = 0; rep < reps; rep++) kp_parallel_for(8, outer_one, &o);
    for (int i = 0; i < 8 * INNER; i++)
        cr_assert_eq(atomic_load(&o.n[i]), reps, "KPARITY_THREADS=%s, nested: index %d ran %d times, not %d", threads, i,
                     atomic_load(&o.n[i]), reps);
    free(o.n);
}

Test(parallel, loops_inside_a_loop_and_loops_from_two_threads_at_once_all_finish_whole) {
    cr_assert_eq(setenv("KPARITY_THREADS", "300", 1), 0);
    expect_nested(2, "300");
    unsetenv("KPARITY_THREADS");
    nested o = {calloc(8 * INNER, sizeof(atomic_int))};
    atomic_int *a = calloc(257, sizeof(atomic_int)), *b = calloc(257, sizeof(atomic_int));
    cr_assert(o.n && a && b);
    pthread_t ta, tb;
    cr_assert_eq(pthread_create(&ta, NULL, many_loops, a), 0);
    cr_assert_eq(pthread_create(&tb, NULL, many_loops, b), 0);
    for (int rep = 0; rep < 20; rep++) kp_parallel_for(8, outer_one, &o);
    cr_assert_eq(pthread_join(ta, NULL), 0);
    cr_assert_eq(pthread_join(tb, NULL), 0);
    for (int i = 0; i < 8 * INNER; i++) cr_assert_eq(atomic_load(&o.n[i]), 20, "nested: index %d ran %d times", i, atomic_load(&o.n[i]));
    for (int i = 0; i < 257; i++) {
        cr_assert_eq(atomic_load(&a[i]), 100, "thread a: index %d ran %d times", i, atomic_load(&a[i]));
        cr_assert_eq(atomic_load(&b[i]), 100, "thread b: index %d ran %d times", i, atomic_load(&b[i]));
    }
    free(o.n), free(a), free(b);
}
