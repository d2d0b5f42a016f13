/* device.c: guarded buffers on the host or a CUDA device, device discovery, and the environment
 * record. The CUDA runtime's C API is used directly; a CPU-only build compiles the host half. */
#define _GNU_SOURCE
#include "kp_device.h"
#include "kp_harness.h"

#include <gnu/libc-version.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "../cases/kp_rng.h"
#include "../cases/kp_sha256.h"
#include "../receipts/kp_json.h"

#ifdef KP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "../cases/cuda/kp_staged_copy.h"
#include "cuda/kp_rows_differ.h"
/* Every CUDA failure goes through here: it names the call, and a sticky error (one a device-wide
 * sync still reports) marks the device lost for the rest of the process (the runner then carries on in a fresh
 * worker process, with a fresh context, where it has one). */
static int g_device_lost;
static int cuda_failed(kp_error *err, cudaError_t e, const char *what, const char *call, const char *file, int line) {
    if (cudaDeviceSynchronize() != cudaSuccess) g_device_lost = 1;
    else cudaGetLastError();
    return kp_fail(err, KP_EXIT_ENV, "%s: %s failed: %s (%s) (%s:%d)%s", what, call, cudaGetErrorString(e),
                   cudaGetErrorName(e), file, line,
                   g_device_lost ? "; the error is sticky: the device is unusable for the rest of this process" : "");
}
#define CUDA_TRY(call, what)                                                                 \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) return cuda_failed(err, e_, what, #call, __FILE__, __LINE__); \
    } while (0)
static cudaStream_t g_stream;
static int g_sm_count;
#endif

static int g_device_count = -1;
#ifndef KP_HAVE_CUDA
static int g_device_lost;
#endif

int kp_device_lost(void) { return g_device_lost; }

void kp_device_simulate_loss(void) { g_device_lost = 1; }

int kp_device_count(void) {
    if (g_device_count >= 0) return g_device_count;
    g_device_count = 0;
#ifdef KP_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess) g_device_count = n;
    else cudaGetLastError(); /* no driver: clear the error, the count stays 0 */
#endif
    return g_device_count;
}

#ifdef KP_HAVE_CUDA
static pthread_t g_warm;
static bool g_warming; /* g_warm runs or has not been joined; only the run's thread starts and joins it */

static int device_ordinal(void) {
    const char *env = getenv("KPARITY_DEVICE");
    return env ? atoi(env) : 0;
}

static void *warm_main(void *arg) {
    (void)arg;
    /* its errors stay on this thread: kp_device_init's own calls meet and report them */
    if (cudaSetDevice(device_ordinal()) == cudaSuccess) (void)cudaFree(0);
    (void)cudaGetLastError();
    return NULL;
}
#endif

void kp_device_warm_start(void) {
#ifdef KP_HAVE_CUDA
    if (g_stream || g_warming || kp_device_count() <= 0) return;
    g_warming = pthread_create(&g_warm, NULL, warm_main, NULL) == 0;
#endif
}

int kp_device_init(kp_error *err) {
#ifdef KP_HAVE_CUDA
    if (g_stream) return 0;
    if (g_warming) pthread_join(g_warm, NULL), g_warming = false;
    if (kp_device_count() <= 0) return kp_fail(err, KP_EXIT_ENV, "no CUDA device is available");
    const int dev = device_ordinal();
    CUDA_TRY(cudaSetDevice(dev), "device init");
    CUDA_TRY(cudaDeviceGetAttribute(&g_sm_count, cudaDevAttrMultiProcessorCount, dev), "device init");
    CUDA_TRY(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "device init");
    return 0;
#else
    return kp_fail(err, KP_EXIT_ENV, "this kparity build has no CUDA support (built with KP_CUDA=OFF or without nvcc)");
#endif
}

void *kp_device_stream(void) {
#ifdef KP_HAVE_CUDA
    return g_stream;
#else
    return NULL;
#endif
}

