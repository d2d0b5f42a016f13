/* test_reference_topk.c: the top-k reference against a brute-force sort of (value desc, index asc), and
 * the judge against planted defects: a dropped index, a duplicate, an index outside the window, a value
 * not bit-identical to the score, a misplaced fill, a wrong order, and a wrong tie choice under every
 * fill and index-base convention. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/topk_ref.h"
#include "kp_test_util.h"

static int g_nan_above; /* NaN ranks above every number (torch.topk's convention), else below */
static uint32_t key_of(float v) { /* written again here from the rule, independent of the reference's */
    if (isnan(v)) return g_nan_above ? UINT32_MAX : 0;
    if (v == 0.0f) v = 0.0f;
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static const float *g_row;
static int by_order(const void *a, const void *b) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const uint32_t ki = key_of(g_row[i]), kj = key_of(g_row[j]);
    if (ki != kj) return ki > kj ? -1 : 1;
    return (i > j) - (i < j);
}
static int by_index(const void *a, const void *b) { return (*(const int32_t *)a > *(const int32_t *)b) - (*(const int32_t *)a < *(const int32_t *)b); }

static void must_ref(const float *x, int64_t rows, int64_t width, const int32_t *s, const int32_t *e, int32_t k, int32_t base,
                     int32_t fill, kp_topk_ref *ref) {
    kp_error err = {0};
    cr_assert_eq(kp_topk_reference(x, rows, width, width, s, e, k, base, fill,
                                   g_nan_above ? KP_TOPK_NAN_ABOVE : KP_TOPK_NAN_BELOW, ref, &err), 0, "%s", err.msg);
}

static kp_topk_judgement must_judge(const kp_topk_ref *ref, const float *x, int64_t width, const int32_t *idx, const float *val,
                                    kp_topk_ties ties, kp_topk_order order) {
    kp_topk_judgement j;
    kp_error err = {0};
    cr_assert_eq(kp_topk_judge(ref, x, width, idx, val, ties, order, &j, &err), 0, "%s", err.msg);
    return j;
}

Test(reference_topk, matches_a_full_sort_on_rows_with_ties_zeros_nan_and_infinities) {
    enum { R = 24, W = 700 };
    float *x = malloc(sizeof *x * R * W);
    int32_t s[R], e[R], order[W];
    uint64_t seed = 11;
    for (int i = 0; i < R * W; i++) {
        const uint64_t u = kpt_splitmix(&seed) % 16;
        x[i] = u == 0 ? NAN : u == 1 ? INFINITY : u == 2 ? -INFINITY : u == 3 ? -0.0f : u == 4 ? 0.0f
             : (float)(int)(kpt_unit(&seed) * 8) / 4.0f; /* few distinct values: ties everywhere */
    }
    for (int r = 0; r < R; r++) s[r] = r % 5, e[r] = W - (r * 29) % W / 2;
    for (int run = 0; run < 4; run++) { /* each index base, NaN below and above */
        const int base = run & 1;
        g_nan_above = run >> 1;
        kp_topk_ref ref;
        const int32_t k = 300;
        must_ref(x, R, W, s, e, k, base, -1, &ref);
        for (int r = 0; r < R; r++) {
            const int32_t len = e[r] - s[r], count = len < k ? len : k;
            for (int i = 0; i < len; i++) order[i] = s[r] + i;
            g_row = x + r * W;
            qsort(order, (size_t)len, sizeof *order, by_order);
            qsort(order, (size_t)count, sizeof *order, by_index);
            for (int q = 0; q < k; q++) {
                const int32_t want = q < count ? order[q] - (base ? s[r] : 0) : -1;
                cr_assert_eq(ref.indices[r * k + q], want, "row %d entry %d (base %d, NaN %s)", r, q, base,
                             g_nan_above ? "above" : "below");
            }
            cr_assert_eq(ref.row[r].group_needed, count - ref.row[r].above);
            int nan_window = 0, nan_taken = 0; /* above: every NaN of the window is taken (k is past their count) */
            for (int i = s[r]; i < e[r]; i++) nan_window += isnan(x[r * W + i]);
            for (int q = 0; q < count; q++) nan_taken += isnan(x[r * W + order[q]]);
            cr_assert_eq(ref.row[r].nan_count, nan_window, "row %d", r);
            if (g_nan_above) cr_assert(nan_window > 0 && nan_taken == nan_window, "row %d: %d of %d NaN", r, nan_taken, nan_window);
        }
        kp_topk_ref_free(&ref);
    }
    g_nan_above = 0;
    free(x);
}

