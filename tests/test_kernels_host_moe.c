/* test_kernels_host_moe.c: the moe host ports through kp_moe_args: accuracy, slots, the candidate's bits in any
 * batch and run, and the incumbents' modelled defects (the positive controls of those checks), and refusals. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_sha256.h"
#include "../cases/moe_case.h"
#include "../kernels/kp_registry.h"
#include "../kernels/moe_plan.h"
#include "../reference/moe_ref.h"

TestSuite(kernels_host_moe, .timeout = 120);

#define GATE_ATOL 4e-2 /* ci/gates/nvfp4-moe.json: vLLM's Marlin MoE tolerance */
#define GATE_NMSE 1e-3 /* and its NMSE bound, which catches what the absolute bound alone lets through */

/* A case's rows and every expert's weights, the bytes the harness makes (harness/moe_family.c). */
typedef struct moe_in {
    kp_moe_case mc;
    float *x;            /* [m, hidden] */
    int32_t *ids;        /* [m, topk] */
    float *weights;      /* [m, topk] */
    uint8_t *w13, *s13;  /* [experts, w13_rows, hidden / 2], [experts, w13_rows, hidden / 16] */
    uint8_t *w2, *s2;    /* [experts, hidden, inter / 2], [experts, hidden, inter / 16] */
    float *g13, *g2;     /* [experts] */
    int64_t group;       /* experts drawn per kp_parallel_for item (one cuRAND call each) */
    atomic_int failed;
} moe_in;

static void gen_group(void *ctx, int64_t i) {
    moe_in *in = ctx;
    const kp_moe_case *mc = &in->mc;
    const int64_t H = mc->hidden, I = mc->inter, R = kp_moe_w13_rows(mc), e = i * in->group;
    const int64_t ne = mc->experts - e < in->group ? mc->experts - e : in->group;
    kp_error err = {0};
    if (kp_moe_case_experts(mc, e, ne, in->w13 + e * R * (H / 2), in->s13 + e * R * (H / 16), &in->g13[e],
                            in->w2 + e * H * (I / 2), in->s2 + e * H * (I / 16), &in->g2[e], &err))
        atomic_store(&in->failed, 1);
}

static moe_in *load(const char *name) {
    moe_in *in = calloc(1, sizeof *in);
    kp_case c;
    kp_error err = {0};
    cr_assert(in);
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_moe_case_read(&c, &in->mc, &err), 0,
                 "%s: %s", name, err.msg);
    const kp_moe_case *mc = &in->mc;
    const int64_t H = mc->hidden, I = mc->inter, E = mc->experts, K = mc->topk, R = kp_moe_w13_rows(mc), m = mc->m;
    in->x = calloc((size_t)(m * H), sizeof *in->x), in->ids = calloc((size_t)(m * K), sizeof *in->ids);
    in->weights = calloc((size_t)(m * K), sizeof *in->weights);
    in->w13 = calloc((size_t)(E * R * H / 2), 1), in->s13 = calloc((size_t)(E * R * H / 16), 1);
    in->w2 = calloc((size_t)(E * H * I / 2), 1), in->s2 = calloc((size_t)(E * H * I / 16), 1);
    in->g13 = calloc((size_t)E, sizeof *in->g13), in->g2 = calloc((size_t)E, sizeof *in->g2);
    cr_assert(in->x && in->ids && in->weights && in->w13 && in->s13 && in->w2 && in->s2 && in->g13 && in->g2);
    cr_assert_eq(kp_moe_case_rows(mc, 0, m, in->x, in->ids, in->weights, &err), 0, "%s", err.msg);
    const int64_t per = (R + I) * H, most = (4 << 20) / per; /* about 4M draws (16 MB) a group */
    in->group = most > 1 ? most : 1;
    if ((E + in->group - 1) / in->group < 2) in->group = (E + 1) / 2; /* two groups at least: both cores busy */
    atomic_init(&in->failed, 0);
    kp_parallel_for((E + in->group - 1) / in->group, gen_group, in); /* each expert draws at its own offset */
    cr_assert(!atomic_load(&in->failed), "%s: generating expert weights failed", name);
    return in;
}

static void drop(moe_in *in) {
    free(in->x), free(in->ids), free(in->weights), free(in->w13), free(in->s13), free(in->w2), free(in->s2);
    free(in->g13), free(in->g2), free(in);
}

/* One run's outputs. */
typedef struct run_out {
    int64_t rows;
    float *out;     /* [rows, hidden] */
    int32_t *slots; /* [rows, topk] */
} run_out;

