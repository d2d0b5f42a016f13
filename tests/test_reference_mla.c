/* test_reference_mla.c: the sparse MLA decode reference against a float64 computation written here from the rule
 * (libm exp and log, whole gathered tokens), on both caches, raw and pow2 scales, sinks on and +-inf, topk_length on;
 * empty rows, duplicates, the sink's semantics, thread-blind and pinned bits; planted defects (a log2 lse reported as
 * ln, a -1 slot that contributes, an out-of-range index) as positive controls; the deterministic ln against libm. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_nvfp4.h"
#include "../cases/kp_sha256.h"
#include "../cases/mla_case.h"
#include "../reference/mla_ref.h"

TestSuite(reference_mla, .timeout = 120);

/* A case's tensors for all its requests, as the harness makes them. */
typedef struct mla_in {
    kp_mla_case mc;
    kp_mla_sizes s;
    kp_mla_buffers b;
    float sink[128];
} mla_in;

static mla_in load(const char *name) {
    mla_in in;
    memset(&in, 0, sizeof in);
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_mla_case_read(&c, &in.mc, &err), 0,
                 "%s: %s", name, err.msg);
    kp_mla_case_sizes(&in.mc, in.mc.batch, &in.s);
    in.b.q = malloc(in.s.q_bytes), in.b.indices = malloc(in.s.indices_bytes), in.b.page_table = malloc(in.s.page_table_bytes);
    in.b.topk_length = in.mc.topk_length ? malloc(in.s.topk_length_bytes) : NULL;
    in.b.cache = malloc(in.s.cache_bytes), in.b.kv = malloc(in.s.kv_bytes);
    cr_assert(in.b.q && in.b.indices && in.b.page_table && in.b.cache && in.b.kv);
    cr_assert_eq(kp_mla_case_requests(&in.mc, 0, in.mc.batch, &in.b, &err), 0, "%s: %s", name, err.msg);
    cr_assert_eq(kp_mla_case_sink(&in.mc, in.sink, &err), 0, "%s: %s", name, err.msg);
    return in;
}

static void drop(mla_in *in) {
    free(in->b.q), free(in->b.indices), free(in->b.topk_length), free(in->b.page_table), free(in->b.cache), free(in->b.kv);
}

/* out, lse, max_logits of one computation, in one allocation: out [rows, h_q, 512], then lse, then max [rows, h_q]. */
typedef struct res {
    int64_t n_out, n_head;
    double *all, *out, *lse, *max;
} res;

static res res_new(const mla_in *in) {
    res r;
    r.n_head = in->s.rows * in->mc.h_q, r.n_out = r.n_head * KP_MLA_D_V;
    r.all = malloc(sizeof(double) * (size_t)(r.n_out + 2 * r.n_head));
    cr_assert(r.all);
    r.out = r.all, r.lse = r.all + r.n_out, r.max = r.lse + r.n_head;
    return r;
}
static size_t res_bytes(const res *r) { return sizeof(double) * (size_t)(r->n_out + 2 * r->n_head); }

static kp_mla_ref_in ref_in(const mla_in *in, const kp_mla_case *mc) {
    return (kp_mla_ref_in){.mc = mc, .first = 0, .rows = in->s.rows, .q = in->b.q, .indices = in->b.indices,
                           .topk_length = in->b.topk_length, .page_table = in->b.page_table, .cache = in->b.cache,
                           .kv = in->b.kv, .sink = in->sink};
}

/* kp_mla_reference on the dequantized cache and on kv. */
static void reference(const mla_in *in, res *cache, res *kv) {
    *cache = res_new(in), *kv = res_new(in);
    const kp_mla_ref_in r = ref_in(in, &in->mc);
    const kp_mla_ref_out o = {.cache = {cache->out, cache->lse, cache->max}, .kv = {kv->out, kv->lse, kv->max}};
    kp_error err = {0};
    cr_assert_eq(kp_mla_reference(&r, &o, &err), 0, "%s", err.msg);
}

static double bf16(uint16_t h) {
    const uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return (double)f;
}

