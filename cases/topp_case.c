/* topp_case.c: topp fields, their canonical form, and the seeded generator for every profile.
 * Built with -ffp-contract=off and no libm transcendental, so inputs are bit-identical anywhere. */
#include "topp_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_rng.h"

static const char *const profile_names[KP_TOPP_PROFILE_COUNT] = {"ordinary", "forced", "ties", "flat", "neginf", "nan"};
static const float mixed_top_p[8] = {0.95f, 1e-8f, 1.0f, 0.5f, 0.99f, 0.8f, 0.1f, 0.9f};

enum { SLOT_TAIL = 0, SLOT_HEAD = 1, SLOT_TIES = 2, SLOT_NEGINF = 3, SLOT_NAN = 4 };
#define HEAD_MAX 16
#define TIE_DEFAULT 1000
#define NEGINF_DEFAULT 0.9
#define NAN_DEFAULT 1
#define SPREAD_DEFAULT 1e-6

static const char *const known_keys[] = {"batch", "vocab", "seed", "top_p", "profile", "stride",
                                         "force_token", "force_value", "tie_count", "neginf_frac", "nan_count", "spread"};

/* Fields that belong to one profile only. */
static const struct {
    const char *key;
    kp_topp_profile profile;
} profile_keys[] = {{"force_token", KP_TOPP_FORCED}, {"force_value", KP_TOPP_FORCED}, {"tie_count", KP_TOPP_TIES},
                    {"neginf_frac", KP_TOPP_NEGINF}, {"nan_count", KP_TOPP_NAN},
                    {"spread", KP_TOPP_FLAT}};

int kp_topp_case_read(const kp_case *c, kp_topp_case *out, kp_error *err) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < c->nparams; i++) {
        int known = 0;
        for (size_t k = 0; k < sizeof known_keys / sizeof *known_keys; k++) known |= !strcmp(c->params[i].key, known_keys[k]);
        if (!known)
            return kp_fail(err, KP_EXIT_USAGE, "case topp: field '%s' is unknown (known: batch, vocab, seed, top_p, "
                           "profile, stride, force_token, force_value, tie_count, neginf_frac, nan_count, spread)", c->params[i].key);
    }
    const char *profile = kp_case_get(c, "profile");
    if (!profile) return kp_fail(err, KP_EXIT_USAGE, "case topp: field 'profile' is required");
    out->profile = KP_TOPP_PROFILE_COUNT;
    for (int p = 0; p < KP_TOPP_PROFILE_COUNT; p++)
        if (!strcmp(profile, profile_names[p])) out->profile = (kp_topp_profile)p;
    if (out->profile == KP_TOPP_PROFILE_COUNT)
        return kp_fail(err, KP_EXIT_USAGE, "case topp: field 'profile': '%s' is unknown (ordinary, forced, ties, flat, "
                       "neginf, nan)", profile);
    for (size_t k = 0; k < sizeof profile_keys / sizeof *profile_keys; k++)
        if (kp_case_get(c, profile_keys[k].key) && out->profile != profile_keys[k].profile)
            return kp_fail(err, KP_EXIT_USAGE, "case topp: field '%s' only applies to profile=%s", profile_keys[k].key,
                           profile_names[profile_keys[k].profile]);
    int rc;
    if ((rc = kp_case_int(c, "batch", 1, KP_TOPP_MAX_BATCH, &out->batch, err)) ||
        (rc = kp_case_int(c, "vocab", 1, KP_TOPP_MAX_VOCAB - 1, &out->vocab, err)) ||
        (rc = kp_case_uint(c, "seed", &out->seed, err)))
        return rc;
    out->stride = out->vocab;
    if (kp_case_get(c, "stride") &&
        (rc = kp_case_int(c, "stride", out->vocab, out->vocab + (1 << 20), &out->stride, err)))
        return rc;
    const char *top_p = kp_case_get(c, "top_p");
    if (top_p && !strcmp(top_p, "mixed")) {
        out->top_p_mixed = 1;
    } else {
        if ((rc = kp_case_num(c, "top_p", &out->top_p, err))) return rc;
        if (!(out->top_p > 0.0 && out->top_p <= 1.0))
            return kp_fail(err, KP_EXIT_USAGE, "case topp: field 'top_p': %g is outside (0, 1] (or use top_p=mixed)", out->top_p);
        if (!((float)out->top_p > 0.0f))
            return kp_fail(err, KP_EXIT_USAGE, "case topp: field 'top_p': %g rounds to 0 in f32", out->top_p);
    }
    out->tie_count = TIE_DEFAULT;
    out->neginf_frac = NEGINF_DEFAULT;
    out->nan_count = NAN_DEFAULT;
    out->spread = SPREAD_DEFAULT;
    switch (out->profile) {
    case KP_TOPP_FORCED:
        if ((rc = kp_case_int(c, "force_token", 0, out->vocab - 1, &out->force_token, err)) ||
            (rc = kp_case_num(c, "force_value", &out->force_value, err)))
            return rc;
        if (!isfinite((float)out->force_value))
            return kp_fail(err, KP_EXIT_USAGE, "case topp: field 'force_value': %g is not finite in f32", out->force_value);
        break;
    case KP_TOPP_TIES:
        if (kp_case_get(c, "tie_count") && (rc = kp_case_int(c, "tie_count", 1, out->vocab / 2, &out->tie_count, err)))
            return rc;
        if (2 * out->tie_count > out->vocab)
            return kp_fail(err, KP_EXIT_USAGE, "case topp: field 'tie_count': 2 x %lld tied tokens do not fit in vocab %lld",
                           (long long)out->tie_count, (long long)out->vocab);
        break;
    case KP_TOPP_NEGINF:
        if (kp_case_get(c, "neginf_frac") && (rc = kp_case_num(c, "neginf_frac", &out->neginf_frac, err))) return rc;
        if (!(out->neginf_frac >= 0.0 && out->neginf_frac <= 1.0))
            return kp_fail(err, KP_EXIT_USAGE, "case topp: field 'neginf_frac': %g is outside [0, 1]", out->neginf_frac);
        break;
    case KP_TOPP_NAN:
        if (kp_case_get(c, "nan_count") && (rc = kp_case_int(c, "nan_count", 0, out->vocab, &out->nan_count, err)))
            return rc;
        break;
    case KP_TOPP_FLAT:
        if (kp_case_get(c, "spread") && (rc = kp_case_num(c, "spread", &out->spread, err))) return rc;
        if (!(out->spread > 0.0 && out->spread <= 100.0))
            return kp_fail(err, KP_EXIT_USAGE, "case topp: field 'spread': %g is outside (0, 100]", out->spread);
        break;
    default:
        break;
    }
    return 0;
}

