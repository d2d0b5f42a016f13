/* topk_ref.h: the reference for indexer top-k (DESIGN.md "topk") and the judge that holds any output to
 * the rule, order-insensitive. Written from the rule, never from an impl.
 *
 * The rule: over row r's window [start, end), the count = min(k, len) entries first in the total order
 * (value descending, then index ascending; -0 and +0 are one value; NaN below every number, -inf
 * included, or with KP_TOPK_NAN_ABOVE above every number, +inf included, as torch.topk ranks it; every NaN is
 * one value, so NaNs tie among themselves and go by index ascending like equal numbers), as indices in the
 * declared base, then fill. The boundary value is the count-th entry's; its tie group is every window entry of
 * that value. */
#ifndef KP_TOPK_REF_H
#define KP_TOPK_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "../cases/kp_common.h"
#include "../cases/kp_sha256.h"

/* Where NaN ranks: below every number (kparity's rule by default) or above (torch.topk's convention). */
typedef enum kp_topk_nan { KP_TOPK_NAN_BELOW = 0, KP_TOPK_NAN_ABOVE } kp_topk_nan;
const char *kp_topk_nan_name(kp_topk_nan n);

typedef struct kp_topk_ref_row {
    int32_t start, len, count;
    int64_t nan_count;      /* NaN entries in the window */
    uint32_t boundary_key;  /* the total order's key of the count-th entry (kernels/topk_radix.h's mapping) */
    float boundary_value;   /* its score */
    int64_t above;          /* window entries strictly before the boundary value */
    int64_t group_size;     /* window entries of the boundary value */
    int64_t group_needed;   /* of those, how many the answer takes (count - above) */
} kp_topk_ref_row;

typedef struct kp_topk_ref {
    int64_t rows;
    int32_t k, index_base, fill;
    kp_topk_nan nan;      /* where NaN ranks in this answer; the judge classifies with the same order */
    kp_topk_ref_row *row; /* [rows] */
    int32_t *indices;     /* [rows, k]: the answer, ascending index in the declared base, then fill */
    float *values;        /* [rows, k]: their scores, then -inf */
} kp_topk_ref;

/* scores [rows, stride]; each row's window [starts[r], ends[r]); NaN ranked as `nan` says. Rows in parallel
 * (kp_parallel_for). KP_EXIT_USAGE for a bad shape or window, k outside [1, 8192], a fill other than -1 and
 * INT32_MAX. */
int kp_topk_reference(const float *scores, int64_t rows, int64_t width, int64_t stride, const int32_t *starts,
                      const int32_t *ends, int32_t k, int32_t index_base, int32_t fill, kp_topk_nan nan, kp_topk_ref *out,
                      kp_error *err);
void kp_topk_ref_free(kp_topk_ref *ref);

/* Which members of the boundary tie group an output may take, and the order its entries must be in. */
typedef enum kp_topk_ties { KP_TOPK_TIES_LOWEST_INDEX = 0, KP_TOPK_TIES_ANY } kp_topk_ties;
typedef enum kp_topk_order { KP_TOPK_ORDER_INDEX = 0, KP_TOPK_ORDER_VALUE, KP_TOPK_ORDER_ANY } kp_topk_order;
const char *kp_topk_ties_name(kp_topk_ties t);
const char *kp_topk_order_name(kp_topk_order o);

/* How one output row compares with the rule. Index lists are row-absolute window positions. */
typedef struct kp_topk_row_judgement {
    int64_t valid;           /* entries other than fill */
    int64_t fill_misplaced;  /* fill among the first count entries, or an index after them */
    int64_t fill_value_bad;  /* a fill entry whose value is not -inf */
    int64_t out_of_window;   /* an index outside the window (in the declared base) */
    int64_t duplicates;      /* an index given twice */
    int64_t value_mismatch;  /* a value not bit-identical to the score at its index */
    int64_t strict_count, tie_count; /* selection differences, classified */
    int64_t missing_count;   /* of those, entries of the answer the output lacks */
    int64_t dropped;         /* unselected entries strictly before the boundary value: lost candidates */
    bool order_ok;           /* the valid entries are in the declared order */
    bool rule_ok;
    char set_sha256[KP_SHA256_HEX_LEN]; /* SHA-256 of the selected row-absolute indices, ascending, int32 LE */
} kp_topk_row_judgement;

typedef struct kp_topk_judgement {
    int64_t rows, rows_rule_ok;
    kp_topk_ties ties;
    kp_topk_order order;
    kp_topk_row_judgement *row;
    int64_t *strict_off, *strict_idx; /* CSR over rows */
    int64_t *tie_off, *tie_idx;
    int64_t *missing_off, *missing_idx; /* entries of the answer the output lacks (strict or tie) */
} kp_topk_judgement;

/* Judge indices and values ([rows, k] each) produced from scores against the reference, in its NaN rank. A selection
 * difference on an entry of the boundary value is `tie`, any other `strict`; `tie` breaks the rule only
 * under KP_TOPK_TIES_LOWEST_INDEX. */
int kp_topk_judge(const kp_topk_ref *ref, const float *scores, int64_t stride, const int32_t *indices,
                  const float *values, kp_topk_ties ties, kp_topk_order order, kp_topk_judgement *out, kp_error *err);
void kp_topk_judgement_free(kp_topk_judgement *j);

#endif
