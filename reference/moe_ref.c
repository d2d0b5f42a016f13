/* moe_ref.c: the NVFP4 MoE's float64 reference (moe_ref.h). Three passes, each over independent items
 * on every core: (expert, 16 intermediate columns) for the first GEMM and the activation, (expert, 16
 * output columns) for the second, then one row at a time the sum over slots. Weight rows are
 * dequantized to float64 per item and dotted with 4 pairs x 2 rows at a time, each dot product in
 * 4 lanes (k mod 4) added in order at the end: an order fixed by K alone, which vector units of any
 * width follow bit for bit (no FMA: reference/ builds with -ffp-contract=off). */
#include "moe_ref.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_detmath.h"

#define COLS 16 /* weight rows an item dequantizes */
#define GQ 4    /* pairs a dot block takes */
#define GR 2    /* weight rows a dot block takes */

/* out[q * GR + r] = x[q] . w[r] over K (a multiple of 4), in 4 lanes added in order. */
KP_CLONES static void dot_block(const double *const x[GQ], const double *const w[GR], int64_t K, double out[GQ * GR]) {
    double acc[GQ * GR][4] = {{0}};
    for (int64_t k = 0; k < K; k += 4)
        for (int q = 0; q < GQ; q++)
            for (int r = 0; r < GR; r++)
                for (int l = 0; l < 4; l++) acc[q * GR + r][l] += x[q][k + l] * w[r][k + l];
    for (int i = 0; i < GQ * GR; i++) out[i] = (acc[i][0] + acc[i][1]) + (acc[i][2] + acc[i][3]);
}

typedef struct ref_job {
    const kp_moe_ref_in *in;
    int64_t w13_rows, pairs;
    int32_t *order;   /* [pairs]: pair indices by expert, each expert's in token order */
    int64_t *first;   /* [experts + 1] */
    double *act;      /* [pairs, inter] */
    double *y;        /* [pairs, hidden] */
    double *out;
    atomic_int failed;
} ref_job;

/* Rows of an NVFP4 tensor [N, K] as float64: code value times block scale, exact. Per block the 16 code
 * values are scaled once into a table, then each byte's two nibbles index it (low nibble first). */
static void dequant_rows(const uint8_t *codes, const uint8_t *scales, const int64_t *rows, int n, int64_t K, double *w) {
    double e2m1[16];
    for (int c = 0; c < 16; c++) e2m1[c] = (double)kp_e2m1_value((uint8_t)c);
    for (int i = 0; i < n; i++) {
        const uint8_t *c = codes + rows[i] * (K / 2), *s = scales + rows[i] * (K / 16);
        double *out = w + i * K;
        for (int64_t b = 0; b < K / 16; b++) {
            const double sf = (double)kp_e4m3_value(s[b]);
            double table[16];
            for (int v = 0; v < 16; v++) table[v] = e2m1[v] * sf;
            for (int j = 0; j < 8; j++) {
                const uint8_t byte = c[b * 8 + j];
                out[b * 16 + 2 * j] = table[byte & 15u];
                out[b * 16 + 2 * j + 1] = table[byte >> 4];
            }
        }
    }
}

static double global_apply(double dot, float g, kp_nvfp4_scale_dir dir) {
    return dir == KP_NVFP4_DIVIDE ? dot / (double)g : dot * (double)g;
}

/* Dots of the n inputs in[] (each K doubles) with the nw rows of w, into res[q * nw + r]. */
static void dots(const double *const *in, int64_t n, const double *w, int nw, int64_t K, double *res) {
    for (int64_t q0 = 0; q0 < n; q0 += GQ)
        for (int r0 = 0; r0 < nw; r0 += GR) {
            const double *x[GQ], *wr[GR];
            double o[GQ * GR];
            for (int q = 0; q < GQ; q++) x[q] = in[q0 + q < n ? q0 + q : n - 1];
            for (int r = 0; r < GR; r++) wr[r] = w + (r0 + r < nw ? r0 + r : nw - 1) * K;
            dot_block(x, wr, K, o);
            for (int q = 0; q < GQ && q0 + q < n; q++)
                for (int r = 0; r < GR && r0 + r < nw; r++) res[(q0 + q) * nw + r0 + r] = o[q * GR + r];
        }
}

/* Item (expert, column block) of a pass: the expert's pair count and the block's first column. */
static int64_t item_at(const ref_job *j, int64_t item, int64_t cols, int64_t *e, int64_t *c0) {
    const int64_t blocks = (cols + COLS - 1) / COLS;
    *e = item / blocks, *c0 = (item % blocks) * COLS;
    return j->first[*e + 1] - j->first[*e];
}

