/* topp_ref.c: the float64 reference for the split top-p rule (DESIGN.md "topp") and the judge
 * that classifies any output mask against it. Written from the rule alone, never from a kernel. */
#include "topp_ref.h"

#include "kp_detmath.h"

#include <math.h> /* isnan, isinf, fabs only: no transcendental, so every IEEE machine agrees */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- shared pieces ------------------------------------------------------------------------ */

static uint32_t float_bits(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static const uint32_t neg_inf_bits = 0xff800000u;

/* Rule order is (p desc, index asc); p is monotone in the logit, so the sort runs on the logit.
 * -0 is folded onto +0 because both have the same p and must tie, interleaved by index. */
static uint32_t rule_key(float v) {
    uint32_t bits = float_bits(v);
    if (bits == 0x80000000u) bits = 0;
    uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return ~ascending;
}

static uint64_t rule_item(float v, int64_t index) { return (uint64_t)rule_key(v) << 32 | (uint64_t)index; }
static int64_t item_index(uint64_t item) { return (int64_t)(item & 0xffffffffu); }
static uint32_t item_key(uint64_t item) { return (uint32_t)(item >> 32); }

#define RADIX_BITS 11
#define RADIX_SIZE (1u << RADIX_BITS)

/* Stable LSD radix sort of items by key (3 passes of 11 bits). Items enter in index order, so
 * equal keys leave in index order. `tmp` holds n items of scratch; the result lands in `items`. */
static void sort_rule_order(uint64_t *items, uint64_t *tmp, int64_t n) {
    if (n < 2) return;
    static _Thread_local uint32_t hist[3][RADIX_SIZE];
    memset(hist, 0, sizeof hist);
    for (int64_t i = 0; i < n; i++) {
        uint32_t key = item_key(items[i]);
        hist[0][key & (RADIX_SIZE - 1)]++;
        hist[1][(key >> RADIX_BITS) & (RADIX_SIZE - 1)]++;
        hist[2][key >> (2 * RADIX_BITS)]++;
    }
    uint64_t *src = items, *dst = tmp;
    for (int pass = 0; pass < 3; pass++) {
        int shift = 32 + pass * RADIX_BITS;
        uint32_t *h = hist[pass];
        if (h[(src[0] >> shift) & (RADIX_SIZE - 1)] == (uint32_t)n) continue; /* one digit: no-op */
        uint32_t sum = 0;
        for (uint32_t d = 0; d < RADIX_SIZE; d++) {
            uint32_t count = h[d];
            h[d] = sum;
            sum += count;
        }
        for (int64_t i = 0; i < n; i++) dst[h[(src[i] >> shift) & (RADIX_SIZE - 1)]++] = src[i];
        uint64_t *swap = src;
        src = dst;
        dst = swap;
    }
    if (src != items) memcpy(items, src, (size_t)n * sizeof *items);
}

/* Workers report the first failure only; kp_error is not safe to write from two threads. */
typedef struct fail_slot {
    atomic_int claimed;
    kp_error first;
} fail_slot;

static void fail_once(fail_slot *f, const kp_error *local) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&f->claimed, &expected, 1)) f->first = *local;
}

static int usage_checks(const char *who, int64_t batch, int64_t vocab, int64_t row_stride, double band,
                        kp_error *err) {
    if (batch <= 0) return kp_fail(err, KP_EXIT_USAGE, "%s: batch must be positive (got %lld)", who, (long long)batch);
    if (vocab <= 0) return kp_fail(err, KP_EXIT_USAGE, "%s: vocab must be positive (got %lld)", who, (long long)vocab);
    if (vocab > (int64_t)UINT32_MAX)
        return kp_fail(err, KP_EXIT_USAGE, "%s: vocab %lld is above 2^32-1, the sort's index width", who, (long long)vocab);
    if (row_stride < vocab)
        return kp_fail(err, KP_EXIT_USAGE, "%s: row_stride %lld is below vocab %lld", who, (long long)row_stride, (long long)vocab);
    if (isnan(band) || band < 0)
        return kp_fail(err, KP_EXIT_USAGE, "%s: band must be >= 0 (got %g)", who, band);
    return 0;
}

