/* test_reference_moe.c: the NVFP4 MoE reference against a float64 computation written here from the rule, with
 * planted nibble-order and scale-direction defects as its positive controls; its bits pinned, thread-blind and, on
 * shapes the gates do not reach, those of its summation order written out here. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_sha256.h"
#include "../cases/moe_case.h"
#include "../kernels/kp_formats.h"
#include "../reference/kp_detmath.h"
#include "../reference/moe_ref.h"

TestSuite(reference_moe, .timeout = 120);

/* A case's rows and every expert's weights, the bytes the harness makes (harness/moe_family.c). */
typedef struct moe_in {
    kp_moe_case mc;
    float *x;            /* [m, hidden] */
    int32_t *ids;        /* [m, topk] */
    float *weights;      /* [m, topk] */
    uint8_t *w13, *s13;  /* [experts, w13_rows, hidden / 2], [experts, w13_rows, hidden / 16] */
    uint8_t *w2, *s2;    /* [experts, hidden, inter / 2], [experts, hidden, inter / 16] */
    float *g13, *g2;     /* [experts] */
    uint8_t *used;       /* [experts]: whether a row routes to it */
} moe_in;

static moe_in load(const char *name) {
    moe_in in = {0};
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_moe_case_read(&c, &in.mc, &err), 0,
                 "%s: %s", name, err.msg);
    const kp_moe_case *mc = &in.mc;
    const int64_t H = mc->hidden, I = mc->inter, E = mc->experts, K = mc->topk, R = kp_moe_w13_rows(mc), m = mc->m;
    in.x = calloc((size_t)(m * H), sizeof *in.x), in.ids = calloc((size_t)(m * K), sizeof *in.ids);
    in.weights = calloc((size_t)(m * K), sizeof *in.weights);
    in.w13 = calloc((size_t)(E * R * H / 2), 1), in.s13 = calloc((size_t)(E * R * H / 16), 1);
    in.w2 = calloc((size_t)(E * H * I / 2), 1), in.s2 = calloc((size_t)(E * H * I / 16), 1);
    in.g13 = calloc((size_t)E, sizeof *in.g13), in.g2 = calloc((size_t)E, sizeof *in.g2), in.used = calloc((size_t)E, 1);
    cr_assert(in.x && in.ids && in.weights && in.w13 && in.s13 && in.w2 && in.s2 && in.g13 && in.g2 && in.used);
    cr_assert_eq(kp_moe_case_rows(mc, 0, m, in.x, in.ids, in.weights, &err), 0, "%s", err.msg);
    for (int64_t i = 0; i < m * K; i++) in.used[in.ids[i]] = 1;
    const int64_t group = (4 << 20) / ((R + I) * H) > 1 ? (4 << 20) / ((R + I) * H) : 1; /* ~4M draws a cuRAND call */
    for (int64_t e = 0; e < E; e += group)
        cr_assert_eq(kp_moe_case_experts(mc, e, E - e < group ? E - e : group, in.w13 + e * R * (H / 2), in.s13 + e * R * (H / 16),
                                         &in.g13[e], in.w2 + e * H * (I / 2), in.s2 + e * H * (I / 16), &in.g2[e], &err),
                     0, "%s", err.msg);
    return in;
}

static void drop(moe_in *in) {
    free(in->x), free(in->ids), free(in->weights), free(in->w13), free(in->s13), free(in->w2), free(in->s2);
    free(in->g13), free(in->g2), free(in->used);
}

/* kp_moe_reference on the case's rows; out [m, hidden] (malloc'd). */
static double *reference(const moe_in *in) {
    const kp_moe_ref_in r = {.mc = &in->mc, .rows = in->mc.m, .x = in->x, .ids = in->ids, .weights = in->weights,
                             .w13 = in->w13, .s13 = in->s13, .w2 = in->w2, .s2 = in->s2, .g13 = in->g13, .g2 = in->g2};
    double *out = malloc(sizeof *out * (size_t)(in->mc.m * in->mc.hidden));
    kp_error err = {0};
    cr_assert(out);
    cr_assert_eq(kp_moe_reference(&r, out, &err), 0, "%s", err.msg);
    return out;
}