static int set_int(kp_case *c, const char *key, int64_t v, kp_error *err) {
    char text[32];
    snprintf(text, sizeof text, "%lld", (long long)v);
    return kp_case_set(c, key, text, err);
}

static int set_num(kp_case *c, const char *key, double v, kp_error *err) {
    char text[64];
    kp_format_number(v, text, sizeof text);
    return kp_case_set(c, key, text, err);
}

/* Validate fields, rewrite values canonically, drop fields equal to their defaults. */
static int normalize(kp_case *c, kp_error *err) {
    kp_topp_case tc;
    int rc = kp_topp_case_read(c, &tc, err);
    if (rc) return rc;
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)tc.seed);
    if ((rc = set_int(c, "batch", tc.batch, err)) || (rc = set_int(c, "vocab", tc.vocab, err)) ||
        (rc = kp_case_set(c, "seed", seed, err)))
        return rc;
    if (!tc.top_p_mixed && (rc = set_num(c, "top_p", tc.top_p, err))) return rc;
    if (tc.stride == tc.vocab) kp_case_unset(c, "stride");
    else if ((rc = set_int(c, "stride", tc.stride, err))) return rc;
    switch (tc.profile) {
    case KP_TOPP_FORCED:
        if ((rc = set_int(c, "force_token", tc.force_token, err)) || (rc = set_num(c, "force_value", tc.force_value, err)))
            return rc;
        break;
    case KP_TOPP_TIES:
        if (tc.tie_count == TIE_DEFAULT) kp_case_unset(c, "tie_count");
        else if ((rc = set_int(c, "tie_count", tc.tie_count, err))) return rc;
        break;
    case KP_TOPP_NEGINF:
        if (tc.neginf_frac == NEGINF_DEFAULT) kp_case_unset(c, "neginf_frac");
        else if ((rc = set_num(c, "neginf_frac", tc.neginf_frac, err))) return rc;
        break;
    case KP_TOPP_NAN:
        if (tc.nan_count == NAN_DEFAULT) kp_case_unset(c, "nan_count");
        else if ((rc = set_int(c, "nan_count", tc.nan_count, err))) return rc;
        break;
    case KP_TOPP_FLAT:
        if (tc.spread == SPREAD_DEFAULT) kp_case_unset(c, "spread");
        else if ((rc = set_num(c, "spread", tc.spread, err))) return rc;
        break;
    default:
        break;
    }
    return 0;
}