/* One row of 10 with the window [2, 9): 9, 5, 5, 1, 5, 8, 5. With k = 4 the rule takes the 9, the 8 and
 * the 5s at positions 3 and 4, the lowest two of the tie group 3, 4, 6, 8. */
static const float row10[10] = {99, 99, 9, 5, 5, 1, 5, 8, 5, 99};
static int32_t ws[1] = {2}, we[1] = {9};

Test(reference_topk, the_judge_passes_the_answer_and_catches_each_planted_defect) {
    for (int base = 0; base < 2; base++)
        for (int f = 0; f < 2; f++) {
            const int32_t fill = f ? INT32_MAX : -1, k = 9, shift = base ? 2 : 0; /* k > window: fill entries */
            kp_topk_ref ref;
            must_ref(row10, 1, 10, ws, we, k, base, fill, &ref);
            cr_assert_eq(ref.row[0].count, 7);
            int32_t idx[9];
            float val[9];
            kp_topk_judgement j;
#define RESET() memcpy(idx, ref.indices, sizeof idx), memcpy(val, ref.values, sizeof val)
            RESET();
            j = must_judge(&ref, row10, 10, idx, val, KP_TOPK_TIES_LOWEST_INDEX, KP_TOPK_ORDER_INDEX);
            cr_assert(j.row[0].rule_ok, "the answer itself (base %d, fill %d)", base, fill);
            kp_topk_judgement_free(&j);
            /* k = 9 over 7 entries takes them all, then two fills; tie choices come with k = 4 below */
            RESET(); /* a dropped index: the 9 at position 2 left out, a fill in its place */
            idx[0] = fill, val[0] = -INFINITY;
            j = must_judge(&ref, row10, 10, idx, val, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_ANY);
            cr_assert(!j.row[0].rule_ok && j.row[0].fill_misplaced == 1 && j.row[0].dropped == 1 && j.row[0].strict_count == 1);
            kp_topk_judgement_free(&j);
            RESET(); /* a duplicate */
            idx[1] = idx[0], val[1] = val[0];
            j = must_judge(&ref, row10, 10, idx, val, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_ANY);
            cr_assert(!j.row[0].rule_ok && j.row[0].duplicates == 1, "base %d fill %d", base, fill);
            kp_topk_judgement_free(&j);
            RESET(); /* outside the window: position 0 holds 99 but the window starts at 2 */
            idx[0] = 0 - shift, val[0] = 99;
            j = must_judge(&ref, row10, 10, idx, val, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_ANY);
            cr_assert(!j.row[0].rule_ok && j.row[0].out_of_window == 1, "base %d fill %d", base, fill);
            kp_topk_judgement_free(&j);
            RESET(); /* a value one ulp off */
            val[2] = nextafterf(val[2], INFINITY);
            j = must_judge(&ref, row10, 10, idx, val, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_ANY);
            cr_assert(!j.row[0].rule_ok && j.row[0].value_mismatch == 1);
            kp_topk_judgement_free(&j);
            RESET(); /* a fill entry whose value is not -inf */
            val[8] = 0.0f;
            j = must_judge(&ref, row10, 10, idx, val, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_ANY);
            cr_assert(!j.row[0].rule_ok && j.row[0].fill_value_bad == 1);
            kp_topk_judgement_free(&j);
            RESET(); /* out of index order: fine under "any", not under "index" */
            int32_t t = idx[0];
            idx[0] = idx[1], idx[1] = t;
            float tv = val[0];
            val[0] = val[1], val[1] = tv;
            j = must_judge(&ref, row10, 10, idx, val, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_ANY);
            cr_assert(j.row[0].rule_ok);
            kp_topk_judgement_free(&j);
            j = must_judge(&ref, row10, 10, idx, val, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_INDEX);
            cr_assert(!j.row[0].rule_ok && !j.row[0].order_ok);
            kp_topk_judgement_free(&j);
            kp_topk_ref_free(&ref);

            /* k = 4: the 9, the 8 and the 5s at 3 and 4 */
            must_ref(row10, 1, 10, ws, we, 4, base, fill, &ref);
            cr_assert_eq(ref.row[0].group_size, 4);
            cr_assert_eq(ref.row[0].group_needed, 2);
            int32_t tie_idx[4];
            float tie_val[4];
            memcpy(tie_idx, ref.indices, sizeof tie_idx), memcpy(tie_val, ref.values, sizeof tie_val);
            for (int q = 0; q < 4; q++) /* take the 5 at 8 instead of the one at 3 */
                if (tie_idx[q] == 3 - shift) tie_idx[q] = 8 - shift;
            qsort(tie_idx, 4, sizeof *tie_idx, by_index);
            for (int q = 0; q < 4; q++) tie_val[q] = row10[tie_idx[q] + shift]; /* values follow their indices */
            j = must_judge(&ref, row10, 10, tie_idx, tie_val, KP_TOPK_TIES_LOWEST_INDEX, KP_TOPK_ORDER_INDEX);
            cr_assert(!j.row[0].rule_ok && j.row[0].tie_count == 2 && j.row[0].strict_count == 0,
                      "a wrong tie choice (base %d, fill %d)", base, fill);
            kp_topk_judgement_free(&j);
            j = must_judge(&ref, row10, 10, tie_idx, tie_val, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_INDEX);
            cr_assert(j.row[0].rule_ok, "the same choice allowed under ties=any (base %d, fill %d)", base, fill);
            kp_topk_judgement_free(&j);
            /* a dropped candidate: the 8 (position 7) replaced by the 1 (position 5) */
            memcpy(tie_idx, ref.indices, sizeof tie_idx), memcpy(tie_val, ref.values, sizeof tie_val);
            for (int q = 0; q < 4; q++)
                if (tie_idx[q] == 7 - shift) tie_idx[q] = 5 - shift, tie_val[q] = 1;
            j = must_judge(&ref, row10, 10, tie_idx, tie_val, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_ANY);
            cr_assert(!j.row[0].rule_ok && j.row[0].strict_count == 2 && j.row[0].dropped == 1, "base %d fill %d", base, fill);
            cr_assert_eq(j.strict_idx[0], 5, "indices in the judgement are row positions");
            cr_assert(j.row[0].missing_count == 1 && j.missing_idx[0] == 7, "the missing entry is the 8 at position 7");
            kp_topk_judgement_free(&j);
            kp_topk_ref_free(&ref);
#undef RESET
        }
}

Test(reference_topk, bad_shapes_and_conventions_are_refused) {
    kp_topk_ref ref;
    kp_error err = {0};
    int32_t s[1] = {3}, e[1] = {2};
    cr_assert_eq(kp_topk_reference(row10, 1, 10, 10, s, e, 4, 0, -1, KP_TOPK_NAN_BELOW, &ref, &err), KP_EXIT_USAGE,
                 "a window that ends first");
    cr_assert(strstr(err.msg, "window"), "%s", err.msg);
    cr_assert_eq(kp_topk_reference(row10, 1, 10, 10, ws, we, 4, 0, 7, KP_TOPK_NAN_BELOW, &ref, &err), KP_EXIT_USAGE, "fill 7");
    cr_assert_eq(kp_topk_reference(row10, 1, 10, 10, ws, we, 0, 0, -1, KP_TOPK_NAN_BELOW, &ref, &err), KP_EXIT_USAGE, "k 0");
}
