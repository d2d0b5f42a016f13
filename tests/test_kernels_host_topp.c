/* test_kernels_host_topp.c: the host ports of topp.split_logit and topp.split_prob against the
 * seed's forced-logit defect and the top-p rule (judged here in float64), plus the impl registry. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cases/kp_sha256.h"
#include "../kernels/kp_registry.h"
#include "../kernels/topp_split.h"
#include "kp_test_util.h"
#include "kp_topp_rows.h"
#include "fixtures/topp_gpu_schedule.h"

static int run_topp(const kp_impl *impl, const float *logits, float *out, const float *top_p, int64_t batch,
                    int64_t vocab, int64_t stride, int32_t sm_count) {
    kp_topp_args a = {.logits = logits, .out = out, .top_p = top_p, .batch = batch, .vocab = vocab,
                      .row_stride = stride, .sm_count = sm_count};
    char msg[256] = "";
    int rc = impl->run(&a, msg, sizeof msg);
    cr_assert_eq(rc, KP_RUN_OK, "%s refused or failed: %s", impl->name, msg);
    return rc;
}

/* ---- the judge (tests/kp_topp_rows.c): float64 mass with libm exp, written from the rule ---- */

Test(topp_judge, catches_planted_defects) {
    enum { V = 4096 };
    float *x = alloc_floats(V), *y = alloc_floats(V);
    fill_ordinary(x, V, 7);
    float p = 0.9f;
    run_topp(impl_named("topp.split_prob@host"), x, y, &p, 1, V, V, 0);
    cr_assert_null(rule_violation(x, y, V, p, 1, 0, NULL), "control: split_prob must pass the judge");

    float *bad = alloc_floats(V);
    for (int i = 0; i < V; i++) bad[i] = -INFINITY; /* the seed's defect */
    cr_assert_not_null(rule_violation(x, bad, V, p, 0, 1, NULL));

    memcpy(bad, y, V * sizeof *bad); /* drop the largest kept token: mass and monotonicity break */
    int64_t top = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[top]) top = i;
    bad[top] = -INFINITY;
    cr_assert_not_null(rule_violation(x, bad, V, p, 0, 1, NULL));

    memcpy(bad, y, V * sizeof *bad); /* swap a kept and a dropped token of clearly different logits */
    int64_t lowest_kept = -1, highest_dropped = -1;
    for (int i = 0; i < V; i++) {
        if (bits_of(y[i]) == bits_of(x[i]) && (lowest_kept < 0 || x[i] < x[lowest_kept])) lowest_kept = i;
        if (bits_of(y[i]) != bits_of(x[i]) && (highest_dropped < 0 || x[i] > x[highest_dropped])) highest_dropped = i;
    }
    bad[lowest_kept] = -INFINITY;
    bad[highest_dropped] = x[highest_dropped];
    int64_t lower = 0; /* then also keep a token far below the boundary */
    for (int i = 1; i < V; i++)
        if (x[i] < x[lower]) lower = i;
    bad[lower] = x[lower];
    cr_assert_not_null(rule_violation(x, bad, V, p, 0, 1, NULL));

    memcpy(bad, x, V * sizeof *bad); /* keep everything: not minimal */
    cr_assert_not_null(rule_violation(x, bad, V, p, 1, 0, NULL));

    memcpy(bad, y, V * sizeof *bad); /* alter a kept value */
    bad[top] = nextafterf(bad[top], 0.0f);
    cr_assert_not_null(rule_violation(x, bad, V, p, 0, 1, NULL));
    free(x), free(y), free(bad);
}

/* The kernel tests' judge is the gates' own (kp_topp_rows.h's gate_rows_failing: kp_topp_judge, band 1e-6,
 * minimal_index). On the seed's ordinary shape (4 x 154,856, top_p 0.95) split_prob's host port meets it on every row,
 * and a split_prob that keeps one extra boundary token (the first token it drops in rule order, un-masked) fails it
 * on every row it is planted in, unless that token's mass-before lies within the band of top_p (then the gate allows
 * it too: rows 1 and 3 here, whose boundary tokens carry 1.8e-6 each). 1294f26's judge (mass and minimality within
 * 1e-5) passed the plant on all four rows. The same plant, through the same code, is the GPU test's positive control. */
Test(topp_judge, gates_judge_catches_one_extra_boundary_token, .timeout = 120) {
    enum { V = 154856, B = 4 };
    float *x = alloc_floats(B * V), *y = alloc_floats(B * V), *bad = alloc_floats(B * V), p[B];
    for (int64_t r = 0; r < B; r++) {
        fill_ordinary(x + r * V, V, 58231 + (uint64_t)r);
        p[r] = 0.95f;
    }
    run_topp(impl_named("topp.split_prob@host"), x, y, p, B, V, V, 0);
    gate_ref g;
    gate_ref_make(&g, x, p, B, V, V);
    char why[768];
    int64_t first;
    cr_assert_eq(gate_rows_failing(&g, y, 0, -1, y, &first, why, sizeof why), 0, "control: row %lld: %s", (long long)first,
                 why);
    int64_t caught = 0;
    for (int64_t r = 0; r < B; r++) {
        memcpy(bad, y, sizeof(float) * B * V);
        const int64_t at = plant_extra_boundary_token(x + r * V, bad + r * V, V);
        cr_assert_geq(at, 0);
        /* a token whose mass-before lies within the band of top_p is one the gate's declared band leaves open: keeping
         * it is no violation at band 1e-6, for the gate or for this judge */
        const double before = g.ref.mass_before[r * V + at];
        const int open = fabs(before - (double)p[r]) <= GATE_BAND;
        fprintf(stderr, "row %lld: planted token %lld (p %.3g, mass before %.9f)%s\n", (long long)r, (long long)at,
                g.ref.prob[r * V + at], before, open ? ": within the band, allowed" : "");
        /* against the rule alone, and against the host port's output as the GPU tests compare */
        cr_assert_eq(gate_rows_failing(&g, bad, 0, -1, NULL, &first, why, sizeof why), !open, "row %lld: one extra token "
                     "(%lld, p %.3g, mass before %.9f) %s the gates' judge", (long long)r, (long long)at,
                     g.ref.prob[r * V + at], before, open ? "failed" : "passed");
        cr_assert_eq(gate_rows_failing(&g, bad, 0, -1, y, &first, why, sizeof why), !open);
        if (!open) cr_assert_eq(first, r);
        caught += !open;
        /* the incumbent's allowance (extra tokens past the boundary) is the only thing that lets it through */
        cr_assert_eq(gate_rows_failing(&g, bad, 1, -1, NULL, &first, why, sizeof why), 0, "%s", why);
    }
    cr_assert_geq(caught, 1, "the control must catch the plant on a row where the band does not leave it open");
    /* the top token dropped (kept by the rule, far from the band): caught even under the incumbent's allowances */
    memcpy(bad, y, sizeof(float) * B * V);
    int64_t top = 0;
    for (int64_t i = 1; i < V; i++)
        if (x[i] > x[top]) top = i;
    bad[top] = -INFINITY;
    cr_assert_eq(gate_rows_failing(&g, bad, 1, -1, NULL, &first, why, sizeof why), 1, "a dropped boundary token passed");
    gate_ref_free(&g);
    free(x), free(y), free(bad);
}

