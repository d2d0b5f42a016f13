/* topp_case.c: topp fields, their canonical form, and the seeded generator for every profile.
 * Built with -ffp-contract=off and no libm transcendental, so inputs are bit-identical anywhere. */
#include "topp_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_rng.h"

static const char *const profile_names[] = {"ordinary", "forced", "ties", "flat", "neginf", "nan", NULL};
static const char *const top_p_words[] = {"mixed", NULL};
static const float mixed_top_p[8] = {0.95f, 1e-8f, 1.0f, 0.5f, 0.99f, 0.8f, 0.1f, 0.9f};

enum { SLOT_TAIL = 0, SLOT_HEAD = 1, SLOT_TIES = 2, SLOT_NEGINF = 3, SLOT_NAN = 4 };
#define HEAD_MAX 16

#define AT(member) KP_FIELD_AT(kp_topp_case, member)
static const kp_case_field fields[] = {
    {"batch", KP_FIELD_INT, AT(batch), .min = 1, .max = KP_TOPP_MAX_BATCH, .help = "rows"},
    {"vocab", KP_FIELD_INT, AT(vocab), .min = 1, .max = KP_TOPP_MAX_VOCAB - 1, .help = "tokens a row"},
    {"seed", KP_FIELD_UINT, AT(seed), .help = "the generator's seed"},
    {"top_p", KP_FIELD_NUMBER, AT(top_p), .nmin = 0, .nmax = 1, .nmin_open = true, .names = top_p_words,
     .word_offset = offsetof(kp_topp_case, top_p_mixed), .help = "the mass kept; mixed cycles rows through eight values"},
    {"profile", KP_FIELD_NAME, AT(profile), .names = profile_names, .help = "the logits' shape (topp_case.h)"},
    {"stride", KP_FIELD_INT, AT(stride), .min = 1, .max = KP_TOPP_MAX_VOCAB + (1 << 20), .same_as = "vocab",
     .help = "row stride in elements, vocab to vocab + 2^20; the padding holds a NaN sentinel"},
    {"force_token", KP_FIELD_INT, AT(force_token), .min = 0, .max = KP_TOPP_MAX_VOCAB - 2, .when = "profile",
     .when_is = "forced", .help = "the token set to force_value in every row, below vocab"},
    {"force_value", KP_FIELD_NUMBER, AT(force_value), .nmin = -INFINITY, .nmax = INFINITY, .when = "profile",
     .when_is = "forced", .help = "its logit, finite in f32"},
    {"tie_count", KP_FIELD_INT, AT(tie_count), .min = 1, .max = KP_TOPP_MAX_VOCAB / 2, .fallback = "1000",
     .when = "profile", .when_is = "ties", .help = "tokens in each of the two tie groups, up to vocab / 2"},
    {"neginf_frac", KP_FIELD_NUMBER, AT(neginf_frac), .nmin = 0, .nmax = 1, .fallback = "0.9", .when = "profile",
     .when_is = "neginf", .help = "each token's chance of -inf"},
    {"nan_count", KP_FIELD_INT, AT(nan_count), .min = 0, .max = KP_TOPP_MAX_VOCAB - 1, .fallback = "1", .when = "profile",
     .when_is = "nan", .help = "NaN tokens a row, up to vocab"},
    {"spread", KP_FIELD_NUMBER, AT(spread), .nmin = 0, .nmax = 100, .nmin_open = true, .fallback = "1e-6", .when = "profile",
     .when_is = "flat", .help = "the logits' range"},
};
#undef AT