/* Token t of request r's 576 values, read here from the bytes: from the cache (format as the case) or kv. */
static void token(const mla_in *in, int64_t r, int32_t t, int from_kv, double *v) {
    const kp_mla_case *mc = &in->mc;
    const int64_t P = in->s.pages_per_request;
    const int64_t slot = (int64_t)in->b.page_table[r * P + t / mc->page] * mc->page + t % mc->page;
    if (from_kv || mc->cache == KP_MLA_BF16) {
        const uint16_t *h = from_kv ? in->b.kv + slot * KP_MLA_D_QK : (const uint16_t *)in->b.cache + slot * KP_MLA_D_QK;
        for (int c = 0; c < KP_MLA_D_QK; c++) v[c] = bf16(h[c]);
        return;
    }
    const uint8_t *b = (const uint8_t *)in->b.cache + slot * KP_MLA_FP8_TOKEN_BYTES;
    for (int c = 0; c < KP_MLA_D_NOPE; c++) {
        float scale;
        memcpy(&scale, b + KP_MLA_FP8_SCALES_AT + 4 * (c / KP_MLA_TILE), 4);
        v[c] = (double)kp_e4m3_value(b[c]) * (double)scale;
    }
    for (int c = 0; c < KP_MLA_D_ROPE; c++) {
        uint16_t h;
        memcpy(&h, b + KP_MLA_FP8_ROPE_AT + 2 * c, 2);
        v[KP_MLA_D_NOPE + c] = bf16(h);
    }
}

/* Variants of the computation here: the rule, or a planted defect. */
typedef enum variant {
    CLEAN = 0,
    LOG2_LSE,      /* lse computed in log2 (log2 L + M log2 e) and reported as if ln */
    HOLE_COUNTS,   /* a -1 slot (within topk_length) mapped to zeroed data but not masked: a score of 0, v 0 */
    DEDUP_WEIGHTED /* each distinct token once, its softmax weight times its number of slots */
} variant;

/* The rule, straightforwardly: per (row, head) gather the counted slots' tokens, scores, max, logsumexp with libm;
 * out = sum exp(s - lse) v times 1 / (1 + exp(sink - lse)) (FlashMLA's tests/ref.py form); empty: 0, +inf, -inf. */
static res independent(const mla_in *in, int from_kv, variant var) {
    const kp_mla_case *mc = &in->mc;
    const int64_t K = mc->topk, H = mc->h_q;
    res o = res_new(in);
    double *vals = malloc(sizeof *vals * (size_t)(K * KP_MLA_D_QK)), *w = malloc(sizeof *w * (size_t)K);
    double *s = malloc(sizeof *s * (size_t)K);
    int32_t *tok = malloc(sizeof *tok * (size_t)K);
    cr_assert(vals && w && s && tok);
    for (int64_t row = 0; row < in->s.rows; row++) {
        const int64_t len = mc->topk_length ? in->b.topk_length[row] : K;
        const int32_t *idx = in->b.indices + row * K;
        int64_t n = 0;
        for (int64_t j = 0; j < len; j++) {
            int32_t t = idx[j];
            if (t == -1 && var != HOLE_COUNTS) continue;
            if (var == DEDUP_WEIGHTED) {
                int64_t seen = -1;
                for (int64_t i = 0; i < n; i++)
                    if (tok[i] == t) seen = i;
                if (seen >= 0) {
                    w[seen] += 1.0;
                    continue;
                }
            }
            tok[n] = t, w[n] = 1.0;
            if (t == -1) memset(vals + n * KP_MLA_D_QK, 0, sizeof *vals * KP_MLA_D_QK);
            else token(in, row / mc->s_q, t, from_kv, vals + n * KP_MLA_D_QK);
            n++;
        }
        for (int64_t h = 0; h < H; h++) {
            double *out = o.out + (row * H + h) * KP_MLA_D_V;
            const int64_t at = row * H + h;
            for (int d = 0; d < KP_MLA_D_V; d++) out[d] = 0.0;
            if (n == 0) {
                o.lse[at] = INFINITY, o.max[at] = -INFINITY;
                continue;
            }
            const uint16_t *q = in->b.q + at * KP_MLA_D_QK;
            double m = -INFINITY, l = 0.0;
            for (int64_t i = 0; i < n; i++) {
                double dot = 0.0;
                for (int c = 0; c < KP_MLA_D_QK; c++) dot += bf16(q[c]) * vals[i * KP_MLA_D_QK + c];
                s[i] = mc->sm_scale * dot;
                m = fmax(m, s[i]);
            }
            for (int64_t i = 0; i < n; i++) l += w[i] * exp(s[i] - m);
            const double lse = m + log(l);
            double scale = 1.0;
            if (mc->sink != KP_MLA_SINK_OFF) scale = 1.0 / (1.0 + exp((double)in->sink[h] - lse));
            for (int64_t i = 0; i < n; i++) {
                const double p = w[i] * exp(s[i] - lse) * scale;
                for (int d = 0; d < KP_MLA_D_V; d++) out[d] += p * vals[i * KP_MLA_D_QK + d];
            }
            o.lse[at] = var == LOG2_LSE ? log2(l) + m * M_LOG2E : lse;
            o.max[at] = m;
        }
    }
    free(vals), free(w), free(s), free(tok);
    return o;
}

