/* rows_differ.cu: the device side of kp_rows_differ.h. Rows compared in chunks of KP_ROWS_DIFFER_CHUNK bytes, a block
 * each, so that one row (a batch probe's) spreads over many SMs instead of queueing on one: a block reads its chunk of
 * both rows of each pair in 16-byte words where both rows and their length allow it, else byte by byte, and its OR of
 * "some word differs" is the chunk's bit for the pair. Every byte of a row is read (padding too): equal bits mean the
 * row the host holds is the row the device holds, byte for byte. Guard regions are checked the same way, a block each. */
#include <cuda_runtime.h>

#include "kp_rows_differ.h"

/* whether x and y differ in [from, to), read by the block's threads; every thread returns the block's answer */
static __device__ bool ranges_differ(const unsigned char *x, const unsigned char *y, size_t from, size_t to) {
    bool differ = false;
    if (((uintptr_t)(x + from) | (uintptr_t)(y + from) | (to - from)) % 16 == 0) {
        const uint4 *a = reinterpret_cast<const uint4 *>(x + from), *b = reinterpret_cast<const uint4 *>(y + from);
        for (size_t w = threadIdx.x; w < (to - from) / 16; w += blockDim.x) {
            const uint4 u = a[w], v = b[w];
            differ |= (u.x != v.x) | (u.y != v.y) | (u.z != v.z) | (u.w != v.w);
        }
    } else {
        for (size_t i = from + threadIdx.x; i < to; i += blockDim.x) differ |= x[i] != y[i];
    }
    return __syncthreads_or(differ) != 0;
}

static __global__ void rows_differ_kernel(kp_rows_differ_args a) {
    const int64_t i = blockIdx.x / a.chunks, c = blockIdx.x % a.chunks, at = a.at[i];
    uint8_t bits = 0;
    if (at >= 0 && at < a.against_rows)
        for (int k = 0; k < a.npairs; k++) {
            const size_t s = a.pair[k].slice, from = (size_t)c * KP_ROWS_DIFFER_CHUNK;
            if (from >= s) continue;
            const size_t to = s - from < KP_ROWS_DIFFER_CHUNK ? s : from + KP_ROWS_DIFFER_CHUNK;
            if (ranges_differ(a.pair[k].rows + (size_t)i * s, a.pair[k].against + (size_t)at * s, from, to))
                bits |= (uint8_t)(1u << k);
        }
    if (threadIdx.x == 0) a.bits[blockIdx.x] = bits;
}

static __global__ void guards_kernel(kp_guard_ranges r, unsigned char byte) {
    const unsigned char *p = r.at[blockIdx.x];
    bool changed = false;
    for (unsigned i = threadIdx.x; i < r.bytes[blockIdx.x]; i += blockDim.x) changed |= p[i] != byte;
    changed = __syncthreads_or(changed) != 0;
    if (threadIdx.x == 0) r.changed[blockIdx.x] = changed;
}

extern "C" int64_t kp_rows_differ_chunks(const kp_rows_differ_args *a) {
    size_t largest = 1;
    for (int k = 0; k < a->npairs; k++)
        if (a->pair[k].slice > largest) largest = a->pair[k].slice;
    return (int64_t)((largest + KP_ROWS_DIFFER_CHUNK - 1) / KP_ROWS_DIFFER_CHUNK);
}

extern "C" int kp_rows_differ_launch(const kp_rows_differ_args *a, void *stream) {
    if (a->nrows <= 0) return cudaSuccess;
    if (a->chunks != kp_rows_differ_chunks(a) || a->nrows > INT32_MAX / a->chunks) return cudaErrorInvalidValue;
    rows_differ_kernel<<<(unsigned)(a->nrows * a->chunks), 256, 0, (cudaStream_t)stream>>>(*a);
    return cudaGetLastError();
}

extern "C" int kp_guards_launch(const kp_guard_ranges *r, unsigned char byte, void *stream) {
    if (r->n <= 0) return cudaSuccess;
    guards_kernel<<<(unsigned)r->n, 256, 0, (cudaStream_t)stream>>>(*r, byte);
    return cudaGetLastError();
}