int kp_device_sm_count(void) {
#ifdef KP_HAVE_CUDA
    /* asked before kp_device_init too (a config's device estimate asks the impls' workspace_bytes at load) */
    if (!g_sm_count && kp_device_count() > 0) {
        const char *env = getenv("KPARITY_DEVICE");
        if (cudaDeviceGetAttribute(&g_sm_count, cudaDevAttrMultiProcessorCount, env ? atoi(env) : 0) != cudaSuccess) {
            g_sm_count = 0;
            cudaGetLastError();
        }
    }
    return g_sm_count;
#else
    return 0;
#endif
}

uint64_t kp_device_memory_bytes(void) {
#ifdef KP_HAVE_CUDA
    if (kp_device_count() <= 0) return 0;
    const char *env = getenv("KPARITY_DEVICE");
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, env ? atoi(env) : 0) != cudaSuccess) return 0;
    return (uint64_t)prop.totalGlobalMem;
#else
    return 0;
#endif
}

int kp_buf_alloc(kp_buf *b, kp_memory memory, size_t bytes, const char *name, kp_error *err) {
    memset(b, 0, sizeof *b);
    b->memory = memory;
    b->bytes = bytes;
    size_t total = bytes + 2 * KP_GUARD_BYTES;
    if (memory == KP_MEMORY_HOST) {
        b->base = kp_alloc(total, name, err);
        if (!b->base) return err->code;
        memset(b->base, KP_GUARD_BYTE, total);
        return 0;
    }
#ifdef KP_HAVE_CUDA
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, total);
    if (e != cudaSuccess) {
        char what[160];
        snprintf(what, sizeof what, "%s (%zu bytes)", name, total);
        return cuda_failed(err, e, what, "cudaMalloc", __FILE__, __LINE__);
    }
    b->base = p;
    /* everything on the impl's stream, so fills and copies are ordered before its kernels (the
     * stream is non-blocking: legacy-stream work would race with it) */
    CUDA_TRY(cudaMemsetAsync(b->base, KP_GUARD_BYTE, total, g_stream), name);
    CUDA_TRY(cudaStreamSynchronize(g_stream), name);
    return 0;
#else
    return kp_fail(err, KP_EXIT_ENV, "%s: device memory requested in a build without CUDA", name);
#endif
}

void *kp_buf_ptr(const kp_buf *b) { return b->base + KP_GUARD_BYTES; }

/* bytes at `at` (inside b's allocation, guards included) copied to host memory dst; a device copy is
 * waited for when `wait` (copies that share one wait pass 0 but for the last) */
static int buf_read(const kp_buf *b, const unsigned char *at, void *dst, size_t bytes, int wait, const char *name,
                    kp_error *err) {
    if (b->memory == KP_MEMORY_HOST) {
        memcpy(dst, at, bytes);
        return 0;
    }
#ifdef KP_HAVE_CUDA
    CUDA_TRY(cudaMemcpyAsync(dst, at, bytes, cudaMemcpyDeviceToHost, g_stream), name);
    if (wait) CUDA_TRY(cudaStreamSynchronize(g_stream), name);
    return 0;
#else
    (void)wait;
    return kp_fail(err, KP_EXIT_ENV, "%s: device read in a build without CUDA", name);
#endif
}

/* bytes at `at` (inside b's allocation) set to KP_GUARD_BYTE */
static int buf_fill(kp_buf *b, unsigned char *at, size_t bytes, const char *name, kp_error *err) {
    if (b->memory == KP_MEMORY_HOST) {
        memset(at, KP_GUARD_BYTE, bytes);
        return 0;
    }
#ifdef KP_HAVE_CUDA
    CUDA_TRY(cudaMemsetAsync(at, KP_GUARD_BYTE, bytes, g_stream), name); /* ordered before the impl on its stream */
    return 0;
#else
    return kp_fail(err, KP_EXIT_ENV, "%s: device fill in a build without CUDA", name);
#endif
}

