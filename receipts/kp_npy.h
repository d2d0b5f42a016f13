/* kp_npy.h: NumPy .npy files (format 1.0), so full mismatch lists and exported tensors open
 * directly in numpy or PyTorch. */
#ifndef KP_NPY_H
#define KP_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "../cases/kp_common.h"

/* descr is a NumPy type string: "<f4", "<f8", "<i8", "<i4", "|u1", "|b1", "<u2" (bf16 bits). */
/* Encode into a malloc'd buffer (header + little-endian data); *len receives its size. */
int kp_npy_encode(const char *descr, int ndim, const int64_t *shape, const void *data, size_t data_bytes,
                  unsigned char **buf, size_t *len, kp_error *err);
/* Just the header of such a file (magic, version, dict, padding to 64 bytes): *header_bytes of it into header,
 * *data_bytes the data that follows (for writing an array in place, as the exec protocol does). */
#define KP_NPY_HEADER_MAX 512
int kp_npy_header(const char *descr, int ndim, const int64_t *shape, unsigned char header[KP_NPY_HEADER_MAX],
                  size_t *header_bytes, size_t *data_bytes, kp_error *err);
/* Write a .npy file atomically (temporary file, fsync, rename). */
int kp_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape, const void *data,
                 size_t data_bytes, kp_error *err);

/* What a .npy header says. Of files numpy itself wrote, format 2.0/3.0 headers are read; '>' byte
 * order, fortran_order True and more than KP_NPY_MAX_DIMS dimensions are refused. */
#define KP_NPY_MAX_DIMS 8
typedef struct kp_npy_info {
    char descr[8];
    int ndim;
    int64_t shape[KP_NPY_MAX_DIMS];
    size_t itemsize;
    size_t data_offset; /* where the data starts in the file */
    size_t data_bytes;  /* prod(shape) * itemsize, checked against the file length */
} kp_npy_info;
/* Parse and check the header of a whole .npy file held in memory; KP_EXIT_USAGE saying what is wrong. */
int kp_npy_decode(const unsigned char *buf, size_t len, kp_npy_info *info, kp_error *err);

#endif