/* NaN and inf positions (and inf signs) first, then |a - b| <= atol + rtol |b| elementwise: the number failing. */
static int64_t failing(const double *a, const double *b, int64_t n, double atol, double rtol) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) bad += !(isnan(a[i]) && isnan(b[i]));
        else if (isinf(a[i]) || isinf(b[i])) bad += a[i] != b[i];
        else bad += !(fabs(a[i] - b[i]) <= atol + rtol * fabs(b[i]));
    }
    return bad;
}

#define TIGHT 1e-12 /* the reference against the computation here: float64 rounding only */
/* The mla gate's decode tolerances (FlashMLA's decode tests, DESIGN.md "mla"). */
#define OUT_ATOL 1e-3
#define OUT_RTOL (2.01 / 128)
#define LSE_ATOL 1e-6
#define LSE_RTOL (8.01 / 65536)

static void assert_close(const res *ref, const res *mine, const char *what) {
    int64_t b;
    cr_assert_eq(b = failing(ref->out, mine->out, ref->n_out, TIGHT, TIGHT), 0, "%s: %lld out elements differ", what, (long long)b);
    cr_assert_eq(b = failing(ref->lse, mine->lse, ref->n_head, TIGHT, TIGHT), 0, "%s: %lld lse differ", what, (long long)b);
    cr_assert_eq(b = failing(ref->max, mine->max, ref->n_head, TIGHT, TIGHT), 0, "%s: %lld max_logits differ", what, (long long)b);
}

/* Whether `row` has a counted slot. */
static int row_counts(const mla_in *in, int64_t row) {
    const int64_t len = in->mc.topk_length ? in->b.topk_length[row] : in->mc.topk;
    for (int64_t j = 0; j < len; j++)
        if (in->b.indices[row * in->mc.topk + j] != -1) return 1;
    return 0;
}

/* batch 2 (one of batch 1 at h_q 128), s_kv 300, page 61 (pages straddle 64-slot blocks), topk 64 and 128. */
static const char *const cases[] = {
    "mla(batch=2,h_q=64,page=61,profile=mixed,s_kv=300,s_q=3,seed=11,topk=128)",
    "mla(batch=2,h_q=64,page=61,profile=mixed,s_kv=300,s_q=3,scale=pow2,seed=12,sink=on,topk=64,topk_length=on)",
    "mla(batch=2,cache=bf16,h_q=64,page=61,profile=dup,s_kv=300,s_q=2,seed=13,sink=inf,topk=128)",
    "mla(batch=2,h_q=64,page=61,profile=holes,s_kv=300,seed=14,sink=inf,topk=128,topk_length=on)",
    "mla(batch=1,h_q=128,page=61,profile=mixed,s_kv=300,s_q=4,seed=15,sink=on,topk=128)",
};
#define NCASES (sizeof cases / sizeof *cases)

/* Each case, both computations: within 1e-12 of the computation here, no NaN (the reference read no unreferenced
 * token: those hold NaN), empty rows exactly out 0 / lse +inf / max -inf, and the bf16 cache's two results the same
 * bits while the fp8 cache's differ (the quantization error the harness reports). */