/* ---- the reference ------------------------------------------------------------------------ */

struct ref_ctx {
    const float *logits; /* [batch, row_stride] */
    const float *top_p;  /* [batch] */
    int64_t vocab, row_stride;
    double band;
    kp_topp_ref *out;
    fail_slot fail;
};

static void reference_row(void *vctx, int64_t r) {
    struct ref_ctx *ctx = vctx;
    if (atomic_load(&ctx->fail.claimed)) return;
    const int64_t V = ctx->vocab;
    const float *x = ctx->logits + r * ctx->row_stride;
    kp_topp_ref *o = ctx->out;
    kp_topp_ref_row *row = &o->rows[r];
    uint8_t *keep = o->keep + r * V, *in_group = o->in_group + r * V;
    double *prob = o->prob + r * V, *mass_before = o->mass_before + r * V;
    const double top_p = (double)ctx->top_p[r];

    int64_t n_finite = 0, n_nan = 0, n_posinf = 0;
    float max_logit = -INFINITY;
    for (int64_t i = 0; i < V; i++) {
        keep[i] = in_group[i] = 0;
        prob[i] = 0.0;
        mass_before[i] = NAN;
        if (isnan(x[i])) n_nan++;
        else if (isinf(x[i])) n_posinf += x[i] > 0;
        else {
            n_finite++;
            if (x[i] > max_logit) max_logit = x[i];
        }
    }
    /* Fields one by one on calloc'ed rows, so padding stays zero and whole rows compare bytewise. */
    row->top_p = top_p;
    row->max_logit = max_logit;
    row->z = 0.0;
    row->finite_count = n_finite;
    row->nan_count = n_nan;
    row->posinf_count = n_posinf;
    row->boundary_token = -1;
    row->boundary_logit = -INFINITY;
    row->tie_group_mass_before = NAN;
    const int64_t n = n_finite + n_posinf;
    if (n == 0) return;

    kp_error local = {0};
    uint64_t *items = kp_alloc((size_t)n * 2 * sizeof *items, "topp reference sort scratch", &local);
    if (!items) {
        fail_once(&ctx->fail, &local);
        return;
    }
    uint64_t *tmp = items + n;

    kp_nsum z = {0, 0};
    for (int64_t i = 0; i < V; i++) {
        if (!isfinite(x[i])) continue;
        prob[i] = kp_exp_det((double)x[i] - (double)max_logit);
        kp_nsum_add(&z, prob[i]);
    }
    row->z = kp_nsum_value(&z);
    int64_t m = 0;
    for (int64_t i = 0; i < V; i++) {
        if (isnan(x[i]) || x[i] == -INFINITY) continue;
        if (n_posinf > 0) prob[i] = isinf(x[i]) ? 1.0 / (double)n_posinf : 0.0;
        else prob[i] /= row->z;
        items[m++] = rule_item(x[i], i);
    }
    sort_rule_order(items, tmp, n);

    /* One walk in rule order: C_t before each step, keep while C_t < top_p (a prefix, even if a
     * rounding ever made C_t dip), and note where the boundary's run of equal keys starts. */
    const uint32_t posinf_key = rule_key(INFINITY);
    kp_nsum run = {0, 0};
    int keeping = 1;
    int64_t kept = 0, last_kept = -1, run_start = 0, group_start = 0, band_count = 0;
    double run_start_c = 0.0, group_start_c = 0.0, kept_mass = 0.0;
    for (int64_t pos = 0; pos < n; pos++) {
        int64_t i = item_index(items[pos]);
        double c_t = kp_nsum_value(&run);
        if (pos > 0 && item_key(items[pos]) != item_key(items[pos - 1])) {
            run_start = pos;
            run_start_c = c_t;
        }
        if (item_key(items[pos]) != posinf_key) { /* the key, not x[i]: one random read fewer */
            mass_before[i] = c_t;
            band_count += fabs(c_t - top_p) <= ctx->band;
        }
        if (keeping && (pos == 0 || c_t < top_p || top_p >= 1.0)) {
            keep[i] = 1;
            kept++;
            last_kept = pos;
            group_start = run_start;
            group_start_c = run_start_c;
        } else {
            keeping = 0;
        }
        kp_nsum_add(&run, prob[i]);
        if (keeping) kept_mass = kp_nsum_value(&run);
    }
    int64_t group_end = last_kept + 1;
    while (group_end < n && item_key(items[group_end]) == item_key(items[last_kept])) group_end++;
    for (int64_t pos = group_start; pos < group_end; pos++) in_group[item_index(items[pos])] = 1;

    row->kept_count = kept;
    row->kept_mass = kept_mass;
    row->boundary_token = item_index(items[last_kept]);
    row->boundary_logit = x[row->boundary_token];
    row->tie_group_size = group_end - group_start;
    row->tie_needed = last_kept - group_start + 1;
    row->tie_group_mass_before = group_start_c;
    row->band_count = band_count;
    free(items);
}