/* Bounds set by vocab, and what f32 must hold. */
static int check(void *fields_, kp_error *err) {
    const kp_topp_case *tc = fields_;
    const kp_case_family *f = &kp_topp_case_family;
    int rc = kp_case_field_range(f, "stride", tc->stride, tc->vocab, tc->vocab + (1 << 20), err);
    if (!rc && !tc->top_p_mixed && !((float)tc->top_p > 0.0f))
        rc = kp_fail(err, KP_EXIT_USAGE, "case topp: field 'top_p': %g rounds to 0 in f32", tc->top_p);
    if (rc || tc->profile == KP_TOPP_ORDINARY) return rc;
    switch (tc->profile) {
    case KP_TOPP_FORCED:
        if ((rc = kp_case_field_range(f, "force_token", tc->force_token, 0, tc->vocab - 1, err))) return rc;
        if (!isfinite((float)tc->force_value))
            return kp_fail(err, KP_EXIT_USAGE, "case topp: field 'force_value': %g is not finite in f32", tc->force_value);
        return 0;
    case KP_TOPP_TIES: return kp_case_field_range(f, "tie_count", tc->tie_count, 1, tc->vocab / 2, err);
    case KP_TOPP_NAN: return kp_case_field_range(f, "nan_count", tc->nan_count, 0, tc->vocab, err);
    default: return 0;
    }
}

const kp_case_family kp_topp_case_family = {
    .name = "topp",
    .generator_version = KP_TOPP_GENERATOR_VERSION,
    KP_CASE_FIELDS(fields, kp_topp_case),
    .check = check,
};

float kp_topp_case_row_top_p(const kp_topp_case *tc, int64_t row) {
    return tc->top_p_mixed ? mixed_top_p[row % 8] : (float)tc->top_p;
}

/* ---- generation ---------------------------------------------------------------------------- */

static uint64_t slot_offset(int slot, int64_t row, int64_t span) {
    return ((uint64_t)slot << 56) + (uint64_t)row * (uint64_t)span;
}

typedef struct gen_job {
    const kp_topp_case *tc;
    int skip_base; /* rows already hold the ordinary base: apply the profile's changes only */
    int64_t first_row, nrows, block_rows;
    float *logits;
    int failed;
    kp_error err;
} gen_job;

static float bits_to_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Distinct positions by a partial Fisher-Yates shuffle over perm (identity on entry, restored on exit). */
static void pick_positions(const uint32_t *draws, int64_t k, int64_t vocab, int32_t *perm, int64_t *pos) {
    for (int64_t j = 0; j < k; j++) {
        int64_t pick = j + kp_index(draws[j], vocab - j);
        int32_t t = perm[j];
        perm[j] = perm[pick];
        perm[pick] = t;
        pos[j] = perm[j];
    }
    for (int64_t j = k - 1; j >= 0; j--) { /* undo the swaps in reverse, so perm is the identity again */
        int64_t pick = j + kp_index(draws[j], vocab - j);
        int32_t t = perm[j];
        perm[j] = perm[pick];
        perm[pick] = t;
    }
}

/* Positions for every row of a block: one seek, then one read per row. */
static int block_positions(kp_rng *rng, int slot, int64_t span, int64_t row0, int64_t nrows, int64_t k, int64_t vocab,
                           int32_t *perm, uint32_t *draws, int64_t *pos, kp_error *err) {
    int rc = kp_rng_seek(rng, slot_offset(slot, row0, span), err);
    for (int64_t r = 0; !rc && r < nrows; r++) {
        if ((rc = kp_rng_next(rng, draws, (size_t)span, err))) break;
        pick_positions(draws, k, vocab, perm, pos + r * k);
    }
    return rc;
}