/* Defects planted in the dequantized weights of the second computation. */
typedef enum defect { CLEAN = 0, NIBBLE_SWAP, SCALE_FLIP } defect;

/* A [rows, k] NVFP4 tensor dequantized whole, the defect applied: nibbles swapped in every byte (element 2i
 * read from the high nibble), or the global scale in the other direction. */
static double *dequant(const uint8_t *packed, const uint8_t *scales, int64_t rows, int64_t k, float g,
                       kp_nvfp4_scale_dir dir, defect d) {
    double *w = malloc(sizeof *w * (size_t)(rows * k));
    uint8_t *swapped = NULL;
    cr_assert(w);
    if (d == NIBBLE_SWAP) {
        swapped = malloc((size_t)(rows * k / 2));
        cr_assert(swapped);
        for (int64_t i = 0; i < rows * k / 2; i++) swapped[i] = (uint8_t)((packed[i] >> 4) | (packed[i] << 4));
        packed = swapped;
    }
    if (d == SCALE_FLIP) dir = dir == KP_NVFP4_DIVIDE ? KP_NVFP4_MULTIPLY : KP_NVFP4_DIVIDE;
    kp_nvfp4_dequantize(packed, scales, rows, k, g, dir, w);
    free(swapped);
    return w;
}

/* The rule, independently: per routed pair, h = W13 x, a = silu(gate) * up or relu(up)^2, y = W2 a, all in
 * float64 on whole dequantized tensors; out[t] = sum over j ascending of weights[t, j] * y. out [m, hidden]. */
static double *independent(const moe_in *in, defect d) {
    const kp_moe_case *mc = &in->mc;
    const int64_t H = mc->hidden, I = mc->inter, E = mc->experts, K = mc->topk, R = kp_moe_w13_rows(mc), m = mc->m;
    double *y = calloc((size_t)(m * K * H), sizeof *y), *h = malloc(sizeof *h * (size_t)R), *a = malloc(sizeof *a * (size_t)I);
    double *out = calloc((size_t)(m * H), sizeof *out);
    cr_assert(y && h && a && out);
    for (int64_t e = 0; e < E; e++) {
        if (!in->used[e]) continue;
        double *w13 = dequant(in->w13 + e * R * (H / 2), in->s13 + e * R * (H / 16), R, H, in->g13[e], mc->scale_dir, d);
        double *w2 = dequant(in->w2 + e * H * (I / 2), in->s2 + e * H * (I / 16), H, I, in->g2[e], mc->scale_dir, d);
        for (int64_t p = 0; p < m * K; p++) {
            if (in->ids[p] != e) continue;
            const float *x = in->x + (p / K) * H;
            for (int64_t r = 0; r < R; r++) {
                double s = 0;
                for (int64_t k = 0; k < H; k++) s += w13[r * H + k] * (double)x[k];
                h[r] = s;
            }
            for (int64_t i = 0; i < I; i++)
                a[i] = mc->gated ? h[i] / (1.0 + exp(-h[i])) * h[I + i] : (h[i] > 0 ? h[i] * h[i] : 0.0);
            for (int64_t o = 0; o < H; o++) {
                double s = 0;
                for (int64_t i = 0; i < I; i++) s += w2[o * I + i] * a[i];
                y[p * H + o] = s;
            }
        }
        free(w13), free(w2);
    }
    for (int64_t t = 0; t < m; t++)
        for (int64_t j = 0; j < K; j++)
            for (int64_t o = 0; o < H; o++) out[t * H + o] += (double)in->weights[t * K + j] * y[(t * K + j) * H + o];
    free(y), free(h), free(a);
    return out;
}

static double max_abs(const double *v, int64_t n) {
    double most = 0;
    for (int64_t i = 0; i < n; i++) most = fmax(most, fabs(v[i]));
    return most;
}

static double max_abs_diff(const double *a, const double *b, int64_t n) {
    double most = 0;
    for (int64_t i = 0; i < n; i++) most = fmax(most, fabs(a[i] - b[i]));
    return most;
}