static void run_free(run_out *o) { free(o->out), free(o->slots); }

/* The args of a batch made of the case's rows rows[0..n) in that order (x, ids and weights gathered, as the
 * harness does), without outputs or workspace. The gathered inputs are the caller's to free. */
static kp_moe_args batch_args(const moe_in *in, const int64_t *rows, int64_t n) {
    const kp_moe_case *mc = &in->mc;
    const int64_t H = mc->hidden, K = mc->topk;
    float *x = malloc(sizeof *x * (size_t)(n * H)), *w = malloc(sizeof *w * (size_t)(n * K));
    int32_t *ids = malloc(sizeof *ids * (size_t)(n * K));
    cr_assert(x && w && ids);
    for (int64_t i = 0; i < n; i++) {
        memcpy(x + i * H, in->x + rows[i] * H, sizeof *x * (size_t)H);
        memcpy(ids + i * K, in->ids + rows[i] * K, sizeof *ids * (size_t)K);
        memcpy(w + i * K, in->weights + rows[i] * K, sizeof *w * (size_t)K);
    }
    return (kp_moe_args){.x = x, .ids = ids, .weights = w, .w13 = in->w13, .s13 = in->s13, .g13 = in->g13, .w2 = in->w2,
                         .s2 = in->s2, .g2 = in->g2, .rows = n, .hidden = H, .inter = mc->inter, .experts = mc->experts,
                         .topk = (int32_t)K, .gated = mc->gated,
                         .scale_dir = mc->scale_dir == KP_NVFP4_MULTIPLY ? KP_MOE_SCALE_MULTIPLY : KP_MOE_SCALE_DIVIDE};
}

static void args_free(kp_moe_args *a) { free((void *)a->x), free((void *)a->ids), free((void *)a->weights); }

/* Run impl on args a (outputs and workspace added here); asserts it ran. */
static run_out run_args(const kp_impl *impl, kp_moe_args a) {
    run_out o = {.rows = a.rows, .out = malloc(sizeof(float) * (size_t)(a.rows * a.hidden)),
                 .slots = malloc(sizeof(int32_t) * (size_t)(a.rows * a.topk))};
    cr_assert(o.out && o.slots);
    a.out = o.out, a.slots = o.slots;
    a.workspace_bytes = impl->workspace_bytes(&a);
    a.workspace = malloc(a.workspace_bytes ? a.workspace_bytes : 1);
    cr_assert(a.workspace);
    char msg[512] = "";
    cr_assert_eq(impl->supports(&a, msg, sizeof msg), KP_RUN_OK, "%s: %s", impl->name, msg);
    cr_assert_eq(impl->run(&a, msg, sizeof msg), KP_RUN_OK, "%s: %s", impl->name, msg);
    free(a.workspace);
    return o;
}

/* Run impl on the case's rows rows[0..n) as one batch. */
static run_out run_rows(const kp_impl *impl, const moe_in *in, const int64_t *rows, int64_t n) {
    kp_moe_args a = batch_args(in, rows, n);
    run_out o = run_args(impl, a);
    args_free(&a);
    return o;
}

/* The case's first n rows, in order. */
static run_out run_first(const kp_impl *impl, const moe_in *in, int64_t n) {
    int64_t *rows = malloc(sizeof *rows * (size_t)n);
    cr_assert(rows);
    for (int64_t r = 0; r < n; r++) rows[r] = r;
    run_out o = run_rows(impl, in, rows, n);
    free(rows);
    return o;
}

static double *reference(const moe_in *in) {
    const kp_moe_ref_in r = {.mc = &in->mc, .rows = in->mc.m, .x = in->x, .ids = in->ids, .weights = in->weights,
                             .w13 = in->w13, .s13 = in->s13, .w2 = in->w2, .s2 = in->s2, .g13 = in->g13, .g2 = in->g2};
    double *out = malloc(sizeof *out * (size_t)(in->mc.m * in->mc.hidden));
    kp_error err = {0};
    cr_assert(out);
    cr_assert_eq(kp_moe_reference(&r, out, &err), 0, "%s", err.msg);
    return out;
}

/* The largest |out - ref|; NaN where any element is not finite (so no bound holds it). */
static double worst_error(const float *out, const double *ref, int64_t n) {
    double most = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)out[i] - ref[i]);
        if (!(d <= most)) most = d; /* NaN sticks */
    }
    return most;
}

