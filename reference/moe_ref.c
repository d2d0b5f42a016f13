/* moe_ref.c: the NVFP4 MoE's float64 reference (moe_ref.h), on one set of activations or on two sharing every
 * dequantized weight block. Each dot product sums in 4 lanes (k mod 4, each in k order) added in order at the end.
 *
 * Pass 1, items (expert, a group of W13 row blocks) on every core: the expert's rows of x, packed in panels of 4,
 * against each block, then the activation, into the expert's rows of act. Pass 2, one span of output columns at a
 * time: items (expert, a block of W2 rows) give y for the expert's rows, then each row's sum over its slots.
 * The 4 lanes of one dot product are one vector and vector arithmetic is lane-wise, so each lane keeps the scalar
 * order bit for bit on any ISA (no FMA: reference/ builds with -ffp-contract=off). A block is dequantized KC steps
 * at a time into a buffer that stays in L1 while every row uses it; the accumulators wait in memory between chunks,
 * which leaves each lane's order as it was. The public entries hand both sets to a device reference in one call when
 * the CUDA build installed one (its rows guarded by the host's), else compute them here (the definition). */
#include "moe_ref.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_detmath.h"

/* The 4 lanes of one dot product: lane l sums the products at k = l mod 4; one step is 4 consecutive k. */
typedef double v4d __attribute__((vector_size(32)));
typedef double v2d __attribute__((vector_size(16)));
typedef float v4f __attribute__((vector_size(16)));

#define NB 24  /* weight rows a block holds: a multiple of every tile's R (3, 4, 6, 12) */
#define KC 32  /* steps of a block dequantized at once: NB x KC x 32 bytes, 24 KiB, stays in L1 */
#define GB 4   /* weight blocks a pass-1 item takes, its rows of x packed once for them */
#define RC 128 /* rows a pass takes at once, so scratch is bounded whatever an expert's load */
#define SETS 2 /* activation sets one call takes at most */

typedef struct ref_tables {
    v2d pair[256]; /* a code byte's two E2M1 values, low nibble first */
    double e4m3[256];
} ref_tables;

typedef struct ref_job {
    const kp_moe_ref_in *in;
    const float *x[SETS];
    double *out[SETS];
    int sets;
    int64_t w13_rows, pairs;
    int32_t *order;  /* [pairs]: pair indices by expert, each expert's in token order */
    int64_t *first;  /* [experts + 1]: where each expert's pairs start in order */
    int64_t *act_at; /* [experts + 1]: where each expert's act panels start, counted in panels */
    v4d *act;        /* per expert [ceil(sets * n / 4) panels][inter / 4 steps][4 rows]: row s * n + q, set s, pair q */
    int64_t span, h_span; /* pass 2's span of output columns and where the current one starts */
    double *y;            /* [sets, pairs, span]: the current span's expert outputs */
    ref_tables tab;
    atomic_int failed;
} ref_job;

/* A worker's: an item's rows of x in panels (pass 1), a dequantized chunk, the accumulators; RC rows at most. */
typedef struct ref_scratch {
    v4d *xp;  /* [RC / 4 panels][K / 4][4] */
    v4d *w;   /* [KC][NB] */
    v4d *acc; /* [RC][NB] */
} ref_scratch;

/* acc[q * NB + r] += a chunk of rows q of a panel x ([steps][4], from the chunk's first step) and slots r of w
 * ([steps][NB]), for q < Q, r < R. Q and R are constants at every call, so the tile lives in registers. */
static inline __attribute__((always_inline)) void tile(const v4d *x, const v4d *w, int64_t steps, int Q, int R, v4d *acc) {
    v4d a[4][12];
    for (int q = 0; q < Q; q++)
        for (int r = 0; r < R; r++) a[q][r] = acc[q * NB + r];
    for (int64_t s = 0; s < steps; s++) {
        v4d xq[4];
        for (int q = 0; q < Q; q++) xq[q] = x[s * 4 + q];
        for (int r = 0; r < R; r++) {
            const v4d wr = w[s * NB + r];
            for (int q = 0; q < Q; q++) a[q][r] += xq[q] * wr;
        }
    }
    for (int q = 0; q < Q; q++)
        for (int r = 0; r < R; r++) acc[q * NB + r] = a[q][r];
}