void kp_topp_ref_free(kp_topp_ref *ref) {
    if (!ref) return;
    free(ref->rows);
    free(ref->keep);
    free(ref->in_group);
    free(ref->prob);
    free(ref->mass_before);
    memset(ref, 0, sizeof *ref);
}

int kp_topp_reference(const float *logits, int64_t batch, int64_t vocab, int64_t row_stride,
                      const float *top_p, double band, kp_topp_ref *out, kp_error *err) {
    KP_ASSERT(out != NULL);
    memset(out, 0, sizeof *out);
    int rc = usage_checks("topp reference", batch, vocab, row_stride, band, err);
    if (rc) return rc;
    KP_ASSERT(logits != NULL && top_p != NULL);
    for (int64_t r = 0; r < batch; r++)
        if (isnan(top_p[r]))
            return kp_fail(err, KP_EXIT_USAGE, "topp reference: top_p[%lld] is NaN", (long long)r);
    size_t cells;
    if (!kp_mul_size((size_t)batch, (size_t)vocab, &cells))
        return kp_fail(err, KP_EXIT_USAGE, "topp reference: batch x vocab overflows size_t");

    out->batch = batch;
    out->vocab = vocab;
    out->band = band;
    if (!(out->rows = kp_calloc((size_t)batch, sizeof *out->rows, "topp reference rows", err)) ||
        !(out->keep = kp_calloc(cells, 1, "topp reference keep mask", err)) ||
        !(out->in_group = kp_calloc(cells, 1, "topp reference tie group mask", err)) ||
        !(out->prob = kp_calloc(cells, sizeof(double), "topp reference probabilities", err)) ||
        !(out->mass_before = kp_calloc(cells, sizeof(double), "topp reference mass_before", err))) {
        kp_topp_ref_free(out);
        return KP_EXIT_ENV;
    }
    struct ref_ctx ctx = {.logits = logits, .top_p = top_p, .vocab = vocab, .row_stride = row_stride,
                          .band = band, .out = out};
    atomic_init(&ctx.fail.claimed, 0);
    kp_parallel_for(batch, reference_row, &ctx);
    if (atomic_load(&ctx.fail.claimed)) {
        kp_topp_ref_free(out);
        if (err) *err = ctx.fail.first;
        return ctx.fail.first.code ? ctx.fail.first.code : KP_EXIT_ENV;
    }
    return 0;
}

/* ---- tie policy names --------------------------------------------------------------------- */

const char *kp_tie_policy_name(kp_tie_policy p) {
    switch (p) {
    case KP_TIE_MINIMAL_INDEX: return "minimal_index";
    case KP_TIE_INCLUSIVE: return "inclusive";
    }
    return "unknown";
}

