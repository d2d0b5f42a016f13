/* kp_tensor.h: host tensors with dtype, shape and row stride, and their canonical digest.
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

typedef struct kp_tensor {
    char name[32];
    kp_dtype dtype;
    int ndim;
    int64_t shape[KP_MAX_DIMS];
    int64_t row_stride; /* elements between rows (last dim); >= shape[ndim-1] */
    void *data;         /* rows() * row_stride elements */
} kp_tensor;

/* Allocate a tensor; 2-D and up use row_stride (pass 0 for dense). Contents zeroed. */
int kp_tensor_alloc(kp_tensor *t, const char *name, kp_dtype dtype, int ndim, const int64_t *shape,
                    int64_t row_stride, kp_error *err);
void kp_tensor_free(kp_tensor *t);
int64_t kp_tensor_rows(const kp_tensor *t);  /* product of all dims but the last (1 for 1-D) */
int64_t kp_tensor_cols(const kp_tensor *t);  /* the last dim */
size_t kp_tensor_bytes(const kp_tensor *t);  /* allocated bytes, padding included */
/* Bytes a tensor of this shape would take, padding included; 0 on overflow. */
size_t kp_tensor_bytes_for(kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride);

/* SHA-256 over "kparity.tensor/v1", dtype name, ndim, shape (int64 LE) and the logical elements
 * row by row, little-endian. */
void kp_tensor_digest(const kp_tensor *t, char hex[KP_SHA256_HEX_LEN]);
/* The same digest for a raw strided buffer. */
void kp_buffer_digest(kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride, const void *data,
                      char hex[KP_SHA256_HEX_LEN]);
/* What that digest hashes, for a kp_sha256_job: the header bytes into prefix (their count returned),
 * then the rows as *nspans spans into *spans (malloc'd; the caller frees it). */
#define KP_TENSOR_PREFIX_MAX 128
size_t kp_buffer_digest_parts(kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride, const void *data,
                              unsigned char prefix[KP_TENSOR_PREFIX_MAX], kp_span **spans, size_t *nspans);

#endif