static int gen_block(const kp_topp_case *tc, int skip_base, int64_t row0, int64_t nrows, float *logits, kp_error *err) {
    const int64_t V = tc->vocab, S = tc->stride;
    const int64_t head = tc->profile == KP_TOPP_TIES || tc->profile == KP_TOPP_FLAT ? 0 : (V / 8 < HEAD_MAX ? V / 8 : HEAD_MAX);
    const int64_t npos = tc->profile == KP_TOPP_TIES ? 2 * tc->tie_count : tc->profile == KP_TOPP_NAN ? tc->nan_count : 0;
    int64_t kpos = head > npos ? head : npos;
    kp_rng rng = {0};
    uint32_t *draws = kp_calloc((size_t)(4 * V + kpos + 1), sizeof *draws, "generator draws", err);
    int32_t *perm = kp_calloc((size_t)V, sizeof *perm, "generator permutation", err);
    int64_t *pos = kp_calloc((size_t)(nrows * (kpos + 1)), sizeof *pos, "generator positions", err);
    int rc = (!draws || !perm || !pos) ? err->code : kp_rng_open(&rng, tc->seed, err);
    for (int64_t i = 0; !rc && i < V; i++) perm[i] = (int32_t)i;

    /* slot 0: the tail, four draws per token */
    if (!rc && !skip_base) rc = kp_rng_seek(&rng, slot_offset(SLOT_TAIL, row0, 4 * V), err);
    for (int64_t r = 0; !rc && !skip_base && r < nrows; r++) {
        float *row = logits + r * S;
        if ((rc = kp_rng_next(&rng, draws, (size_t)(4 * V), err))) break;
        for (int64_t i = 0; i < V; i++) {
            const uint32_t *d = draws + 4 * i;
            double t = (kp_unit(d[0]) + kp_unit(d[1]) + kp_unit(d[2]) + kp_unit(d[3]) - 2.0) * 3.4641016151377544;
            switch (tc->profile) {
            case KP_TOPP_TIES: row[i] = (float)(t - 12.0); break;
            case KP_TOPP_FLAT: row[i] = (float)(kp_unit(d[0]) * tc->spread); break;
            default: row[i] = (float)t; break;
            }
        }
        for (int64_t i = V; i < S; i++) row[i] = bits_to_float(KP_TOPP_PAD_BITS);
    }
    /* slot 1: the dominant head */
    if (!rc && head > 0 && !skip_base)
        rc = block_positions(&rng, SLOT_HEAD, HEAD_MAX, row0, nrows, head, V, perm, draws, pos, err);
    for (int64_t r = 0; !rc && head > 0 && !skip_base && r < nrows; r++)
        for (int64_t j = 0; j < head; j++) {
            float *x = logits + r * S + pos[r * head + j];
            *x = (float)(14.0 - 0.75 * (double)j + (double)*x);
        }
    if (!rc && tc->profile == KP_TOPP_FORCED)
        for (int64_t r = 0; r < nrows; r++) logits[r * S + tc->force_token] = (float)tc->force_value;
    if (!rc && tc->profile == KP_TOPP_TIES) {
        rc = block_positions(&rng, SLOT_TIES, npos, row0, nrows, npos, V, perm, draws, pos, err);
        for (int64_t r = 0; !rc && r < nrows; r++)
            for (int64_t j = 0; j < npos; j++) logits[r * S + pos[r * npos + j]] = j < tc->tie_count ? 1.0f : 0.0f;
    }
    if (!rc && tc->profile == KP_TOPP_NEGINF) {
        /* frac * 2^32 compared with a 64-bit draw, so frac = 1 masks every token */
        uint64_t threshold = (uint64_t)(tc->neginf_frac * 4294967296.0);
        rc = kp_rng_seek(&rng, slot_offset(SLOT_NEGINF, row0, V), err);
        for (int64_t r = 0; !rc && r < nrows; r++) {
            if ((rc = kp_rng_next(&rng, draws, (size_t)V, err))) break;
            for (int64_t i = 0; i < V; i++)
                if ((uint64_t)draws[i] < threshold) logits[r * S + i] = -INFINITY;
        }
    }
    if (!rc && tc->profile == KP_TOPP_NAN && npos > 0) {
        rc = block_positions(&rng, SLOT_NAN, npos, row0, nrows, npos, V, perm, draws, pos, err);
        for (int64_t r = 0; !rc && r < nrows; r++)
            for (int64_t j = 0; j < npos; j++) logits[r * S + pos[r * npos + j]] = bits_to_float(0x7fc00000u);
    }
    if (rng.gen) kp_rng_close(&rng);
    free(draws);
    free(perm);
    free(pos);
    return rc;
}