int kp_tie_policy_parse(const char *s, kp_tie_policy *out) {
    if (!s) return KP_EXIT_USAGE;
    if (strcmp(s, "minimal_index") == 0) *out = KP_TIE_MINIMAL_INDEX;
    else if (strcmp(s, "inclusive") == 0) *out = KP_TIE_INCLUSIVE;
    else return KP_EXIT_USAGE;
    return 0;
}

/* ---- the judge ---------------------------------------------------------------------------- */

enum { OUT_KEPT, OUT_DROPPED, OUT_ALTERED };
enum { DIFF_NONE, DIFF_STRICT, DIFF_TIE, DIFF_BAND };

/* Kept means the input's bits came back, for an input the rule could keep (finite or +inf);
 * dropped means -inf; anything else (NaN, a changed value, a value where none was) is altered. */
static int out_state(float in, float out) {
    uint32_t ob = float_bits(out);
    if (ob == neg_inf_bits) return OUT_DROPPED;
    if (ob == float_bits(in) && !isnan(in) && in != -INFINITY) return OUT_KEPT;
    return OUT_ALTERED;
}

struct judge_ctx {
    const kp_topp_ref *ref;
    const float *input, *output; /* [batch, row_stride] */
    int64_t row_stride;
    kp_tie_policy policy;
    double band;
    kp_topp_judgement *out;
    fail_slot fail;
};

/* The difference of an element whose out_state is `state` from the rule's mask (keep, in_group and mass_before: the
 * reference's cells for it; mass_before read only where the two disagree). */
static inline int classify(int state, uint8_t keep, uint8_t in_group, const double *mass_before, double top_p,
                           double band, kp_tie_policy policy) {
    if (state == OUT_ALTERED) return DIFF_STRICT;
    const int impl_keep = state == OUT_KEPT, rule_keep = keep != 0;
    if (impl_keep == rule_keep) return DIFF_NONE;
    /* Inclusive may keep more of the boundary group, never fewer than the rule's copies. */
    if (policy == KP_TIE_INCLUSIVE && in_group && impl_keep) return DIFF_TIE;
    if (fabs(*mass_before - top_p) <= band) return DIFF_BAND;
    return DIFF_STRICT; /* NaN mass_before (non-finite input) lands here too */
}

static int diff_class(const struct judge_ctx *ctx, int64_t r, int64_t i) {
    const int64_t cell = r * ctx->ref->vocab + i, at = r * ctx->row_stride + i;
    return classify(out_state(ctx->input[at], ctx->output[at]), ctx->ref->keep[cell], ctx->ref->in_group[cell],
                    &ctx->ref->mass_before[cell], ctx->ref->rows[r].top_p, ctx->band, ctx->policy);
}

/* A float's place in float order as an unsigned key (NaN excluded), -0 folded onto +0 since they compare equal: for
 * non-NaN a and b, a >= b exactly when order_key(a) >= order_key(b). */
static inline uint32_t order_key(uint32_t bits) { /* in masks, not branches: so scan_row's loop vectorizes */
    bits &= 0u - (uint32_t)(bits != 0x80000000u);        /* -0 -> +0 */
    return bits ^ ((0u - (bits >> 31)) | 0x80000000u); /* negative: ~bits; else bits | sign */
}

enum { FLAG_KEPT = 1, FLAG_LOOK = 2 }; /* a token's byte in the scan: kept (out_state's KEPT); to be classified */

/* The scan judge_row starts with, without a branch on any token (vectorized in the avx2 clone): each token's flags
 * into flags[0, V), the -inf outputs counted, the least kept and the greatest dropped non-NaN input as order_keys (0:
 * none dropped; UINT32_MAX: none kept). FLAG_LOOK marks what judge_row's per-token classification must see: altered
 * tokens (neither kept nor -inf: the only ones that can be NaN), tokens the rule's mask keeps and the output does not
 * or the reverse, and the boundary group's members. Every other token is kept or dropped as the mask says: no
 * difference, nothing else to count. A branch on each token where kept ones fall (a few percent of a row, scattered)
 * mispredicted often enough to be most of the judge's time. */