/* Every model, gated (glm53, qwen3, glm47) and relu^2 (nemotron), both directions of the global scale, each
 * routing profile; few rows, since each routed expert costs its own weight draws. */
static const char *const cases[] = {
    "moe(hidden=64,inter=32,m=3,model=glm53,profile=uniform,seed=21)",
    "moe(hidden=32,inter=16,m=4,model=qwen3,profile=hot,scale_dir=multiply,seed=22)",
    "moe(hidden=48,inter=32,m=4,model=nemotron,profile=uniform,seed=23)",
    "moe(hidden=64,inter=16,m=4,model=nemotron,profile=straddle,scale_dir=multiply,seed=24)",
    "moe(hidden=32,inter=32,m=1,model=glm47,profile=single,seed=25)",
    "moe(hidden=64,inter=32,m=4,model=glm47,profile=hot,scale_dir=multiply,seed=26)",
};
#define NCASES (sizeof cases / sizeof *cases)

/* Relative to the output's largest element: an element that cancels to near zero keeps the absolute error
 * of the terms it sums, which no per-element relative bound can hold. */
#define REL_TOL 1e-12
#define GATE_ATOL 4e-2 /* the NVFP4 MoE gate's tolerance (ci/gates/nvfp4-moe.json), vLLM's Marlin MoE test's */

/* Each case: the reference within 1e-12 (relative to the output's scale) of the computation here, on an
 * output with no zero element; and, as that comparison's positive controls, the same computation on
 * weights read with swapped nibbles or the global scale the other way lands over a million times further. */
Test(reference_moe, matches_an_independent_float64_computation_and_not_a_defective_one) {
    for (size_t c = 0; c < NCASES; c++) {
        moe_in in = load(cases[c]);
        const int64_t n = in.mc.m * in.mc.hidden;
        double *ref = reference(&in), *mine = independent(&in, CLEAN);
        double *swap = independent(&in, NIBBLE_SWAP), *flip = independent(&in, SCALE_FLIP);
        const double scale = max_abs(mine, n), diff = max_abs_diff(ref, mine, n);
        cr_assert(scale > 1e-3, "%s: the output is nearly zero (max %g): the comparison would test nothing", cases[c], scale);
        int64_t zeros = 0;
        for (int64_t i = 0; i < n; i++) zeros += ref[i] == 0.0;
        cr_assert_eq(zeros, 0, "%s: %lld output elements are exactly zero", cases[c], (long long)zeros);
        cr_assert(diff <= REL_TOL * scale, "%s: max |reference - independent| = %g, over %g x max |out| = %g", cases[c], diff,
                  REL_TOL, REL_TOL * scale);
        const double d_swap = max_abs_diff(ref, swap, n), d_flip = max_abs_diff(ref, flip, n);
        cr_assert(d_swap > 1e6 * REL_TOL * scale, "%s: nibble swap moved the output by only %g", cases[c], d_swap);
        cr_assert(d_flip > 1e6 * REL_TOL * scale, "%s: scale flip moved the output by only %g", cases[c], d_flip);
        free(ref), free(mine), free(swap), free(flip);
        drop(&in);
    }
}

/* At the gate's shape (hidden 256, inter 128) the same two defects move some element far past the gate's
 * 4e-2: the tolerance can see them. (At hidden 64 the whole output is about 0.02, so no defect could move
 * it by 4e-2: the tiny shapes above are held to 1e-12 instead.) */