/* sum (out - ref)^2 / sum ref^2, the tolerance check's NMSE (scale: out multiplied by it first). */
static double nmse_of(const float *out, double scale, const double *ref, int64_t n) {
    double see = 0, srr = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = scale * (double)out[i] - ref[i];
        see += d * d, srr += ref[i] * ref[i];
    }
    return srr > 0 ? see / srr : INFINITY;
}

/* Whether row a of x and row b of y hold the same out bits (and, when `slots`, the same slots). */
static int same_row(const moe_in *in, const run_out *x, int64_t a, const run_out *y, int64_t b, int slots) {
    const int64_t H = in->mc.hidden, K = in->mc.topk;
    if (memcmp(x->out + a * H, y->out + b * H, sizeof(float) * (size_t)H)) return 0;
    return !slots || !memcmp(x->slots + a * K, y->slots + b * K, sizeof(int32_t) * (size_t)K);
}

/* slots[t, j] = the number of pairs before (t, j), in token order, routed to the same expert. */
static int32_t *token_order_slots(const int32_t *ids, int64_t rows, int64_t topk, int64_t experts) {
    int32_t *slots = malloc(sizeof *slots * (size_t)(rows * topk)), *count = calloc((size_t)experts, sizeof *count);
    cr_assert(slots && count);
    for (int64_t i = 0; i < rows * topk; i++) slots[i] = count[ids[i]]++;
    free(count);
    return slots;
}

/* How many of the first n rows route to expert e. */
static int64_t rows_with(const moe_in *in, int64_t n, int32_t e) {
    int64_t count = 0;
    for (int64_t i = 0; i < n * in->mc.topk; i++) count += in->ids[i] == e;
    return count;
}

static const kp_impl *const impls[] = {&kp_moe_invariant_host, &kp_moe_marlin_like_host, &kp_moe_marlin_gemv32_host};
#define NIMPLS (sizeof impls / sizeof *impls)

/* (a) Every port, every model at the gate's shape (or smaller), each routing profile, both directions of
 * the global scale: within 4e-2 of the reference and NMSE <= 1e-3, the gates' bounds. The controls: the
 * candidate told the global scale goes the other way lands far outside; the candidate's output times 0.9 (a 10%
 * error the absolute bound alone passes at these shapes) is caught, by NMSE. */
Test(kernels_host_moe, each_port_is_within_the_gate_tolerance_of_the_reference) {
    static const char *const cases[] = {
        "moe(hidden=256,inter=128,m=6,model=glm53,profile=uniform,seed=61)",
        "moe(hidden=256,inter=128,m=1,model=qwen3,profile=single,seed=62)",
        "moe(hidden=256,inter=128,m=5,model=nemotron,profile=uniform,seed=63)", /* relu^2 */
        "moe(hidden=256,inter=128,m=36,model=glm47,profile=hot,seed=64)",       /* expert 0 over 32 rows */
        "moe(hidden=256,inter=128,m=33,model=glm47,profile=straddle,seed=65)",  /* experts 0, 1, 2 at 31, 32, 33 rows */
        "moe(hidden=256,inter=128,m=4,model=glm53,profile=uniform,scale_dir=multiply,seed=66)",
        "moe(hidden=128,inter=128,m=6,model=nemotron,profile=hot,scale_dir=multiply,seed=67)",
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        moe_in *in = load(cases[c]);
        const int64_t n = in->mc.m * in->mc.hidden;
        double *ref = reference(in);
        double ref_most = 0;
        for (int64_t i = 0; i < n; i++) ref_most = fmax(ref_most, fabs(ref[i]));
        cr_assert(ref_most > GATE_ATOL, "%s: the reference is within the tolerance of zero (max %g): vacuous", cases[c], ref_most);
        for (size_t k = 0; k < NIMPLS; k++) {
            run_out o = run_first(impls[k], in, in->mc.m);
            const double err = worst_error(o.out, ref, n);
            cr_assert(err <= GATE_ATOL, "%s on %s: max |out - ref| = %g, over %g", impls[k]->name, cases[c], err, GATE_ATOL);
            const double nmse = nmse_of(o.out, 1.0, ref, n);
            cr_assert(nmse <= GATE_NMSE, "%s on %s: NMSE %g, over %g", impls[k]->name, cases[c], nmse, GATE_NMSE);
            if (k == 0) { /* the 0.9x control */
                const double scaled = nmse_of(o.out, 0.9, ref, n);
                cr_assert(!(scaled <= GATE_NMSE), "%s: 0.9 x the candidate's output has NMSE %g, within %g", cases[c], scaled,
                          GATE_NMSE);
            }
            run_free(&o);
        }
        int64_t all[64];
        cr_assert(in->mc.m <= 64);
        for (int64_t r = 0; r < in->mc.m; r++) all[r] = r;
        kp_moe_args flipped = batch_args(in, all, in->mc.m);
        flipped.scale_dir = flipped.scale_dir == KP_MOE_SCALE_DIVIDE ? KP_MOE_SCALE_MULTIPLY : KP_MOE_SCALE_DIVIDE;
        run_out o = run_args(&kp_moe_invariant_host, flipped);
        const double err = worst_error(o.out, ref, n);
        cr_assert(!(err <= 100 * GATE_ATOL), "%s: the global scale the wrong way is only %g from the reference", cases[c], err);
        run_free(&o), args_free(&flipped);
        free(ref);
        drop(in);
    }
}