KP_CLONES static void scan_row(const float *in, const float *outp, const uint8_t *keep, const uint8_t *in_group, int64_t V,
                               uint8_t *flags, int64_t *neginf_out, uint32_t *least_kept, uint32_t *most_dropped) {
    uint32_t neginf = 0, kmin = UINT32_MAX, dmax = 0; /* V < 2^32 (kp_topp_judge's checks) */
    for (int64_t i = 0; i < V; i++) {
        const uint32_t xb = float_bits(in[i]), yb = float_bits(outp[i]);
        const uint32_t x_not_nan = (xb & 0x7fffffffu) <= 0x7f800000u, dropped = yb == neg_inf_bits;
        const uint32_t kept = (yb == xb) & x_not_nan & (xb != neg_inf_bits);
        const uint32_t look = ((kept | dropped) ^ 1u) | (kept ^ (keep[i] != 0)) | (in_group[i] != 0);
        flags[i] = (uint8_t)(kept | look << 1);
        neginf += dropped;
        const uint32_t key = order_key(xb);
        const uint32_t kept_key = key | (0u - (kept ^ 1u)), dropped_key = key & (0u - (dropped & x_not_nan));
        kmin = kept_key < kmin ? kept_key : kmin;
        dmax = dropped_key > dmax ? dropped_key : dmax;
    }
    *neginf_out = neginf, *least_kept = kmin, *most_dropped = dmax;
}

/* Pass one: counts and conformance for row r. Masses are summed in rule order so that the
 * reference's own mask reproduces its C_t and kept_mass bit for bit, even at band 0. */
