/* kp_tensor.h: host tensors with dtype, shape and row stride, and their canonical digest: the currency
 * in which a family describes its inputs, outputs and reference.
 * The digest covers dtype, shape and the logical elements only, never row padding. */
#ifndef KP_TENSOR_H
#define KP_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "kp_common.h"
#include "kp_sha256.h"

typedef enum kp_dtype { KP_F32 = 0, KP_F64, KP_I32, KP_I64, KP_U8, KP_BF16, KP_DTYPE_COUNT } kp_dtype;

const char *kp_dtype_name(kp_dtype t); /* "f32", ... */
const char *kp_dtype_npy(kp_dtype t);  /* "<f4", ... */
size_t kp_dtype_size(kp_dtype t);

#define KP_MAX_DIMS 4

/* A family's tensors are described with this struct: inputs, outputs and reference arrays alike. */
typedef struct kp_tensor {
    char name[32];
    kp_dtype dtype;
    int ndim;
    int64_t shape[KP_MAX_DIMS];
    int64_t row_stride; /* elements between rows (last dim); >= shape[ndim-1], or 0 for dense */
    int batched;        /* dim 0 runs over the case's rows: a batch probe runs any subset of them */
    void *data;         /* rows() * row_stride elements; for a batched input, as many dim-0 slices as the
                           prepared case holds (its extra rows too), while shape[0] is the case's batch */
} kp_tensor;

/* Allocate `slices` slices of dim 0 of a tensor of this shape (contents zeroed; row_stride 0 for
 * dense); shape[0] stays as given, so a case's tensor can hold extra rows past its batch. */
int kp_tensor_alloc(kp_tensor *t, const char *name, kp_dtype dtype, int ndim, const int64_t *shape,
                    int64_t row_stride, int64_t slices, kp_error *err);
void kp_tensor_free(kp_tensor *t);
int64_t kp_tensor_rows(const kp_tensor *t);   /* product of all dims but the last (1 for 1-D) */
int64_t kp_tensor_cols(const kp_tensor *t);   /* the last dim */
int64_t kp_tensor_stride(const kp_tensor *t); /* row_stride, or the last dim when dense */
/* Bytes of one slice of dim 0, padding included (1-D: one element); 0 on overflow. */
size_t kp_tensor_slice_bytes(const kp_tensor *t);
/* The logical elements of slices [first, first + n) of dim 0, densely, into dst (for .npy export). */
void kp_tensor_copy_dense(const kp_tensor *t, int64_t first, int64_t n, void *dst);

/* SHA-256 over "kparity.tensor/v1", dtype name, ndim, shape (int64 LE) and the logical elements
 * row by row, little-endian, of a strided buffer. */
void kp_buffer_digest(kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride, const void *data,
                      char hex[KP_SHA256_HEX_LEN]);
/* What that digest hashes, for a kp_sha256_job: the header bytes into prefix (their count returned),
 * then the rows as *nspans spans into *spans (malloc'd; the caller frees it). */
#define KP_TENSOR_PREFIX_MAX 128
size_t kp_buffer_digest_parts(kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride, const void *data,
                              unsigned char prefix[KP_TENSOR_PREFIX_MAX], kp_span **spans, size_t *nspans);

#endif
