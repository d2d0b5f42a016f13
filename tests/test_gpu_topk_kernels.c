/* test_gpu_topk_kernels.c: topk.radix_exact@cuda and topk.radix_buffer@cuda against the host port of
 * radix_exact (the oracle, kernels/host/topk_radix.c); exit 77 when no GPU or no CUDA impls.
 * CUDA state is created only inside tests: Criterion runs each test in a forked child, and a CUDA
 * context does not survive fork, so even the device count is read in a throwaway child. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <cuda_runtime_api.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kp_registry.h"
#include "../kernels/topk_radix.h"
#include "kp_gpu_test.h"
#include "kp_test_util.h"


static uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}
static float float_of(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}


/* ---- inputs ---- */

enum {
    KIND_RANDOM,   /* uniform in (-100, 100): distinct in practice */
    KIND_TIES,     /* 8 distinct values: the boundary falls inside a tie group */
    KIND_ZEROS,    /* +0 and -0 (one value) mixed, a few numbers either side */
    KIND_SPECIAL,  /* NaN of both signs and several payloads, +-inf, subnormals, FLT_MAX, numbers */
    KIND_DISTINCT, /* a permutation of width values in steps of 0.25: tie-free by construction */
    KIND_NARROW,   /* tie-free, every score in [1.0, 1.245): one coarse fp16 bin holds the row */
    KIND_MIXED     /* row r takes kind r % 5 (RANDOM .. DISTINCT) */
};
enum { WINDOWS_FULL, WINDOWS_MIXED };

/* rows x width scores with their windows. Columns [width, stride) hold +inf: no window covers them, so
 * a kernel that reads past width (or mixes up stride and width) selects them and is caught. */
typedef struct topk_in {
    int64_t rows, width, stride;
    float *scores;          /* [rows, stride], f32 */
    int32_t *starts, *ends; /* [rows] */
} topk_in;

static void permute(int64_t *perm, int64_t n, uint64_t *s) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = (int64_t)(kpt_splitmix(s) % (uint64_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
}

static void fill_row(float *x, int64_t width, int kind, uint64_t seed) {
    uint64_t s = seed;
    int64_t *perm = NULL;
    if (kind == KIND_DISTINCT || kind == KIND_NARROW) {
        perm = alloc_or_die(sizeof *perm * (size_t)width);
        permute(perm, width, &s);
    }
    /* NARROW: 1 + (perm * 64 + noise) ulps, below 1.245 for every width used here */
    cr_assert(kind != KIND_NARROW || (double)width * 64.0 < 0.245 * 8388608.0, "width %lld too wide for NARROW",
              (long long)width);
    for (int64_t i = 0; i < width; i++) {
        const double u = kpt_unit(&s);
        switch (kind) {
        case KIND_RANDOM: x[i] = (float)((u * 2.0 - 1.0) * 100.0); break;
        case KIND_TIES: x[i] = (float)(floor(u * 8.0) - 4.0) * 0.5f; break;
        case KIND_ZEROS:
            x[i] = u < 0.35 ? 0.0f : u < 0.7 ? -0.0f : u < 0.85 ? (float)(u * 1e-30) : (float)(-u * 3.0);
            break;
        case KIND_SPECIAL: {
            const uint32_t low = (uint32_t)(kpt_splitmix(&s) & 0x3fffffu);
            switch (kpt_splitmix(&s) % 16) {
            case 0: x[i] = float_of(0x7fc00000u | low); break;       /* quiet NaN */
            case 1: x[i] = float_of(0xffc00000u | low); break;       /* negative quiet NaN */
            case 2: x[i] = float_of(0x7f800000u | (low | 1u)); break; /* signalling NaN */
            case 3: x[i] = INFINITY; break;
            case 4: x[i] = -INFINITY; break;
            case 5: x[i] = float_of((u < 0.5 ? 0x80000000u : 0u) | (low | 1u)); break; /* subnormal */
            case 6: x[i] = u < 0.5 ? FLT_MAX : -FLT_MAX; break;
            case 7: x[i] = u < 0.5 ? 0.0f : -0.0f; break;
            default: x[i] = (float)((u * 2.0 - 1.0) * 10.0); break;
            }
            break;
        }
        case KIND_DISTINCT: x[i] = (float)(perm[i] - width / 2) * 0.25f; break;
        case KIND_NARROW:
            x[i] = float_of(0x3f800000u + (uint32_t)perm[i] * 64u + (uint32_t)(kpt_splitmix(&s) % 64u));
            break;
        default: cr_assert_fail("kind %d", kind);
        }
    }
    free(perm);
}

/* Row r's window, by mode: 0 the whole row, 1 a start past 0 and an end before width, 2 shorter than
 * k (possibly empty), 3 a start past 0 to the end of the row. */
static void pick_window(int mode, int64_t width, int32_t k, uint64_t *s, int32_t *start, int32_t *end) {
    const int64_t w = width;
    int64_t a = 0, b = w;
    if (mode == 1 && w > 2) {
        a = 1 + (int64_t)(kpt_splitmix(s) % (uint64_t)(w / 3 + 1));
        b = a + 1 + (int64_t)(kpt_splitmix(s) % (uint64_t)(w - a));
    } else if (mode == 2) {
        const int64_t cap = w < k ? w : k, len = (int64_t)(kpt_splitmix(s) % (uint64_t)cap); /* < k */
        a = (int64_t)(kpt_splitmix(s) % (uint64_t)(w - len + 1));
        b = a + len;
    } else if (mode == 3 && w > 1) {
        a = 1 + (int64_t)(kpt_splitmix(s) % (uint64_t)(w - 1));
    }
    *start = (int32_t)a, *end = (int32_t)b;
}

static topk_in make_input(int64_t rows, int64_t width, int64_t stride, int kind, int windows, int32_t k,
                          uint64_t seed) {
    topk_in in = {rows, width, stride, NULL, NULL, NULL};
    in.scores = alloc_or_die(sizeof(float) * (size_t)(rows * stride));
    in.starts = alloc_or_die(sizeof(int32_t) * (size_t)rows);
    in.ends = alloc_or_die(sizeof(int32_t) * (size_t)rows);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t r = 0; r < rows; r++) {
        float *x = in.scores + r * stride;
        fill_row(x, width, kind == KIND_MIXED ? (int)(r % 5) : kind, seed * 1000003u + (uint64_t)r);
        for (int64_t i = width; i < stride; i++) x[i] = INFINITY;
        const int mode = windows == WINDOWS_FULL ? 0 : (int)((r + (int64_t)seed) % 4);
        pick_window(mode, width, k, &s, &in.starts[r], &in.ends[r]);
    }
    return in;
}