/* (b) The candidate's slots are each pair's rank in token order within its expert; the incumbent's (atomic
 * order: glm53 has more than 64 experts) are a permutation of those ranks within each expert, and not
 * token order (the hot expert's 40 pairs arrive shuffled). */
Test(kernels_host_moe, slots_are_token_order_ranks_or_a_permutation_of_them) {
    moe_in *in = load("moe(hidden=64,inter=32,m=40,model=glm53,profile=hot,seed=71)");
    const kp_moe_case *mc = &in->mc;
    const int64_t pairs = mc->m * mc->topk;
    cr_assert(kp_marlin_atomic_order(mc->m, (int32_t)mc->topk, mc->experts));
    int32_t *want = token_order_slots(in->ids, mc->m, mc->topk, mc->experts);
    run_out inv = run_first(&kp_moe_invariant_host, in, mc->m);
    cr_assert(!memcmp(inv.slots, want, sizeof *want * (size_t)pairs), "invariant's slots are not token-order ranks");
    for (size_t k = 1; k < NIMPLS; k++) {
        run_out o = run_first(impls[k], in, mc->m);
        int64_t *count = calloc((size_t)mc->experts, sizeof *count);
        uint8_t *seen = calloc((size_t)pairs, 1); /* seen[first pair index of expert e + slot] */
        int64_t *first = calloc((size_t)mc->experts + 1, sizeof *first), moved = 0;
        cr_assert(count && seen && first);
        for (int64_t i = 0; i < pairs; i++) count[in->ids[i]]++;
        for (int64_t e = 0; e < mc->experts; e++) first[e + 1] = first[e] + count[e];
        for (int64_t i = 0; i < pairs; i++) {
            const int32_t e = in->ids[i], s = o.slots[i];
            cr_assert(s >= 0 && s < count[e], "%s: pair %lld has slot %d of expert %d's %lld", impls[k]->name, (long long)i, s, e,
                      (long long)count[e]);
            cr_assert(!seen[first[e] + s], "%s: expert %d's slot %d is taken twice", impls[k]->name, e, s);
            seen[first[e] + s] = 1;
            moved += s != want[i];
        }
        cr_assert(moved > 0, "%s: atomic order, yet every slot is the token-order rank", impls[k]->name);
        free(count), free(seen), free(first);
        run_free(&o);
    }
    run_free(&inv);
    free(want);
    drop(in);
}

/* (c) The candidate gives each row the same bits alone, in its batch and in the batch reversed, and the same
 * bits and slots run to run. The control: marlin_gemv32 on the same probes changes a row's bits (alone, the
 * straddling expert has 1 row and takes the f32 path; in the batch, 33 and bf16). */
Test(kernels_host_moe, the_candidate_gives_a_row_the_same_bits_alone_in_its_batch_and_reversed) {
    moe_in *in = load("moe(hidden=256,inter=128,m=33,model=glm53,profile=straddle,seed=5)");
    const int64_t m = in->mc.m;
    int64_t reversed[33];
    for (int64_t r = 0; r < m; r++) reversed[r] = m - 1 - r;
    run_out full = run_first(&kp_moe_invariant_host, in, m), again = run_first(&kp_moe_invariant_host, in, m);
    run_out rev = run_rows(&kp_moe_invariant_host, in, reversed, m);
    int64_t slots_moved = 0;
    for (int64_t r = 0; r < m; r++) {
        cr_assert(same_row(in, &full, r, &again, r, 1), "row %lld: two runs differ (out or slots)", (long long)r);
        cr_assert(same_row(in, &full, r, &rev, m - 1 - r, 0), "row %lld: other bits in the reversed batch", (long long)r);
        slots_moved += !same_row(in, &full, r, &rev, m - 1 - r, 1);
        run_out alone = run_rows(&kp_moe_invariant_host, in, &r, 1);
        cr_assert(same_row(in, &full, r, &alone, 0, 0), "row %lld: other bits alone", (long long)r);
        run_free(&alone);
    }
    cr_assert(slots_moved >= m - 1, "the reversed batch moved only %lld rows to other slots: it tested little",
              (long long)slots_moved);
    /* the control */
    run_out gemv = run_first(&kp_moe_marlin_gemv32_host, in, m);
    int64_t differ = 0;
    for (int64_t r = 0; r < m; r++) {
        run_out alone = run_rows(&kp_moe_marlin_gemv32_host, in, &r, 1);
        differ += !same_row(in, &gemv, r, &alone, 0, 0);
        run_free(&alone);
    }
    cr_assert(differ > 0, "marlin_gemv32 gave every row the same bits alone as in a batch where its expert has 33 rows");
    run_free(&gemv), run_free(&full), run_free(&again), run_free(&rev);
    drop(in);
}