Test(reference_moe, planted_nibble_and_scale_direction_defects_are_far_past_the_gate_tolerance) {
    static const char *const gate_shape[] = {
        "moe(hidden=256,inter=128,m=2,model=glm53,profile=hot,seed=8)",
        "moe(hidden=256,inter=128,m=2,model=nemotron,profile=uniform,scale_dir=multiply,seed=5)",
    };
    for (size_t c = 0; c < sizeof gate_shape / sizeof *gate_shape; c++) {
        moe_in in = load(gate_shape[c]);
        const int64_t n = in.mc.m * in.mc.hidden;
        double *ref = reference(&in), *mine = independent(&in, CLEAN);
        double *swap = independent(&in, NIBBLE_SWAP), *flip = independent(&in, SCALE_FLIP);
        cr_assert(max_abs_diff(ref, mine, n) <= REL_TOL * max_abs(ref, n), "%s: the clean computation disagrees",
                  gate_shape[c]);
        const double d_swap = max_abs_diff(ref, swap, n), d_flip = max_abs_diff(ref, flip, n);
        cr_assert(d_swap > 3 * GATE_ATOL, "%s: nibble swap moved the output by %g, not far past %g", gate_shape[c], d_swap,
                  GATE_ATOL);
        cr_assert(d_flip > 1e6 * GATE_ATOL, "%s: scale flip moved the output by %g, not far past %g", gate_shape[c], d_flip,
                  GATE_ATOL);
        free(ref), free(mine), free(swap), free(flip);
        drop(&in);
    }
}

/* Every pass splits its work over kp_thread_count() threads (read from KPARITY_THREADS at each call): the
 * bits must not depend on how many. */
Test(reference_moe, the_bits_do_not_depend_on_the_thread_count) {
    moe_in in = load("moe(hidden=64,inter=32,m=5,model=glm47,profile=hot,seed=31)");
    const size_t bytes = sizeof(double) * (size_t)(in.mc.m * in.mc.hidden);
    cr_assert_eq(setenv("KPARITY_THREADS", "1", 1), 0);
    cr_assert_eq(kp_thread_count(), 1);
    double *one = reference(&in);
    cr_assert_eq(setenv("KPARITY_THREADS", "7", 1), 0);
    cr_assert_eq(kp_thread_count(), 7);
    double *seven = reference(&in);
    cr_assert_eq(unsetenv("KPARITY_THREADS"), 0);
    double *dflt = reference(&in);
    cr_assert(!memcmp(one, seven, bytes), "1 thread and 7 threads give different bits");
    cr_assert(!memcmp(one, dflt, bytes), "1 thread and the default (%d) give different bits", kp_thread_count());
    free(one), free(seven), free(dflt);
    drop(&in);
}

/* The reference's bits on one case, pinned: another machine, compiler or vector width that gets other bits
 * fails here (the reference sums in an order fixed by K alone, with its own exp, for exactly this). */
Test(reference_moe, one_reference_output_has_its_pinned_digest) {
    moe_in in = load("moe(hidden=64,inter=32,m=3,model=qwen3,profile=uniform,seed=41)");
    double *ref = reference(&in);
    char hex[KP_SHA256_HEX_LEN];
    kp_sha256_hex(ref, sizeof *ref * (size_t)(in.mc.m * in.mc.hidden), hex);
    cr_assert_str_eq(hex, "35510bd02f5f1f31fe4f3ad7fcd9fed03d3db4789bf2be1397d9b1dc2940c5a3",
                     "the reference's output bytes (f64, little-endian) hash to %s", hex);
    free(ref);
    drop(&in);
}

/* Rows [rows, K] of an NVFP4 tensor as code value times block scale in float64, the global scale not applied. */
static void dequant_unscaled(const uint8_t *packed, const uint8_t *scales, int64_t rows, int64_t K, double *w) {
    for (int64_t i = 0; i < rows * K; i++)
        w[i] = (double)kp_e2m1_value((uint8_t)((packed[i / 2] >> (4 * (i % 2))) & 15u)) * (double)kp_e4m3_value(scales[i / 16]);
}

/* x . w over K in the reference's order: `lanes` sums (k mod lanes), each in k order, then for 4 lanes
 * (l0 + l1) + (l2 + l3). */
static double dot_in_lanes(const double *w, const double *x, int64_t K, int lanes) {
    double l[4] = {0, 0, 0, 0};
    for (int64_t k = 0; k < K; k++) l[k % lanes] += x[k] * w[k];
    return lanes == 4 ? (l[0] + l[1]) + (l[2] + l[3]) : l[0];
}