/* ---- the seed's forced-logit case ---- */

/* Runs impl on every forced batch (forced_shapes x forced_values x forced_batches, make_forced_batch)
 * and hands each output row to check. A forced batch's rows depend on the row alone, and its value only on the
 * forced token: each shape's rows are made once, for the largest batch, and the others are their first rows with
 * the forced tokens set to each value (the same inputs make_forced_batch gives each batch). */
typedef void forced_row_check(const float *xr, const float *yr, float p, int64_t r, forced_shape sh, float value,
                              int64_t batch);
static void run_forced_batches(const kp_impl *impl, forced_row_check *check) {
    const int64_t most = forced_batches[1];
    cr_assert(forced_batches[0] <= most);
    for (size_t s = 0; s < 2; s++) {
        forced_shape sh = forced_shapes[s];
        float *x = alloc_floats(most * sh.vocab), *y = alloc_floats(most * sh.vocab), p[64];
        cr_assert_leq(most, 64);
        make_forced_batch(x, p, most, sh, forced_values[0]);
        for (size_t v = 0; v < 2; v++) {
            for (int64_t r = 0; r < most; r++)
                if (r != 1) x[r * sh.vocab + sh.token] = forced_values[v];
            for (size_t b = 0; b < 2; b++) {
                int64_t batch = forced_batches[b];
                run_topp(impl, x, y, p, batch, sh.vocab, sh.vocab, 0);
                for (int64_t r = 0; r < batch; r++)
                    check(x + r * sh.vocab, y + r * sh.vocab, p[r], r, sh, forced_values[v], batch);
            }
        }
        free(x), free(y);
    }
}

static void split_logit_forced_row(const float *xr, const float *yr, float p, int64_t r, forced_shape sh, float value,
                                   int64_t batch) {
    int64_t finite_out = 0;
    for (int64_t i = 0; i < sh.vocab; i++) finite_out += bits_of(yr[i]) != bits_of(-INFINITY);
    if (r == 1) {
        const char *why = rule_violation(xr, yr, sh.vocab, p, 0, 1, NULL);
        cr_assert_null(why, "control row (vocab %lld, batch %lld): %s", (long long)sh.vocab, (long long)batch, why);
    } else {
        cr_assert_eq(finite_out, 0,
                     "forced row %lld (vocab %lld, value %g, batch %lld) kept %lld tokens; the seed's "
                     "defect masks every token",
                     (long long)r, (long long)sh.vocab, (double)value, (long long)batch, (long long)finite_out);
    }
}

Test(topp_host, split_logit_reproduces_forced_defect, .timeout = 120) {
    run_forced_batches(impl_named("topp.split_logit@host"), split_logit_forced_row);
}

static void split_prob_forced_row(const float *xr, const float *yr, float p, int64_t r, forced_shape sh, float value,
                                  int64_t batch) {
    (void)value;
    const char *why = rule_violation(xr, yr, sh.vocab, p, r == 1, 0, NULL);
    cr_assert_null(why, "row %lld (vocab %lld, batch %lld): %s", (long long)r, (long long)sh.vocab, (long long)batch,
                   why);
    if (r == 1) return;
    int64_t i = 0; /* the first token off (one assertion a row: 64 x 154856 of them took a quarter of the time) */
    while (i < sh.vocab && bits_of(yr[i]) == (i == sh.token ? bits_of(xr[i]) : bits_of(-INFINITY))) i++;
    const uint32_t want = i < sh.vocab && i == sh.token ? bits_of(xr[i]) : bits_of(-INFINITY);
    cr_assert_eq(i, sh.vocab, "forced row %lld, token %lld: got %08x, want %08x", (long long)r, (long long)i,
                 i < sh.vocab ? bits_of(yr[i]) : 0u, want);
}

Test(topp_host, split_prob_keeps_exactly_forced_token, .timeout = 120) {
    run_forced_batches(impl_named("topp.split_prob@host"), split_prob_forced_row);
}