/* (d) marlin_like at glm53 (288 experts, top 8), 800 rows: atomic slot order moves rows between blocks and
 * stream-K cuts, so within 20 calls the out bits change, and so do the slots. */
Test(kernels_host_moe, marlin_like_varies_run_to_run_where_its_order_is_atomic) {
    moe_in *in = load("moe(hidden=256,inter=128,m=800,model=glm53,profile=uniform,seed=1)");
    const int64_t m = in->mc.m, n = m * in->mc.hidden, pairs = m * in->mc.topk;
    cr_assert(kp_marlin_atomic_order(m, (int32_t)in->mc.topk, in->mc.experts));
    run_out first = run_first(&kp_moe_marlin_like_host, in, m);
    int out_changed = 0, slots_changed = 0;
    for (int call = 1; call < 20 && !(out_changed && slots_changed); call++) {
        run_out o = run_first(&kp_moe_marlin_like_host, in, m);
        out_changed |= memcmp(o.out, first.out, sizeof(float) * (size_t)n) != 0;
        slots_changed |= memcmp(o.slots, first.slots, sizeof(int32_t) * (size_t)pairs) != 0;
        run_free(&o);
    }
    cr_assert(slots_changed, "20 calls in atomic order, and the slots never changed");
    cr_assert(out_changed, "20 calls in atomic order, and the out bits never changed");
    run_free(&first);
    drop(in);
}

/* (d) The negative controls: one row (each expert one pair: no order to change) and glm47 (64 experts, top 4)
 * at 200 rows, 800 slots, below the 1024 of the atomic path: bit-stable over 20 calls, token-order slots. */
Test(kernels_host_moe, marlin_like_is_bit_stable_where_its_order_is_not_atomic) {
    static const char *const cases[] = {
        "moe(hidden=256,inter=128,m=1,model=glm53,profile=single,seed=3)",
        "moe(hidden=256,inter=128,m=200,model=glm47,profile=uniform,seed=4)",
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        moe_in *in = load(cases[c]);
        const int64_t m = in->mc.m, n = m * in->mc.hidden, pairs = m * in->mc.topk;
        run_out first = run_first(&kp_moe_marlin_like_host, in, m);
        if (m > 1) {
            cr_assert(!kp_marlin_atomic_order(m, (int32_t)in->mc.topk, in->mc.experts), "%s", cases[c]);
            int32_t *want = token_order_slots(in->ids, m, in->mc.topk, in->mc.experts);
            cr_assert(!memcmp(first.slots, want, sizeof *want * (size_t)pairs), "%s: slots are not in token order", cases[c]);
            free(want);
        }
        for (int call = 1; call < 20; call++) {
            run_out o = run_first(&kp_moe_marlin_like_host, in, m);
            cr_assert(!memcmp(o.out, first.out, sizeof(float) * (size_t)n), "%s: call %d changed the out bits", cases[c],
                      call + 1);
            cr_assert(!memcmp(o.slots, first.slots, sizeof(int32_t) * (size_t)pairs), "%s: call %d changed the slots",
                      cases[c], call + 1);
            run_free(&o);
        }
        run_free(&first);
        drop(in);
    }
}

/* (e) marlin_gemv32 at profile=straddle, 33 rows: expert 2 has 33 rows in the batch (bf16 path) and 32 in
 * its first 32 rows (f32 path), so a row routed to it changes bits between the two; the candidate does not.
 * Between the first 31 and 32 rows no expert crosses 32 (31/31/31, then 31/32/32): there gemv32 is stable. */