static double global_apply(double dot, float g, kp_nvfp4_scale_dir dir) {
    return dir == KP_NVFP4_DIVIDE ? dot / (double)g : dot * (double)g;
}

/* The reference's sequence of float64 operations written out one pair at a time: each dot product as dot_in_lanes,
 * the global scale after it, the activation with kp_exp_det, out[t] summed over slots j ascending from 0.
 * out [m, hidden] (malloc'd). */
static double *written_out(const moe_in *in, const float *x, int lanes) {
    const kp_moe_case *mc = &in->mc;
    const int64_t H = mc->hidden, I = mc->inter, K = mc->topk, R = kp_moe_w13_rows(mc), m = mc->m;
    double *w13 = malloc(sizeof *w13 * (size_t)(R * H)), *w2 = malloc(sizeof *w2 * (size_t)(H * I));
    double *xd = malloc(sizeof *xd * (size_t)H), *h = malloc(sizeof *h * (size_t)R), *a = malloc(sizeof *a * (size_t)I);
    double *y = malloc(sizeof *y * (size_t)(K * H)), *out = malloc(sizeof *out * (size_t)(m * H));
    cr_assert(w13 && w2 && xd && h && a && y && out);
    for (int64_t t = 0; t < m; t++) {
        for (int64_t k = 0; k < H; k++) xd[k] = (double)x[t * H + k];
        for (int64_t j = 0; j < K; j++) {
            const int64_t e = in->ids[t * K + j];
            dequant_unscaled(in->w13 + e * R * (H / 2), in->s13 + e * R * (H / 16), R, H, w13);
            dequant_unscaled(in->w2 + e * H * (I / 2), in->s2 + e * H * (I / 16), H, I, w2);
            for (int64_t r = 0; r < R; r++)
                h[r] = global_apply(dot_in_lanes(w13 + r * H, xd, H, lanes), in->g13[e], mc->scale_dir);
            for (int64_t i = 0; i < I; i++)
                a[i] = mc->gated ? h[i] / (1.0 + kp_exp_det(-h[i])) * h[I + i] : (h[i] > 0.0 ? h[i] * h[i] : 0.0);
            for (int64_t o = 0; o < H; o++)
                y[j * H + o] = global_apply(dot_in_lanes(w2 + o * I, a, I, lanes), in->g2[e], mc->scale_dir);
        }
        for (int64_t o = 0; o < H; o++) {
            double s = 0.0;
            for (int64_t j = 0; j < K; j++) s += (double)in->weights[t * K + j] * y[j * H + o];
            out[t * H + o] = s;
        }
    }
    free(w13), free(w2), free(xd), free(h), free(a), free(y);
    return out;
}

/* The first element where a and b differ in their bits, or -1. */
static int64_t first_bit_difference(const double *a, const double *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a)) return i;
    return -1;
}

/* Edges of the reference's blocking the gates (hidden 256, inter 128) do not reach, each held bit for bit to the
 * order written out above, on x alone (kp_moe_reference) and on x and x in bf16 together (kp_moe_reference_x2).
 * As the positive control, the same computation summing each dot product in one lane differs somewhere: equal bits
 * say the reference kept the order, not merely the value. */