static void free_input(topk_in *in) { free(in->scores), free(in->starts), free(in->ends); }

/* One call's outputs: [rows, k] each. */
typedef struct topk_out {
    int32_t *idx;
    float *val;
} topk_out;

static topk_out alloc_out(int64_t rows, int32_t k) {
    const size_t n = (size_t)(rows * k);
    return (topk_out){alloc_or_die(sizeof(int32_t) * n), alloc_or_die(sizeof(float) * n)};
}
static void free_out(topk_out *o) { free(o->idx), free(o->val); }

static int32_t row_count(const topk_in *in, int64_t r, int32_t k) {
    const int32_t len = in->ends[r] - in->starts[r];
    return len < k ? len : k;
}

/* ---- device plumbing ---- */

#define GUARD 64        /* entries past rows * k of each output that no call may write */
#define GUARD_BYTE 0xab /* every output byte before a call: an entry left unwritten shows */

/* Device copies of rows [row0, row0 + rows) of `in` and of one call's outputs. */
typedef struct topk_call {
    kp_topk_args args;
    float *d_scores, *d_val;
    int32_t *d_starts, *d_ends, *d_idx;
    void *d_ws;
} topk_call;

static topk_call gpu_prepare(const gpu *g, const kp_impl *impl, const topk_in *in, int64_t row0, int64_t rows,
                             int32_t k, int32_t index_base, int32_t fill) {
    topk_call c;
    memset(&c, 0, sizeof c);
    const size_t score_bytes = sizeof(float) * (size_t)(rows * in->stride);
    const size_t out_entries = (size_t)(rows * k) + GUARD;
    CUDA_OK(cudaMalloc((void **)&c.d_scores, score_bytes));
    CUDA_OK(cudaMalloc((void **)&c.d_starts, sizeof(int32_t) * (size_t)rows));
    CUDA_OK(cudaMalloc((void **)&c.d_ends, sizeof(int32_t) * (size_t)rows));
    CUDA_OK(cudaMalloc((void **)&c.d_idx, sizeof(int32_t) * out_entries));
    CUDA_OK(cudaMalloc((void **)&c.d_val, sizeof(float) * out_entries));
    CUDA_OK(cudaMemcpy(c.d_scores, in->scores + row0 * in->stride, score_bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(c.d_starts, in->starts + row0, sizeof(int32_t) * (size_t)rows, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(c.d_ends, in->ends + row0, sizeof(int32_t) * (size_t)rows, cudaMemcpyHostToDevice));
    c.args = (kp_topk_args){.scores = c.d_scores, .starts = c.d_starts, .ends = c.d_ends, .indices = c.d_idx,
                            .values = c.d_val, .rows = rows, .width = in->width, .row_stride = in->stride,
                            .k = k, .index_base = index_base, .fill = fill, .sm_count = g->sm_count,
                            .stream = g->stream};
    c.args.workspace_bytes = impl->workspace_bytes ? impl->workspace_bytes(&c.args) : 0;
    if (c.args.workspace_bytes) CUDA_OK(cudaMalloc(&c.d_ws, c.args.workspace_bytes));
    c.args.workspace = c.d_ws;
    char msg[256] = "";
    cr_assert_eq(impl->supports(&c.args, msg, sizeof msg), KP_RUN_OK, "%s refuses: %s", impl->name, msg);
    return c;
}

/* Outputs (and their guards) set to GUARD_BYTE, then one call, synchronized. */
static void gpu_launch(const gpu *g, const kp_impl *impl, topk_call *c) {
    const size_t out_entries = (size_t)(c->args.rows * c->args.k) + GUARD;
    CUDA_OK(cudaMemsetAsync(c->d_idx, GUARD_BYTE, sizeof(int32_t) * out_entries, g->stream));
    CUDA_OK(cudaMemsetAsync(c->d_val, GUARD_BYTE, sizeof(float) * out_entries, g->stream));
    char msg[512] = "";
    const int rc = impl->run(&c->args, msg, sizeof msg);
    cr_assert_eq(rc, KP_RUN_OK, "%s run: %s", impl->name, msg);
    CUDA_OK(cudaStreamSynchronize(g->stream));
    CUDA_OK(cudaGetLastError());
}

/* The outputs back, and the guards past them checked untouched. */
static void gpu_fetch(const kp_impl *impl, const topk_call *c, topk_out *out) {
    const size_t n = (size_t)(c->args.rows * c->args.k);
    CUDA_OK(cudaMemcpy(out->idx, c->d_idx, sizeof(int32_t) * n, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(out->val, c->d_val, sizeof(float) * n, cudaMemcpyDeviceToHost));
    unsigned char guard[2][GUARD * 4];
    CUDA_OK(cudaMemcpy(guard[0], c->d_idx + n, sizeof guard[0], cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(guard[1], c->d_val + n, sizeof guard[1], cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < sizeof guard[0]; i++)
        cr_assert(guard[0][i] == GUARD_BYTE && guard[1][i] == GUARD_BYTE,
                  "%s wrote past rows x k (%lld x %d) of an output, byte %zu of the guard", impl->name,
                  (long long)c->args.rows, c->args.k, i);
}

static void gpu_release(topk_call *c) {
    CUDA_OK(cudaFree(c->d_scores));
    CUDA_OK(cudaFree(c->d_starts));
    CUDA_OK(cudaFree(c->d_ends));
    CUDA_OK(cudaFree(c->d_idx));
    CUDA_OK(cudaFree(c->d_val));
    if (c->d_ws) CUDA_OK(cudaFree(c->d_ws));
}

/* One call on rows [row0, row0 + rows) of `in`, start to end. */
static void gpu_run(const gpu *g, const kp_impl *impl, const topk_in *in, int64_t row0, int64_t rows, int32_t k,
                    int32_t index_base, int32_t fill, topk_out *out) {
    topk_call c = gpu_prepare(g, impl, in, row0, rows, k, index_base, fill);
    gpu_launch(g, impl, &c);
    gpu_fetch(impl, &c, out);
    gpu_release(&c);
}

static void host_run(const kp_impl *impl, const topk_in *in, int64_t row0, int64_t rows, int32_t k,
                     int32_t index_base, int32_t fill, topk_out *out) {
    kp_topk_args a = {.scores = in->scores + row0 * in->stride, .starts = in->starts + row0, .ends = in->ends + row0,
                      .indices = out->idx, .values = out->val, .rows = rows, .width = in->width,
                      .row_stride = in->stride, .k = k, .index_base = index_base, .fill = fill};
    char msg[256] = "";
    cr_assert_eq(impl->run(&a, msg, sizeof msg), KP_RUN_OK, "%s: %s", impl->name, msg);
}

/* ---- judging ---- */

/* The first row (of rows x k outputs) where a and b differ in an index or a value's bits, -1 if none;
 * *slot receives the first differing entry of that row. */
static int64_t first_differing_row(const topk_out *a, const topk_out *b, int64_t rows, int32_t k, int32_t *slot) {
    for (int64_t r = 0; r < rows; r++)
        for (int32_t j = 0; j < k; j++) {
            const int64_t e = r * k + j;
            if (a->idx[e] != b->idx[e] || bits_of(a->val[e]) != bits_of(b->val[e])) {
                *slot = j;
                return r;
            }
        }
    return -1;
}

/* Why row r of an output (its [k] entries at idx, val) is not a well-formed answer, NULL if it is: the
 * first count entries index distinct entries of the window (per index_base) and carry their scores'
 * bits, in ascending index order when `ascending`; entries [count, k) hold fill and -inf. */
static const char *row_problem(const topk_in *in, int64_t r, int32_t k, int32_t index_base, int32_t fill,
                               const int32_t *idx, const float *val, bool ascending, char *why, size_t why_len) {
    const int32_t start = in->starts[r], end = in->ends[r], count = row_count(in, r, k);
    const int32_t lo = index_base == KP_TOPK_BASE_WINDOW ? 0 : start, hi = lo + (end - start);
    unsigned char *seen = alloc_or_die((size_t)in->width + 1);
    const char *problem = NULL;
    for (int32_t j = 0; j < count && !problem; j++) {
        if (idx[j] < lo || idx[j] >= hi) {
            snprintf(why, why_len, "entry %d: index %d outside the window [%d, %d)", j, idx[j], lo, hi);
            problem = why;
        } else if (seen[idx[j] - lo]++) {
            snprintf(why, why_len, "entry %d: index %d repeated", j, idx[j]);
            problem = why;
        } else if (bits_of(val[j]) != bits_of(in->scores[r * in->stride + start + (idx[j] - lo)])) {
            snprintf(why, why_len, "entry %d: value %08x is not index %d's score %08x", j, bits_of(val[j]), idx[j],
                     bits_of(in->scores[r * in->stride + start + (idx[j] - lo)]));
            problem = why;
        } else if (ascending && j > 0 && idx[j] <= idx[j - 1]) {
            snprintf(why, why_len, "entry %d: index %d after %d, not ascending", j, idx[j], idx[j - 1]);
            problem = why;
        }
    }
    for (int32_t j = count; j < k && !problem; j++)
        if (idx[j] != fill || bits_of(val[j]) != bits_of(-INFINITY)) {
            snprintf(why, why_len, "entry %d of the tail past count %d: (%d, %08x), not (fill %d, -inf)", j, count,
                     idx[j], bits_of(val[j]), fill);
            problem = why;
        }
    free(seen);
    return problem;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Whether the first n indices of a and b are the same set. */
static bool same_set(const int32_t *a, const int32_t *b, int32_t n) {
    int32_t *sa = alloc_or_die(sizeof *sa * (size_t)(n ? n : 1)), *sb = alloc_or_die(sizeof *sb * (size_t)(n ? n : 1));
    memcpy(sa, a, sizeof *sa * (size_t)n);
    memcpy(sb, b, sizeof *sb * (size_t)n);
    qsort(sa, (size_t)n, sizeof *sa, cmp_i32);
    qsort(sb, (size_t)n, sizeof *sb, cmp_i32);
    const bool same = memcmp(sa, sb, sizeof *sa * (size_t)n) == 0;
    free(sa), free(sb);
    return same;
}

/* Whether an exact answer's row splits a tie group: some key == T (the smallest selected key) was left
 * out of the window. Proves a tie probe reached the tie-breaking code. */
static bool boundary_split(const topk_in *in, int64_t r, int32_t k, const float *val) {
    const int32_t count = row_count(in, r, k);
    if (count == 0) return false;
    uint32_t t = UINT32_MAX, taken = 0, present = 0;
    for (int32_t j = 0; j < count; j++) t = kp_topk_key(val[j]) < t ? kp_topk_key(val[j]) : t;
    for (int32_t j = 0; j < count; j++) taken += kp_topk_key(val[j]) == t;
    for (int32_t i = in->starts[r]; i < in->ends[r]; i++) present += kp_topk_key(in->scores[r * in->stride + i]) == t;
    return present > taken;
}

/* ---- radix_exact@cuda: the host port's bits ---- */

/* Every combination of kind, width, k and row count; fill, index_base and padding vary with it, and
 * the rows' windows rotate through whole, offset, shorter than k (or empty) and tail. */
Test(gpu_topk, exact_matches_host_bit_for_bit, .timeout = 600) {
    static const int kinds[] = {KIND_RANDOM, KIND_TIES, KIND_ZEROS, KIND_SPECIAL};
    /* 16384 = KP_TOPK_BUFFER_CAP and 16 sweeps of 1024 threads; 16385 one past */
    static const int64_t widths[] = {1000, 16384, 16385, 65536};
    static const int32_t ks[] = {512, 1024, 2048};
    static const int64_t row_counts[] = {1, 32, 33, 64}; /* around KP_TOPK_EXACT_MAX_ROWS = 32 */
    gpu g = gpu_open();
    const kp_impl *cuda = impl_named("topk.radix_exact@cuda"), *host = impl_named("topk.radix_exact@host");
    int64_t split[KIND_SPECIAL + 1] = {0}, nan_out = 0, selected = 0;
    uint64_t combo = 0;
    for (size_t a = 0; a < sizeof kinds / sizeof kinds[0]; a++)
        for (size_t b = 0; b < sizeof widths / sizeof widths[0]; b++)
            for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++)
                for (size_t d = 0; d < sizeof row_counts / sizeof row_counts[0]; d++) {
                    combo++;
                    const int kind = kinds[a];
                    const int64_t width = widths[b], rows = row_counts[d], stride = width + (int64_t)(combo % 3) * 7;
                    const int32_t k = ks[c], fill = combo & 1 ? INT32_MAX : -1;
                    const int32_t base = combo & 2 ? KP_TOPK_BASE_WINDOW : KP_TOPK_BASE_ROW;
                    topk_in in = make_input(rows, width, stride, kind, WINDOWS_MIXED, k, combo);
                    topk_out want = alloc_out(rows, k), got = alloc_out(rows, k);
                    host_run(host, &in, 0, rows, k, base, fill, &want);
                    gpu_run(&g, cuda, &in, 0, rows, k, base, fill, &got);
                    int32_t slot = 0;
                    const int64_t r = first_differing_row(&got, &want, rows, k, &slot);
                    cr_assert_eq(r, -1,
                                 "kind %d width %lld k %d rows %lld fill %d base %d: row %lld entry %d is (%d, %08x) "
                                 "on %s, (%d, %08x) on %s",
                                 kind, (long long)width, k, (long long)rows, fill, base, (long long)r, slot,
                                 got.idx[r * k + slot], bits_of(got.val[r * k + slot]), cuda->name,
                                 want.idx[r * k + slot], bits_of(want.val[r * k + slot]), host->name);
                    for (int64_t q = 0; q < rows; q++) {
                        char why[160];
                        const char *p = row_problem(&in, q, k, base, fill, got.idx + q * k, got.val + q * k, true, why,
                                                    sizeof why);
                        cr_assert_null(p, "kind %d width %lld k %d rows %lld row %lld: %s", kind, (long long)width, k,
                                       (long long)rows, (long long)q, p);
                        split[kind] += boundary_split(&in, q, k, got.val + q * k);
                        for (int32_t j = 0; j < row_count(&in, q, k); j++) nan_out += isnan(got.val[q * k + j]);
                        selected += row_count(&in, q, k);
                    }
                    free_out(&want), free_out(&got), free_input(&in);
                }
    /* the probes reached what they probe */
    cr_assert_gt(selected, 0, "no entry was selected in the whole sweep");
    cr_assert_gt(split[KIND_TIES], 0, "no tie row split a tie group at its boundary");
    cr_assert_gt(split[KIND_ZEROS], 0, "no zero row split the +0/-0 group at its boundary");
    cr_assert_gt(nan_out, 0, "no NaN was selected from the special rows");
    cr_log_info("exact sweep: %lld entries selected, boundary splits: ties %lld, zeros %lld; %lld NaNs selected",
                (long long)selected, (long long)split[KIND_TIES], (long long)split[KIND_ZEROS], (long long)nan_out);
}

/* Rows as wide as radix_exact@cuda's tilings get (kernels/cuda/topk_radix.cu): 15 and 16 blocks a row
 * either side of 122,880 (15 x EXACT_TILE), chunks of EXACT_MAX_CACHED = 24,576 keys (kept in shared
 * memory) at 393,216 and one past it (read from global memory on every pass), and a million. Every
 * kind and window mode, both conventions and fills. */
Test(gpu_topk, exact_matches_host_on_wide_rows, .timeout = 300) {
    enum { ROWS = 5 };
    static const int64_t widths[] = {122880, 122881, 262144, 393216, 393217, 1000003};
    static const int32_t ks[] = {2048, 8192};
    gpu g = gpu_open();
    const kp_impl *cuda = impl_named("topk.radix_exact@cuda"), *host = impl_named("topk.radix_exact@host");
    int64_t selected = 0;
    uint64_t combo = 0;
    for (size_t b = 0; b < sizeof widths / sizeof widths[0]; b++)
        for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++) {
            combo++;
            const int64_t width = widths[b], stride = width + (int64_t)(combo % 3) * 5;
            const int32_t k = ks[c], fill = combo & 1 ? INT32_MAX : -1;
            const int32_t base = combo & 2 ? KP_TOPK_BASE_WINDOW : KP_TOPK_BASE_ROW;
            topk_in in = make_input(ROWS, width, stride, KIND_MIXED, WINDOWS_MIXED, k, 1100 + combo);
            topk_out want = alloc_out(ROWS, k), got = alloc_out(ROWS, k);
            host_run(host, &in, 0, ROWS, k, base, fill, &want);
            gpu_run(&g, cuda, &in, 0, ROWS, k, base, fill, &got);
            int32_t slot = 0;
            const int64_t r = first_differing_row(&got, &want, ROWS, k, &slot);
            cr_assert_eq(r, -1,
                         "width %lld k %d fill %d base %d: row %lld entry %d is (%d, %08x) on %s, (%d, %08x) on %s",
                         (long long)width, k, fill, base, (long long)r, slot, got.idx[r * k + slot],
                         bits_of(got.val[r * k + slot]), cuda->name, want.idx[r * k + slot],
                         bits_of(want.val[r * k + slot]), host->name);
            for (int64_t q = 0; q < ROWS; q++) {
                char why[160];
                const char *p = row_problem(&in, q, k, base, fill, got.idx + q * k, got.val + q * k, true, why,
                                            sizeof why);
                cr_assert_null(p, "width %lld k %d row %lld: %s", (long long)width, k, (long long)q, p);
                selected += row_count(&in, q, k);
            }
            free_out(&want), free_out(&got), free_input(&in);
        }
    cr_assert_gt(selected, 0, "no entry was selected in the whole sweep");
}

/* Every window shorter than k (some empty) under each fill and index_base: the tail holds fill and
 * -inf, on both impls (radix_buffer at 33 rows: its coarse path). */
Test(gpu_topk, short_and_empty_windows_fill_the_tail, .timeout = 120) {
    enum { ROWS = 33, WIDTH = 1000, K = 2048 };
    gpu g = gpu_open();
    const kp_impl *exact = impl_named("topk.radix_exact@cuda"), *buffer = impl_named("topk.radix_buffer@cuda");
    const kp_impl *host = impl_named("topk.radix_exact@host");
    topk_in in = make_input(ROWS, WIDTH, WIDTH + 5, KIND_DISTINCT, WINDOWS_FULL, K, 77);
    int64_t empty = 0;
    for (int64_t r = 0; r < ROWS; r++) {
        const int32_t len = (int32_t)((r * 29) % WIDTH);
        in.starts[r] = (int32_t)((r * 7) % (WIDTH - len + 1));
        in.ends[r] = in.starts[r] + len;
        empty += len == 0;
    }
    cr_assert_gt(empty, 0, "no empty window");
    static const int32_t fills[] = {-1, INT32_MAX};
    static const int32_t bases[] = {KP_TOPK_BASE_ROW, KP_TOPK_BASE_WINDOW};
    for (int f = 0; f < 2; f++)
        for (int b = 0; b < 2; b++) {
            topk_out want = alloc_out(ROWS, K), got = alloc_out(ROWS, K), loose = alloc_out(ROWS, K);
            host_run(host, &in, 0, ROWS, K, bases[b], fills[f], &want);
            gpu_run(&g, exact, &in, 0, ROWS, K, bases[b], fills[f], &got);
            gpu_run(&g, buffer, &in, 0, ROWS, K, bases[b], fills[f], &loose);
            int32_t slot = 0;
            const int64_t r = first_differing_row(&got, &want, ROWS, K, &slot);
            cr_assert_eq(r, -1, "fill %d base %d: %s row %lld entry %d differs from %s", fills[f], bases[b],
                         exact->name, (long long)r, slot, host->name);
            for (int64_t q = 0; q < ROWS; q++) {
                char why[160];
                const char *p = row_problem(&in, q, K, bases[b], fills[f], got.idx + q * K, got.val + q * K, true,
                                            why, sizeof why);
                cr_assert_null(p, "%s fill %d base %d row %lld: %s", exact->name, fills[f], bases[b], (long long)q, p);
                p = row_problem(&in, q, K, bases[b], fills[f], loose.idx + q * K, loose.val + q * K, false, why,
                                sizeof why);
                cr_assert_null(p, "%s fill %d base %d row %lld: %s", buffer->name, fills[f], bases[b], (long long)q, p);
                cr_assert(same_set(loose.idx + q * K, want.idx + q * K, row_count(&in, q, K)),
                          "%s fill %d base %d row %lld: not the exact set", buffer->name, fills[f], bases[b],
                          (long long)q);
            }
            free_out(&want), free_out(&got), free_out(&loose);
        }
    free_input(&in);
}

/* A row's bits do not depend on the rows that share its launch: 64 rows, and the same rows in batches
 * of 1, 32, 33 and 64 (32 and 33 straddle KP_TOPK_EXACT_MAX_ROWS, radix_buffer's dispatch). */
Test(gpu_topk, exact_row_bits_do_not_depend_on_batch, .timeout = 300) {
    enum { ROWS = 64, WIDTH = 16385 };
    static const int64_t batches[] = {1, 32, 33, 64};
    static const int32_t ks[] = {512, 2048};
    gpu g = gpu_open();
    const kp_impl *cuda = impl_named("topk.radix_exact@cuda"), *host = impl_named("topk.radix_exact@host");
    for (int c = 0; c < 2; c++) {
        const int32_t k = ks[c], base = c ? KP_TOPK_BASE_WINDOW : KP_TOPK_BASE_ROW;
        topk_in in = make_input(ROWS, WIDTH, WIDTH + 3, KIND_MIXED, WINDOWS_MIXED, k, 300 + (uint64_t)c);
        topk_out whole = alloc_out(ROWS, k), want = alloc_out(ROWS, k), part = alloc_out(ROWS, k);
        gpu_run(&g, cuda, &in, 0, ROWS, k, base, -1, &whole);
        host_run(host, &in, 0, ROWS, k, base, -1, &want);
        int32_t slot = 0;
        int64_t r = first_differing_row(&whole, &want, ROWS, k, &slot);
        cr_assert_eq(r, -1, "k %d: %s row %lld entry %d differs from %s", k, cuda->name, (long long)r, slot,
                     host->name);
        for (int b = 0; b < 4; b++)
            for (int64_t row0 = 0; row0 < ROWS; row0 += batches[b]) {
                const int64_t n = ROWS - row0 < batches[b] ? ROWS - row0 : batches[b];
                gpu_run(&g, cuda, &in, row0, n, k, base, -1, &part);
                const topk_out here = {whole.idx + row0 * k, whole.val + row0 * k};
                r = first_differing_row(&part, &here, n, k, &slot);
                cr_assert_eq(r, -1, "k %d: row %lld run in a batch of %lld (rows %lld..%lld) differs at entry %d from "
                             "the same row in a batch of %d", k, (long long)(row0 + r), (long long)n, (long long)row0,
                             (long long)(row0 + n - 1), slot, ROWS);
            }
        free_out(&whole), free_out(&want), free_out(&part), free_input(&in);
    }
}

/* Five calls on the same buffers give the same bits, on rows made of tie groups (where an order-
 * dependent pick would show). The incumbent's repeats are counted, not judged. */
Test(gpu_topk, exact_repeat_calls_are_bit_identical, .timeout = 300) {
    enum { ROWS = 64, WIDTH = 65536, K = 2048, CALLS = 5 };
    gpu g = gpu_open();
    const kp_impl *names[] = {impl_named("topk.radix_exact@cuda"), impl_named("topk.radix_buffer@cuda")};
    topk_in in = make_input(ROWS, WIDTH, WIDTH, KIND_TIES, WINDOWS_MIXED, K, 500);
    for (int n = 0; n < 2; n++) {
        const kp_impl *cuda = names[n];
        topk_out first = alloc_out(ROWS, K), again = alloc_out(ROWS, K);
        topk_call c = gpu_prepare(&g, cuda, &in, 0, ROWS, K, KP_TOPK_BASE_ROW, -1);
        gpu_launch(&g, cuda, &c);
        gpu_fetch(cuda, &c, &first);
        int differing_calls = 0;
        for (int call = 1; call < CALLS; call++) {
            gpu_launch(&g, cuda, &c);
            gpu_fetch(cuda, &c, &again);
            int32_t slot = 0;
            const int64_t r = first_differing_row(&again, &first, ROWS, K, &slot);
            if (n == 0)
                cr_assert_eq(r, -1, "%s call %d: row %lld entry %d differs from call 1", cuda->name, call + 1,
                             (long long)r, slot);
            differing_calls += r >= 0;
        }
        if (n == 1)
            cr_log_info("%s: %d of %d repeat calls differ from the first (arrival order)", cuda->name, differing_calls,
                        CALLS - 1);
        gpu_release(&c);
        free_out(&first), free_out(&again);
    }
    free_input(&in);
}

/* ---- radix_buffer@cuda: the exact set where nothing is tied or dropped ---- */

/* Tie-free rows: at <= KP_TOPK_EXACT_MAX_ROWS rows (the exact descent) and above it (the coarse path;
 * no fp16 bin of these rows holds more than 4096 entries, under KP_TOPK_BUFFER_CAP) the set is the
 * exact answer's, with no duplicate and no index outside the window. */
Test(gpu_topk, buffer_returns_the_exact_set_without_ties_or_overflow, .timeout = 300) {
    static const int64_t row_counts[] = {1, 32, 33, 64};
    static const int64_t widths[] = {1000, 16384, 65536};
    static const int32_t ks[] = {512, 2048};
    gpu g = gpu_open();
    const kp_impl *cuda = impl_named("topk.radix_buffer@cuda"), *host = impl_named("topk.radix_exact@host");
    uint64_t combo = 0;
    for (size_t a = 0; a < sizeof row_counts / sizeof row_counts[0]; a++)
        for (size_t b = 0; b < sizeof widths / sizeof widths[0]; b++)
            for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++) {
                combo++;
                const int64_t rows = row_counts[a], width = widths[b];
                const int32_t k = ks[c], fill = combo & 1 ? -1 : INT32_MAX;
                const int32_t base = combo & 2 ? KP_TOPK_BASE_ROW : KP_TOPK_BASE_WINDOW;
                topk_in in = make_input(rows, width, width + 1, KIND_DISTINCT, WINDOWS_MIXED, k, 700 + combo);
                topk_out want = alloc_out(rows, k), got = alloc_out(rows, k);
                host_run(host, &in, 0, rows, k, base, fill, &want);
                gpu_run(&g, cuda, &in, 0, rows, k, base, fill, &got);
                for (int64_t r = 0; r < rows; r++) {
                    char why[160];
                    const char *p = row_problem(&in, r, k, base, fill, got.idx + r * k, got.val + r * k, false, why,
                                                sizeof why);
                    cr_assert_null(p, "%s rows %lld width %lld k %d row %lld: %s", cuda->name, (long long)rows,
                                   (long long)width, k, (long long)r, p);
                    cr_assert(same_set(got.idx + r * k, want.idx + r * k, row_count(&in, r, k)),
                              "%s rows %lld width %lld k %d row %lld: not the exact set of %s", cuda->name,
                              (long long)rows, (long long)width, k, (long long)r, host->name);
                }
                free_out(&want), free_out(&got), free_input(&in);
            }
}

/* 33 rows (the coarse path) of whole windows whose every score lies in [1.0, 1.245), so one fp16 bin
 * holds the whole row: of `width` entries KP_TOPK_BUFFER_CAP are buffered. Returns how many rows' sets
 * differ from the exact answer, after checking every row is well formed. */
static int64_t coarse_rows_differing(int64_t width, uint64_t seed) {
    enum { ROWS = 33, K = 2048 };
    gpu g = gpu_open();
    const kp_impl *cuda = impl_named("topk.radix_buffer@cuda"), *host = impl_named("topk.radix_exact@host");
    topk_in in = make_input(ROWS, width, width, KIND_NARROW, WINDOWS_FULL, K, seed);
    const uint32_t bin = kp_topk_coarse_bin(in.scores[0]);
    for (int64_t i = 0; i < ROWS * width; i++)
        cr_assert_eq(kp_topk_coarse_bin(in.scores[i]), bin, "score %lld (%a) is outside the one coarse bin",
                     (long long)i, (double)in.scores[i]);
    topk_out want = alloc_out(ROWS, K), got = alloc_out(ROWS, K);
    host_run(host, &in, 0, ROWS, K, KP_TOPK_BASE_ROW, -1, &want);
    gpu_run(&g, cuda, &in, 0, ROWS, K, KP_TOPK_BASE_ROW, -1, &got);
    int64_t differ = 0;
    for (int64_t r = 0; r < ROWS; r++) {
        char why[160];
        const char *p = row_problem(&in, r, K, KP_TOPK_BASE_ROW, -1, got.idx + r * K, got.val + r * K, false, why,
                                    sizeof why);
        cr_assert_null(p, "%s width %lld row %lld: %s", cuda->name, (long long)width, (long long)r, p);
        differ += !same_set(got.idx + r * K, want.idx + r * K, K);
    }
    free_out(&want), free_out(&got), free_input(&in);
    return differ;
}

Test(gpu_topk, buffer_coarse_bin_at_capacity_returns_the_exact_set, .timeout = 120) {
    const int64_t differ = coarse_rows_differing(KP_TOPK_BUFFER_CAP, 900);
    cr_assert_eq(differ, 0, "%lld of 33 rows lost an entry with the bin exactly at the buffer's %d", (long long)differ,
                 KP_TOPK_BUFFER_CAP);
}

/* The planted overflow: 128 entries past the buffer are dropped per row; each is one of the top 2048
 * with probability 2048 / 16512, so a row keeps its exact set with probability about 4e-8. */
Test(gpu_topk, buffer_coarse_bin_past_capacity_drops_entries, .timeout = 120) {
    const int64_t differ = coarse_rows_differing(KP_TOPK_BUFFER_CAP + 128, 901);
    cr_assert_gt(differ, 0, "no row of 33 lost an entry with %d entries in a bin of the buffer's %d",
                 KP_TOPK_BUFFER_CAP + 128, KP_TOPK_BUFFER_CAP);
    cr_log_info("topk.radix_buffer@cuda at width %d: %lld of 33 rows differ from the exact set",
                KP_TOPK_BUFFER_CAP + 128, (long long)differ);
}

/* ---- arguments, and the judges' own controls ---- */

/* What the host ports refuse, the CUDA impls refuse with the same message under their own name. */
Test(gpu_topk, bad_args_are_refused_like_the_host_port, .timeout = 60) {
    static const char *const pairs[][2] = {{"topk.radix_exact@cuda", "topk.radix_exact@host"},
                                           {"topk.radix_buffer@cuda", "topk.radix_buffer@host"}};
    float score = 1.0f, value = 0.0f;
    int32_t start = 0, end = 1, index = 0;
    const kp_topk_args ok = {.scores = &score, .starts = &start, .ends = &end, .indices = &index, .values = &value,
                             .rows = 1, .width = 1, .row_stride = 1, .k = 1, .index_base = KP_TOPK_BASE_ROW,
                             .fill = -1};
    kp_topk_args bad[8];
    for (int i = 0; i < 8; i++) bad[i] = ok;
    bad[0].rows = 0;
    bad[1].width = 0;
    bad[2].width = (int64_t)INT32_MAX + 1, bad[2].row_stride = (int64_t)INT32_MAX + 1;
    bad[3].row_stride = 0;
    bad[4].k = 0;
    bad[5].k = KP_TOPK_MAX_K + 1;
    bad[6].fill = 0;
    bad[7].index_base = 2;
    for (int n = 0; n < 2; n++) {
        const kp_impl *cuda = impl_named(pairs[n][0]), *host = impl_named(pairs[n][1]);
        cr_assert_eq(cuda->abi, KP_ABI_VERSION);
        cr_assert_eq(cuda->memory, KP_MEMORY_CUDA);
        cr_assert_str_eq(cuda->family, "topk");
        char msg[256] = "";
        cr_assert_eq(cuda->supports(&ok, msg, sizeof msg), KP_RUN_OK, "%s refuses valid args: %s", cuda->name, msg);
        for (int i = 0; i < 8; i++) {
            char want[256] = "", got[256] = "", ran[256] = "";
            cr_assert_eq(host->supports(&bad[i], want, sizeof want), KP_RUN_NOT_SUPPORTED, "%s case %d", host->name, i);
            cr_assert_eq(cuda->supports(&bad[i], got, sizeof got), KP_RUN_NOT_SUPPORTED, "%s case %d", cuda->name, i);
            cr_assert_eq(cuda->run(&bad[i], ran, sizeof ran), KP_RUN_NOT_SUPPORTED, "%s run case %d", cuda->name, i);
            char *at = strstr(want, "@host");
            cr_assert_not_null(at, "%s case %d: message '%s' does not name it", host->name, i, want);
            memcpy(at, "@cuda", 5);
            cr_assert_str_eq(got, want, "%s case %d", cuda->name, i);
            cr_assert_str_eq(ran, want, "%s run case %d", cuda->name, i);
        }
    }
}

/* Each judge above catches the defect it is there for, planted into a host answer. */
Test(gpu_topk, judges_catch_planted_defects, .timeout = 60) {
    enum { ROWS = 2, WIDTH = 1000, K = 512 };
    const kp_impl *host = impl_named("topk.radix_exact@host");
    topk_in in = make_input(ROWS, WIDTH, WIDTH, KIND_DISTINCT, WINDOWS_FULL, K, 42);
    topk_out want = alloc_out(ROWS, K), bad = alloc_out(ROWS, K);
    host_run(host, &in, 0, ROWS, K, KP_TOPK_BASE_ROW, -1, &want);
    char why[160];
    int32_t slot = 0;
    cr_assert_null(row_problem(&in, 1, K, KP_TOPK_BASE_ROW, -1, want.idx + K, want.val + K, true, why, sizeof why));
#define RESET() \
    (memcpy(bad.idx, want.idx, sizeof(int32_t) * ROWS * K), memcpy(bad.val, want.val, sizeof(float) * ROWS * K))
    RESET(); /* a value's last bit */
    bad.val[K + 7] = float_of(bits_of(bad.val[K + 7]) ^ 1u);
    cr_assert_eq(first_differing_row(&bad, &want, ROWS, K, &slot), 1);
    cr_assert_eq(slot, 7);
    cr_assert_not_null(row_problem(&in, 1, K, KP_TOPK_BASE_ROW, -1, bad.idx + K, bad.val + K, true, why, sizeof why));
    RESET(); /* two entries swapped: the same set, not the same bits or order */
    int32_t ti = bad.idx[K + 3];
    float tv = bad.val[K + 3];
    bad.idx[K + 3] = bad.idx[K + 4], bad.val[K + 3] = bad.val[K + 4], bad.idx[K + 4] = ti, bad.val[K + 4] = tv;
    cr_assert_eq(first_differing_row(&bad, &want, ROWS, K, &slot), 1);
    cr_assert(same_set(bad.idx + K, want.idx + K, K));
    cr_assert_not_null(row_problem(&in, 1, K, KP_TOPK_BASE_ROW, -1, bad.idx + K, bad.val + K, true, why, sizeof why));
    cr_assert_null(row_problem(&in, 1, K, KP_TOPK_BASE_ROW, -1, bad.idx + K, bad.val + K, false, why, sizeof why));
    RESET(); /* a repeated entry */
    bad.idx[5] = bad.idx[6], bad.val[5] = bad.val[6];
    cr_assert_not_null(row_problem(&in, 0, K, KP_TOPK_BASE_ROW, -1, bad.idx, bad.val, false, why, sizeof why));
    cr_assert(!same_set(bad.idx, want.idx, K));
    RESET(); /* an index past the window */
    in.ends[0] = WIDTH - 1;
    bad.idx[0] = WIDTH - 1;
    cr_assert_not_null(row_problem(&in, 0, K, KP_TOPK_BASE_ROW, -1, bad.idx, bad.val, false, why, sizeof why));
    in.ends[0] = WIDTH;
    in.ends[0] = K - 1; /* a tail entry left unwritten */
    host_run(host, &in, 0, 1, K, KP_TOPK_BASE_ROW, -1, &want);
    RESET();
    cr_assert_null(row_problem(&in, 0, K, KP_TOPK_BASE_ROW, -1, bad.idx, bad.val, true, why, sizeof why));
    bad.val[K - 1] = 0.0f;
    cr_assert_not_null(row_problem(&in, 0, K, KP_TOPK_BASE_ROW, -1, bad.idx, bad.val, true, why, sizeof why));
#undef RESET
    /* a row of one value splits its group; a tie-free row cannot */
    for (int64_t i = 0; i < WIDTH; i++) in.scores[WIDTH + i] = 0.5f;
    host_run(host, &in, 1, 1, K, KP_TOPK_BASE_ROW, -1, &bad);
    cr_assert(boundary_split(&in, 1, K, bad.val));
    in.ends[0] = WIDTH;
    host_run(host, &in, 0, 1, K, KP_TOPK_BASE_ROW, -1, &bad);
    cr_assert(!boundary_split(&in, 0, K, bad.val));
    free_out(&want), free_out(&bad), free_input(&in);
}

int main(int argc, char *argv[]) { return kpt_gpu_main(argc, argv, "test_gpu_topk_kernels", "topk.radix_exact@cuda"); }