int kp_buf_upload(kp_buf *b, const void *src, size_t bytes, const char *name, kp_error *err) {
    KP_ASSERT(bytes <= b->bytes);
    if (!src) return buf_fill(b, kp_buf_ptr(b), bytes, name, err);
    if (b->memory == KP_MEMORY_HOST) {
        memcpy(kp_buf_ptr(b), src, bytes);
        return 0;
    }
#ifdef KP_HAVE_CUDA
    /* staged through page-locked buffers when src is pageable (inputs, a cache entry's map); waited for: the source
       may be freed as soon as we return */
    CUDA_TRY((cudaError_t)kp_staged_copy(kp_buf_ptr(b), src, bytes, 1, g_stream), name);
    return 0;
#else
    (void)name;
    return kp_fail(err, KP_EXIT_ENV, "device upload in a build without CUDA");
#endif
}

int kp_buf_download_range(const kp_buf *b, size_t offset, void *dst, size_t bytes, const char *name, kp_error *err) {
    KP_ASSERT(offset <= b->bytes && bytes <= b->bytes - offset);
    const unsigned char *at = (const unsigned char *)kp_buf_ptr(b) + offset;
#ifdef KP_HAVE_CUDA
    /* as uploads: into pageable memory (an output block the driver would not pin) through the staging buffers the
       run's threads drain, so page faults are taken on every thread; into page-locked memory, straight */
    if (b->memory != KP_MEMORY_HOST) {
        CUDA_TRY((cudaError_t)kp_staged_copy(dst, at, bytes, 0, g_stream), name);
        return 0;
    }
#endif
    return buf_read(b, at, dst, bytes, 1, name, err);
}

int kp_buf_download(const kp_buf *b, void *dst, size_t bytes, const char *name, kp_error *err) {
    return kp_buf_download_range(b, 0, dst, bytes, name, err);
}

#ifdef KP_HAVE_CUDA
/* Device scratch and the page-locked memory its results come back in, kept for the thread: a run compares and checks
 * about as much as the last. */
typedef struct readback {
    unsigned char *dev, *host;
    size_t bytes;
} readback;

static int readback_reserve(readback *r, size_t bytes, const char *what, kp_error *err) {
    if (bytes <= r->bytes) return 0;
    cudaFree(r->dev), cudaFreeHost(r->host);
    *r = (readback){0};
    CUDA_TRY(cudaMalloc((void **)&r->dev, bytes), what);
    CUDA_TRY(cudaMallocHost((void **)&r->host, bytes), what);
    r->bytes = bytes;
    return 0;
}

static _Thread_local readback g_rows_at, g_rows_bits, g_guards;
static _Thread_local int64_t g_rows_chunks; /* of the comparison queued last */
#endif

