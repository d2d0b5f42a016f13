/* kp_rows_differ.h: rows of device buffers compared bit for bit on the device (harness/cuda/rows_differ.cu), so that a
 * run whose rows equal those of an output the host already holds need not copy them back; and guard regions checked
 * there, so that a run's fifteen or so read back as one copy. Built only with CUDA. */
#ifndef KP_ROWS_DIFFER_H
#define KP_ROWS_DIFFER_H

#include <stddef.h>
#include <stdint.h>

#define KP_ROWS_DIFFER_PAIRS 8        /* KP_MAX_TENSORS: a pair a tensor, a bit each in a chunk's byte */
#define KP_ROWS_DIFFER_CHUNK (32 << 10) /* bytes of a row a block compares */

/* Row i of `rows` (bytes [i * slice, (i + 1) * slice)) against row at[i] of `against`. */
typedef struct kp_rows_differ_pair {
    const unsigned char *rows, *against;
    size_t slice;
} kp_rows_differ_pair;

typedef struct kp_rows_differ_args {
    kp_rows_differ_pair pair[KP_ROWS_DIFFER_PAIRS];
    int npairs;
    int64_t nrows;        /* rows compared */
    int64_t chunks;       /* chunks a row: kp_rows_differ_chunks */
    int64_t against_rows; /* rows the against buffers hold: a row whose at[i] is past them is not compared (0) */
    const int64_t *at;    /* device memory, nrows of them */
    uint8_t *bits;        /* device memory, nrows * chunks: bit k of bits[i * chunks + c] set where pair k's rows i and
                             at[i] differ in chunk c (the bytes [c, c + 1) * KP_ROWS_DIFFER_CHUNK of the slice) */
} kp_rows_differ_args;

/* Guard regions, each (at most KP_GUARD_BYTES) checked to hold one byte value throughout. */
#define KP_GUARD_RANGES 64
typedef struct kp_guard_ranges {
    const unsigned char *at[KP_GUARD_RANGES]; /* device memory */
    unsigned bytes[KP_GUARD_RANGES];
    int n;
    unsigned char *changed; /* device memory, n of them: 1 where range j holds another byte */
} kp_guard_ranges;

#ifdef __cplusplus
extern "C" {
#endif
/* The chunks a row of a's pairs takes: of the longest slice. */
int64_t kp_rows_differ_chunks(const kp_rows_differ_args *a);
/* Queue the comparison or the guard check on `stream` (a cudaStream_t); each returns a cudaError_t (cudaSuccess, 0, or
 * the launch's error). */
int kp_rows_differ_launch(const kp_rows_differ_args *a, void *stream);
int kp_guards_launch(const kp_guard_ranges *r, unsigned char byte, void *stream);
#ifdef __cplusplus
}
#endif

#endif