static void judge_row(void *vctx, int64_t r) {
    struct judge_ctx *ctx = vctx;
    if (atomic_load(&ctx->fail.claimed)) return;
    const kp_topp_ref *ref = ctx->ref;
    const int64_t V = ref->vocab;
    const kp_topp_ref_row *rr = &ref->rows[r];
    const float *in = ctx->input + r * ctx->row_stride, *outp = ctx->output + r * ctx->row_stride;
    const uint8_t *in_group = ref->in_group + r * V;
    const double *prob = ref->prob + r * V;
    kp_topp_row_judgement *j = &ctx->out->rows[r];
    const int64_t keepable = rr->finite_count + rr->posinf_count;

    kp_error local = {0};
    /* the sort's items and scratch, then the scan's flags (8 more zero bytes: read 8 at a time) */
    uint64_t *items = kp_alloc((size_t)V * 2 * sizeof *items + (size_t)V + 8, "topp judge sort scratch", &local);
    if (!items) {
        fail_once(&ctx->fail, &local);
        return;
    }
    uint8_t *flags = (uint8_t *)(items + 2 * V);
    memset(flags + V, 0, 8);
    /* the counts in locals, not in *j: the stores into items[] could alias them, and would force a reload a token */
    const uint8_t *keep = ref->keep + r * V;
    const double *mass_before = ref->mass_before + r * V;
    const double row_top_p = rr->top_p, row_band = ctx->band;
    const kp_tie_policy policy = ctx->policy;
    int64_t kept = 0, neginf_out, nan_out = 0, altered = 0, group_kept = 0, strict = 0, tie = 0, band_n = 0;
    int group_dropped_seen = 0;
    bool group_lowest_first = true;
    uint32_t least_kept, most_dropped;
    scan_row(in, outp, keep, in_group, V, flags, &neginf_out, &least_kept, &most_dropped);
    /* the flagged tokens in index order, 8 flag bytes at a time: kept ones into items (so the sort sees them in index
       order, as equal keys must leave), the others that need it classified */
    for (int64_t at = 0; at < V; at += 8) {
        uint64_t word;
        memcpy(&word, flags + at, 8);
        for (uint64_t set = (word | word >> 1) & 0x0101010101010101u; set; set &= set - 1) {
            const int64_t i = at + (__builtin_ctzll(set) >> 3);
            const int f = flags[i];
            if (f & FLAG_KEPT) items[kept++] = rule_item(in[i], i);
            if (!(f & FLAG_LOOK)) continue;
            const float y = outp[i];
            const int state = f & FLAG_KEPT ? OUT_KEPT : float_bits(y) == neg_inf_bits ? OUT_DROPPED : OUT_ALTERED;
            nan_out += isnan(y);
            altered += state == OUT_ALTERED;
            if (in_group[i]) {
                if (state == OUT_KEPT) {
                    group_kept++;
                    if (group_dropped_seen) group_lowest_first = false;
                } else {
                    group_dropped_seen = 1;
                }
            }
            switch (classify(state, keep[i], in_group[i], &mass_before[i], row_top_p, row_band, policy)) {
            case DIFF_STRICT: strict++; break;
            case DIFF_TIE: tie++; break;
            case DIFF_BAND: band_n++; break;
            default: break;
            }
        }
    }
    j->nan_out_count = nan_out, j->altered_count = altered, j->group_kept = group_kept;
    j->group_lowest_first = group_lowest_first;
    j->strict_count = strict, j->tie_count = tie, j->band_count = band_n;
    sort_rule_order(items, items + V, kept);

    /* The tail minimality removes: the last kept token, or under inclusive every kept token equal
     * to the smallest kept logit. Removing it must drop the mass below top_p. */
    int64_t tail = kept - 1;
    if (ctx->policy == KP_TIE_INCLUSIVE)
        while (tail > 0 && item_key(items[tail - 1]) == item_key(items[kept - 1])) tail--;
    kp_nsum mass = {0, 0};
    double remaining = 0.0;
    for (int64_t k = 0; k < kept; k++) {
        if (k == tail) remaining = kp_nsum_value(&mass);
        kp_nsum_add(&mass, prob[item_index(items[k])]);
    }
    free(items);

    const double top_p = rr->top_p, band = ctx->band;
    j->kept_count = kept;
    j->kept_mass = kp_nsum_value(&mass);
    j->all_neginf = keepable > 0 && neginf_out == V;
    j->mass_ok = kept == keepable || j->kept_mass >= top_p - band;
    /* top_p >= 1 keeps everything by definition, so there is no smaller mask to compare with. */
    j->minimal_ok = tail <= 0 || top_p >= 1.0 || remaining < top_p + band;
    j->monotone_ok = kept == 0 || least_kept >= most_dropped;
    j->no_nan_ok = j->nan_out_count == 0;
    j->nonempty_ok = keepable == 0 || kept > 0;
    j->rule_ok = j->strict_count == 0 && j->mass_ok && j->minimal_ok && j->monotone_ok && j->no_nan_ok &&
                 j->nonempty_ok;
}

/* Pass two: each row writes its indices into the slots the offsets reserved. */
static void judge_row_indices(void *vctx, int64_t r) {
    struct judge_ctx *ctx = vctx;
    kp_topp_judgement *o = ctx->out;
    int64_t s = o->strict_off[r], t = o->tie_off[r], b = o->band_off[r];
    const bool none = s == o->strict_off[r + 1] && t == o->tie_off[r + 1] && b == o->band_off[r + 1];
    const int64_t V = ctx->ref->vocab;
    /* a row pass one found clean has nothing to list; else scan_row's FLAG_LOOK marks every token that can differ
       (the others classify as NONE), in index order; where its flags cannot be had, every token is classified */
    uint8_t *flags = none ? NULL : malloc((size_t)V + 8);
    if (flags) {
        int64_t neginf;
        uint32_t least_kept, most_dropped;
        const uint8_t *keep = ctx->ref->keep + r * V, *in_group = ctx->ref->in_group + r * V;
        scan_row(ctx->input + r * ctx->row_stride, ctx->output + r * ctx->row_stride, keep, in_group, V, flags, &neginf,
                 &least_kept, &most_dropped);
        memset(flags + V, 0, 8);
    }
    for (int64_t at = 0; !none && at < V; at += 8) {
        uint64_t look = 0x0101010101010101u; /* the 8 tokens from `at` (past V: not listed, below) */
        if (flags) {
            uint64_t word;
            memcpy(&word, flags + at, 8);
            look = word >> 1 & 0x0101010101010101u;
        }
        for (; look; look &= look - 1) {
            const int64_t i = at + (__builtin_ctzll(look) >> 3);
            if (i >= V) break;
            switch (diff_class(ctx, r, i)) {
            case DIFF_STRICT: o->strict_idx[s++] = i; break;
            case DIFF_TIE: o->tie_idx[t++] = i; break;
            case DIFF_BAND: o->band_idx[b++] = i; break;
            default: break;
            }
        }
    }
    free(flags);
    KP_ASSERT(s == o->strict_off[r + 1] && t == o->tie_off[r + 1] && b == o->band_off[r + 1]);
}