int kp_bufs_rows_differ_queue(const kp_rows_pair *pairs, int n, const int64_t *at, int64_t nrows, int64_t against_rows,
                              kp_error *err) {
    KP_ASSERT(n >= 1 && n <= KP_MAX_TENSORS && nrows >= 1);
    for (int k = 0; k < n; k++)
        KP_ASSERT(pairs[k].rows->memory == KP_MEMORY_CUDA && pairs[k].against->memory == KP_MEMORY_CUDA &&
                  pairs[k].slice * (size_t)nrows <= pairs[k].rows->bytes &&
                  pairs[k].slice * (size_t)against_rows <= pairs[k].against->bytes);
#ifdef KP_HAVE_CUDA
    _Static_assert(KP_ROWS_DIFFER_PAIRS == KP_MAX_TENSORS, "a pair a tensor");
    kp_rows_differ_args a = {.npairs = n, .nrows = nrows, .against_rows = against_rows};
    for (int k = 0; k < n; k++)
        a.pair[k] = (kp_rows_differ_pair){kp_buf_ptr(pairs[k].rows), kp_buf_ptr(pairs[k].against), pairs[k].slice};
    a.chunks = kp_rows_differ_chunks(&a);
    if (readback_reserve(&g_rows_at, sizeof *at * (size_t)nrows, "comparing rows", err) ||
        readback_reserve(&g_rows_bits, (size_t)(nrows * a.chunks), "comparing rows", err))
        return err->code;
    int64_t *idx = (int64_t *)g_rows_at.host; /* page-locked: the copy in is queued, not staged */
    for (int64_t i = 0; i < nrows; i++) idx[i] = at ? at[i] : i;
    a.at = (const int64_t *)g_rows_at.dev, a.bits = g_rows_bits.dev;
    g_rows_chunks = a.chunks;
    CUDA_TRY(cudaMemcpyAsync(g_rows_at.dev, idx, sizeof *idx * (size_t)nrows, cudaMemcpyHostToDevice, g_stream),
             "comparing rows");
    CUDA_TRY((cudaError_t)kp_rows_differ_launch(&a, g_stream), "comparing rows");
    CUDA_TRY(cudaMemcpyAsync(g_rows_bits.host, g_rows_bits.dev, (size_t)(nrows * a.chunks), cudaMemcpyDeviceToHost,
                             g_stream), "comparing rows");
    return 0;
#else
    (void)at;
    return kp_fail(err, KP_EXIT_ENV, "device row comparison in a build without CUDA");
#endif
}

void kp_bufs_rows_differ_result(int64_t nrows, uint8_t *bits) {
#ifdef KP_HAVE_CUDA
    const uint8_t *chunk = g_rows_bits.host;
    for (int64_t i = 0; i < nrows; i++) {
        uint8_t b = 0;
        for (int64_t c = 0; c < g_rows_chunks; c++) b |= *chunk++;
        bits[i] = b;
    }
#else
    (void)nrows, (void)bits;
    KP_ASSERT(!"no device comparison in a build without CUDA");
#endif
}

static int guard_clean(const unsigned char *g, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (g[i] != KP_GUARD_BYTE) return 0;
    return 1;
}

void kp_buf_free(kp_buf *b) {
    if (!b->base) return;
    if (b->memory == KP_MEMORY_HOST) free(b->base);
#ifdef KP_HAVE_CUDA
    else cudaFree(b->base);
#endif
    b->base = NULL;
}

int kp_buf_gather_rows(kp_buf *dst, const kp_buf *src, const int64_t *rows, int64_t nrows, size_t row_bytes,
                       const char *name, kp_error *err) {
    KP_ASSERT(dst->memory == src->memory && (size_t)nrows * row_bytes <= dst->bytes);
    for (int64_t i = 0; i < nrows;) {
        int64_t run = 1;
        while (i + run < nrows && rows[i + run] == rows[i] + run) run++;
        KP_ASSERT((size_t)(rows[i] + run) * row_bytes <= src->bytes);
        unsigned char *to = (unsigned char *)kp_buf_ptr(dst) + (size_t)i * row_bytes;
        const unsigned char *from = (const unsigned char *)kp_buf_ptr(src) + (size_t)rows[i] * row_bytes;
        if (dst->memory == KP_MEMORY_HOST) {
            memcpy(to, from, (size_t)run * row_bytes);
        } else {
#ifdef KP_HAVE_CUDA
            CUDA_TRY(cudaMemcpyAsync(to, from, (size_t)run * row_bytes, cudaMemcpyDeviceToDevice, g_stream), name);
#else
            (void)name;
            return kp_fail(err, KP_EXIT_ENV, "device copy in a build without CUDA");
#endif
        }
        i += run;
    }
    (void)err; /* device copies are ordered before the impl on its stream */
    return 0;
}

int kp_buf_fill_guard(kp_buf *b, size_t offset, size_t bytes, const char *name, kp_error *err) {
    KP_ASSERT(offset + bytes <= b->bytes + KP_GUARD_BYTES);
    return buf_fill(b, (unsigned char *)kp_buf_ptr(b) + offset, bytes, name, err);
}

