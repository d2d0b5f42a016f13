/* topk_radix.c: the host ports of topk.radix_exact (candidate) and topk.radix_buffer (incumbent), the
 * steps of kernels/topk_radix.h, one row per kp_parallel_for item. The incumbent's arrival order is a
 * seeded permutation of the window, a new one each call, as atomics give on a GPU. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kp_registry.h"
#include "../topk_radix.h"

static int topk_host_check(const char *name, const void *args, char *message, size_t message_len) {
    const char *why = kp_topk_args_problem(args);
    if (!why) return KP_RUN_OK;
    if (message && message_len) snprintf(message, message_len, "%s: %s", name, why);
    return KP_RUN_NOT_SUPPORTED;
}

static size_t topk_host_workspace_bytes(const void *args) {
    (void)args;
    return 0;
}

enum { ALGO_EXACT = 0, ALGO_BUFFER = 1 };

typedef struct topk_job {
    const kp_topk_args *a;
    int algo;
    uint64_t call; /* the incumbent's arrival order: a new permutation each call */
    atomic_int failed;
} topk_job;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The key T of the need-th largest of n keys (a 4-pass descent, most significant byte first); *ties
 * receives how many entries with key == T the answer takes. need in [1, n]. */
static uint32_t descend(const uint32_t *keys, const int32_t *at, int32_t n, uint32_t need, uint32_t *ties) {
    uint32_t prefix = 0, mask = 0, hist[256];
    for (int pass = 0; pass < 4; pass++) {
        memset(hist, 0, sizeof hist);
        for (int32_t i = 0; i < n; i++) {
            const uint32_t key = keys[at ? at[i] : i];
            if ((key & mask) == prefix) hist[kp_topk_digit(key, pass)]++;
        }
        uint32_t above;
        const uint32_t d = kp_topk_pick_digit(hist, need, &above);
        need -= above;
        prefix |= d << (24 - 8 * pass);
        mask |= 0xffu << (24 - 8 * pass);
    }
    *ties = need;
    return prefix;
}

static void topk_row(void *ctx, int64_t r) {
    topk_job *job = ctx;
    const kp_topk_args *a = job->a;
    const float *x = a->scores + r * a->row_stride;
    const int32_t start = a->starts[r], len = a->ends[r] - a->starts[r];
    const int32_t count = len < a->k ? len : a->k;
    int32_t *idx = a->indices + r * a->k, out = 0;
    float *val = a->values + r * a->k;
    uint32_t *keys = malloc(sizeof *keys * (size_t)(len ? len : 1));
    int32_t *order = job->algo == ALGO_BUFFER ? malloc(sizeof *order * (size_t)(len ? len : 1)) : NULL;
    int32_t *buffer = job->algo == ALGO_BUFFER ? malloc(sizeof *buffer * KP_TOPK_BUFFER_CAP) : NULL;
    if (!keys || (job->algo == ALGO_BUFFER && (!order || !buffer))) {
        atomic_store(&job->failed, 1);
        free(keys), free(order), free(buffer);
        return;
    }
    for (int32_t i = 0; i < len; i++) keys[i] = kp_topk_key(x[start + i]);
#define EMIT(i)                                                                           \
    do {                                                                                  \
        idx[out] = a->index_base == KP_TOPK_BASE_WINDOW ? (i) : start + (i);              \
        val[out++] = x[start + (i)];                                                      \
    } while (0)
    if (count > 0 && job->algo == ALGO_EXACT) {
        uint32_t ties;
        const uint32_t t = descend(keys, NULL, len, (uint32_t)count, &ties);
        for (int32_t i = 0; i < len; i++) /* index order: ties to the lowest index */
            if (keys[i] > t || (keys[i] == t && ties && ties--)) EMIT(i);
    } else if (count > 0) {
        uint64_t s = job->call * 0x9e3779b97f4a7c15ull ^ (uint64_t)r;
        for (int32_t i = 0; i < len; i++) order[i] = i;
        for (int32_t i = len - 1; i > 0; i--) { /* the arrival order */
            const int32_t j = (int32_t)(splitmix(&s) % (uint64_t)(i + 1)), tmp = order[i];
            order[i] = order[j], order[j] = tmp;
        }
        uint32_t ties;
        if (a->rows <= KP_TOPK_EXACT_MAX_ROWS) { /* exact descent, ties and output in arrival order */
            const uint32_t t = descend(keys, NULL, len, (uint32_t)count, &ties);
            for (int32_t q = 0; q < len; q++)
                if (keys[order[q]] > t || (keys[order[q]] == t && ties && ties--)) EMIT(order[q]);
        } else { /* the coarse fp16 bin, then a buffer that drops what does not fit */
            uint32_t hist[256] = {0}, above;
            for (int32_t i = 0; i < len; i++) hist[kp_topk_coarse_bin(x[start + i])]++;
            const uint32_t bin = kp_topk_pick_digit(hist, (uint32_t)count, &above);
            int32_t nbuf = 0;
            for (int32_t q = 0; q < len; q++) {
                const int32_t i = order[q];
                const uint32_t b = kp_topk_coarse_bin(x[start + i]);
                if (b > bin) EMIT(i);
                else if (b == bin && nbuf < KP_TOPK_BUFFER_CAP) buffer[nbuf++] = i; /* later arrivals: dropped */
            }
            const uint32_t need = (uint32_t)count - above;
            if (need > 0 && nbuf > 0) {
                const uint32_t t = descend(keys, buffer, nbuf, need < (uint32_t)nbuf ? need : (uint32_t)nbuf, &ties);
                for (int32_t q = 0; q < nbuf; q++)
                    if (keys[buffer[q]] > t || (keys[buffer[q]] == t && ties && ties--)) EMIT(buffer[q]);
            }
        }
    }
#undef EMIT
    for (; out < a->k; out++) idx[out] = a->fill, val[out] = -INFINITY;
    free(keys), free(order), free(buffer);
}

static int topk_host_run(int algo, const char *name, const void *args, char *message, size_t message_len) {
    int rc = topk_host_check(name, args, message, message_len);
    if (rc) return rc;
    static atomic_ullong calls;
    topk_job job = {.a = args, .algo = algo, .call = atomic_fetch_add(&calls, 1) + 1};
    atomic_init(&job.failed, 0);
    kp_parallel_for(job.a->rows, topk_row, &job);
    if (atomic_load(&job.failed)) {
        if (message && message_len) snprintf(message, message_len, "%s: out of host memory for a row", name);
        return KP_RUN_FAILED;
    }
    return KP_RUN_OK;
}

static int exact_supports(const void *args, char *message, size_t message_len) {
    return topk_host_check("topk.radix_exact@host", args, message, message_len);
}
static int exact_run(const void *args, char *message, size_t message_len) {
    return topk_host_run(ALGO_EXACT, "topk.radix_exact@host", args, message, message_len);
}
static int buffer_supports(const void *args, char *message, size_t message_len) {
    return topk_host_check("topk.radix_buffer@host", args, message, message_len);
}
static int buffer_run(const void *args, char *message, size_t message_len) {
    return topk_host_run(ALGO_BUFFER, "topk.radix_buffer@host", args, message, message_len);
}

const kp_impl kp_topk_radix_exact_host = {KP_ABI_VERSION, "topk", "topk.radix_exact@host", KP_MEMORY_HOST,
                                          topk_host_workspace_bytes, exact_supports, exact_run};
const kp_impl kp_topk_radix_buffer_host = {KP_ABI_VERSION, "topk", "topk.radix_buffer@host", KP_MEMORY_HOST,
                                           topk_host_workspace_bytes, buffer_supports, buffer_run};
