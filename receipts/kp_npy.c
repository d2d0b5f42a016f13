/* kp_npy.c: NumPy .npy encoding (format 1.0) and header parsing, so artifacts open with np.load
 * and a replay can read them back. The layout follows numpy/lib/_format_impl.py. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "kp_npy.h"
#include "kp_fileio.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Data is written as the host holds it and labelled '<': only right on a little-endian host. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kp_npy labels host bytes as little-endian");

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* Item size of a descr kparity writes or reads: '<' or '|' (one-byte types), kind f/i/u/b, size 1/2/4/8.
 * 0 when the descr is not one of those. */
static size_t descr_itemsize(const char *descr) {
    if (!descr || strlen(descr) != 3 || (descr[0] != '<' && descr[0] != '|')) return 0;
    if (!strchr("fiub", descr[1]) || !strchr("1248", descr[2])) return 0;
    size_t size = (size_t)(descr[2] - '0');
    if ((descr[0] == '|') != (size == 1)) return 0; /* numpy writes '|' exactly for one-byte types */
    if (descr[1] == 'b' && size != 1) return 0;
    if (descr[1] == 'f' && size == 1) return 0;
    return size;
}

static int shape_bytes(int ndim, const int64_t *shape, size_t itemsize, size_t *bytes, kp_error *err) {
    if (ndim < 0 || ndim > KP_NPY_MAX_DIMS)
        return kp_fail(err, KP_EXIT_USAGE, "npy: %d dimensions (0 to %d are supported)", ndim, KP_NPY_MAX_DIMS);
    size_t total = itemsize;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return kp_fail(err, KP_EXIT_USAGE, "npy: negative dimension %lld", (long long)shape[d]);
        if ((uint64_t)shape[d] > SIZE_MAX || !kp_mul_size(total, (size_t)shape[d], &total))
            return kp_fail(err, KP_EXIT_USAGE, "npy: shape is too large to address");
    }
    *bytes = total;
    return 0;
}

/* Python's tuple text: "()", "(5,)", "(2, 3)". */
static void shape_text(int ndim, const int64_t *shape, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "(");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap) snprintf(out + n, cap - n, "%s)", ndim == 1 ? "," : "");
}

int kp_npy_header(const char *descr, int ndim, const int64_t *shape, unsigned char header[KP_NPY_HEADER_MAX],
                  size_t *header_bytes, size_t *data_bytes, kp_error *err) {
    *header_bytes = 0;
    size_t itemsize = descr_itemsize(descr);
    if (!itemsize)
        return kp_fail(err, KP_EXIT_USAGE, "npy: descr '%s' is not one kparity writes (<f2 <f4 <f8 <i2 <i4 <i8 "
                       "<u2 <u4 <u8 |u1 |i1 |b1)", descr ? descr : "(null)");
    if (shape_bytes(ndim, shape, itemsize, data_bytes, err)) return err->code;
    char shape_str[KP_NPY_MAX_DIMS * 24 + 8], dict[sizeof shape_str + 96];
    shape_text(ndim, shape, shape_str, sizeof shape_str);
    int dict_len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape_str);
    /* magic(6) + version(2) + u16 length(2) + dict + padding + '\n' is a multiple of 64, as numpy
     * writes it, so the data starts aligned. */
    size_t unpadded = 10 + (size_t)dict_len + 1;
    size_t header_len = (size_t)dict_len + (64 - unpadded % 64) % 64 + 1;
    if (10 + header_len > KP_NPY_HEADER_MAX || *data_bytes > SIZE_MAX - 10 - header_len)
        return kp_fail(err, KP_EXIT_USAGE, "npy: array too large");
    memcpy(header, npy_magic, 6);
    header[6] = 1;
    header[7] = 0;
    header[8] = (unsigned char)(header_len & 0xFF);
    header[9] = (unsigned char)(header_len >> 8);
    memcpy(header + 10, dict, (size_t)dict_len);
    memset(header + 10 + dict_len, ' ', header_len - (size_t)dict_len - 1);
    header[10 + header_len - 1] = '\n';
    *header_bytes = 10 + header_len;
    return 0;
}

int kp_npy_encode(const char *descr, int ndim, const int64_t *shape, const void *data, size_t data_bytes,
                  unsigned char **buf, size_t *len, kp_error *err) {
    *buf = NULL;
    *len = 0;
    unsigned char header[KP_NPY_HEADER_MAX];
    size_t header_bytes, expected;
    if (kp_npy_header(descr, ndim, shape, header, &header_bytes, &expected, err)) return err->code;
    if (expected != data_bytes)
        return kp_fail(err, KP_EXIT_USAGE, "npy: %zu data bytes given, but shape and descr '%s' need %zu",
                       data_bytes, descr, expected);
    if (data_bytes && !data) return kp_fail(err, KP_EXIT_USAGE, "npy: no data pointer for %zu bytes", data_bytes);
    const size_t total = header_bytes + data_bytes;
    unsigned char *out = kp_alloc(total, "npy file", err);
    if (!out) return err->code;
    memcpy(out, header, header_bytes);
    if (data_bytes) memcpy(out + header_bytes, data, data_bytes);
    *buf = out;
    *len = total;
    return 0;
}