int kp_bufs_check_queue(const kp_guard_check *c, int n, kp_error *err) {
#ifdef KP_HAVE_CUDA
    kp_guard_ranges r = {.n = 0};
    for (int i = 0; i < n; i++) {
        if (c[i].b->memory == KP_MEMORY_HOST) continue;
        const unsigned char *user = c[i].b->base + KP_GUARD_BYTES;
        KP_ASSERT(r.n + 2 <= KP_GUARD_RANGES && c[i].bytes <= KP_GUARD_BYTES);
        if (c[i].range) {
            r.at[r.n] = user + c[i].offset, r.bytes[r.n++] = (unsigned)c[i].bytes;
        } else {
            r.at[r.n] = c[i].b->base, r.bytes[r.n++] = KP_GUARD_BYTES;
            r.at[r.n] = user + c[i].b->bytes, r.bytes[r.n++] = KP_GUARD_BYTES;
        }
    }
    if (r.n == 0) return 0;
    if (readback_reserve(&g_guards, KP_GUARD_RANGES, "guard checks", err)) return err->code;
    r.changed = g_guards.dev;
    CUDA_TRY((cudaError_t)kp_guards_launch(&r, KP_GUARD_BYTE, g_stream), "guard checks");
    CUDA_TRY(cudaMemcpyAsync(g_guards.host, g_guards.dev, (size_t)r.n, cudaMemcpyDeviceToHost, g_stream), "guard checks");
    return 0;
#else
    for (int i = 0; i < n; i++)
        if (c[i].b->memory != KP_MEMORY_HOST) return kp_fail(err, KP_EXIT_ENV, "device guard checks in a build without CUDA");
    return 0;
#endif
}

int kp_bufs_check_result(const kp_guard_check *c, int n, kp_error *err) {
#ifdef KP_HAVE_CUDA
    const unsigned char *changed = g_guards.host; /* the device's verdicts, in kp_bufs_check_queue's order */
#else
    const unsigned char *changed = NULL; /* kp_bufs_check_queue refused device checks */
#endif
    int j = 0;
    for (int i = 0; i < n; i++) {
        KP_ASSERT(c[i].range ? c[i].offset + c[i].bytes <= c[i].b->bytes + KP_GUARD_BYTES && c[i].bytes <= KP_GUARD_BYTES : 1);
        const bool host = c[i].b->memory == KP_MEMORY_HOST;
        KP_ASSERT(host || changed);
        const unsigned char *user = c[i].b->base + KP_GUARD_BYTES;
        if (c[i].range) {
            if (host ? !guard_clean(user + c[i].offset, c[i].bytes) : changed[j++])
                return kp_fail(err, KP_EXIT_ENV, "out-of-bounds write: the guard region after buffer '%s' was overwritten",
                               c[i].name);
            continue;
        }
        const bool before = host ? !guard_clean(c[i].b->base, KP_GUARD_BYTES) : changed[j];
        const bool after = host ? !guard_clean(user + c[i].b->bytes, KP_GUARD_BYTES) : changed[j + 1];
        if (!host) j += 2;
        if (before)
            return kp_fail(err, KP_EXIT_ENV, "out-of-bounds write: the guard region before buffer '%s' was overwritten",
                           c[i].name);
        if (after)
            return kp_fail(err, KP_EXIT_ENV, "out-of-bounds write: the guard region after buffer '%s' was overwritten",
                           c[i].name);
    }
    return 0;
}

