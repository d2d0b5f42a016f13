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
/* Write a .npy file atomically (temporary file, fsync, rename). */
int kp_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape, const void *data,
                 size_t data_bytes, kp_error *err);

/* Write a whole file atomically: temporary file in the same folder, fsync, rename, fsync folder. */
int kp_write_file_atomic(const char *path, const void *data, size_t len, kp_error *err);

#endif