Test(kernels_host_moe, marlin_gemv32_changes_a_row_when_its_expert_crosses_32_rows) {
    moe_in *in = load("moe(hidden=256,inter=128,m=33,model=glm53,profile=straddle,seed=5)");
    cr_assert(rows_with(in, 33, 2) == 33 && rows_with(in, 32, 2) == 32, "expert 2: %lld and %lld rows",
              (long long)rows_with(in, 33, 2), (long long)rows_with(in, 32, 2));
    for (int32_t e = 0; e < (int32_t)in->mc.experts; e++)
        cr_assert(e == 2 || rows_with(in, 33, e) <= KP_MOE_GEMV_ROWS, "expert %d has %lld rows", e, (long long)rows_with(in, 33, e));
    run_out g33 = run_first(&kp_moe_marlin_gemv32_host, in, 33), g32 = run_first(&kp_moe_marlin_gemv32_host, in, 32);
    run_out g31 = run_first(&kp_moe_marlin_gemv32_host, in, 31);
    run_out i33 = run_first(&kp_moe_invariant_host, in, 33), i32 = run_first(&kp_moe_invariant_host, in, 32);
    int64_t differ = 0;
    for (int64_t r = 0; r < 32; r++) {
        int routed = 0;
        for (int64_t j = 0; j < in->mc.topk; j++) routed |= in->ids[r * in->mc.topk + j] == 2;
        cr_assert(routed, "row %lld is not routed to expert 2", (long long)r);
        differ += !same_row(in, &g33, r, &g32, r, 0);
        cr_assert(same_row(in, &i33, r, &i32, r, 0), "invariant: row %lld differs between 33 and 32 rows", (long long)r);
        if (r < 31) cr_assert(same_row(in, &g32, r, &g31, r, 0), "gemv32: row %lld differs between 32 and 31 rows", (long long)r);
    }
    cr_assert(differ > 0, "marlin_gemv32: no row routed to expert 2 changed when it crossed 32 rows");
    run_free(&g33), run_free(&g32), run_free(&g31), run_free(&i33), run_free(&i32);
    drop(in);
}

/* (f) What every port refuses, with a message: bad args (from supports and run alike) and ids out of range
 * as NOT_SUPPORTED; a workspace smaller than it asked for as FAILED. The same args, corrected, run. */
Test(kernels_host_moe, bad_args_are_refused_and_a_short_workspace_fails) {
    moe_in *in = load("moe(hidden=32,inter=16,m=3,model=glm47,profile=uniform,seed=81)");
    int64_t rows[3] = {0, 1, 2};
    for (size_t k = 0; k < NIMPLS; k++) {
        const kp_impl *impl = impls[k];
        kp_moe_args good = batch_args(in, rows, 3);
        float out[3 * 32];
        int32_t slots[3 * 4];
        good.out = out, good.slots = slots;
        good.workspace_bytes = impl->workspace_bytes(&good);
        good.workspace = malloc(good.workspace_bytes);
        cr_assert(good.workspace && good.workspace_bytes > 0);
        char msg[512] = "";
        cr_assert_eq(impl->run(&good, msg, sizeof msg), KP_RUN_OK, "%s: the good args: %s", impl->name, msg);
        kp_moe_args bad[4];
        const char *what[4] = {"topk 0", "hidden 40", "scale_dir 7", "gated 2"};
        for (int b = 0; b < 4; b++) bad[b] = good;
        bad[0].topk = 0, bad[1].hidden = 40, bad[2].scale_dir = 7, bad[3].gated = 2;
        for (int b = 0; b < 4; b++) {
            msg[0] = '\0';
            cr_assert_eq(impl->supports(&bad[b], msg, sizeof msg), KP_RUN_NOT_SUPPORTED, "%s supports %s", impl->name, what[b]);
            cr_assert(strstr(msg, impl->name), "%s, %s: supports' message does not name the impl: '%s'", impl->name, what[b], msg);
            msg[0] = '\0';
            cr_assert_eq(impl->run(&bad[b], msg, sizeof msg), KP_RUN_NOT_SUPPORTED, "%s runs %s", impl->name, what[b]);
            cr_assert(strstr(msg, impl->name), "%s, %s: run's message does not name the impl: '%s'", impl->name, what[b], msg);
        }
        int32_t *ids = (int32_t *)good.ids;
        const int32_t bad_ids[2] = {(int32_t)in->mc.experts, -1};
        for (int b = 0; b < 2; b++) {
            const int32_t keep = ids[5];
            ids[5] = bad_ids[b], msg[0] = '\0';
            cr_assert_eq(impl->run(&good, msg, sizeof msg), KP_RUN_NOT_SUPPORTED, "%s runs id %d", impl->name, bad_ids[b]);
            cr_assert(strstr(msg, "ids[5]"), "%s: the message does not name the bad id: '%s'", impl->name, msg);
            ids[5] = keep;
        }
        kp_moe_args small = good;
        small.workspace_bytes -= 1, msg[0] = '\0';
        cr_assert_eq(impl->run(&small, msg, sizeof msg), KP_RUN_FAILED, "%s: a workspace 1 byte short", impl->name);
        cr_assert(strstr(msg, "workspace"), "%s: '%s'", impl->name, msg);
        small.workspace = NULL, small.workspace_bytes = good.workspace_bytes, msg[0] = '\0';
        cr_assert_eq(impl->run(&small, msg, sizeof msg), KP_RUN_FAILED, "%s: no workspace", impl->name);
        cr_assert_eq(impl->run(&good, msg, sizeof msg), KP_RUN_OK, "%s: the good args again: %s", impl->name, msg);
        free(good.workspace);
        args_free(&good);
    }
    drop(in);
}