/* Pass 1: act[pair, i] for i in the item's columns. */
static void gemm1_item(void *ctx, int64_t item) {
    ref_job *j = ctx;
    const kp_moe_ref_in *in = j->in;
    const kp_moe_case *mc = in->mc;
    const int64_t H = mc->hidden, I = mc->inter;
    int64_t e, c0;
    const int64_t n = item_at(j, item, I, &e, &c0);
    if (n == 0) return;
    const int nc = (int)(I - c0 < COLS ? I - c0 : COLS), nw = mc->gated ? 2 * nc : nc;
    double *xd = malloc(sizeof *xd * (size_t)(n * H)), *w = malloc(sizeof *w * (size_t)(nw * H));
    double *res = malloc(sizeof *res * (size_t)(n * nw));
    const double **rows = malloc(sizeof *rows * (size_t)n);
    if (!xd || !w || !res || !rows) {
        atomic_store(&j->failed, 1);
        free(xd), free(w), free(res), free(rows);
        return;
    }
    const int32_t *pairs = j->order + j->first[e];
    for (int64_t q = 0; q < n; q++) {
        const float *x = in->x + (pairs[q] / mc->topk) * H;
        for (int64_t k = 0; k < H; k++) xd[q * H + k] = (double)x[k];
        rows[q] = xd + q * H;
    }
    int64_t wrows[2 * COLS];
    for (int i = 0; i < nc; i++) wrows[i] = c0 + i, wrows[nc + i] = I + c0 + i; /* gate rows, then up rows */
    dequant_rows(in->w13 + e * j->w13_rows * (H / 2), in->s13 + e * j->w13_rows * (H / 16), wrows, nw, H, w);
    dots(rows, n, w, nw, H, res);
    const float g = in->g13[e];
    for (int64_t q = 0; q < n; q++)
        for (int i = 0; i < nc; i++) {
            const double a = global_apply(res[q * nw + i], g, mc->scale_dir);
            double v;
            if (mc->gated) v = a / (1.0 + kp_exp_det(-a)) * global_apply(res[q * nw + nc + i], g, mc->scale_dir);
            else v = a > 0.0 ? a * a : 0.0;
            j->act[(int64_t)pairs[q] * I + c0 + i] = v;
        }
    free(xd), free(w), free(res), free(rows);
}

/* Pass 2: y[pair, h] for h in the item's columns. */
static void gemm2_item(void *ctx, int64_t item) {
    ref_job *j = ctx;
    const kp_moe_ref_in *in = j->in;
    const kp_moe_case *mc = in->mc;
    const int64_t H = mc->hidden, I = mc->inter;
    int64_t e, c0;
    const int64_t n = item_at(j, item, H, &e, &c0);
    if (n == 0) return;
    const int nw = (int)(H - c0 < COLS ? H - c0 : COLS);
    double *w = malloc(sizeof *w * (size_t)(nw * I)), *res = malloc(sizeof *res * (size_t)(n * nw));
    const double **rows = malloc(sizeof *rows * (size_t)n);
    if (!w || !res || !rows) {
        atomic_store(&j->failed, 1);
        free(w), free(res), free(rows);
        return;
    }
    const int32_t *pairs = j->order + j->first[e];
    for (int64_t q = 0; q < n; q++) rows[q] = j->act + (int64_t)pairs[q] * I;
    int64_t wrows[COLS];
    for (int i = 0; i < nw; i++) wrows[i] = c0 + i;
    dequant_rows(in->w2 + e * H * (I / 2), in->s2 + e * H * (I / 16), wrows, nw, I, w);
    dots(rows, n, w, nw, I, res);
    for (int64_t q = 0; q < n; q++)
        for (int i = 0; i < nw; i++) j->y[(int64_t)pairs[q] * H + c0 + i] = global_apply(res[q * nw + i], in->g2[e], mc->scale_dir);
    free(w), free(res), free(rows);
}

/* Pass 3: row t's sum over its slots, j ascending. */
static void combine_item(void *ctx, int64_t t) {
    ref_job *j = ctx;
    const kp_moe_case *mc = j->in->mc;
    const int64_t H = mc->hidden, K = mc->topk;
    for (int64_t h = 0; h < H; h++) {
        double s = 0.0;
        for (int64_t k = 0; k < K; k++) s += (double)j->in->weights[t * K + k] * j->y[(t * K + k) * H + h];
        j->out[t * H + h] = s;
    }
}

