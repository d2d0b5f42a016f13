/* kp_common.h: the error path, exit classes and always-on asserts shared by every stage.
 * Lowest layer of kparity: everything may include it, it includes nothing of ours. */
#ifndef KP_COMMON_H
#define KP_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* Exit classes, fixed (DESIGN.md "The gate"). */
enum {
    KP_EXIT_OK = 0,
    KP_EXIT_INCORRECT = 1, /* it ran and broke a declared check */
    KP_EXIT_USAGE = 2,     /* usage, config or input error */
    KP_EXIT_ENV = 3,       /* environment or kernel failure */
    KP_EXIT_TIMEOUT = 4,
    KP_EXIT_SKIP = 77      /* nothing could run */
};

/* Result vocabulary, everywhere (CLI, receipts, JUnit, report), ordered by severity: a case's result
 * is the worst of its checks'. The one definition of these names (DESIGN.md "Checks and results"). */
typedef enum kp_result {
    KP_PASSED = 0,
    KP_NOT_SUPPORTED, /* the impl refuses the shape */
    KP_NOT_RUN,       /* no device, filtered out, the gate's time ran out */
    KP_INCORRECT,     /* it ran and broke a declared check */
    KP_FAILED,        /* launch or runtime error, crash, timeout */
    KP_RESULT_COUNT
} kp_result;
const char *kp_result_name(kp_result r);
/* The result a name spells; -1 when it is none of the vocabulary. */
int kp_result_parse(const char *name);

/* One error path: functions return 0 or an exit class and fill a kp_error. */
typedef struct kp_error {
    int code;
    char msg[1024];
} kp_error;

/* Record an error and return its code, so `return kp_fail(err, KP_EXIT_USAGE, ...)` reads as one step. */
int kp_fail(kp_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prefix context ("cases[3]: ") to an error already recorded. */
void kp_error_prefix(kp_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Programmer errors: abort with file and line; stays on in release builds. */
#define KP_ASSERT(cond)                                                                  \
    do {                                                                                 \
        if (!(cond)) kp_abort(__FILE__, __LINE__, "assertion failed: %s", #cond);       \
    } while (0)
_Noreturn void kp_abort(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Out of host memory is an environment failure (KP_EXIT_ENV), never a crash, and takes one of two ways:
 *  - where the caller can return a kp_error (nearly everywhere): kp_alloc / kp_calloc, or after a plain
 *    malloc/realloc/asprintf `return kp_fail(err, KP_EXIT_ENV, "out of host memory <what>")`;
 *  - where it truly cannot, in a void helper whose callers have no error path (digest jobs and the rows they hash,
 *    the pending-digest list, an output row's copy): KP_OUT_OF_MEMORY("for <what>", ...), which prints
 *    "kparity: out of host memory <what>" with file, line and a hint, and ends the process with KP_EXIT_ENV (3).
 *    It is _exit, not exit: it may run on a digest thread, and a forked worker must not run its parent's atexit
 *    handlers; the supervisor sees exit 3, a run that failed for want of memory, where abort() read as a BUG. */
void *kp_alloc(size_t bytes, const char *what, kp_error *err);
void *kp_calloc(size_t count, size_t size, const char *what, kp_error *err);
#define KP_OUT_OF_MEMORY(...) kp_out_of_memory(__FILE__, __LINE__, __VA_ARGS__)
_Noreturn void kp_out_of_memory(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Checked size arithmetic: 0 on overflow. */
int kp_mul_size(size_t a, size_t b, size_t *out);

/* Worker count for CPU-parallel stages: KPARITY_THREADS if set, else the online core count. */
int kp_thread_count(void);
/* Run fn(ctx, i) for i in [0, n) over kp_thread_count() threads, items handed out in order. */
void kp_parallel_for(int64_t n, void (*fn)(void *ctx, int64_t i), void *ctx);

/* A table of named rows (the family tables): the built-in rows, then rows added at run time (a test's
 * own family). Every row type begins with its `const char *name`. */
#define KP_TABLE_ADDED_MAX 8
typedef struct kp_table {
    const void *const *builtin;
    int nbuiltin;
    const void *added[KP_TABLE_ADDED_MAX];
    int nadded;
} kp_table;
int kp_table_count(const kp_table *t);
const void *kp_table_at(const kp_table *t, int i); /* NULL out of range */
const void *kp_table_find(const kp_table *t, const char *name);
/* Every row's name, comma-separated ("known: ..." in errors). */
void kp_table_names(const kp_table *t, char *buf, size_t len);
/* KP_EXIT_USAGE naming `what` when a row of that name exists or the table is full. */
int kp_table_add(kp_table *t, const void *row, const char *what, kp_error *err);

/* qsort comparator for doubles, ascending. */
int kp_cmp_double(const void *a, const void *b);

/* Monotonic seconds. */
double kp_now(void);

#endif
