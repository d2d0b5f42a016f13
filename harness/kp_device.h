/* kp_device.h: where impls run: buffers with guard regions on the host or a CUDA device, stream
 * sync, device discovery, and the environment every receipt records. */
#ifndef KP_DEVICE_H
#define KP_DEVICE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "../cases/kp_common.h"
#include "../kernels/kparity_kernel.h"

/* Usable CUDA devices (0 in a CPU-only build or without a driver). */
int kp_device_count(void);
/* Select the device and create its stream once; KP_EXIT_ENV naming the call on failure. */
int kp_device_init(kp_error *err);
/* The CUDA context made on a thread of its own while the run's first case is prepared (a tenth of a second the first
 * device call would otherwise wait through); kp_device_init waits for it. Nothing when there is no device. */
void kp_device_warm_start(void);
void *kp_device_stream(void);
int kp_device_sm_count(void);
/* Total memory of the selected device in bytes (0 without one). */
uint64_t kp_device_memory_bytes(void);

/* A buffer with guard regions before and after it, on the host or the device. */
typedef struct kp_buf {
    kp_memory memory;
    unsigned char *base; /* guard | user | guard */
    size_t bytes;
} kp_buf;
#define KP_GUARD_BYTES 4096
#define KP_GUARD_BYTE 0xA5

int kp_buf_alloc(kp_buf *b, kp_memory memory, size_t bytes, const char *name, kp_error *err);
void *kp_buf_ptr(const kp_buf *b);
/* Copy host data in (or fill the user area with KP_GUARD_BYTE when src is NULL). */
int kp_buf_upload(kp_buf *b, const void *src, size_t bytes, const char *name, kp_error *err);
int kp_buf_download(const kp_buf *b, void *dst, size_t bytes, const char *name, kp_error *err);
/* [offset, offset + bytes) of the user area copied back, as kp_buf_download copies its start. */
int kp_buf_download_range(const kp_buf *b, size_t offset, void *dst, size_t bytes, const char *name, kp_error *err);
/* Device rows compared bit for bit on the device: for each pair k, row i of `rows` (bytes [i * slice, (i + 1) * slice)
 * of its user area, padding included) with row at[i] of `against` (at NULL: row i). Both buffers of a pair on the CUDA
 * device. Queued on the impls' stream with the copy of its answer back; after a wait for that stream (kp_sync),
 * kp_bufs_rows_differ_result gives bits[i] bit k where they differ, 0 where at[i] is against_rows or more (not
 * compared). A thread's queued comparison is the one its next result reads. */
typedef struct kp_rows_pair {
    const kp_buf *rows, *against;
    size_t slice;
} kp_rows_pair;
int kp_bufs_rows_differ_queue(const kp_rows_pair *pairs, int n, const int64_t *at, int64_t nrows, int64_t against_rows,
                              kp_error *err);
void kp_bufs_rows_differ_result(int64_t nrows, uint8_t *bits);
void kp_buf_free(kp_buf *b);
/* Copy rows between two buffers of the same memory: dst row i <- src row rows[i]; runs of
 * consecutive rows go as one copy. */
int kp_buf_gather_rows(kp_buf *dst, const kp_buf *src, const int64_t *rows, int64_t nrows, size_t row_bytes,
                       const char *name, kp_error *err);
/* Fill [offset, offset + bytes) of the user area with KP_GUARD_BYTE: a guard placed right after the rows in use when a
 * buffer is larger than one run needs. Device fills and gathers are queued on the impls' stream, not waited for:
 * kp_stream_wait before an impl may run on another. */
int kp_buf_fill_guard(kp_buf *b, size_t offset, size_t bytes, const char *name, kp_error *err);
/* Whether guard bytes still hold KP_GUARD_BYTE, check by check in order: range 0, both of a buffer's guard regions;
 * range 1, [offset, offset + bytes) of its user area (a guard after the rows in use). Device regions are checked on
 * the device (kp_bufs_check_queue queues the check and the copy of its answer back on the impls' stream: a launch checks
 * about fifteen); after a wait for that stream (kp_sync), kp_bufs_check_result reads them, and host regions in place,
 * with the same checks: the first changed one is a FAILED-class error naming the buffer and the region (an
 * out-of-bounds write). */
typedef struct kp_guard_check {
    const kp_buf *b;
    const char *name;
    int range; /* 0: the guards; 1: [offset, offset + bytes) */
    size_t offset, bytes;
} kp_guard_check;
int kp_bufs_check_queue(const kp_guard_check *c, int n, kp_error *err);
int kp_bufs_check_result(const kp_guard_check *c, int n, kp_error *err);
/* Page-lock existing host memory for fast device copies (1 on success; 0 without a GPU). */
int kp_host_register(void *p, size_t bytes);
void kp_host_unregister(void *p);

/* Whether a sticky CUDA error (illegal address, launch failure...) has made the device unusable
 * for the rest of the process; set by kp_sync and guard checks when they see one. */
int kp_device_lost(void);
/* A test hook, never called by kparity itself: mark the device lost as a sticky CUDA error does, so the path that
 * follows one (the case FAILED, the rest in a fresh worker) runs on a machine without a GPU. A host plugin calls
 * it through the kparity binary's exported symbols (tests/fixtures/plugin_hostile.c, KPT_LOSE_DEVICE), then fails
 * its run as an impl whose kernel faulted would. */
void kp_device_simulate_loss(void);

/* Wait for what the harness queued on the impls' stream (fills, gathers), naming `what` on an error. */
int kp_stream_wait(const char *what, kp_error *err);
/* Wait for the impl's work; a CUDA error names the call and is sticky-checked. */
int kp_sync(kp_memory memory, kp_error *err);

/* The environment: host, libc, kparity version and binary digest, cuRAND, GPU/driver/runtime. */
cJSON *kp_environment_json(void);
/* SHA-256 of the running kparity binary (computed once). */
const char *kp_self_sha256(void);

/* Timing of one launch (harness/launch.c: receipts and the bench loop): on a GPU with CUDA events
 * (after flushing L2 by writing a buffer twice its size, when asked), on the host by wall clock. */
typedef struct kp_timer kp_timer;
int kp_timer_create(kp_timer **t, kp_memory memory, int flush_l2, kp_error *err);
int kp_timer_start(kp_timer *t, kp_error *err);
int kp_timer_stop(kp_timer *t, double *microseconds, kp_error *err);
void kp_timer_free(kp_timer *t);
/* Device-to-device copy bandwidth in bytes/s (a 1 GiB copy, median of 5); 0 without a GPU. */
double kp_device_copy_bandwidth(void);

#endif