static void gen_worker(void *ctx, int64_t b) {
    gen_job *job = ctx;
    int64_t r0 = b * job->block_rows;
    int64_t n = job->nrows - r0 < job->block_rows ? job->nrows - r0 : job->block_rows;
    kp_error err = {0};
    if (gen_block(job->tc, job->skip_base, job->first_row + r0, n, job->logits + r0 * job->tc->stride, &err)) {
        if (!__atomic_exchange_n(&job->failed, 1, __ATOMIC_SEQ_CST)) job->err = err;
    }
}

static int gen_rows(const kp_topp_case *tc, int skip_base, int64_t first_row, int64_t nrows, float *logits, kp_error *err) {
    /* One block per worker: a cuRAND host seek costs milliseconds, so seek as rarely as possible. */
    int64_t threads = kp_thread_count();
    gen_job job = {.tc = tc, .skip_base = skip_base, .first_row = first_row, .nrows = nrows, .logits = logits};
    job.block_rows = (nrows + threads - 1) / threads;
    kp_parallel_for((nrows + job.block_rows - 1) / job.block_rows, gen_worker, &job);
    if (job.failed) {
        *err = job.err;
        return err->code;
    }
    return 0;
}

/* The ordinary rows of the last (seed, vocab, stride) generated. ordinary, forced, neginf and nan
 * share them (a gate's cases often differ only in the forced value or the batch), and drawing
 * them is most of generation's cost. */
typedef struct base_cache {
    int valid;
    uint64_t seed;
    int64_t vocab, stride, first, nrows;
    float *rows;
    double seconds; /* drawing them took */
} base_cache;
static base_cache g_base;

void kp_topp_case_cache_clear(void) {
    free(g_base.rows);
    memset(&g_base, 0, sizeof g_base);
}

static int base_rows(const kp_topp_case *tc, int64_t first_row, int64_t nrows, float *logits, double *borrowed_s,
                     kp_error *err) {
    const size_t row_bytes = (size_t)tc->stride * sizeof(float);
    int hit = g_base.valid && g_base.seed == tc->seed && g_base.vocab == tc->vocab && g_base.stride == tc->stride &&
              first_row >= g_base.first && first_row + nrows <= g_base.first + g_base.nrows;
    if (hit) {
        *borrowed_s = g_base.seconds * (double)nrows / (double)g_base.nrows;
    } else {
        kp_topp_case base = *tc;
        base.profile = KP_TOPP_ORDINARY;
        float *rows = kp_calloc((size_t)nrows, row_bytes, "generated rows", err);
        if (!rows) return err->code;
        const double t0 = kp_now();
        int rc = gen_rows(&base, 0, first_row, nrows, rows, err);
        if (rc) {
            free(rows);
            return rc;
        }
        kp_topp_case_cache_clear();
        g_base = (base_cache){1, tc->seed, tc->vocab, tc->stride, first_row, nrows, rows, kp_now() - t0};
    }
    memcpy(logits, g_base.rows + (first_row - g_base.first) * tc->stride, row_bytes * (size_t)nrows);
    return 0;
}

int kp_topp_case_rows(const kp_topp_case *tc, int64_t first_row, int64_t nrows, float *logits, float *top_p,
                      double *borrowed_s, kp_error *err) {
    double borrowed = 0;
    if (borrowed_s) *borrowed_s = 0;
    if (nrows <= 0) return 0;
    int rc;
    switch (tc->profile) {
    case KP_TOPP_ORDINARY:
    case KP_TOPP_FORCED:
    case KP_TOPP_NEGINF:
    case KP_TOPP_NAN:
        rc = base_rows(tc, first_row, nrows, logits, &borrowed, err);
        if (!rc && tc->profile != KP_TOPP_ORDINARY) rc = gen_rows(tc, 1, first_row, nrows, logits, err);
        break;
    default:
        rc = gen_rows(tc, 0, first_row, nrows, logits, err);
        break;
    }
    if (rc) return rc;
    if (top_p)
        for (int64_t r = 0; r < nrows; r++) top_p[r] = kp_topp_case_row_top_p(tc, first_row + r);
    if (borrowed_s) *borrowed_s = borrowed;
    return 0;
}