Test(topp_host, ordinary_rows_follow_rule, .timeout = 120) {
    static const int64_t vocabs[] = {1, 5, 7, 2048, 2049, 5003, 131072, 154856};
    static const float ps[] = {0.95f, 0.5f, 0.1f, 0.999f, 1e-6f};
    static const char *names[] = {"topp.split_logit@host", "topp.split_prob@host"};
    for (int n = 0; n < 2; n++) {
        const kp_impl *impl = impl_named(names[n]);
        for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
            int64_t vocab = vocabs[v], batch = 5;
            float *x = alloc_floats(batch * vocab), *y = alloc_floats(batch * vocab), p[5];
            for (int64_t r = 0; r < batch; r++) {
                fill_ordinary(x + r * vocab, vocab, 1000 * (uint64_t)v + (uint64_t)r);
                p[r] = ps[r];
            }
            run_topp(impl, x, y, p, batch, vocab, vocab, 0);
            for (int64_t r = 0; r < batch; r++) {
                row_verdict rv;
                /* split_prob closes its bracket to adjacent floats, so it must also be minimal */
                const char *why = rule_violation(x + r * vocab, y + r * vocab, vocab, p[r], n == 1, n == 0, &rv);
                cr_assert_null(why, "%s vocab %lld row %lld p %g: %s (kept %lld, mass %.9f)", names[n],
                               (long long)vocab, (long long)r, (double)p[r], why, (long long)rv.kept, rv.mass);
                if (vocab >= 2048 && p[r] < 0.99f)
                    cr_assert_lt(rv.kept, rv.finite, "%s vocab %lld row %lld p %g filtered nothing", names[n],
                                 (long long)vocab, (long long)r, (double)p[r]);
            }
            free(x), free(y);
        }
    }
}

/* Found by the GPU test at 64 x 154856 (S = 1): two logits 5.4e-7 apart round to the same f32
 * x - max, so split_logit's prob-equality tie group holds both and its lowest-index trim keeps the
 * lower logit and drops the higher. The candidate groups ties by logit bits and stays monotone. */
Test(topp_host, split_logit_prob_ties_can_invert_order) {
    enum { V = 154856 };
    float *x = alloc_floats(V), *y = alloc_floats(V), p = 0.95f;
    fill_ordinary(x, V, 606);
    row_verdict rv;
    run_topp(impl_named("topp.split_logit@host"), x, y, &p, 1, V, V, 1); /* 1 SM: one slice, as batch 64 on 132 */
    cr_assert_null(rule_violation(x, y, V, p, 0, 1, &rv));
    cr_assert(rv.min_kept < rv.max_dropped && rv.prob_tie_inversion,
              "split_logit kept %.9g and dropped %.9g: the known f32-prob tie inversion no longer shows", rv.min_kept,
              rv.max_dropped);
    cr_assert_not_null(rule_violation(x, y, V, p, 0, 0, NULL), "a strict judge must call it non-monotone");
    run_topp(impl_named("topp.split_prob@host"), x, y, &p, 1, V, V, 1);
    cr_assert_null(rule_violation(x, y, V, p, 1, 0, &rv), "split_prob on the same row");
    free(x), free(y);
}

Test(topp_host, top_p_at_least_one_keeps_every_finite_token) {
    enum { V = 3000 };
    static const char *names[] = {"topp.split_logit@host", "topp.split_prob@host"};
    float *x = alloc_floats(2 * V), *y = alloc_floats(2 * V), p[2] = {1.0f, 1.5f};
    fill_ordinary(x, V, 11);
    fill_ordinary(x + V, V, 12);
    for (int i = 0; i < 2 * V; i += 7) x[i] = -INFINITY;
    x[5] = NAN; /* NaN counts as absent: dropped */
    for (int n = 0; n < 2; n++) {
        run_topp(impl_named(names[n]), x, y, p, 2, V, V, 0);
        for (int i = 0; i < 2 * V; i++) {
            uint32_t want = isfinite(x[i]) ? bits_of(x[i]) : bits_of(-INFINITY);
            cr_assert_eq(bits_of(y[i]), want, "%s element %d: got %08x want %08x", names[n], i, bits_of(y[i]), want);
        }
    }
    free(x), free(y);
}

Test(topp_host, rows_without_finite_logits_are_copied) {
    enum { V = 4100 };
    static const char *names[] = {"topp.split_logit@host", "topp.split_prob@host"};
    float *x = alloc_floats(2 * V), *y = alloc_floats(2 * V), p[2] = {0.95f, 0.5f};
    for (int i = 0; i < V; i++) x[i] = -INFINITY;
    uint32_t nan_bits = 0x7fc01234u;
    for (int i = V; i < 2 * V; i++) memcpy(&x[i], &nan_bits, sizeof nan_bits);
    for (int n = 0; n < 2; n++) {
        memset(y, 0, 2 * V * sizeof *y);
        run_topp(impl_named(names[n]), x, y, p, 2, V, V, 0);
        cr_assert(memcmp(x, y, 2 * V * sizeof *y) == 0, "%s changed a row with no finite logit", names[n]);
    }
    free(x), free(y);
}

/* ---- ties ---- */

/* A row of `high` tokens at 3.0, a tie group of `group` tokens at 1.0 spread over several tiles, the
 * rest at -2.0; top_p puts the boundary half a copy into the group, so the rule needs exactly
 * `want` copies (computed here in float64). */
static void make_tie_row(float *x, int64_t vocab, int64_t group, int64_t first, int64_t step, int64_t *want,
                         float *p, double copies) {
    const int64_t high = 10;
    for (int64_t i = 0; i < vocab; i++) x[i] = -2.0f;
    for (int64_t i = 0; i < high; i++) x[vocab - 1 - 3 * i] = 3.0f;
    for (int64_t g = 0; g < group; g++) x[first + g * step] = 1.0f;
    double z = (double)high * exp(5.0) + (double)group * exp(3.0) + (double)(vocab - high - group);
    double d = exp(3.0) / z, top = (double)high * exp(5.0) / z;
    *p = (float)(top + copies * d);
    *want = (int64_t)floor(copies) + 1;
}