/* (g) The bits of every port's output, pinned: SHA-256 of out (f32) then slots (int32), little-endian, per case
 * and impl, computed with the scalar ports of 340885f. A host port may be rewritten for speed only if every
 * product and sum keeps its order (and its two roundings: no contraction to FMA), so these must never move.
 * The cases: atomic order with stream-K cuts at both tile shapes (bsm 8: n 128 / k 128; bsm 32 and 64: n 256 /
 * k 64), a K and an N that are not whole tiles (192, 320, 80, 96), gemv32's f32 path and its crossing,
 * token order (glm47 below 1024 slots), relu^2 and the multiply direction. The incumbents' arrival order is
 * seeded by the number of calls in the process (moe_host_run's counter), so the order of runs below is part of
 * the pins; Criterion runs each test in a process of its own. */
Test(kernels_host_moe, every_ports_output_has_its_pinned_digest) {
    static const struct {
        const char *name;
        const char *hex[NIMPLS]; /* invariant, marlin_like, marlin_gemv32 */
    } pins[] = {
        {"moe(hidden=256,inter=128,m=800,model=glm53,profile=uniform,seed=1)",
         {"b1517f4033469831c0561859a0d631d1b66edac0e73899ee3e3b215f52630570",
          "7a87c5141f13ca6c80c306ba745718b00cbaf1c99bfdbc599b08c0827b2cd227",
          "7bd4c28ba14a5473997431e4a7ff2d767854a9706fb31fa9649086003b659db3"}},
        {"moe(hidden=128,inter=64,m=2304,model=glm53,profile=uniform,seed=2)",
         {"aa9776a2056efbdac9fdf46c06977d4dee4a538c81b5c3e00a1ec174dca5af77",
          "903da327f38185f692bc4bf9434cb296befda6ee94df6e7e5faed41a460bc3e7",
          "f8fef0aa38d6acfd543bd8333e6277f7ca0c35792bcb95d882be202265a052de"}},
        {"moe(hidden=256,inter=128,m=33,model=glm53,profile=straddle,seed=5)",
         {"8e8875ca6128cf93f46aedec163d75680c401e18c3f606366ffb85d1b447ac28",
          "104ac85a03349e25fa961e1088b85b670952ac7dbe60eeae01fadb6777c296f2",
          "53c0185c415d9d83e93865a13fef79ea194de059cc331a542e10b76fbd4a2711"}},
        {"moe(hidden=256,inter=128,m=200,model=glm47,profile=uniform,seed=4)",
         {"4780a1ac7918176f9e695ac5ebc4c6a3db81673268b17863e395e0181e3f8d1f",
          "7feddce2c7b4df68c2a32e131068a1ba21b4c434a424c821f05bc1ce05189b39",
          "7b5f4f023099db366699adfcee36568e0c5448286484840a0681c7826380c84d"}},
        {"moe(hidden=192,inter=80,m=120,model=nemotron,profile=hot,scale_dir=multiply,seed=21)",
         {"19af5d4f621df186fefce3890cf4b1685c67e2979dd48ccd4c14c99dd1990f77",
          "e9432f790940eb91df8375dfc0d3acb11eac078b272f549ae5aa96a61961094d",
          "1cca5188f73dd472c55cbeb56c8b8032dea5307975af7ed623b867f9026eb425"}},
        {"moe(hidden=320,inter=96,m=1000,model=qwen3,profile=uniform,scale_dir=multiply,seed=22)",
         {"2cba605338232c50a46cfffcd8a8466dcbc70f443cbd0fbf6bed62ff39bd22f5",
          "120c9169d3e0810808d99bf910954fe890edbc879203223205a5e991b502c3c1",
          "c2b07895a5d4894847a78d89d5306df8b0e5e3fa4a7542170070bf3e087a0cd3"}},
    };
    int wrong = 0;
    for (size_t c = 0; c < sizeof pins / sizeof *pins; c++) {
        moe_in *in = load(pins[c].name);
        for (size_t k = 0; k < NIMPLS; k++) {
            run_out o = run_first(impls[k], in, in->mc.m);
            kp_sha256 h;
            kp_error err = {0};
            char hex[KP_SHA256_HEX_LEN];
            cr_assert_eq(kp_sha256_init(&h, &err), 0, "%s", err.msg);
            kp_sha256_update(&h, o.out, sizeof(float) * (size_t)(in->mc.m * in->mc.hidden));
            kp_sha256_update(&h, o.slots, sizeof(int32_t) * (size_t)(in->mc.m * in->mc.topk));
            kp_sha256_final_hex(&h, hex);
            if (strcmp(hex, pins[c].hex[k])) {
                fprintf(stderr, "%s on %s: output digest %s, pinned %s\n", impls[k]->name, pins[c].name, hex, pins[c].hex[k]);
                wrong++;
            }
            run_free(&o);
        }
        drop(in);
    }
    cr_assert_eq(wrong, 0, "%d outputs are not the pinned bits (each named above)", wrong);
}

