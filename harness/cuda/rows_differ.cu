/* rows_differ.cu: the device side of kp_rows_differ.h. One block a compared row: its threads read both rows of each
 * pair in 16-byte words where both rows and their length allow it, else byte by byte, and the block's OR of "some
 * word differs" is the pair's bit. Every byte of a row is read (padding too): equal bits mean the row the host holds is
 * the row the device holds, byte for byte. */
#include <cuda_runtime.h>

#include "kp_rows_differ.h"

static __device__ bool slices_differ(const unsigned char *x, const unsigned char *y, size_t bytes) {
    bool differ = false;
    if (((uintptr_t)x | (uintptr_t)y | bytes) % 16 == 0) {
        const uint4 *a = reinterpret_cast<const uint4 *>(x), *b = reinterpret_cast<const uint4 *>(y);
        for (size_t w = threadIdx.x; w < bytes / 16; w += blockDim.x) {
            const uint4 u = a[w], v = b[w];
            differ |= (u.x != v.x) | (u.y != v.y) | (u.z != v.z) | (u.w != v.w);
        }
    } else {
        for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) differ |= x[i] != y[i];
    }
    return __syncthreads_or(differ) != 0;
}

static __global__ void rows_differ_kernel(kp_rows_differ_args a) {
    const int64_t i = blockIdx.x, at = a.at[i];
    uint8_t bits = 0;
    if (at >= 0 && at < a.against_rows)
        for (int k = 0; k < a.npairs; k++) {
            const size_t s = a.pair[k].slice;
            if (slices_differ(a.pair[k].rows + (size_t)i * s, a.pair[k].against + (size_t)at * s, s)) bits |= (uint8_t)(1u << k);
        }
    if (threadIdx.x == 0) a.bits[i] = bits;
}

extern "C" int kp_rows_differ_launch(const kp_rows_differ_args *a, void *stream) {
    if (a->nrows <= 0) return cudaSuccess;
    rows_differ_kernel<<<(unsigned)a->nrows, 256, 0, (cudaStream_t)stream>>>(*a);
    return cudaGetLastError();
}