Test(topp_host, tie_group_straddling_boundary_keeps_lowest_index_copies) {
    enum { V = 7000 };
    static const char *names[] = {"topp.split_prob@host", "topp.split_logit@host"};
    static const double copies[] = {0.5, 41.5, 150.5, 298.5};
    float *x = alloc_floats(V), *y = alloc_floats(V);
    for (int n = 0; n < 2; n++)
        for (size_t c = 0; c < sizeof copies / sizeof copies[0]; c++) {
            int64_t want, group = 300, first = 1500, step = 13; /* indices 1500 .. 5387: tiles 0 to 2 */
            float p;
            make_tie_row(x, V, group, first, step, &want, &p, copies[c]);
            run_topp(impl_named(names[n]), x, y, &p, 1, V, V, 0);
            int64_t kept_group = 0;
            for (int64_t g = 0; g < group; g++) {
                int64_t i = first + g * step;
                int kept = bits_of(y[i]) == bits_of(x[i]);
                cr_assert_eq(kept, g < want, "%s copies %.1f: group member %lld (index %lld) %s; want the %lld "
                             "lowest-index copies",
                             names[n], copies[c], (long long)g, (long long)i, kept ? "kept" : "dropped",
                             (long long)want);
                kept_group += kept;
            }
            for (int64_t i = 0; i < V; i++) {
                if (x[i] == 3.0f) cr_assert_eq(bits_of(y[i]), bits_of(x[i]), "%s dropped a 3.0 token", names[n]);
                if (x[i] == -2.0f) cr_assert_eq(bits_of(y[i]), bits_of(-INFINITY), "%s kept a -2.0 token", names[n]);
            }
            cr_assert_eq(kept_group, want);
        }
    free(x), free(y);
}

/* vLLM's test_topp_tie_break_deterministic: 1000 logits of 1.0, 1000 of 0.0, p = 0.5. */
Test(topp_host, thousand_way_tie_keeps_prefix) {
    enum { V = 128256, B = 4 };
    float *x = alloc_floats(B * V), *y = alloc_floats(B * V), p[B];
    for (int64_t r = 0; r < B; r++) {
        for (int64_t i = 0; i < V; i++) x[r * V + i] = i < 1000 ? 1.0f : i < 2000 ? 0.0f : -INFINITY;
        p[r] = 0.5f;
    }
    double z = 1000.0 * exp(1.0) + 1000.0;
    int64_t want = (int64_t)ceil(0.5 * z / exp(1.0)); /* 684 copies of 1.0 reach 0.5 */
    const kp_impl *impl = impl_named("topp.split_prob@host");
    for (int rep = 0; rep < 5; rep++) {
        run_topp(impl, x, y, p, B, V, V, 0);
        for (int64_t r = 0; r < B; r++)
            for (int64_t i = 0; i < V; i++) {
                uint32_t expect = i < want ? bits_of(1.0f) : bits_of(-INFINITY);
                cr_assert_eq(bits_of(y[r * V + i]), expect, "rep %d row %lld token %lld (want the first %lld kept)",
                             rep, (long long)r, (long long)i, (long long)want);
            }
    }
    free(x), free(y);
}

/* ---- near-uniform rows: one f32 prob shared by many distinct logits ---- */


Test(topp_host, split_prob_flat_rows_follow_rule, .timeout = 120) {
    static const double spreads[] = {1e-6, 1e-4, 0.01, 0.1};
    enum { V = 32000, B = 8 };
    const kp_impl *impl = impl_named("topp.split_prob@host");
    float *x = alloc_floats(B * V), *y = alloc_floats(B * V);
    for (size_t s = 0; s < sizeof spreads / sizeof spreads[0]; s++) {
        for (int64_t r = 0; r < B; r++) fill_flat(x + r * V, V, 70 + (uint64_t)r, spreads[s]);
        run_topp(impl, x, y, mixed_ps, B, V, V, 0);
        for (int64_t r = 0; r < B; r++) {
            row_verdict rv;
            const char *why = rule_violation(x + r * V, y + r * V, V, mixed_ps[r], 1, 0, &rv);
            cr_assert_null(why, "spread %g row %lld p %g: %s (kept %lld, mass %.9f)", spreads[s], (long long)r,
                           (double)mixed_ps[r], why, (long long)rv.kept, rv.mass);
        }
    }
    free(x), free(y);
}

/* The members of the level kept by y: all must rank above all dropped ones by logit. Returns kept. */
static int64_t level_kept_in_order(const float *x, const float *y, int64_t vocab, float *lowest_kept,
                                   float *highest_dropped) {
    int64_t kept = 0;
    *lowest_kept = INFINITY, *highest_dropped = -INFINITY;
    for (int64_t i = 0; i < vocab; i++) {
        if (!isfinite(x[i])) continue;
        if (bits_of(y[i]) == bits_of(x[i])) {
            kept++;
            if (x[i] < *lowest_kept) *lowest_kept = x[i];
        } else if (x[i] > *highest_dropped) {
            *highest_dropped = x[i];
        }
    }
    return kept;
}

/* The defect split_prob had: the kept members of a level chosen by index, not by the rule's order. */
static void plant_index_order_selection(const float *x, float *y, int64_t vocab, int64_t keep) {
    for (int64_t i = 0; i < vocab; i++) {
        if (!isfinite(x[i])) continue;
        y[i] = keep > 0 ? x[i] : -INFINITY;
        keep -= keep > 0;
    }
}