/* (g) The same with planted scale bytes the generator never makes (NaN 0x7f and 0xff, -0 0x80, 0, the smallest
 * subnormal 0x01, 448 0x7e) in both tensors (NaN in two experts, the rest in every one): NaN and zero weights
 * through every path, pinned with the scalar ports of 340885f as above. */
Test(kernels_host_moe, outputs_with_planted_scales_have_their_pinned_digest) {
    static const char *const name = "moe(hidden=128,inter=64,m=300,model=glm53,profile=uniform,seed=23)";
    static const char *const pinned[NIMPLS] = {"b784c106096a58dbf534b704f7f7b204e8719c1350146dcefea9a05fc4f0fe52",
                                               "8b78cdcff88b675c934f229628a1515557dd51e4d7d1f6e72a98f9a9896b125f",
                                               "cd7c4e250d1557eff589cee6dc40438ba36d5a09e31f1d259ff7350ffeff8263"};
    static const uint8_t planted[4] = {0x80, 0x00, 0x01, 0x7e};
    moe_in *in = load(name);
    const kp_moe_case *mc = &in->mc;
    const int64_t per13 = kp_moe_w13_rows(mc) * (mc->hidden / 16), per2 = mc->hidden * (mc->inter / 16);
    for (int64_t i = 0; i < mc->experts * per13; i += 397) in->s13[i] = planted[(i / 397) % 4];
    for (int64_t i = 0; i < mc->experts * per2; i += 389) in->s2[i] = planted[(i / 389) % 4];
    in->s13[3 * per13 + 77] = 0x7f, in->s2[7 * per2 + 5] = 0xff; /* NaN in two experts only: most rows stay finite */
    int wrong = 0;
    for (size_t k = 0; k < NIMPLS; k++) {
        run_out o = run_first(impls[k], in, mc->m);
        int64_t nan = 0;
        for (int64_t i = 0; i < mc->m * mc->hidden; i++) nan += isnan(o.out[i]);
        cr_assert(nan > 0 && nan < mc->m * mc->hidden, "%s: %lld NaN outputs: the planted NaN scales must reach some, not all",
                  impls[k]->name, (long long)nan);
        kp_sha256 h;
        kp_error err = {0};
        char hex[KP_SHA256_HEX_LEN];
        cr_assert_eq(kp_sha256_init(&h, &err), 0, "%s", err.msg);
        kp_sha256_update(&h, o.out, sizeof(float) * (size_t)(mc->m * mc->hidden));
        kp_sha256_update(&h, o.slots, sizeof(int32_t) * (size_t)(mc->m * mc->topk));
        kp_sha256_final_hex(&h, hex);
        if (strcmp(hex, pinned[k])) {
            fprintf(stderr, "%s on %s, planted scales: output digest %s, pinned %s\n", impls[k]->name, name, hex, pinned[k]);
            wrong++;
        }
        run_free(&o);
    }
    drop(in);
    cr_assert_eq(wrong, 0, "%d outputs are not the pinned bits (each named above)", wrong);
}