/* acc [N, NB] += steps [s0, s0 + steps) of the N rows of x (panels of 4 rows, K4 steps each, the last panel
 * partial) with w, those steps of NB weight rows. A tile is Q x 12 / Q: 12 accumulators however few rows a panel
 * has left, within 16 vector registers (SSE2, AVX2). The ref_ prefix of the two target_clones functions: clang makes
 * a clone's resolver a global symbol even for a static function (kernels/host/moe.c has a dequant_chunk too). */
KP_CLONES static void ref_dot_chunk(const v4d *x, int64_t N, int64_t K4, int64_t s0, const v4d *w, int64_t steps, v4d *acc) {
    for (int64_t q0 = 0; q0 < N; q0 += 4) {
        const v4d *panel = x + q0 * K4 + s0 * 4;
        v4d *aq = acc + q0 * NB;
        switch (N - q0 < 4 ? N - q0 : 4) {
        case 4:
            for (int r0 = 0; r0 < NB; r0 += 3) tile(panel, w + r0, steps, 4, 3, aq + r0);
            break;
        case 3:
            for (int r0 = 0; r0 < NB; r0 += 4) tile(panel, w + r0, steps, 3, 4, aq + r0);
            break;
        case 2:
            for (int r0 = 0; r0 < NB; r0 += 6) tile(panel, w + r0, steps, 2, 6, aq + r0);
            break;
        default:
            for (int r0 = 0; r0 < NB; r0 += 12) tile(panel, w + r0, steps, 1, 12, aq + r0);
            break;
        }
    }
}

/* Two halves as one vector: one load and one insert where the builtin exists (gcc 12, clang). */
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define JOIN(lo, hi) __builtin_shufflevector((lo), (hi), 0, 1, 2, 3)
#endif
#endif
#ifndef JOIN
#define JOIN(lo, hi) ((v4d){(lo)[0], (lo)[1], (hi)[0], (hi)[1]})
#endif

/* Steps [s0, s0 + steps) of NVFP4 weight rows as float64 into w ([steps][NB]): slot i is the row whose codes and
 * scales start at codes[i] and scales[i], or zero where codes[i] is NULL. Each value is code value times block scale,
 * exact in float64 (the products a scalar dequantization makes, 4 at a time). */
KP_CLONES static void ref_dequant_chunk(const ref_tables *t, const uint8_t *const codes[NB],
                                        const uint8_t *const scales[NB], int64_t s0, int64_t steps, v4d *w) {
    for (int64_t b = s0 / 4; b < (s0 + steps) / 4; b++) { /* 16 k, 4 steps, one scale */
        v4d *dst = w + (b * 4 - s0) * NB;
        for (int i = 0; i < NB; i++) {
            if (!codes[i]) {
                for (int q = 0; q < 4; q++) dst[q * NB + i] = (v4d){0, 0, 0, 0};
                continue;
            }
            const uint8_t *c = codes[i] + b * 8;
            const double sf = t->e4m3[scales[i][b]];
            const v4d sfv = {sf, sf, sf, sf};
            for (int q = 0; q < 4; q++) dst[q * NB + i] = JOIN(t->pair[c[2 * q]], t->pair[c[2 * q + 1]]) * sfv;
        }
    }
}

/* acc [N, NB] = the dots of the N rows of x (panels, K4 steps) with the NB weight rows, over all K4 steps. */
static void dot_rows(const ref_job *j, const ref_scratch *sc, const v4d *x, int64_t N, int64_t K4,
                     const uint8_t *const codes[NB], const uint8_t *const scales[NB]) {
    memset(sc->acc, 0, sizeof *sc->acc * (size_t)(N * NB));
    for (int64_t s0 = 0; s0 < K4; s0 += KC) {
        const int64_t steps = K4 - s0 < KC ? K4 - s0 : KC;
        ref_dequant_chunk(&j->tab, codes, scales, s0, steps, sc->w);
        ref_dot_chunk(x, N, K4, s0, sc->w, steps, sc->acc);
    }
}