Test(topp_host, split_prob_level_kept_in_rule_order_and_index_order_defect_caught) {
    enum { V = 20000 };
    float *x = alloc_floats(V), *y = alloc_floats(V), *bad = alloc_floats(V), p = 0.5f;
    int64_t n = make_level_row(x, V, 99, 3000);
    run_topp(impl_named("topp.split_prob@host"), x, y, &p, 1, V, V, 0);
    float lowest_kept, highest_dropped;
    int64_t kept = level_kept_in_order(x, y, V, &lowest_kept, &highest_dropped);
    cr_assert(kept == n / 2 || kept == n / 2 + 1, "kept %lld of the %lld-member level at p 0.5", (long long)kept,
              (long long)n);
    cr_assert_lt(highest_dropped, lowest_kept, "a dropped member (%g) outranks a kept one (%g)",
                 (double)highest_dropped, (double)lowest_kept);
    cr_assert_null(rule_violation(x, y, V, p, 1, 0, NULL));

    memcpy(bad, x, V * sizeof *bad);
    plant_index_order_selection(x, bad, V, kept);
    cr_assert_not_null(rule_violation(x, bad, V, p, 1, 0, NULL), "the judge must catch index-order selection");
    level_kept_in_order(x, bad, V, &lowest_kept, &highest_dropped);
    cr_assert_gt(highest_dropped, lowest_kept, "the planted defect did not invert the order");

    /* the other half of the old defect: the whole level (or more) kept, not minimal */
    cr_assert_not_null(rule_violation(x, x, V, p, 1, 0, NULL), "keeping the whole level must fail minimality");
    free(x), free(y), free(bad);
}

/* Flat rows among ordinary ones: the row bits must not depend on the batch either. */
Test(topp_host, split_prob_flat_row_bits_do_not_depend_on_batch, .timeout = 60) {
    enum { V = 32000, B = 65 };
    const kp_impl *impl = impl_named("topp.split_prob@host");
    float *x = alloc_floats(B * V), *y = alloc_floats(B * V), *alone = alloc_floats(V), p[B];
    for (int64_t r = 0; r < B; r++) {
        if (r % 3 == 0) fill_flat(x + r * V, V, 300 + (uint64_t)r, r % 2 ? 1e-6 : 1e-4);
        else fill_ordinary(x + r * V, V, 300 + (uint64_t)r);
        p[r] = mixed_ps[r % 8];
    }
    run_topp(impl, x, y, p, B, V, V, 0);
    for (int64_t r = 0; r < B; r += 3) {
        run_topp(impl, x + r * V, alone, &p[r], 1, V, V, 0);
        cr_assert(memcmp(alone, y + r * V, V * sizeof *y) == 0, "row %lld differs alone and in a batch of %d",
                  (long long)r, B);
    }
    free(x), free(y), free(alone);
}

/* ---- invariance and determinism ---- */

Test(topp_host, split_prob_row_bits_do_not_depend_on_batch, .timeout = 120) {
    static const int64_t vocabs[] = {5003, 131072};
    static const int64_t batches[] = {4, 64, 65};
    const kp_impl *impl = impl_named("topp.split_prob@host");
    for (size_t v = 0; v < 2; v++) {
        int64_t vocab = vocabs[v];
        float *pool = alloc_floats(65 * vocab), ppool[65];
        for (int64_t r = 0; r < 65; r++) {
            fill_ordinary(pool + r * vocab, vocab, 500 + (uint64_t)r);
            ppool[r] = r % 3 == 0 ? 0.95f : r % 3 == 1 ? 0.5f : 0.99f;
        }
        pool[17 * vocab + 3] = 1e9f; /* a forced row among them */
        float *alone = alloc_floats(65 * vocab), *y = alloc_floats(65 * vocab);
        for (int64_t r = 0; r < 65; r++) run_topp(impl, pool + r * vocab, alone + r * vocab, &ppool[r], 1, vocab, vocab, 0);
        for (size_t b = 0; b < 3; b++) {
            int64_t batch = batches[b];
            if (vocab > 5003 && batch > 4) continue; /* the large vocab only at the smallest batch: time */
            /* a batch of rows rotated through the pool, so each row sits at a new position */
            for (int64_t shift = 0; shift < 65; shift += batch) {
                float *x = alloc_floats(batch * vocab), p[65];
                rotate_rows(x, p, pool, ppool, 65, batch, shift, vocab);
                run_topp(impl, x, y, p, batch, vocab, vocab, 0);
                for (int64_t r = 0; r < batch; r++) {
                    int64_t src = (r + shift) % 65;
                    cr_assert(memcmp(y + r * vocab, alone + src * vocab, (size_t)vocab * sizeof *y) == 0,
                              "row %lld at position %lld of batch %lld (vocab %lld) differs from the row alone",
                              (long long)src, (long long)r, (long long)batch, (long long)vocab);
                }
                free(x);
            }
        }
        free(pool), free(alone), free(y);
    }
}

Test(topp_host, repeat_calls_and_thread_counts_agree, .timeout = 120) {
    enum { V = 154856, B = 8 };
    static const char *names[] = {"topp.split_logit@host", "topp.split_prob@host"};
    float *x = alloc_floats(B * V), *first = alloc_floats(B * V), *y = alloc_floats(B * V), p[B];
    for (int64_t r = 0; r < B; r++) {
        fill_ordinary(x + r * V, V, 900 + (uint64_t)r);
        p[r] = 0.95f;
    }
    for (int n = 0; n < 2; n++) {
        const kp_impl *impl = impl_named(names[n]);
        setenv("KPARITY_THREADS", "1", 1);
        run_topp(impl, x, first, p, B, V, V, 0);
        static const char *threads[] = {"1", "3", "8"};
        for (int rep = 0; rep < 3; rep++) {
            setenv("KPARITY_THREADS", threads[rep], 1);
            run_topp(impl, x, y, p, B, V, V, 0);
            cr_assert(memcmp(first, y, sizeof(float) * B * V) == 0, "%s: call %d with %s threads differs", names[n],
                      rep + 2, threads[rep]);
        }
    }
    unsetenv("KPARITY_THREADS");
    free(x), free(first), free(y);
}

