/* kp_judge.h: the check of an output made outside kparity (harness/outside_output.c): `kparity judge`'s files and
 * exec programs' arrays, exposed on its own so fuzz/fuzz_judge_output.c can drive it from memory. */
#ifndef KP_JUDGE_H
#define KP_JUDGE_H

#include "../receipts/kp_npy.h"
#include "kp_harness.h"

/* One outside output checked: buf (a whole file's len bytes, named `path` in messages) must be a .npy of tensor
 * t's dtype (a bf16 tensor's bits as <u2 or <i2) and shape with `rows` rows; *info then says where its data lies. KP_EXIT_USAGE naming path and what is
 * wrong (not .npy, truncated, dtype, shape) otherwise. */
int kp_judge_check_output(const char *path, const unsigned char *buf, size_t len, const kp_tensor *t, int64_t rows,
                          kp_npy_info *info, kp_error *err);

#endif