Test(reference_moe, edge_shapes_give_the_bits_of_the_summation_order_written_out) {
    static const char *const edges[] = {
        /* K past a whole number of 128-k chunks (272 = 2 x 128 + 16, 144 = 128 + 16), hidden not a whole number of
           24-row blocks, two output spans, the global scale multiplied */
        "moe(hidden=272,inter=144,m=5,model=glm47,profile=hot,scale_dir=multiply,seed=61)",
        "moe(hidden=48,inter=16,m=1,model=qwen3,profile=single,seed=62,topk=1)", /* one row, top-1: one expert used */
        "moe(hidden=80,inter=208,m=9,model=nemotron,profile=uniform,seed=63)",   /* relu^2, inter not 24-column blocks */
        "moe(hidden=32,inter=32,m=130,model=glm47,profile=hot,seed=64)",        /* an expert's 130 (260) rows: 128-row chunks */
        "moe(experts=1,hidden=16,inter=16,m=3,model=qwen3,profile=uniform,seed=65,topk=1)", /* K 16, one expert */
    };
    for (size_t c = 0; c < sizeof edges / sizeof *edges; c++) {
        moe_in in = load(edges[c]);
        const int64_t n = in.mc.m * in.mc.hidden;
        float *x_bf16 = malloc(sizeof *x_bf16 * (size_t)n);
        double *out = malloc(sizeof *out * (size_t)n), *out_bf16 = malloc(sizeof *out_bf16 * (size_t)n);
        cr_assert(x_bf16 && out && out_bf16);
        for (int64_t i = 0; i < n; i++) x_bf16[i] = kp_bf16_round(in.x[i]);
        const kp_moe_ref_in r = {.mc = &in.mc, .rows = in.mc.m, .x = in.x, .ids = in.ids, .weights = in.weights,
                                 .w13 = in.w13, .s13 = in.s13, .w2 = in.w2, .s2 = in.s2, .g13 = in.g13, .g2 = in.g2};
        kp_error err = {0};
        cr_assert_eq(kp_moe_reference_x2(&r, x_bf16, out, out_bf16, &err), 0, "%s: %s", edges[c], err.msg);
        double *alone = reference(&in), *mine = written_out(&in, in.x, 4), *mine_bf16 = written_out(&in, x_bf16, 4);
        double *one_lane = written_out(&in, in.x, 1);
        int64_t at = first_bit_difference(alone, mine, n);
        cr_assert_eq(at, -1, "%s: kp_moe_reference's element %lld is %.17g, the order written out gives %.17g", edges[c],
                     (long long)at, at < 0 ? 0 : alone[at], at < 0 ? 0 : mine[at]);
        at = first_bit_difference(out, mine, n);
        cr_assert_eq(at, -1, "%s: kp_moe_reference_x2's out[%lld] is %.17g, the order written out gives %.17g", edges[c],
                     (long long)at, at < 0 ? 0 : out[at], at < 0 ? 0 : mine[at]);
        at = first_bit_difference(out_bf16, mine_bf16, n);
        cr_assert_eq(at, -1, "%s: kp_moe_reference_x2's out2[%lld] is %.17g, the order written out gives %.17g", edges[c],
                     (long long)at, at < 0 ? 0 : out_bf16[at], at < 0 ? 0 : mine_bf16[at]);
        cr_assert_neq(first_bit_difference(alone, one_lane, n), -1, "%s: a one-lane sum gives the same bits: the comparison "
                      "cannot tell the order", edges[c]);
        cr_assert_neq(first_bit_difference(out, out_bf16, n), -1, "%s: x in bf16 changed nothing", edges[c]);
        free(x_bf16), free(out), free(out_bf16), free(alone), free(mine), free(mine_bf16), free(one_lane);
        drop(&in);
    }
}

Test(reference_moe, an_id_outside_the_experts_is_refused_as_usage) {
    moe_in in = load("moe(hidden=32,inter=16,m=2,model=glm47,profile=uniform,seed=51)");
    double *out = malloc(sizeof *out * (size_t)(in.mc.m * in.mc.hidden));
    cr_assert(out);
    const kp_moe_ref_in r = {.mc = &in.mc, .rows = in.mc.m, .x = in.x, .ids = in.ids, .weights = in.weights, .w13 = in.w13,
                             .s13 = in.s13, .w2 = in.w2, .s2 = in.s2, .g13 = in.g13, .g2 = in.g2};
    kp_error err = {0};
    cr_assert_eq(kp_moe_reference(&r, out, &err), 0, "the case as generated runs: %s", err.msg);
    const int32_t bad[2] = {(int32_t)in.mc.experts, -1};
    const int64_t at[2] = {0, in.mc.m * in.mc.topk - 1};
    for (int i = 0; i < 2; i++) {
        const int32_t keep = in.ids[at[i]];
        in.ids[at[i]] = bad[i];
        memset(&err, 0, sizeof err);
        cr_assert_eq(kp_moe_reference(&r, out, &err), KP_EXIT_USAGE, "id %d", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "ids[%lld] = %d", (long long)at[i], bad[i]);
        cr_assert(strstr(err.msg, want), "the message names the id: %s", err.msg);
        in.ids[at[i]] = keep;
    }
    free(out);
    drop(&in);
}