/* ---- the CUDA kernels' pivot schedule, run on the host ----
 * split_prob@cuda (kernels/cuda/topp_prob.cuh) takes 2048 pivots a round spaced by 2^sh and 3 rounds; the host port
 * takes 64 evenly spread pivots and 5 rounds. The level is the one f32 prob q with mass(> q) < P <= mass(>= q), so
 * from the same start both must end in the same state. The GPU schedule runs here through kernels/topp_split.h's
 * kp_topp_gpu_* steps, the code the kernels run (tests/fixtures/topp_gpu_schedule.h); the positive control is the
 * same code built with the test-only plant KP_TOPP_PLANT_PIVOTS_PAST_HI (the defect the H200 run found: pivots past
 * hi left in the decision; tests/fixtures/topp_schedule_planted.c), which must change a row. */
void kpt_planted_gpu_schedule_search(kp_topp_search *s, const float *prob, int64_t n);

static void host_ladder_search(kp_topp_search *s, const float *prob, int64_t n) {
    for (int round = 0; round < KP_TOPP_ROUNDS_PROB && s->mode == KP_TOPP_LIVE; round++) {
        uint32_t pivots[KP_TOPP_FANOUT_PROB];
        uint64_t hist[KP_TOPP_FANOUT_PROB + 1] = {0};
        for (int f = 0; f < KP_TOPP_FANOUT_PROB; f++) pivots[f] = kp_topp_pivot(s, f);
        for (int64_t i = 0; i < n; i++) {
            uint32_t pb = kp_topp_bits(prob[i]);
            if (pb <= s->lo || pb > s->hi) continue;
            hist[kp_topp_bucket(pivots, pb)] += kp_topp_fix(prob[i]);
        }
        kp_topp_advance(s, hist);
    }
    kp_topp_finish(s);
}

/* The start state and f32 probs of a row of logits (any consistent f32 arithmetic will do). */
static int64_t row_probs(const float *x, int64_t V, float p, float *prob, kp_topp_search *s) {
    float m = -INFINITY, mn = INFINITY, z = 0.0f;
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++)
        if (isfinite(x[i])) m = fmaxf(m, x[i]), mn = fminf(mn, x[i]);
    for (int64_t i = 0; i < V; i++)
        if (isfinite(x[i])) z += expf(x[i] - m);
    for (int64_t i = 0; i < V; i++)
        if (isfinite(x[i])) prob[n++] = expf(x[i] - m) / z;
    kp_topp_start(s, m, z, mn, n, p, n ? expf(mn - m) / z : 0.0f);
    return n;
}

static int same_state(const kp_topp_search *a, const kp_topp_search *b) {
    return a->mode == b->mode && a->lo == b->lo && a->hi == b->hi && a->hi_mass == b->hi_mass &&
           a->numdup == b->numdup && a->numkeep == b->numkeep;
}

Test(topp_search, gpu_pivot_schedule_ends_where_the_host_ladder_does, .timeout = 120) {
    static const int64_t vocabs[] = {1, 2, 5, 2048, 5003, 40000};
    static const float ps[] = {1e-30f, 1e-6f, 0.1f, 0.5f, 0.9f, 0.95f, 0.999f, 0.9999999f};
    float *x = alloc_floats(40000), *prob = alloc_floats(40000);
    int64_t compared = 0, levels = 0, planted_caught = 0;
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++)
        for (int profile = 0; profile < 6; profile++)
            for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
                const int64_t V = vocabs[v];
                const uint64_t seed = 1000 * v + 10 * (uint64_t)profile + k;
                switch (profile) {
                case 0: fill_ordinary(x, V, seed); break;
                case 1: fill_flat(x, V, seed, 1e-6); break;
                case 2: fill_flat(x, V, seed, 1e-2); break;
                case 3: make_level_row(x, V, seed, V / 3 + 1); break;
                case 4: fill_ordinary(x, V, seed), x[V / 2] = 1e9f; break;        /* the seed's forced logit */
                default: fill_ordinary(x, V, seed), x[0] = -INFINITY, x[V - 1] = NAN; break;
                }
                kp_topp_search host, gpu, planted;
                const int64_t n = row_probs(x, V, ps[k], prob, &host);
                gpu = planted = host;
                host_ladder_search(&host, prob, n);
                kpt_gpu_schedule_search(&gpu, prob, n);
                kpt_planted_gpu_schedule_search(&planted, prob, n);
                cr_assert(same_state(&gpu, &host),
                          "vocab %lld profile %d top_p %g: GPU schedule mode %d level %08x numdup %lld numkeep %lld, "
                          "host ladder mode %d level %08x numdup %lld numkeep %lld", (long long)V, profile,
                          (double)ps[k], gpu.mode, gpu.hi, (long long)gpu.numdup, (long long)gpu.numkeep, host.mode,
                          host.hi, (long long)host.numdup, (long long)host.numkeep);
                compared++;
                levels += host.mode == KP_TOPP_LEVEL;
                planted_caught += !same_state(&planted, &host);
            }
    cr_log_info("%lld rows, %lld decided by a level; the planted defect changed %lld", (long long)compared,
                (long long)levels, (long long)planted_caught);
    cr_assert_gt(levels, compared / 2, "most rows must reach the level search, or the comparison is vacuous");
    cr_assert_gt(planted_caught, 0, "positive control: leaving the pivots past hi in the decision must change a row");
    free(x), free(prob);
}

Test(topp_host, padding_between_vocab_and_stride_untouched) {
    enum { V = 4099, STRIDE = V + 37, B = 3 };
    static const char *names[] = {"topp.split_logit@host", "topp.split_prob@host"};
    const uint32_t sentinel = 0x7fbadbadu;
    float *x = alloc_floats(B * STRIDE), *y = alloc_floats(B * STRIDE), p[B] = {0.95f, 0.5f, 1.0f};
    for (int64_t r = 0; r < B; r++) {
        fill_ordinary(x + r * STRIDE, V, 77 + (uint64_t)r);
        for (int64_t i = V; i < STRIDE; i++) x[r * STRIDE + i] = 1e30f; /* must never be read as a logit */
    }
    for (int n = 0; n < 2; n++) {
        for (int64_t i = 0; i < B * STRIDE; i++) memcpy(&y[i], &sentinel, sizeof sentinel);
        run_topp(impl_named(names[n]), x, y, p, B, V, STRIDE, 0);
        for (int64_t r = 0; r < B; r++) {
            for (int64_t i = V; i < STRIDE; i++)
                cr_assert_eq(bits_of(y[r * STRIDE + i]), sentinel, "%s wrote padding row %lld element %lld",
                             names[n], (long long)r, (long long)i);
            const char *why = rule_violation(x + r * STRIDE, y + r * STRIDE, V, p[r], 0, n == 0, NULL);
            cr_assert_null(why, "%s row %lld with stride %d: %s", names[n], (long long)r, STRIDE, why);
        }
    }
    free(x), free(y);
}

