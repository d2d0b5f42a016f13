/* kp_rows_differ.h: rows of device buffers compared bit for bit on the device (harness/cuda/rows_differ.cu), so that a
 * run whose rows equal those of an output the host already holds need not copy them back. Built only with CUDA. */
#ifndef KP_ROWS_DIFFER_H
#define KP_ROWS_DIFFER_H

#include <stddef.h>
#include <stdint.h>

#define KP_ROWS_DIFFER_PAIRS 8 /* KP_MAX_TENSORS: a pair a tensor, a bit each in a row's byte */

/* Row i of `rows` (bytes [i * slice, (i + 1) * slice)) against row at[i] of `against`. */
typedef struct kp_rows_differ_pair {
    const unsigned char *rows, *against;
    size_t slice;
} kp_rows_differ_pair;

typedef struct kp_rows_differ_args {
    kp_rows_differ_pair pair[KP_ROWS_DIFFER_PAIRS];
    int npairs;
    int64_t nrows;         /* rows compared: bits[0 .. nrows) */
    int64_t against_rows;  /* rows the against buffers hold: a row whose at[i] is past them is not compared (0) */
    const int64_t *at;     /* device memory, nrows of them */
    uint8_t *bits;         /* device memory: bit k of bits[i] set where pair k's rows differ */
} kp_rows_differ_args;

#ifdef __cplusplus
extern "C" {
#endif
/* Queue the comparison on `stream` (a cudaStream_t); returns a cudaError_t (cudaSuccess, 0, or the launch's error). */
int kp_rows_differ_launch(const kp_rows_differ_args *a, void *stream);
#ifdef __cplusplus
}
#endif

#endif