int kp_host_register(void *p, size_t bytes) {
#ifdef KP_HAVE_CUDA
    if (kp_device_count() > 0 && cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return 1;
    cudaGetLastError();
#endif
    (void)p, (void)bytes;
    return 0;
}

void kp_host_unregister(void *p) {
#ifdef KP_HAVE_CUDA
    cudaHostUnregister(p);
#endif
    (void)p;
}

int kp_stream_wait(const char *what, kp_error *err) {
#ifdef KP_HAVE_CUDA
    CUDA_TRY(cudaStreamSynchronize(g_stream), what);
    return 0;
#else
    (void)what, (void)err;
    return 0;
#endif
}

int kp_sync(kp_memory memory, kp_error *err) {
    if (memory == KP_MEMORY_HOST) return 0;
#ifdef KP_HAVE_CUDA
    CUDA_TRY(cudaStreamSynchronize(g_stream), "after the impl ran");
    CUDA_TRY(cudaGetLastError(), "after the impl ran");
    return 0;
#else
    return kp_fail(err, KP_EXIT_ENV, "device sync in a build without CUDA");
#endif
}

const char *kp_self_sha256(void) {
    static char hex[KP_SHA256_HEX_LEN];
    if (!hex[0]) {
        kp_error err;
        if (kp_sha256_file_hex("/proc/self/exe", hex, &err)) snprintf(hex, sizeof hex, "unavailable");
    }
    return hex;
}

cJSON *kp_environment_json(void) {
    cJSON *env = cJSON_CreateObject();
    struct utsname u;
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    cJSON_AddStringToObject(env, "host", host);
    if (uname(&u) == 0) {
        char text[600];
        snprintf(text, sizeof text, "%s %s %s", u.sysname, u.release, u.machine);
        cJSON_AddStringToObject(env, "kernel", text);
    }
    char libc[64];
    snprintf(libc, sizeof libc, "glibc %s", gnu_get_libc_version());
    cJSON_AddStringToObject(env, "libc", libc);
    kp_json_add_int(env, "cpus", kp_thread_count());
    cJSON_AddStringToObject(env, "kparity_version", KPARITY_VERSION);
    cJSON_AddStringToObject(env, "kparity_sha256", kp_self_sha256());
    kp_json_add_int(env, "curand_version", kp_curand_version());
#ifdef KP_HAVE_CUDA
    cJSON_AddTrueToObject(env, "cuda_build");
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    kp_json_add_int(env, "cuda_driver_version", driver);
    kp_json_add_int(env, "cuda_runtime_version", runtime);
    if (kp_device_count() > 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
            cJSON *gpu = cJSON_AddObjectToObject(env, "gpu");
            cJSON_AddStringToObject(gpu, "name", prop.name);
            char uuid[64];
            int n = snprintf(uuid, sizeof uuid, "GPU-");
            for (int i = 0; i < 16; i++) {
                n += snprintf(uuid + n, sizeof uuid - (size_t)n, "%02x", (unsigned char)prop.uuid.bytes[i]);
                if (i == 3 || i == 5 || i == 7 || i == 9) n += snprintf(uuid + n, sizeof uuid - (size_t)n, "-");
            }
            cJSON_AddStringToObject(gpu, "uuid", uuid);
            kp_json_add_int(gpu, "index", dev);
            kp_json_add_int(gpu, "sm_count", prop.multiProcessorCount);
            char cc[16];
            snprintf(cc, sizeof cc, "%d.%d", prop.major, prop.minor);
            cJSON_AddStringToObject(gpu, "compute_capability", cc);
            int clock = 0, mclock = 0;
            cudaDeviceGetAttribute(&clock, cudaDevAttrClockRate, dev);
            cudaDeviceGetAttribute(&mclock, cudaDevAttrMemoryClockRate, dev);
            kp_json_add_int(gpu, "sm_clock_khz", clock);
            kp_json_add_int(gpu, "memory_clock_khz", mclock);
            kp_json_add_int(gpu, "memory_bytes", (int64_t)prop.totalGlobalMem);
            kp_json_add_int(gpu, "l2_bytes", prop.l2CacheSize);
        }
    } else {
        cJSON_AddNullToObject(env, "gpu");
    }
#else
    cJSON_AddFalseToObject(env, "cuda_build");
    cJSON_AddNullToObject(env, "gpu");
#endif
    return env;
}