/* Row r's dot with slot i: its lanes added in order. */
static double dot_at(const ref_scratch *sc, int64_t r, int64_t i) {
    const v4d a = sc->acc[r * NB + i];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static double global_apply(double dot, float g, kp_nvfp4_scale_dir dir) {
    return dir == KP_NVFP4_DIVIDE ? dot / (double)g : dot * (double)g;
}

static void *aligned(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

/* A worker's scratch for RC rows, with xp when K is not 0. */
static int scratch_new(ref_scratch *sc, int64_t K) {
    sc->xp = K ? aligned(sizeof *sc->xp * (size_t)(RC * K / 4)) : NULL;
    sc->w = aligned(sizeof *sc->w * (size_t)(KC * NB)), sc->acc = aligned(sizeof *sc->acc * (size_t)(RC * NB));
    return (sc->xp || !K) && sc->w && sc->acc;
}

static void scratch_free(ref_scratch *sc) { free(sc->xp), free(sc->w), free(sc->acc); }

/* Pass 1: act for expert e's rows and the item's blocks of intermediate columns (gated: 12 gate rows and the 12
 * up rows of the same columns a block; relu^2: 24 up rows). */
static void gemm1_item(ref_job *j, const ref_scratch *sc, int64_t item) {
    const kp_moe_ref_in *in = j->in;
    const kp_moe_case *mc = in->mc;
    const int64_t H = mc->hidden, I = mc->inter, H4 = H / 4, I4 = I / 4, cols = mc->gated ? NB / 2 : NB;
    const int64_t groups = (I + GB * cols - 1) / (GB * cols), e = item / groups, c_first = (item % groups) * GB * cols;
    const int64_t n = j->first[e + 1] - j->first[e], N = j->sets * n;
    if (n == 0) return;
    const int32_t *pairs = j->order + j->first[e];
    const uint8_t *codes = in->w13 + e * j->w13_rows * (H / 2), *scales = in->s13 + e * j->w13_rows * (H / 16);
    const float g = in->g13[e];
    for (int64_t r0 = 0; r0 < N; r0 += RC) {
        const int64_t nr = N - r0 < RC ? N - r0 : RC;
        for (int64_t r = 0; r < nr; r++) { /* row r's step s at xp[((r / 4) * H4 + s) * 4 + r % 4] */
            const float *x = j->x[(r0 + r) / n] + (pairs[(r0 + r) % n] / mc->topk) * H;
            v4d *dst = sc->xp + (r / 4) * H4 * 4 + r % 4;
            for (int64_t s = 0; s < H4; s++) {
                v4f f;
                memcpy(&f, x + 4 * s, sizeof f);
                dst[s * 4] = __builtin_convertvector(f, v4d);
            }
        }
        for (int64_t c0 = c_first; c0 < c_first + GB * cols && c0 < I; c0 += cols) {
            const int64_t nc = I - c0 < cols ? I - c0 : cols;
            const uint8_t *wc[NB] = {0}, *ws[NB] = {0}; /* gated: the gate rows, then the up rows */
            for (int64_t i = 0; i < nc; i++) {
                wc[i] = codes + (c0 + i) * (H / 2), ws[i] = scales + (c0 + i) * (H / 16);
                if (mc->gated) wc[cols + i] = codes + (I + c0 + i) * (H / 2), ws[cols + i] = scales + (I + c0 + i) * (H / 16);
            }
            dot_rows(j, sc, sc->xp, nr, H4, wc, ws);
            for (int64_t r = 0; r < nr; r++) {
                const int64_t row = r0 + r;
                double *dst = (double *)(j->act + (j->act_at[e] + row / 4) * I4 * 4 + row % 4);
                for (int64_t i = 0; i < nc; i++) {
                    const int64_t c = c0 + i;
                    const double a = global_apply(dot_at(sc, r, i), g, mc->scale_dir);
                    double v;
                    if (mc->gated) v = a / (1.0 + kp_exp_det(-a)) * global_apply(dot_at(sc, r, cols + i), g, mc->scale_dir);
                    else v = a > 0.0 ? a * a : 0.0;
                    dst[(c / 4) * 16 + c % 4] = v;
                }
            }
        }
    }
}

/* Pass 2a: y for expert e's rows and one block of NB output columns of the current span. */
static void gemm2_item(ref_job *j, const ref_scratch *sc, int64_t item) {
    const kp_moe_ref_in *in = j->in;
    const kp_moe_case *mc = in->mc;
    const int64_t H = mc->hidden, I = mc->inter, I4 = I / 4, width = H - j->h_span < j->span ? H - j->h_span : j->span;
    const int64_t blocks = (width + NB - 1) / NB, e = item / blocks, c0 = (item % blocks) * NB, h0 = j->h_span + c0;
    const int64_t nh = width - c0 < NB ? width - c0 : NB, n = j->first[e + 1] - j->first[e], N = j->sets * n;
    if (n == 0) return;
    const uint8_t *wc[NB] = {0}, *ws[NB] = {0};
    for (int64_t i = 0; i < nh; i++) wc[i] = in->w2 + (e * H + h0 + i) * (I / 2), ws[i] = in->s2 + (e * H + h0 + i) * (I / 16);
    const int32_t *pairs = j->order + j->first[e];
    for (int64_t r0 = 0; r0 < N; r0 += RC) {
        const int64_t nr = N - r0 < RC ? N - r0 : RC;
        dot_rows(j, sc, j->act + (j->act_at[e] + r0 / 4) * I4 * 4, nr, I4, wc, ws);
        for (int64_t r = 0; r < nr; r++) {
            double *dst = j->y + ((r0 + r) / n * j->pairs + pairs[(r0 + r) % n]) * j->span + c0;
            for (int64_t i = 0; i < nh; i++) dst[i] = global_apply(dot_at(sc, r, i), in->g2[e], mc->scale_dir);
        }
    }
}

/* One pass: kp_thread_count() workers, each with its scratch, taking items [0, n) in order. */
typedef struct ref_pass {
    ref_job *j;
    void (*item)(ref_job *j, const ref_scratch *sc, int64_t item);
    int64_t n, K; /* items; K of the rows pass 1 packs, 0 in pass 2 */
    atomic_llong next;
} ref_pass;

static void pass_worker(void *ctx, int64_t worker) {
    ref_pass *p = ctx;
    ref_scratch sc;
    (void)worker;
    if (!scratch_new(&sc, p->K)) atomic_store(&p->j->failed, 1);
    else
        for (int64_t i; (i = atomic_fetch_add(&p->next, 1)) < p->n;) p->item(p->j, &sc, i);
    scratch_free(&sc);
}

static void run_pass(ref_job *j, void (*item)(ref_job *, const ref_scratch *, int64_t), int64_t n, int64_t K) {
    ref_pass p = {.j = j, .item = item, .n = n, .K = K};
    atomic_init(&p.next, 0);
    kp_parallel_for(kp_thread_count() < n ? kp_thread_count() : n, pass_worker, &p);
}

/* Pass 2b: row t's output in the current span, the sum over its slots, j ascending. */
static void combine_item(void *ctx, int64_t t) {
    ref_job *j = ctx;
    const kp_moe_case *mc = j->in->mc;
    const int64_t H = mc->hidden, K = mc->topk, width = H - j->h_span < j->span ? H - j->h_span : j->span;
    for (int set = 0; set < j->sets; set++)
        for (int64_t i = 0; i < width; i++) {
            const double *y = j->y + (set * j->pairs + t * K) * j->span + i;
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) s += (double)j->in->weights[t * K + k] * y[k * j->span];
            j->out[set][t * H + j->h_span + i] = s;
        }
}

/* Output columns pass 2 takes at once: H split into spans of about inter columns (a multiple of NB), so y holds
 * about as much as act, and each expert's act rows are read once a span. */
static int64_t span_of(const kp_moe_case *mc) {
    const int64_t parts = (mc->hidden + mc->inter - 1) / mc->inter;
    const int64_t span = ((mc->hidden + parts - 1) / parts + NB - 1) / NB * NB;
    return span < mc->hidden ? span : mc->hidden;
}

double kp_moe_reference_bytes(const kp_moe_case *mc, int64_t rows) {
    const double pairs = (double)rows * (double)mc->topk, H = (double)mc->hidden, I = (double)mc->inter;
    const double item = KC * NB * 32.0 + RC * NB * 32.0 + 3 * 64.0 + RC * H * 8.0; /* pass 1's; pass 2's has no xp */
    return (double)sizeof(ref_job) + (SETS * pairs + 3.0 * (double)mc->experts) * I * 8.0 + 32.0 +
           SETS * pairs * (double)span_of(mc) * 8.0 + pairs * 4.0 + 3.0 * (double)(mc->experts + 1) * 8.0 +
           (double)kp_thread_count() * item;
}

static int ids_valid(const kp_moe_ref_in *in, kp_error *err) {
    const kp_moe_case *mc = in->mc;
    for (int64_t i = 0; i < in->rows * mc->topk; i++)
        if (in->ids[i] < 0 || in->ids[i] >= mc->experts)
            return kp_fail(err, KP_EXIT_USAGE, "moe reference: ids[%lld] = %d is outside [0, %lld)", (long long)i,
                           in->ids[i], (long long)mc->experts);
    return 0;
}

/* The definition: the host on every core, on `sets` activation arrays at once (ids already checked). */
static int host_sets(const kp_moe_ref_in *in, int sets, const float *const x[], double *const out[], kp_error *err) {
    const kp_moe_case *mc = in->mc;
    ref_job *j = kp_calloc(1, sizeof *j, "moe reference", err);
    if (!j) return err->code;
    *j = (ref_job){.in = in, .sets = sets, .w13_rows = kp_moe_w13_rows(mc), .pairs = in->rows * mc->topk};
    for (int s = 0; s < sets; s++) j->x[s] = x[s], j->out[s] = out[s];
    atomic_init(&j->failed, 0);
    for (int c = 0; c < 256; c++) {
        j->tab.pair[c] = (v2d){(double)kp_e2m1_value((uint8_t)(c & 15)), (double)kp_e2m1_value((uint8_t)(c >> 4))};
        j->tab.e4m3[c] = (double)kp_e4m3_value((uint8_t)c);
    }
    j->order = kp_calloc((size_t)j->pairs, sizeof *j->order, "moe reference order", err);
    j->first = j->order ? kp_calloc((size_t)mc->experts + 1, sizeof *j->first, "moe reference order", err) : NULL;
    j->act_at = j->first ? kp_calloc((size_t)mc->experts + 1, sizeof *j->act_at, "moe reference order", err) : NULL;
    int rc = j->act_at ? 0 : err->code;
    v4d *act_block = NULL;
    if (!rc) { /* a counting sort by expert, token order within one; then each expert's act panels */
        for (int64_t i = 0; i < j->pairs; i++) j->first[in->ids[i] + 1]++;
        for (int64_t e = 0; e < mc->experts; e++) {
            const int64_t n = j->first[e + 1];
            j->first[e + 1] += j->first[e];
            j->act_at[e + 1] = j->act_at[e] + (sets * n + 3) / 4;
        }
        int64_t *at = kp_calloc((size_t)mc->experts, sizeof *at, "moe reference order", err);
        if (!at) rc = err->code;
        for (int64_t i = 0; at && i < j->pairs; i++) j->order[j->first[in->ids[i]] + at[in->ids[i]]++] = (int32_t)i;
        free(at);
        /* calloc'd, then aligned: its pages come zeroed and untouched, and a panel's unused rows are never read */
        const size_t steps = (size_t)(j->act_at[mc->experts] * mc->inter);
        act_block = rc ? NULL : kp_calloc(steps + 1, sizeof *act_block, "moe reference activations", err);
        if (!rc && !act_block) rc = err->code;
        if (!rc) j->act = (v4d *)(((uintptr_t)act_block + 31) / 32 * 32);
    }
    const int64_t cols = mc->gated ? NB / 2 : NB;
    if (!rc) run_pass(j, gemm1_item, mc->experts * ((mc->inter + GB * cols - 1) / (GB * cols)), mc->hidden);
    j->span = span_of(mc);
    j->y = rc ? NULL : kp_calloc((size_t)(sets * j->pairs * j->span), sizeof *j->y, "moe reference expert outputs", err);
    if (!rc && !j->y) rc = err->code;
    for (j->h_span = 0; !rc && !atomic_load(&j->failed) && j->h_span < mc->hidden; j->h_span += j->span) {
        const int64_t width = mc->hidden - j->h_span < j->span ? mc->hidden - j->h_span : j->span;
        run_pass(j, gemm2_item, mc->experts * ((width + NB - 1) / NB), 0);
        if (!atomic_load(&j->failed)) kp_parallel_for(in->rows, combine_item, j);
    }
    if (!rc && atomic_load(&j->failed)) rc = kp_fail(err, KP_EXIT_ENV, "moe reference: out of host memory");
    free(j->order), free(j->first), free(j->act_at), free(act_block), free(j->y), free(j);
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

int kp_moe_reference_x2(const kp_moe_ref_in *in, const float *x2, double *out, double *out2, kp_error *err) {
    const float *x[2] = {in->x, x2};
    double *o[2] = {out, out2};
    return reference_sets(in, 2, x, o, err);
}