/* ---- the device hook (kp_moe_reference_set_device) with fakes: the guard's rows, the device's bytes really used ---- */

static const double *fake_answer; /* the host's answer the fakes start from */
static int64_t fake_flip_row;     /* the row whose first element a fake flips the last bit of; -1: none */
static int fake_calls;

static int fake_device(const kp_moe_ref_in *in, int sets, const float *const x[], double *const out[], kp_error *err) {
    (void)x, (void)err;
    fake_calls++;
    cr_assert_eq(sets, 1);
    memcpy(out[0], fake_answer, sizeof *out[0] * (size_t)(in->rows * in->mc->hidden));
    if (fake_flip_row >= 0) {
        uint64_t b;
        memcpy(&b, &out[0][fake_flip_row * in->mc->hidden], sizeof b);
        b ^= 1;
        memcpy(&out[0][fake_flip_row * in->mc->hidden], &b, sizeof b);
    }
    return 0;
}
static int fake_no_device(const kp_moe_ref_in *in, int sets, const float *const x[], double *const out[], kp_error *err) {
    (void)in, (void)sets, (void)x, (void)out, (void)err;
    fake_calls++;
    return KP_EXIT_SKIP;
}

Test(reference_moe, a_device_reference_is_guarded_by_host_rows_and_its_bytes_used_elsewhere) {
    moe_in in = load("moe(hidden=256,inter=128,m=33,model=glm53,profile=straddle,seed=5)");
    const int64_t n = in.mc.m * in.mc.hidden;
    double *host = reference(&in), *got = malloc(sizeof *got * (size_t)n);
    cr_assert(got);
    int64_t at[KP_MOE_REF_GUARD_ROWS];
    cr_assert_eq(kp_moe_reference_guard_rows(33, at), 3);
    cr_assert(at[0] == 0 && at[1] == 16 && at[2] == 32);
    cr_assert_eq(kp_moe_reference_guard_rows(1, at), 1);
    cr_assert_eq(kp_moe_reference_guard_rows(2, at), 2);
    const char *where = NULL;
    const kp_moe_ref_in r = {.mc = &in.mc, .rows = in.mc.m, .x = in.x, .ids = in.ids, .weights = in.weights,
                             .w13 = in.w13, .s13 = in.s13, .w2 = in.w2, .s2 = in.s2, .g13 = in.g13, .g2 = in.g2,
                             .computed_on = &where};
    kp_error err = {0};
    fake_answer = host;
    const struct {
        kp_moe_reference_fn fn;
        int64_t flip;
        bool host_bits;
        const char *where;
    } runs[] = {
        {fake_device, -1, true, "cuda (host-identical; 3 guard rows checked on the host)"},
        {fake_device, 5, false, "cuda (host-identical; 3 guard rows checked on the host)"}, /* the device's bytes, used */
        {fake_device, 16, true, "host (the device reference's guard rows differed)"},      /* a guard row: the host's */
        {fake_device, 32, true, "host (the device reference's guard rows differed)"},
        {fake_no_device, -1, true, "host"},
        {NULL, -1, true, "host"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        kp_moe_reference_set_device(runs[i].fn);
        fake_flip_row = runs[i].flip, fake_calls = 0, where = NULL;
        memset(got, 0xff, sizeof *got * (size_t)n);
        cr_assert_eq(kp_moe_reference(&r, got, &err), 0, "run %zu: %s", i, err.msg);
        cr_assert_eq(fake_calls, runs[i].fn ? 1 : 0, "run %zu", i);
        cr_assert_eq(memcmp(got, host, sizeof *got * (size_t)n) == 0, runs[i].host_bits, "run %zu", i);
        cr_assert_str_eq(where, runs[i].where, "run %zu", i);
    }
    kp_moe_reference_set_device(NULL);
    free(host), free(got);
    drop(&in);
}