struct kp_timer {
    kp_memory memory;
    double t0;
#ifdef KP_HAVE_CUDA
    cudaEvent_t start, stop;
    void *flush;
    size_t flush_bytes;
#endif
};

int kp_timer_create(kp_timer **out, kp_memory memory, int flush_l2, kp_error *err) {
    kp_timer *t = kp_calloc(1, sizeof *t, "timer", err);
    if (!t) return err->code;
    t->memory = memory;
    *out = t;
    (void)flush_l2;
#ifdef KP_HAVE_CUDA
    if (memory == KP_MEMORY_CUDA) {
        int dev = 0, l2 = 0;
        CUDA_TRY(cudaGetDevice(&dev), "timer");
        CUDA_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "timer");
        if (flush_l2) {
            t->flush_bytes = (size_t)(l2 > 0 ? l2 : 64 << 20) * 2;
            CUDA_TRY(cudaMalloc(&t->flush, t->flush_bytes), "timer L2 flush buffer");
        }
        CUDA_TRY(cudaEventCreate(&t->start), "timer");
        CUDA_TRY(cudaEventCreate(&t->stop), "timer");
    }
#endif
    return 0;
}

int kp_timer_start(kp_timer *t, kp_error *err) {
#ifdef KP_HAVE_CUDA
    if (t->memory == KP_MEMORY_CUDA) {
        if (t->flush) CUDA_TRY(cudaMemsetAsync(t->flush, t->flush_bytes & 0xff, t->flush_bytes, g_stream), "L2 flush");
        CUDA_TRY(cudaEventRecord(t->start, g_stream), "timer start");
        return 0;
    }
#endif
    (void)err;
    t->t0 = kp_now();
    return 0;
}

int kp_timer_stop(kp_timer *t, double *us, kp_error *err) {
#ifdef KP_HAVE_CUDA
    if (t->memory == KP_MEMORY_CUDA) {
        float ms = 0;
        CUDA_TRY(cudaEventRecord(t->stop, g_stream), "timer stop");
        CUDA_TRY(cudaEventSynchronize(t->stop), "timer stop");
        CUDA_TRY(cudaEventElapsedTime(&ms, t->start, t->stop), "timer");
        *us = (double)ms * 1e3;
        return 0;
    }
#endif
    (void)err;
    *us = (kp_now() - t->t0) * 1e6;
    return 0;
}

void kp_timer_free(kp_timer *t) {
    if (!t) return;
#ifdef KP_HAVE_CUDA
    if (t->memory == KP_MEMORY_CUDA) {
        cudaFree(t->flush);
        cudaEventDestroy(t->start);
        cudaEventDestroy(t->stop);
    }
#endif
    free(t);
}

double kp_device_copy_bandwidth(void) {
#ifdef KP_HAVE_CUDA
    kp_error err;
    if (kp_device_init(&err)) return 0;
    size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaFree(a);
        cudaGetLastError();
        return 0;
    }
    cudaEvent_t s, e;
    cudaEventCreate(&s);
    cudaEventCreate(&e);
    double ms[5];
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream); /* warm-up */
    for (int i = 0; i < 5; i++) {
        float t = 0;
        cudaEventRecord(s, g_stream);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream);
        cudaEventRecord(e, g_stream);
        cudaEventSynchronize(e);
        cudaEventElapsedTime(&t, s, e);
        ms[i] = t;
    }
    cudaEventDestroy(s);
    cudaEventDestroy(e);
    cudaFree(a);
    cudaFree(b);
    qsort(ms, 5, sizeof *ms, kp_cmp_double);
    /* a copy reads and writes every byte */
    return ms[2] > 0 ? 2.0 * (double)bytes / (ms[2] * 1e-3) : 0;
#else
    return 0;
#endif
}