Test(topp_host, bad_args_are_refused_naming_the_field) {
    float x[8] = {0}, y[8], p = 0.9f;
    static const char *names[] = {"topp.split_logit@host", "topp.split_prob@host"};
    for (int n = 0; n < 2; n++) {
        const kp_impl *impl = impl_named(names[n]);
        struct {
            kp_topp_args a;
            const char *field;
        } bad[] = {
            {{NULL, y, &p, 1, 8, 8, NULL, NULL, 0, 0}, "logits"},
            {{x, NULL, &p, 1, 8, 8, NULL, NULL, 0, 0}, "out"},
            {{x, y, NULL, 1, 8, 8, NULL, NULL, 0, 0}, "top_p"},
            {{x, y, &p, 0, 8, 8, NULL, NULL, 0, 0}, "batch"},
            {{x, y, &p, -3, 8, 8, NULL, NULL, 0, 0}, "batch"},
            {{x, y, &p, 1, 0, 8, NULL, NULL, 0, 0}, "vocab"},
            {{x, y, &p, 1, 8, 7, NULL, NULL, 0, 0}, "row_stride"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            char msg[256] = "";
            for (int k = 0; k < 8; k++) y[k] = 42.0f;
            int rc = impl->supports(&bad[i].a, msg, sizeof msg);
            cr_assert_eq(rc, KP_RUN_NOT_SUPPORTED, "%s supports() case %zu: rc %d", names[n], i, rc);
            cr_assert(strstr(msg, bad[i].field), "%s supports() message '%s' does not name %s", names[n], msg,
                      bad[i].field);
            msg[0] = '\0';
            rc = impl->run(&bad[i].a, msg, sizeof msg);
            cr_assert(rc == KP_RUN_NOT_SUPPORTED || rc == KP_RUN_FAILED, "%s run() case %zu: rc %d", names[n], i, rc);
            cr_assert(strstr(msg, bad[i].field), "%s run() message '%s' does not name %s", names[n], msg,
                      bad[i].field);
            for (int k = 0; k < 8; k++) cr_assert_eq(y[k], 42.0f, "%s wrote out on a refused call", names[n]);
        }
        char msg[64];
        cr_assert_eq(impl->supports(NULL, msg, sizeof msg), KP_RUN_NOT_SUPPORTED);
        kp_topp_args ok = {x, y, &p, 1, 8, 8, NULL, NULL, 0, 0};
        cr_assert_eq(impl->supports(&ok, msg, sizeof msg), KP_RUN_OK);
        cr_assert_eq(impl->workspace_bytes(&ok), 0);
        cr_assert_eq(impl->memory, KP_MEMORY_HOST);
        cr_assert_eq(impl->abi, KP_ABI_VERSION);
    }
}

/* ---- registry and plugins ---- */

Test(registry, finds_builtins_by_exact_name) {
    int count = kp_impl_count();
    cr_assert_geq(count, kp_registry_has_cuda() ? 4 : 2);
    cr_assert_eq(kp_impl_find("topp.split_logit@host"), &kp_topp_split_logit_host);
    cr_assert_eq(kp_impl_find("topp.split_prob@host"), &kp_topp_split_prob_host);
    cr_assert_null(kp_impl_find("topp.split_prob"));
    cr_assert_null(kp_impl_find("topp.split_prob@host "));
    cr_assert_null(kp_impl_find(NULL));
    cr_assert_null(kp_impl_at(-1));
    cr_assert_null(kp_impl_at(count));
    int seen_logit = 0, seen_prob = 0;
    for (int i = 0; i < count; i++) {
        const kp_impl *impl = kp_impl_at(i);
        cr_assert_not_null(impl);
        cr_assert_eq(kp_impl_find(impl->name), impl, "%s is not found by its own name", impl->name);
        const char *sha = "unset";
        cr_assert_null(kp_impl_origin(impl, &sha), "a built-in has no plugin origin");
        cr_assert_null(sha);
        seen_logit += impl == &kp_topp_split_logit_host;
        seen_prob += impl == &kp_topp_split_prob_host;
    }
    cr_assert(seen_logit == 1 && seen_prob == 1);
#ifdef KP_HAVE_CUDA
    cr_assert_eq(kp_impl_find("topp.split_prob@cuda"), &kp_topp_split_prob_cuda);
    cr_assert_eq(kp_impl_find("topp.split_logit@cuda"), &kp_topp_split_logit_cuda);
#endif
}

/* Build tests/fixtures/plugin_topp_copy.c with extra -D flags into dir/name. */
static char *build_fixture(const char *dir, const char *name, const char *define1, const char *define2) {
    char *so, *src, *inc;
    cr_assert(asprintf(&so, "%s/%s", dir, name) > 0);
    cr_assert(asprintf(&src, "%s/tests/fixtures/plugin_topp_copy.c", kpt_source_dir()) > 0);
    cr_assert(asprintf(&inc, "-I%s/kernels", kpt_source_dir()) > 0);
    char *argv[16];
    int n = 0;
    argv[n++] = "/usr/bin/env";
    argv[n++] = "cc";
    argv[n++] = "-shared";
    argv[n++] = "-fPIC";
    argv[n++] = "-std=c11";
    argv[n++] = inc;
    if (define1) argv[n++] = (char *)define1;
    if (define2) argv[n++] = (char *)define2;
    argv[n++] = "-o";
    argv[n++] = so;
    argv[n++] = src;
    argv[n] = NULL;
    char *out = NULL, *err = NULL;
    int rc = kpt_run(argv, &out, &err);
    cr_assert_eq(rc, 0, "building the plugin fixture failed (%d): %s%s", rc, out, err);
    free(out), free(err), free(src), free(inc);
    return so;
}

static void expect_load_error(const char *path, const char *needle) {
    int before = kp_impl_count();
    kp_error err = {0};
    int rc = kp_plugin_load(path, &err);
    cr_assert_eq(rc, KP_EXIT_USAGE, "loading %s: rc %d (%s)", path, rc, err.msg);
    cr_assert_eq(err.code, KP_EXIT_USAGE);
    cr_assert(strstr(err.msg, path), "message '%s' does not name the path %s", err.msg, path);
    cr_assert(strstr(err.msg, needle), "message '%s' does not name %s", err.msg, needle);
    cr_assert_eq(kp_impl_count(), before, "a refused plugin registered something");
}

/* Builds the copy fixture with the given defines into dir/name and expects loading it to fail naming needle. */
static void expect_fixture_error(const char *dir, const char *name, const char *define1, const char *define2,
                                 const char *needle) {
    char *so = build_fixture(dir, name, define1, define2);
    expect_load_error(so, needle);
    free(so);
}

Test(registry, plugin_load_errors_name_path_and_field, .timeout = 60) {
    char *dir = kpt_tempdir();
    cr_assert_not_null(dir);
    char *missing;
    cr_assert(asprintf(&missing, "%s/no-such-plugin.so", dir) > 0);
    expect_load_error(missing, "cannot load");

    char *not_a_lib;
    cr_assert(asprintf(&not_a_lib, "%s/not-a-library.so", dir) > 0);
    cr_assert_eq(kpt_write(not_a_lib, "hello\n", 6), 0);
    expect_load_error(not_a_lib, "cannot load");

    expect_fixture_error(dir, "no_entry.so", "-DKPT_FIXTURE_NO_ENTRY", NULL, KP_PLUGIN_ENTRY_NAME);
    expect_fixture_error(dir, "abi.so", "-DKPT_FIXTURE_ABI=2u", NULL, "abi");
    expect_fixture_error(dir, "family.so", "-DKPT_FIXTURE_FAMILY=\"toppp\"", "-DKPT_FIXTURE_NAME=\"toppp.copy@host\"",
                         "family");
    static const char *bad_names[] = {"-DKPT_FIXTURE_NAME=\"moe.copy@host\"", "-DKPT_FIXTURE_NAME=\"topp.copy\"",
                                      "-DKPT_FIXTURE_NAME=\"topp.@host\"", "-DKPT_FIXTURE_NAME=\"topp.copy@\"",
                                      "-DKPT_FIXTURE_NAME=\"topp.co py@host\"", "-DKPT_FIXTURE_NAME=\"toppcopy@host\""};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        char file[32];
        snprintf(file, sizeof file, "name%zu.so", i);
        expect_fixture_error(dir, file, bad_names[i], NULL, "name");
    }
    expect_fixture_error(dir, "memory.so", "-DKPT_FIXTURE_MEMORY=7", NULL, "memory");
    expect_fixture_error(dir, "run.so", "-DKPT_FIXTURE_NULL_RUN", NULL, "run");
    expect_fixture_error(dir, "clash.so", "-DKPT_FIXTURE_NAME=\"topp.split_prob@host\"", NULL, "already registered");
    expect_fixture_error(dir, "twice.so", "-DKPT_FIXTURE_COUNT=2", NULL, "repeats");
    expect_fixture_error(dir, "empty.so", "-DKPT_FIXTURE_COUNT=0", NULL, "at least one");

    kp_error err = {0};
    cr_assert_eq(kp_plugin_load("libm.so.6", &err), KP_EXIT_USAGE, "a bare name must be refused");
    cr_assert(strstr(err.msg, "libm.so.6"));
    kpt_rmtree(dir);
    free(dir), free(missing), free(not_a_lib);
}