double kp_moe_reference_bytes(const kp_moe_case *mc, int64_t rows) {
    const double pairs = (double)rows * (double)mc->topk;
    return pairs * (double)(mc->inter + mc->hidden) * 8.0 + pairs * 4.0 + (double)(mc->experts + 1) * 8.0 +
           (double)kp_thread_count() * (64.0 * (double)mc->hidden * 8.0 + 2.0 * COLS * (double)(mc->hidden + mc->inter) * 8.0);
}

static int ids_valid(const kp_moe_ref_in *in, kp_error *err) {
    const kp_moe_case *mc = in->mc;
    for (int64_t i = 0; i < in->rows * mc->topk; i++)
        if (in->ids[i] < 0 || in->ids[i] >= mc->experts)
            return kp_fail(err, KP_EXIT_USAGE, "moe reference: ids[%lld] = %d is outside [0, %lld)", (long long)i,
                           in->ids[i], (long long)mc->experts);
    return 0;
}

/* The definition: the host on every core. */
static int host_reference(const kp_moe_ref_in *in, double *out, kp_error *err) {
    const kp_moe_case *mc = in->mc;
    ref_job j = {.in = in, .w13_rows = kp_moe_w13_rows(mc), .pairs = in->rows * mc->topk, .out = out};
    atomic_init(&j.failed, 0);
    if (ids_valid(in, err)) return err->code;
    j.order = kp_calloc((size_t)j.pairs, sizeof *j.order, "moe reference order", err);
    j.first = kp_calloc((size_t)mc->experts + 1, sizeof *j.first, "moe reference order", err);
    j.act = j.order && j.first ? kp_calloc((size_t)(j.pairs * mc->inter), sizeof *j.act, "moe reference activations", err) : NULL;
    j.y = j.act ? kp_calloc((size_t)(j.pairs * mc->hidden), sizeof *j.y, "moe reference expert outputs", err) : NULL;
    int rc = j.y ? 0 : err->code;
    if (!rc) { /* a counting sort by expert, token order within one */
        for (int64_t i = 0; i < j.pairs; i++) j.first[in->ids[i] + 1]++;
        for (int64_t e = 0; e < mc->experts; e++) j.first[e + 1] += j.first[e];
        int64_t *at = kp_calloc((size_t)mc->experts, sizeof *at, "moe reference order", err);
        if (!at) rc = err->code;
        for (int64_t i = 0; at && i < j.pairs; i++) j.order[j.first[in->ids[i]] + at[in->ids[i]]++] = (int32_t)i;
        free(at);
    }
    if (!rc) kp_parallel_for(mc->experts * ((mc->inter + COLS - 1) / COLS), gemm1_item, &j);
    if (!rc && !atomic_load(&j.failed)) kp_parallel_for(mc->experts * ((mc->hidden + COLS - 1) / COLS), gemm2_item, &j);
    if (!rc && !atomic_load(&j.failed)) kp_parallel_for(in->rows, combine_item, &j);
    if (!rc && atomic_load(&j.failed)) rc = kp_fail(err, KP_EXIT_ENV, "moe reference: out of host memory");
    free(j.order), free(j.first), free(j.act), free(j.y);
    return rc;
}

/* ---- the device hook and its guard ---- */

/* A hook, not a call: reference/ is plain C built without nvcc, and a CPU-only build links no CUDA symbol, so the
 * CUDA build hands its reference in (reference/cuda/reference_cuda.c, installed by the CLI). */
static kp_moe_reference_fn device_reference;

void kp_moe_reference_set_device(kp_moe_reference_fn fn) { device_reference = fn; }

int kp_moe_reference_guard_rows(int64_t rows, int64_t at[KP_MOE_REF_GUARD_ROWS]) {
    const int64_t want[KP_MOE_REF_GUARD_ROWS] = {0, rows / 2, rows - 1};
    int n = 0;
    for (int i = 0; i < KP_MOE_REF_GUARD_ROWS && rows > 0; i++)
        if (n == 0 || want[i] != at[n - 1]) at[n++] = want[i];
    return n;
}

/* The host on `sets` activation arrays, one call each. */
static int host_sets(const kp_moe_ref_in *in, int sets, const float *const x[], double *const out[], kp_error *err) {
    for (int s = 0; s < sets; s++) {
        kp_moe_ref_in one = *in;
        one.x = x[s];
        const int rc = host_reference(&one, out[s], err);
        if (rc) return rc;
    }
    return 0;
}

