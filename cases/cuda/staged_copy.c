/* staged_copy.c: kp_staged_copy (kp_staged_copy.h). Two page-locked buffers of STAGE bytes, made once a process: while
 * the DMA engine moves one, the threads fill (or drain) the other, each thread a contiguous piece. */
#include "kp_staged_copy.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <string.h>

#include "../kp_common.h"

#define STAGE ((size_t)64 << 20)
#define PIECE ((size_t)1 << 20) /* a thread's share of a buffer: a copy of KP_STAGED_MIN spreads over four */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *g_buf[2];
static cudaEvent_t g_done[2];
static int g_ready = -1; /* -1 not tried, 0 none to be had, 1 ready */

static int stage_ready(void) {
    if (g_ready >= 0) return g_ready;
    g_ready = 0;
    for (int i = 0; i < 2; i++)
        if (cudaMallocHost((void **)&g_buf[i], STAGE) != cudaSuccess ||
            cudaEventCreateWithFlags(&g_done[i], cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
    g_ready = 1;
    return 1;
}

typedef struct pieces {
    unsigned char *dst;
    const unsigned char *src;
    size_t bytes;
} pieces;

static void copy_piece(void *ctx, int64_t i) {
    const pieces *p = ctx;
    const size_t at = (size_t)i * PIECE, n = p->bytes - at < PIECE ? p->bytes - at : PIECE;
    memcpy(p->dst + at, p->src + at, n);
}

static void parallel_memcpy(void *dst, const void *src, size_t bytes) {
    pieces p = {dst, src, bytes};
    kp_parallel_for((int64_t)((bytes + PIECE - 1) / PIECE), copy_piece, &p);
}

static int pageable(const void *host) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    return a.type == cudaMemoryTypeUnregistered;
}

#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        const cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) {                                                                                       \
            pthread_mutex_unlock(&g_lock);                                                                             \
            return (int)e_;                                                                                            \
        }                                                                                                              \
    } while (0)

int kp_staged_copy(void *dst, const void *src, size_t bytes, int to_device, void *stream_) {
    cudaStream_t stream = (cudaStream_t)stream_;
    const enum cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    pthread_mutex_lock(&g_lock);
    if (bytes < KP_STAGED_MIN || !pageable(to_device ? src : dst) || !stage_ready()) {
        pthread_mutex_unlock(&g_lock);
        cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream);
        return (int)(e != cudaSuccess ? e : cudaStreamSynchronize(stream));
    }
    unsigned char *d = dst;
    const unsigned char *s = src;
    const size_t chunks = (bytes + STAGE - 1) / STAGE;
    if (to_device) {
        for (size_t c = 0; c < chunks; c++) {
            const size_t at = c * STAGE, n = bytes - at < STAGE ? bytes - at : STAGE;
            unsigned char *buf = g_buf[c % 2];
            TRY(cudaEventSynchronize(g_done[c % 2])); /* its last copy out of this buffer is done */
            parallel_memcpy(buf, s + at, n);
            TRY(cudaMemcpyAsync(d + at, buf, n, kind, stream));
            TRY(cudaEventRecord(g_done[c % 2], stream));
        }
    } else {
        /* chunk c+1 moves into one buffer while the threads drain chunk c from the other */
        for (size_t c = 0; c <= chunks; c++) {
            if (c < chunks) {
                const size_t at = c * STAGE, n = bytes - at < STAGE ? bytes - at : STAGE;
                TRY(cudaMemcpyAsync(g_buf[c % 2], s + at, n, kind, stream));
                TRY(cudaEventRecord(g_done[c % 2], stream));
            }
            if (c > 0) {
                const size_t at = (c - 1) * STAGE, n = bytes - at < STAGE ? bytes - at : STAGE;
                TRY(cudaEventSynchronize(g_done[(c - 1) % 2]));
                parallel_memcpy(d + at, g_buf[(c - 1) % 2], n);
            }
        }
    }
    TRY(cudaStreamSynchronize(stream));
    pthread_mutex_unlock(&g_lock);
    return (int)cudaSuccess;
}