Test(registry, plugin_loads_and_records_origin, .timeout = 60) {
    char *dir = kpt_tempdir();
    cr_assert_not_null(dir);
    char *so = build_fixture(dir, "copy.so", NULL, NULL);
    int before = kp_impl_count();
    kp_error err = {0};
    int rc = kp_plugin_load(so, &err);
    cr_assert_eq(rc, 0, "loading %s: %s", so, err.msg);
    cr_assert_eq(kp_impl_count(), before + 1);
    const kp_impl *impl = kp_impl_find("topp.copy@host");
    cr_assert_not_null(impl);
    cr_assert_eq(kp_impl_at(before), impl);
    const char *sha = NULL;
    const char *origin = kp_impl_origin(impl, &sha);
    cr_assert_str_eq(origin, so);
    char want[KP_SHA256_HEX_LEN];
    cr_assert_eq(kp_sha256_file_hex(so, want, &err), 0);
    cr_assert_str_eq(sha, want);

    /* the plugin's run() is callable through the registry */
    float x[4] = {1, 2, 3, 4}, y[4] = {0}, p = 0.5f;
    kp_topp_args a = {x, y, &p, 1, 4, 4, NULL, NULL, 0, 0};
    char msg[64];
    cr_assert_eq(impl->run(&a, msg, sizeof msg), KP_RUN_OK);
    cr_assert(memcmp(x, y, sizeof x) == 0);

    /* the same plugin twice clashes on the name and names the first origin */
    expect_load_error(so, "already registered");
    kpt_rmtree(dir);
    free(dir), free(so);
}