Test(reference_mla, matches_an_independent_float64_computation_on_both_caches) {
    int64_t empty_rows = 0, rows = 0;
    for (size_t c = 0; c < NCASES; c++) {
        mla_in in = load(cases[c]);
        res cache, kv;
        reference(&in, &cache, &kv);
        res mine_cache = independent(&in, 0, CLEAN), mine_kv = independent(&in, 1, CLEAN);
        assert_close(&cache, &mine_cache, cases[c]);
        assert_close(&kv, &mine_kv, cases[c]);
        for (int64_t i = 0; i < cache.n_out + 2 * cache.n_head; i++)
            cr_assert(!isnan(cache.all[i]) && !isnan(kv.all[i]), "%s: a NaN at %lld: a stray read", cases[c], (long long)i);
        double most = 0;
        for (int64_t i = 0; i < cache.n_out; i++) most = fmax(most, fabs(cache.out[i]));
        cr_assert(most > 0.05, "%s: the output is nearly zero (max %g)", cases[c], most);
        for (int64_t row = 0; row < in.s.rows; row++, rows++) {
            if (row_counts(&in, row)) continue;
            empty_rows++;
            for (int64_t h = 0; h < in.mc.h_q; h++) {
                const int64_t at = row * in.mc.h_q + h;
                cr_assert(cache.lse[at] == INFINITY && kv.lse[at] == INFINITY, "%s: row %lld lse", cases[c], (long long)row);
                cr_assert(cache.max[at] == -INFINITY && kv.max[at] == -INFINITY, "%s: row %lld max", cases[c], (long long)row);
                for (int d = 0; d < KP_MLA_D_V; d++) {
                    const double a = cache.out[at * KP_MLA_D_V + d], b = kv.out[at * KP_MLA_D_V + d];
                    cr_assert(a == 0.0 && !signbit(a) && b == 0.0 && !signbit(b), "%s: row %lld out", cases[c], (long long)row);
                }
            }
        }
        const int same = !memcmp(cache.all, kv.all, res_bytes(&cache));
        if (in.mc.cache == KP_MLA_BF16) cr_assert(same, "%s: a bf16 cache holds kv exactly", cases[c]);
        else cr_assert(!same, "%s: the fp8 cache's result equals kv's: quantization invisible", cases[c]);
        free(cache.all), free(kv.all), free(mine_cache.all), free(mine_kv.all);
        drop(&in);
    }
    cr_assert(empty_rows > 0 && empty_rows < rows, "%lld of %lld rows empty: both kinds must be present",
              (long long)empty_rows, (long long)rows);
}

/* profile=invalid: every row empty, whatever the sink. */
Test(reference_mla, an_all_invalid_row_gives_out_0_lse_inf_max_minus_inf) {
    mla_in in = load("mla(batch=2,h_q=64,page=61,profile=invalid,s_kv=300,seed=21,sink=inf,topk=64)");
    res cache, kv;
    reference(&in, &cache, &kv);
    for (int64_t i = 0; i < cache.n_out; i++) cr_assert(cache.out[i] == 0.0 && !signbit(cache.out[i]) && kv.out[i] == 0.0);
    for (int64_t i = 0; i < cache.n_head; i++) {
        cr_assert(cache.lse[i] == INFINITY && kv.lse[i] == INFINITY);
        cr_assert(cache.max[i] == -INFINITY && kv.max[i] == -INFINITY);
    }
    free(cache.all), free(kv.all);
    drop(&in);
}

/* profile=dup: the reference equals the computation over distinct tokens with each one's weight times its slot
 * count; the same with every weight 1 (a kernel deduplicating) lands far outside the gate's tolerance. */
Test(reference_mla, duplicate_indices_count_twice) {
    mla_in in = load("mla(batch=2,h_q=64,page=61,profile=dup,s_kv=300,s_q=2,seed=22,topk=128)");
    int64_t dups = 0;
    for (int64_t row = 0; row < in.s.rows; row++)
        for (int64_t j = 0; j < in.mc.topk; j++)
            for (int64_t i = 0; i < j; i++) {
                const int32_t t = in.b.indices[row * in.mc.topk + j];
                if (t != -1 && in.b.indices[row * in.mc.topk + i] == t) {
                    dups++;
                    break;
                }
            }
    cr_assert(dups > 4, "only %lld duplicated slots", (long long)dups);
    res cache, kv;
    reference(&in, &cache, &kv);
    res weighted = independent(&in, 0, DEDUP_WEIGHTED);
    assert_close(&cache, &weighted, "weight doubled");
    /* deduplicated with weight 1: the same tokens, each once */
    int32_t *keep = malloc(in.s.indices_bytes);
    cr_assert(keep);
    memcpy(keep, in.b.indices, in.s.indices_bytes);
    for (int64_t row = 0; row < in.s.rows; row++)
        for (int64_t j = 0; j < in.mc.topk; j++)
            for (int64_t i = 0; i < j; i++)
                if (in.b.indices[row * in.mc.topk + j] != -1 && keep[row * in.mc.topk + i] == in.b.indices[row * in.mc.topk + j])
                    in.b.indices[row * in.mc.topk + j] = -1;
    res once = independent(&in, 0, CLEAN);
    cr_assert(failing(once.lse, cache.lse, cache.n_head, LSE_ATOL, LSE_RTOL) > 0, "counting duplicates once went unseen");
    memcpy(in.b.indices, keep, in.s.indices_bytes);
    free(keep), free(cache.all), free(kv.all), free(weighted.all), free(once.all);
    drop(&in);
}