int kp_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape, const void *data,
                 size_t data_bytes, kp_error *err) {
    unsigned char *buf;
    size_t len;
    if (kp_npy_encode(descr, ndim, shape, data, data_bytes, &buf, &len, err)) {
        kp_error_prefix(err, "%s: ", path);
        return err->code;
    }
    int rc = kp_write_file_atomic(path, buf, len, err);
    free(buf);
    return rc;
}

/* --- reading a header --- */

/* Position just after `'key':` (either quote style) in the header dict, or NULL. */
static const char *find_key(const char *header, const char *key) {
    char pattern[32];
    for (int q = 0; q < 2; q++) {
        snprintf(pattern, sizeof pattern, q ? "\"%s\"" : "'%s'", key);
        const char *p = strstr(header, pattern);
        if (!p) continue;
        p += strlen(pattern);
        while (*p == ' ') p++;
        if (*p != ':') return NULL;
        p++;
        while (*p == ' ') p++;
        return p;
    }
    return NULL;
}

static int parse_shape(const char *p, kp_npy_info *info, kp_error *err) {
    if (*p++ != '(') return kp_fail(err, KP_EXIT_USAGE, "npy: 'shape' is not a tuple");
    info->ndim = 0;
    for (;;) {
        while (*p == ' ') p++;
        if (*p == ')') return 0;
        if (!isdigit((unsigned char)*p)) return kp_fail(err, KP_EXIT_USAGE, "npy: 'shape' has a non-integer entry");
        if (info->ndim == KP_NPY_MAX_DIMS)
            return kp_fail(err, KP_EXIT_USAGE, "npy: more than %d dimensions", KP_NPY_MAX_DIMS);
        errno = 0;
        char *end;
        long long v = strtoll(p, &end, 10);
        if (errno == ERANGE) return kp_fail(err, KP_EXIT_USAGE, "npy: 'shape' entry out of range");
        info->shape[info->ndim++] = v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') p++;
        else if (*p != ')') return kp_fail(err, KP_EXIT_USAGE, "npy: 'shape' tuple is malformed");
    }
}

int kp_npy_decode(const unsigned char *buf, size_t len, kp_npy_info *info, kp_error *err) {
    memset(info, 0, sizeof *info);
    if (len < 10 || memcmp(buf, npy_magic, 6) != 0) return kp_fail(err, KP_EXIT_USAGE, "npy: no \\x93NUMPY magic");
    size_t prefix, header_len;
    if (buf[6] == 1 && buf[7] == 0) {
        prefix = 10;
        header_len = (size_t)buf[8] | (size_t)buf[9] << 8;
    } else if ((buf[6] == 2 || buf[6] == 3) && buf[7] == 0 && len >= 12) {
        prefix = 12;
        header_len = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    } else {
        return kp_fail(err, KP_EXIT_USAGE, "npy: format version %u.%u is not supported", buf[6], buf[7]);
    }
    if (header_len == 0 || header_len > len - prefix)
        return kp_fail(err, KP_EXIT_USAGE, "npy: header length %zu runs past the file (%zu bytes)", header_len, len);
    if (buf[prefix + header_len - 1] != '\n') return kp_fail(err, KP_EXIT_USAGE, "npy: header does not end in a newline");
    char *header = kp_alloc(header_len + 1, "npy header", err);
    if (!header) return err->code;
    memcpy(header, buf + prefix, header_len);
    header[header_len] = '\0';

    int rc = 0;
    const char *p = find_key(header, "descr"), *fo = find_key(header, "fortran_order"), *sh = find_key(header, "shape");
    if (!p || !fo || !sh || header[0] != '{') {
        rc = kp_fail(err, KP_EXIT_USAGE, "npy: header dict lacks descr, fortran_order or shape");
    } else if ((*p != '\'' && *p != '"') || !strchr(p + 1, *p) || (size_t)(strchr(p + 1, *p) - p - 1) >= sizeof info->descr) {
        rc = kp_fail(err, KP_EXIT_USAGE, "npy: 'descr' is not a short string");
    } else {
        size_t n = (size_t)(strchr(p + 1, *p) - p - 1);
        memcpy(info->descr, p + 1, n);
        info->descr[n] = '\0';
        info->itemsize = descr_itemsize(info->descr);
        if (!info->itemsize) rc = kp_fail(err, KP_EXIT_USAGE, "npy: descr '%s' is not supported (big-endian or unknown)", info->descr);
        else if (strncmp(fo, "False", 5) != 0) rc = kp_fail(err, KP_EXIT_USAGE, "npy: fortran_order True is not supported");
        else rc = parse_shape(sh, info, err);
    }
    free(header);
    if (rc) return rc;
    if (shape_bytes(info->ndim, info->shape, info->itemsize, &info->data_bytes, err)) return err->code;
    info->data_offset = prefix + header_len;
    if (len - info->data_offset != info->data_bytes)
        return kp_fail(err, KP_EXIT_USAGE, "npy: %zu data bytes after the header, shape and descr '%s' need %zu",
                       len - info->data_offset, info->descr, info->data_bytes);
    return 0;
}
