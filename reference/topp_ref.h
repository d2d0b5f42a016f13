/* topp_ref.h: the float64 reference for the split top-p rule (DESIGN.md "topp"), and the judge
 * that holds any mask to that rule. Written from the rule, never from an impl. */
#ifndef KP_TOPP_REF_H
#define KP_TOPP_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "../cases/kp_common.h"

/* How the boundary tie group (every token bit-equal to the boundary token's logit) may be kept. */
typedef enum kp_tie_policy {
    KP_TIE_MINIMAL_INDEX = 0, /* keep only the copies needed, lowest index first */
    KP_TIE_INCLUSIVE = 1      /* keep the whole group */
} kp_tie_policy;

const char *kp_tie_policy_name(kp_tie_policy p);
int kp_tie_policy_parse(const char *s, kp_tie_policy *out); /* 0 on success, else KP_EXIT_USAGE */

/* Per row, what the rule says. Indices are absolute within the row; -1 where none.
 * Rule order is (logit desc, index asc), which is (p desc, index asc) since p is monotone in the
 * logit; -0 and +0 have the same p, so they count as one value (one tie group, ordered by index).
 * +inf tokens, when present, come first, share all the mass and are kept like any other token. */
typedef struct kp_topp_ref_row {
    double top_p;             /* the row's f32 top_p, widened */
    double max_logit;         /* max finite logit; -inf when none */
    double z;                 /* sum exp(x - max) over finite tokens */
    int64_t finite_count;     /* tokens that are neither NaN nor +-inf */
    int64_t nan_count;        /* NaN inputs (the declared policy: NaN is treated as -inf, never kept) */
    int64_t posinf_count;     /* +inf inputs: they share all the mass equally */
    int64_t kept_count;       /* rule mask under minimal_index (+inf tokens included) */
    double kept_mass;         /* float64 mass of that mask */
    int64_t boundary_token;   /* last kept token in rule order */
    float boundary_logit;
    int64_t tie_group_size;   /* tokens bit-equal to boundary_logit (+-0 as one) */
    int64_t tie_needed;       /* copies of the group the rule keeps (lowest index first) */
    double tie_group_mass_before; /* C_t of the group's first member */
    int64_t band_count;       /* tokens with |C_t - top_p| <= band */
} kp_topp_ref_row;

/* The reference for a whole [batch, vocab] input. */
typedef struct kp_topp_ref {
    int64_t batch, vocab;
    double band;               /* the ambiguity band the band_count fields were computed for */
    kp_topp_ref_row *rows;     /* [batch] */
    uint8_t *keep;             /* [batch, vocab]: 1 where the rule keeps the token (minimal_index) */
    uint8_t *in_group;         /* [batch, vocab]: 1 for members of the row's boundary tie group */
    double *prob;              /* [batch, vocab]: float64 probability (0 for -inf and NaN) */
    double *mass_before;       /* [batch, vocab]: C_t, float64 mass strictly before t in rule order; NaN for non-finite
                                  (+inf too, although the rule does order and keep +inf tokens) */
} kp_topp_ref;

/* Compute the reference; multithreaded over rows (kp_parallel_for). `logits` is [batch, row_stride].
 * Deterministic on every IEEE-754 machine: exp is computed with basic operations only.
 * KP_EXIT_USAGE for a bad shape, a negative or NaN band, a NaN top_p or vocab > 2^32-1. */
int kp_topp_reference(const float *logits, int64_t batch, int64_t vocab, int64_t row_stride,
                      const float *top_p, double band, kp_topp_ref *out, kp_error *err);
void kp_topp_ref_free(kp_topp_ref *ref);

/* How one output row's mask compares with the rule. */
typedef struct kp_topp_row_judgement {
    int64_t kept_count;        /* tokens whose output equals the input bit for bit (finite or +inf inputs) */
    double kept_mass;          /* float64 mass of the impl's kept set, summed in rule order */
    int64_t altered_count;     /* outputs that are neither -inf nor the input's bits: always strict */
    int64_t nan_out_count;     /* NaN in the output */
    bool all_neginf;           /* every output -inf although the row has finite (or +inf) inputs */
    int64_t group_kept;        /* members of the boundary tie group the impl kept */
    bool group_lowest_first;   /* the kept members are the lowest-index ones */
    int64_t strict_count, tie_count, band_count; /* differences from the rule, classified */
    /* Conformance without the reference mask (band applied): */
    bool mass_ok;              /* kept_mass >= top_p - band, or every keepable token kept */
    bool minimal_ok;           /* dropping the smallest kept token (the kept group, if inclusive) falls below top_p + band;
                                  holds for a single kept token (or group) and whenever top_p >= 1 */
    bool monotone_ok;          /* min kept logit >= max dropped finite (or +inf) logit */
    bool no_nan_ok;            /* no NaN in the output */
    bool nonempty_ok;          /* something kept when finite (or +inf) inputs exist; all_neginf implies false */
    bool rule_ok;              /* strict_count == 0 and every conformance flag holds */
} kp_topp_row_judgement;

/* Index lists of one judgement, CSR over rows: row r's strict indices are
 * strict_idx[strict_off[r] .. strict_off[r+1]). */
typedef struct kp_topp_judgement {
    int64_t batch;
    kp_tie_policy tie_policy;
    double band;
    kp_topp_row_judgement *rows;
    int64_t *strict_off, *strict_idx;
    int64_t *tie_off, *tie_idx;
    int64_t *band_off, *band_idx;
    int64_t rows_rule_ok;      /* count of rows with rule_ok */
} kp_topp_judgement;

/* Judge `output` ([batch, row_stride]) produced from `input` against the reference.
 * A difference from ref->keep inside the boundary tie group that the policy allows is `tie`;
 * else, on a band-ambiguous token (|C_t - top_p| <= band), `band`; else `strict`. */
int kp_topp_judge(const kp_topp_ref *ref, const float *input, const float *output, int64_t row_stride,
                  kp_tie_policy policy, double band, kp_topp_judgement *out, kp_error *err);
void kp_topp_judgement_free(kp_topp_judgement *j);

#endif
