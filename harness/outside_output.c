/* outside_output.c: an output made outside kparity, a whole .npy in memory, checked against the family's output
 * tensor before anything reads it: `kparity judge`'s files (judge.c) and the arrays exec programs write (exec.c). */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "kp_judge.h"

static const char *npy_descr(kp_dtype dt) {
    switch (dt) {
    case KP_F32: return "<f4";
    case KP_F64: return "<f8";
    case KP_I32: return "<i4";
    case KP_BF16: return "<u2";
    case KP_U8: return "|u1";
    default: return "?";
    }
}

static void shape_text(const kp_tensor *t, int64_t rows, char *buf, size_t len) {
    int n = snprintf(buf, len, "[%lld", (long long)rows);
    for (int d = 1; d < t->ndim && n > 0 && (size_t)n < len; d++) n += snprintf(buf + n, len - (size_t)n, ", %lld", (long long)t->shape[d]);
    if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, "]");
}

int kp_judge_check_output(const char *path, const unsigned char *buf, size_t len, const kp_tensor *t, int64_t rows,
                          kp_npy_info *info, kp_error *err) {
    kp_error e = {0};
    if (kp_npy_decode(buf, len, info, &e))
        return kp_fail(err, KP_EXIT_USAGE, "%s: not a readable .npy file for output '%s': %s", path, t->name, e.msg);
    /* room for the longest shape a header may give (KP_NPY_MAX_DIMS entries of 19 digits and ", "), and bounded
       anyway: a 96-byte buffer here was overrun by (0, 2^63 - 1, ...), an empty array of any shape (fuzz_judge_output) */
    char want[96], got[KP_NPY_MAX_DIMS * 22 + 8];
    shape_text(t, rows, want, sizeof want);
    size_t n = (size_t)snprintf(got, sizeof got, "[");
    for (int d = 0; d < info->ndim && n < sizeof got; d++)
        n += (size_t)snprintf(got + n, sizeof got - n, "%s%lld", d ? ", " : "", (long long)info->shape[d]);
    if (n < sizeof got) snprintf(got + n, sizeof got - n, "]");
    /* bf16 has no numpy dtype: its bits come as uint16 (numpy, kparity's export) or int16 (torch's view of bf16 bits,
       t.view(torch.int16)); the same bytes either way */
    const int bf16_bits = t->dtype == KP_BF16 && !strcmp(info->descr, "<i2");
    if (strcmp(info->descr, npy_descr(t->dtype)) && !bf16_bits)
        return kp_fail(err, KP_EXIT_USAGE, "%s: dtype %s; the family's output '%s' is %s%s (%s) %s", path, info->descr,
                       t->name, npy_descr(t->dtype), t->dtype == KP_BF16 ? " or <i2" : "", kp_dtype_name(t->dtype), want);
    int same = info->ndim == t->ndim && info->shape[0] == rows;
    for (int d = 1; same && d < t->ndim; d++) same = info->shape[d] == t->shape[d];
    if (!same)
        return kp_fail(err, KP_EXIT_USAGE, "%s: shape %s; the family's output '%s' of %lld rows is %s", path, got, t->name,
                       (long long)rows, want);
    return 0;
}