void kp_topp_judgement_free(kp_topp_judgement *j) {
    if (!j) return;
    free(j->rows);
    free(j->strict_off);
    free(j->strict_idx);
    free(j->tie_off);
    free(j->tie_idx);
    free(j->band_off);
    free(j->band_idx);
    memset(j, 0, sizeof *j);
}

int kp_topp_judge(const kp_topp_ref *ref, const float *input, const float *output, int64_t row_stride,
                  kp_tie_policy policy, double band, kp_topp_judgement *out, kp_error *err) {
    KP_ASSERT(out != NULL && ref != NULL);
    memset(out, 0, sizeof *out);
    KP_ASSERT(ref->rows != NULL && input != NULL && output != NULL);
    int rc = usage_checks("topp judge", ref->batch, ref->vocab, row_stride, band, err);
    if (rc) return rc;
    if (policy != KP_TIE_MINIMAL_INDEX && policy != KP_TIE_INCLUSIVE)
        return kp_fail(err, KP_EXIT_USAGE, "topp judge: tie_policy %d is neither minimal_index nor inclusive", (int)policy);
    const int64_t B = ref->batch;
    out->batch = B;
    out->tie_policy = policy;
    out->band = band;
    if (!(out->rows = kp_calloc((size_t)B, sizeof *out->rows, "topp judgement rows", err)) ||
        !(out->strict_off = kp_calloc((size_t)B + 1, sizeof(int64_t), "topp judgement offsets", err)) ||
        !(out->tie_off = kp_calloc((size_t)B + 1, sizeof(int64_t), "topp judgement offsets", err)) ||
        !(out->band_off = kp_calloc((size_t)B + 1, sizeof(int64_t), "topp judgement offsets", err))) {
        kp_topp_judgement_free(out);
        return KP_EXIT_ENV;
    }
    struct judge_ctx ctx = {.ref = ref, .input = input, .output = output, .row_stride = row_stride,
                            .policy = policy, .band = band, .out = out};
    atomic_init(&ctx.fail.claimed, 0);
    kp_parallel_for(B, judge_row, &ctx);
    if (atomic_load(&ctx.fail.claimed)) {
        kp_topp_judgement_free(out);
        if (err) *err = ctx.fail.first;
        return ctx.fail.first.code ? ctx.fail.first.code : KP_EXIT_ENV;
    }
    for (int64_t r = 0; r < B; r++) {
        const kp_topp_row_judgement *j = &out->rows[r];
        out->strict_off[r + 1] = out->strict_off[r] + j->strict_count;
        out->tie_off[r + 1] = out->tie_off[r] + j->tie_count;
        out->band_off[r + 1] = out->band_off[r] + j->band_count;
        out->rows_rule_ok += j->rule_ok;
    }
    if (!(out->strict_idx = kp_calloc((size_t)out->strict_off[B], sizeof(int64_t), "topp strict indices", err)) ||
        !(out->tie_idx = kp_calloc((size_t)out->tie_off[B], sizeof(int64_t), "topp tie indices", err)) ||
        !(out->band_idx = kp_calloc((size_t)out->band_off[B], sizeof(int64_t), "topp band indices", err))) {
        kp_topp_judgement_free(out);
        return KP_EXIT_ENV;
    }
    kp_parallel_for(B, judge_row_indices, &ctx);
    return 0;
}