/* sink=inf: lse and max_logits are those of the scores alone (the same bits as with the sink off); a head whose sink
 * is -inf has the sink-off output, one whose sink is +inf out 0; a finite sink scales out by L / (L + exp(sink)). */
Test(reference_mla, the_sink_adds_to_the_denominator_only) {
    mla_in in = load("mla(batch=2,h_q=64,page=61,profile=uniform,s_kv=300,seed=23,sink=inf,topk=128)");
    res cache, kv;
    reference(&in, &cache, &kv);
    kp_mla_case off = in.mc;
    off.sink = KP_MLA_SINK_OFF;
    res ocache = res_new(&in);
    const kp_mla_ref_in r = ref_in(&in, &off);
    const kp_mla_ref_out o = {.cache = {ocache.out, ocache.lse, ocache.max}};
    kp_error err = {0};
    cr_assert_eq(kp_mla_reference(&r, &o, &err), 0, "%s", err.msg);
    cr_assert(!memcmp(cache.lse, ocache.lse, sizeof(double) * (size_t)cache.n_head), "lse excludes the sink");
    cr_assert(!memcmp(cache.max, ocache.max, sizeof(double) * (size_t)cache.n_head));
    int kinds[3] = {0, 0, 0};
    for (int64_t row = 0; row < in.s.rows; row++)
        for (int64_t h = 0; h < in.mc.h_q; h++) {
            const double sink = in.sink[h], *a = cache.out + (row * in.mc.h_q + h) * KP_MLA_D_V;
            const double *b = ocache.out + (row * in.mc.h_q + h) * KP_MLA_D_V;
            const double lse = cache.lse[row * in.mc.h_q + h];
            const double f = isinf(sink) ? (sink > 0 ? 0.0 : 1.0) : 1.0 / (1.0 + exp(sink - lse));
            kinds[isinf(sink) ? (sink > 0 ? 2 : 1) : 0]++;
            for (int d = 0; d < KP_MLA_D_V; d++) {
                if (sink == -INFINITY) cr_assert(a[d] == b[d], "a -inf sink changes nothing");
                else if (sink == INFINITY) cr_assert(a[d] == 0.0 && !signbit(a[d]), "a +inf sink gives 0");
                else cr_assert(fabs(a[d] - f * b[d]) <= 1e-13 * (1 + fabs(b[d])), "finite sink: %g vs %g", a[d], f * b[d]);
            }
        }
    cr_assert(kinds[0] && kinds[1] && kinds[2], "heads with finite, -inf and +inf sinks: %d %d %d", kinds[0], kinds[1], kinds[2]);
    free(cache.all), free(kv.all), free(ocache.all);
    drop(&in);
}

/* Items are handed to kp_thread_count() threads (re-read from KPARITY_THREADS at each call): the bits must not
 * depend on how many. */
Test(reference_mla, the_bits_do_not_depend_on_the_thread_count) {
    mla_in in = load(cases[1]);
    res c1, k1, c7, k7;
    cr_assert_eq(setenv("KPARITY_THREADS", "1", 1), 0);
    cr_assert_eq(kp_thread_count(), 1);
    reference(&in, &c1, &k1);
    cr_assert_eq(setenv("KPARITY_THREADS", "7", 1), 0);
    cr_assert_eq(kp_thread_count(), 7);
    reference(&in, &c7, &k7);
    cr_assert_eq(unsetenv("KPARITY_THREADS"), 0);
    cr_assert(!memcmp(c1.all, c7.all, res_bytes(&c1)), "cache result: 1 and 7 threads differ");
    cr_assert(!memcmp(k1.all, k7.all, res_bytes(&k1)), "kv result: 1 and 7 threads differ");
    free(c1.all), free(k1.all), free(c7.all), free(k7.all);
    drop(&in);
}