/* Every field, defaults included (a profile's own fields only for that profile). */
static int fill_defaults(kp_case *c, kp_error *err) {
    kp_topp_case tc;
    int rc = kp_topp_case_read(c, &tc, err);
    if (!rc) rc = set_int(c, "stride", tc.stride, err);
    if (!rc && tc.profile == KP_TOPP_TIES) rc = set_int(c, "tie_count", tc.tie_count, err);
    if (!rc && tc.profile == KP_TOPP_NEGINF) rc = set_num(c, "neginf_frac", tc.neginf_frac, err);
    if (!rc && tc.profile == KP_TOPP_NAN) rc = set_int(c, "nan_count", tc.nan_count, err);
    if (!rc && tc.profile == KP_TOPP_FLAT) rc = set_num(c, "spread", tc.spread, err);
    return rc;
}

const kp_case_family kp_topp_case_family = {
    .name = "topp",
    .generator_version = KP_TOPP_GENERATOR_VERSION,
    .fields_help = "batch vocab seed top_p profile [stride]; profiles: ordinary forced ties flat neginf nan; "
                   "top_p: number in (0,1] or mixed",
    .normalize = normalize,
    .fill_defaults = fill_defaults,
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
} base_cache;
static base_cache g_base;

void kp_topp_case_cache_clear(void) {
    free(g_base.rows);
    memset(&g_base, 0, sizeof g_base);
}

static int base_rows(const kp_topp_case *tc, int64_t first_row, int64_t nrows, float *logits, kp_error *err) {
    const size_t row_bytes = (size_t)tc->stride * sizeof(float);
    int hit = g_base.valid && g_base.seed == tc->seed && g_base.vocab == tc->vocab && g_base.stride == tc->stride &&
              first_row >= g_base.first && first_row + nrows <= g_base.first + g_base.nrows;
    if (!hit) {
        kp_topp_case base = *tc;
        base.profile = KP_TOPP_ORDINARY;
        float *rows = kp_calloc((size_t)nrows, row_bytes, "generated rows", err);
        if (!rows) return err->code;
        int rc = gen_rows(&base, 0, first_row, nrows, rows, err);
        if (rc) {
            free(rows);
            return rc;
        }
        kp_topp_case_cache_clear();
        g_base = (base_cache){1, tc->seed, tc->vocab, tc->stride, first_row, nrows, rows};
    }
    memcpy(logits, g_base.rows + (first_row - g_base.first) * tc->stride, row_bytes * (size_t)nrows);
    return 0;
}

int kp_topp_case_rows(const kp_topp_case *tc, int64_t first_row, int64_t nrows, float *logits, float *top_p,
                      kp_error *err) {
    if (nrows <= 0) return 0;
    int rc;
    switch (tc->profile) {
    case KP_TOPP_ORDINARY:
    case KP_TOPP_FORCED:
    case KP_TOPP_NEGINF:
    case KP_TOPP_NAN:
        rc = base_rows(tc, first_row, nrows, logits, err);
        if (!rc && tc->profile != KP_TOPP_ORDINARY) rc = gen_rows(tc, 1, first_row, nrows, logits, err);
        break;
    default:
        rc = gen_rows(tc, 0, first_row, nrows, logits, err);
        break;
    }
    if (rc) return rc;
    if (top_p)
        for (int64_t r = 0; r < nrows; r++) top_p[r] = kp_topp_case_row_top_p(tc, first_row + r);
    return 0;
}
