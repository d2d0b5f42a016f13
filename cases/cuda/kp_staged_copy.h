/* kp_staged_copy.h: large copies between pageable host memory and the device, through page-locked staging buffers
 * that the run's threads fill or drain. Measured on the H200 (4 GiB): the driver's own pageable path moves 6-8 GB/s
 * to the device and 10 GB/s back (1 GB/s into pages never touched: one thread takes every page fault); staged, with
 * 8-16 threads copying, 28-36 and 20-23 GB/s. Built only with CUDA (KP_HAVE_CUDA). */
#ifndef KP_STAGED_COPY_H
#define KP_STAGED_COPY_H

#include <stddef.h>

/* Copy `bytes` from src to dst on `stream` (a cudaStream_t), to the device when to_device else back, and wait for it.
 * Copies under KP_STAGED_MIN bytes, from or to page-locked host memory, or made where no staging buffer can be had go
 * straight through cudaMemcpyAsync. Returns a cudaError_t: cudaSuccess (0) or the first error met. */
#define KP_STAGED_MIN ((size_t)4 << 20)
#ifdef __cplusplus
extern "C" {
#endif
int kp_staged_copy(void *dst, const void *src, size_t bytes, int to_device, void *stream);
#ifdef __cplusplus
}
#endif

#endif