/* The bits of one case's cache result (out, then lse, then max_logits; f64 little-endian), pinned. */
Test(reference_mla, one_reference_output_has_its_pinned_digest) {
    mla_in in = load(cases[0]);
    res cache, kv;
    reference(&in, &cache, &kv);
    char hex[KP_SHA256_HEX_LEN];
    kp_sha256_hex(cache.all, res_bytes(&cache), hex);
    cr_assert_str_eq(hex, "61d4f31c82767b6500eeb0c66cdf9467e2a2497ca5f8e7fbd0b93ae852b884a1", "the reference's cache result hashes to %s", hex);
    free(cache.all), free(kv.all);
    drop(&in);
}

/* Planted defects in the computation here, each far outside the gate's tolerance against the reference: lse in log2
 * reported as ln, and -1 slots counted (zeroed data, unmasked: score 0). */
Test(reference_mla, planted_lse_and_hole_defects_are_caught) {
    mla_in in = load(cases[0]); /* mixed: holes and all-invalid rows among others */
    res cache, kv;
    reference(&in, &cache, &kv);
    res log2lse = independent(&in, 0, LOG2_LSE), holes = independent(&in, 0, HOLE_COUNTS);
    const int64_t bad_lse = failing(log2lse.lse, cache.lse, cache.n_head, LSE_ATOL, LSE_RTOL);
    cr_assert(bad_lse > cache.n_head / 2, "log2 lse: only %lld of %lld lse outside tolerance", (long long)bad_lse,
              (long long)cache.n_head);
    cr_assert_eq(failing(log2lse.out, cache.out, cache.n_out, OUT_ATOL, OUT_RTOL), 0, "the log2 defect touches lse only");
    const int64_t hole_lse = failing(holes.lse, cache.lse, cache.n_head, LSE_ATOL, LSE_RTOL);
    const int64_t hole_out = failing(holes.out, cache.out, cache.n_out, OUT_ATOL, OUT_RTOL);
    cr_assert(hole_lse > 0 && hole_out > 0, "a contributing -1: %lld lse, %lld out outside tolerance", (long long)hole_lse,
              (long long)hole_out);
    free(cache.all), free(kv.all), free(log2lse.all), free(holes.all);
    drop(&in);
}

/* An index outside [0, s_kv) other than -1, in any slot (decode dereferences it, topk_length or not), is refused
 * before anything is read, naming row and slot. */
Test(reference_mla, an_out_of_range_index_is_refused_as_usage) {
    mla_in in = load(cases[1]); /* topk_length on */
    res cache = res_new(&in);
    const kp_mla_ref_in r = ref_in(&in, &in.mc);
    const kp_mla_ref_out o = {.cache = {cache.out, cache.lse, cache.max}};
    kp_error err = {0};
    cr_assert_eq(kp_mla_reference(&r, &o, &err), 0, "the case as generated runs: %s", err.msg);
    const int64_t K = in.mc.topk, last = in.s.rows * K - 1;
    const int32_t bad[4] = {(int32_t)in.mc.s_kv, INT32_MAX, -2, INT32_MIN};
    const int64_t at[4] = {0, last, 3 * K + 5, last};
    for (int i = 0; i < 4; i++) {
        const int32_t keep = in.b.indices[at[i]];
        in.b.indices[at[i]] = bad[i];
        memset(&err, 0, sizeof err);
        cr_assert_eq(kp_mla_reference(&r, &o, &err), KP_EXIT_USAGE, "index %d", bad[i]);
        char want[96];
        snprintf(want, sizeof want, "indices[%lld][%lld] = %d", (long long)(at[i] / K), (long long)(at[i] % K), bad[i]);
        cr_assert(strstr(err.msg, want), "the message names row and slot (%s): %s", want, err.msg);
        in.b.indices[at[i]] = keep;
    }
    /* a missing input and nothing asked are usage errors too */
    kp_mla_ref_in nosink = r;
    nosink.sink = NULL;
    cr_assert_eq(kp_mla_reference(&nosink, &o, &err), KP_EXIT_USAGE);
    const kp_mla_ref_out none = {.cache = {NULL, NULL, NULL}, .kv = {NULL, NULL, NULL}};
    cr_assert_eq(kp_mla_reference(&r, &none, &err), KP_EXIT_USAGE);
    free(cache.all);
    drop(&in);
}
