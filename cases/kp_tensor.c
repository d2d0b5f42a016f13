/* kp_tensor.c: tensor allocation and canonical digests. Hosts are little-endian (x86-64, aarch64);
 * a big-endian host would have to swap before hashing, which the assert below refuses to skip. */
#include "kp_tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name, *npy;
    size_t size;
} dtypes[KP_DTYPE_COUNT] = {
    [KP_F32] = {"f32", "<f4", 4}, [KP_F64] = {"f64", "<f8", 8}, [KP_I32] = {"i32", "<i4", 4},
    [KP_I64] = {"i64", "<i8", 8}, [KP_U8] = {"u8", "|u1", 1},   [KP_BF16] = {"bf16", "<u2", 2},
};

const char *kp_dtype_name(kp_dtype t) { return dtypes[t].name; }
const char *kp_dtype_npy(kp_dtype t) { return dtypes[t].npy; }
size_t kp_dtype_size(kp_dtype t) { return dtypes[t].size; }

static size_t bytes_for(kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride) {
    size_t rows = 1, bytes;
    for (int d = 0; d + 1 < ndim; d++) {
        if (shape[d] < 0 || !kp_mul_size(rows, (size_t)shape[d], &rows)) return 0;
    }
    int64_t cols = ndim ? shape[ndim - 1] : 1;
    int64_t stride = row_stride > 0 ? row_stride : cols;
    if (cols < 0 || stride < cols) return 0;
    if (!kp_mul_size(rows, (size_t)stride, &bytes) || !kp_mul_size(bytes, dtypes[dtype].size, &bytes)) return 0;
    return bytes;
}

int kp_tensor_alloc(kp_tensor *t, const char *name, kp_dtype dtype, int ndim, const int64_t *shape,
                    int64_t row_stride, int64_t slices, kp_error *err) {
    KP_ASSERT(ndim >= 1 && ndim <= KP_MAX_DIMS && slices >= 0);
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->row_stride = row_stride;
    int empty = 0;
    for (int d = 1; d < ndim; d++) empty |= shape[d] == 0;
    size_t bytes, slice = kp_tensor_slice_bytes(t);
    if ((slice == 0 && !empty) || !kp_mul_size(slice, (size_t)slices, &bytes))
        return kp_fail(err, KP_EXIT_USAGE, "tensor %s: shape overflows the address space", name);
    t->data = kp_calloc(1, bytes, name, err);
    return t->data ? 0 : err->code;
}

void kp_tensor_free(kp_tensor *t) {
    free(t->data);
    t->data = NULL;
}

int64_t kp_tensor_rows(const kp_tensor *t) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < t->ndim; d++) rows *= t->shape[d];
    return rows;
}

int64_t kp_tensor_cols(const kp_tensor *t) { return t->shape[t->ndim - 1]; }

int64_t kp_tensor_stride(const kp_tensor *t) { return t->row_stride > 0 ? t->row_stride : kp_tensor_cols(t); }

size_t kp_tensor_slice_bytes(const kp_tensor *t) {
    if (t->ndim == 1) return dtypes[t->dtype].size;
    int64_t one[KP_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) one[d] = d ? t->shape[d] : 1;
    return bytes_for(t->dtype, t->ndim, one, t->row_stride);
}

void kp_tensor_copy_dense(const kp_tensor *t, int64_t first, int64_t n, void *dst) {
    const size_t esize = dtypes[t->dtype].size;
    if (t->ndim == 1) {
        memcpy(dst, (const unsigned char *)t->data + (size_t)first * esize, (size_t)n * esize);
        return;
    }
    const int64_t per_slice = kp_tensor_rows(t) / (t->shape[0] ? t->shape[0] : 1), cols = kp_tensor_cols(t);
    const size_t row_bytes = (size_t)cols * esize, stride_bytes = (size_t)kp_tensor_stride(t) * esize;
    const unsigned char *src = (const unsigned char *)t->data + (size_t)(first * per_slice) * stride_bytes;
    unsigned char *to = dst;
    for (int64_t r = 0; r < n * per_slice; r++) memcpy(to + (size_t)r * row_bytes, src + (size_t)r * stride_bytes, row_bytes);
}

static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

size_t kp_buffer_digest_parts(kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride, const void *data,
                              unsigned char prefix[KP_TENSOR_PREFIX_MAX], kp_span **spans, size_t *nspans) {
    const uint16_t probe = 1;
    KP_ASSERT(*(const unsigned char *)&probe == 1); /* canonical bytes are little-endian */
    KP_ASSERT(ndim >= 1 && ndim <= KP_MAX_DIMS); /* the prefix fits KP_TENSOR_PREFIX_MAX */
    static const char tag[] = "kparity.tensor/v1";
    size_t n = 0;
    memcpy(prefix, tag, sizeof tag); /* NUL included as a separator */
    n += sizeof tag;
    const char *dname = dtypes[dtype].name;
    memcpy(prefix + n, dname, strlen(dname) + 1);
    n += strlen(dname) + 1;
    put_le64(prefix + n, (uint64_t)ndim);
    n += 8;
    int64_t rows = 1;
    for (int d = 0; d < ndim; d++) {
        put_le64(prefix + n, (uint64_t)shape[d]);
        n += 8;
        if (d + 1 < ndim) rows *= shape[d];
    }
    int64_t cols = shape[ndim - 1];
    int64_t stride = row_stride > 0 ? row_stride : cols;
    size_t esize = dtypes[dtype].size;
    *spans = malloc(sizeof **spans * (size_t)(rows > 0 ? rows : 1));
    if (!*spans) KP_OUT_OF_MEMORY("for a digest's rows");
    for (int64_t r = 0; r < rows; r++)
        (*spans)[r] = (kp_span){(const unsigned char *)data + (size_t)(r * stride) * esize, (size_t)cols * esize};
    *nspans = (size_t)(rows > 0 ? rows : 0);
    return n;
}

void kp_buffer_digest(kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride, const void *data,
                      char hex[KP_SHA256_HEX_LEN]) {
    unsigned char prefix[KP_TENSOR_PREFIX_MAX];
    kp_span *spans;
    size_t nspans;
    const size_t n = kp_buffer_digest_parts(dtype, ndim, shape, row_stride, data, prefix, &spans, &nspans);
    kp_sha256_spans_hex(prefix, n, spans, nspans, hex);
    free(spans);
}