/* The guard: the guard rows, packed into a batch of their own, on the host; *differs when the device's rows differ
 * from them by a bit (the first named in *row, *set). 0 or an error class. */
static int guard_check(const kp_moe_ref_in *in, int sets, const float *const x[], double *const out[], bool *differs,
                       int64_t *row, int *set, kp_error *err) {
    const kp_moe_case *mc = in->mc;
    const int64_t H = mc->hidden, K = mc->topk;
    int64_t at[KP_MOE_REF_GUARD_ROWS];
    const int n = kp_moe_reference_guard_rows(in->rows, at);
    float *gx = kp_calloc((size_t)(sets * n * H) + (size_t)(n * K), sizeof *gx, "moe reference guard rows", err);
    int32_t *gids = gx ? kp_calloc((size_t)(n * K), sizeof *gids, "moe reference guard rows", err) : NULL;
    double *gout = gids ? kp_calloc((size_t)(sets * n * H), sizeof *gout, "moe reference guard rows", err) : NULL;
    if (!gout) return free(gx), free(gids), err->code;
    float *gw = gx + sets * n * H;
    const float *sx[2];
    double *sout[2];
    for (int s = 0; s < sets; s++) {
        for (int i = 0; i < n; i++) memcpy(gx + (s * n + i) * H, x[s] + at[i] * H, sizeof *gx * (size_t)H);
        sx[s] = gx + s * n * H, sout[s] = gout + s * n * H;
    }
    for (int i = 0; i < n; i++) {
        memcpy(gids + i * K, in->ids + at[i] * K, sizeof *gids * (size_t)K);
        memcpy(gw + i * K, in->weights + at[i] * K, sizeof *gw * (size_t)K);
    }
    kp_moe_ref_in sub = *in;
    sub.rows = n, sub.ids = gids, sub.weights = gw;
    int rc = host_sets(&sub, sets, sx, sout, err);
    *differs = false;
    for (int s = 0; !rc && s < sets; s++)
        for (int i = 0; !rc && !*differs && i < n; i++)
            if (memcmp(sout[s] + i * H, out[s] + at[i] * H, sizeof *gout * (size_t)H)) *row = at[i], *set = s, *differs = true;
    free(gx), free(gids), free(gout);
    return rc;
}

static const char *const on_device_names[KP_MOE_REF_GUARD_ROWS + 1] = {
    "cuda (host-identical; 0 guard rows)", "cuda (host-identical; 1 guard row checked on the host)",
    "cuda (host-identical; 2 guard rows checked on the host)", "cuda (host-identical; 3 guard rows checked on the host)"};

/* Every public entry: the device when one is set and can run here, guarded, else the host. */
static int reference_sets(const kp_moe_ref_in *in, int sets, const float *const x[], double *const out[], kp_error *err) {
    if (ids_valid(in, err)) return err->code;
    const char *where = "host";
    int rc = KP_EXIT_SKIP;
    if (device_reference && in->rows > 0) rc = device_reference(in, sets, x, out, err);
    if (rc == 0) {
        int64_t row = 0, at[KP_MOE_REF_GUARD_ROWS];
        int set = 0;
        bool differs = false;
        rc = guard_check(in, sets, x, out, &differs, &row, &set, err);
        if (!rc && differs) {
            const kp_moe_case *mc = in->mc;
            fprintf(stderr, "kparity: warning: moe(model=%s,hidden=%lld,inter=%lld,m=%lld,seed=%llu): the device "
                    "reference's row %lld (activation set %d) differs from the host's; computing the whole reference on "
                    "the host instead (a defect in the device reference: please report it)\n", mc->model ? mc->model : "?",
                    (long long)mc->hidden, (long long)mc->inter, (long long)in->rows, (unsigned long long)mc->seed,
                    (long long)row, set);
            where = "host (the device reference's guard rows differed)";
            rc = KP_EXIT_SKIP;
        } else if (rc == 0) where = on_device_names[kp_moe_reference_guard_rows(in->rows, at)];
    }
    if (rc == KP_EXIT_SKIP) rc = host_sets(in, sets, x, out, err); /* the host's bits are the definition either way */
    if (!rc && in->computed_on) *in->computed_on = where;
    return rc;
}

int kp_moe_reference(const kp_moe_ref_in *in, double *out, kp_error *err) {
    const float *x[1] = {in->x};
    double *o[1] = {out};
    return reference_sets(in, 1, x, o, err);
}
