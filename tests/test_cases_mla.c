/* test_cases_mla.c: mla case names and generation: canonical names with defaults dropped, bad fields refused naming
 * the field, a request the same whatever the batch, the fp8_ds_mla token byte for byte (codes, raw and pow2 scales,
 * RoPE), the fast e4m3 encoder against the table quantizer, NaN in unreferenced tokens, each index profile's
 * promise, the page table, value magnitudes, and pinned digests. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_nvfp4.h"
#include "../cases/kp_tensor.h"
#include "../cases/mla_case.h"
#include "kp_test_util.h"

static kp_mla_case read_case(const char *name, char *canonical) {
    kp_case c;
    kp_mla_case mc;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_mla_case_read(&c, &mc, &err), 0, "%s: %s",
                 name, err.msg);
    if (canonical) kp_case_format(&c, canonical, KP_CASE_NAME_MAX);
    return mc;
}

typedef struct gen {
    kp_mla_sizes s;
    kp_mla_buffers b;
    float sink[128];
} gen;

/* Requests [first, first + n), every tensor. */
static gen make(const kp_mla_case *mc, int64_t first, int64_t n) {
    gen g;
    memset(&g, 0, sizeof g);
    kp_mla_case_sizes(mc, n, &g.s);
    g.b.q = malloc(g.s.q_bytes), g.b.indices = malloc(g.s.indices_bytes), g.b.page_table = malloc(g.s.page_table_bytes);
    g.b.topk_length = mc->topk_length ? malloc(g.s.topk_length_bytes) : NULL;
    g.b.cache = malloc(g.s.cache_bytes), g.b.kv = malloc(g.s.kv_bytes);
    kp_error err = {0};
    cr_assert_eq(kp_mla_case_requests(mc, first, n, &g.b, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_mla_case_sink(mc, g.sink, &err), 0, "%s", err.msg);
    return g;
}
static void drop(gen *g) {
    free(g->b.q), free(g->b.indices), free(g->b.topk_length), free(g->b.page_table), free(g->b.cache), free(g->b.kv);
}

static float bf16(uint16_t h) {
    const uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}
static uint32_t f32_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

Test(cases_mla, names_are_canonical_and_defaults_dropped) {
    char name[KP_CASE_NAME_MAX];
    kp_mla_case d = read_case("mla(seed=7,profile=uniform,batch=4,s_q=1,h_q=128,topk=2048,s_kv=4096,page=64,"
                              "cache=fp8_ds_mla,scale=raw,topk_length=off,sink=off,sm_scale=0.1352340)", name);
    cr_assert_str_eq(name, "mla(batch=4,profile=uniform,seed=7)", "defaults dropped");
    cr_assert(d.batch == 4 && d.s_q == 1 && d.h_q == 128 && d.topk == 2048 && d.s_kv == 4096 && d.page == 64);
    cr_assert(d.cache == KP_MLA_FP8_DS_MLA && d.scale == KP_MLA_SCALE_RAW && !d.topk_length && d.sink == KP_MLA_SINK_OFF);
    cr_assert_eq(d.sm_scale, 0.135234);
    const char *kept = "mla(batch=33,h_q=64,page=61,profile=mixed,s_kv=2046,s_q=2,scale=pow2,seed=3,sink=inf,sm_scale=0.5,"
                       "topk=576,topk_length=on)";
    kp_mla_case k = read_case("mla(batch=33,h_q=64,page=61,profile=mixed,s_kv=2046,s_q=2,scale=pow2,seed=03,sink=inf,"
                              "sm_scale=5e-1,topk=576,topk_length=on)", name);
    cr_assert_str_eq(name, kept);
    cr_assert(k.batch == 33 && k.h_q == 64 && k.page == 61 && k.profile == KP_MLA_MIXED && k.s_kv == 2046 && k.s_q == 2);
    cr_assert(k.scale == KP_MLA_SCALE_POW2 && k.seed == 3 && k.sink == KP_MLA_SINK_INF && k.sm_scale == 0.5 && k.topk == 576);
    cr_assert(k.topk_length);
    read_case(kept, name);
    cr_assert_str_eq(name, kept, "the canonical name is a fixed point");
    kp_mla_case b = read_case("mla(batch=1,cache=bf16,profile=dup,seed=1,sink=on)", name);
    cr_assert_str_eq(name, "mla(batch=1,cache=bf16,profile=dup,seed=1,sink=on)");
    cr_assert(b.cache == KP_MLA_BF16 && b.profile == KP_MLA_DUP && b.sink == KP_MLA_SINK_ON);
    kp_mla_sizes s;
    kp_mla_case_sizes(&k, 2, &s);
    cr_assert(s.rows == 4 && s.pages_per_request == 34 && s.pages == 68 && s.token_bytes == 656, "ceil(2046 / 61) = 34 pages");
    cr_assert(s.cache_bytes == (size_t)68 * 61 * 656 && s.kv_bytes == (size_t)68 * 61 * 1152 && s.sink_bytes == 64 * 4);
    cr_assert(s.q_bytes == (size_t)4 * 64 * 576 * 2 && s.indices_bytes == (size_t)4 * 576 * 4 && s.topk_length_bytes == 16);
    kp_mla_case_sizes(&b, 3, &s);
    cr_assert(s.token_bytes == 1152 && s.pages_per_request == 64 && s.topk_length_bytes == 0 && s.sink_bytes == 128 * 4);
}

Test(cases_mla, bad_fields_are_refused_naming_the_field) {
    struct {
        const char *name, *needle;
    } bad[] = {
        {"mla(batch=1,h_q=96,profile=uniform,seed=1)", "'h_q': 96 is not 64 or 128"},
        {"mla(batch=1,profile=uniform,seed=1,topk=100)", "'topk': 100 is not a multiple of 64"},
        {"mla(batch=1,profile=uniform,seed=1,topk=0)", "'topk'"},
        {"mla(batch=1,profile=uniform,s_q=5,seed=1)", "'s_q'"},
        {"mla(batch=1,profile=uniform,s_kv=1,s_q=2,seed=1)", "'s_kv'"},
        {"mla(batch=1,profile=uniform,s_kv=0,seed=1)", "'s_kv'"},
        {"mla(batch=1,page=0,profile=uniform,seed=1)", "'page'"},
        {"mla(batch=0,profile=uniform,seed=1)", "'batch'"},
        {"mla(batch=4097,profile=uniform,seed=1)", "'batch'"},
        {"mla(batch=1,profile=uniform)", "'seed' is required"},
        {"mla(batch=1,seed=1)", "'profile' is required"},
        {"mla(profile=uniform,seed=1)", "'batch' is required"},
        {"mla(batch=1,profile=random,seed=1)", "'profile': 'random' is unknown"},
        {"mla(batch=1,cache=fp8,profile=uniform,seed=1)", "'cache': 'fp8' is unknown"},
        {"mla(batch=1,profile=uniform,scale=ue8m0,seed=1)", "'scale': 'ue8m0' is unknown"},
        {"mla(batch=1,cache=bf16,profile=uniform,scale=pow2,seed=1)", "'scale' only applies to cache=fp8_ds_mla"},
        {"mla(batch=1,profile=uniform,seed=1,topk_length=yes)", "'topk_length'"},
        {"mla(batch=1,profile=uniform,seed=1,sink=1)", "'sink'"},
        {"mla(batch=1,profile=uniform,seed=1,sm_scale=0)", "'sm_scale'"},
        {"mla(batch=1,profile=uniform,seed=1,sm_scale=-0.1)", "'sm_scale'"},
        {"mla(batch=1,profile=uniform,seed=1,sm_scale=inf)", "'sm_scale'"},
        {"mla(batch=1,profile=uniform,seed=1,sm_scale=abc)", "'sm_scale'"},
        {"mla(batch=1,profile=uniform,seed=-1)", "'seed'"},
        {"mla(batch=1,colour=1,profile=uniform,seed=1)", "'colour' is unknown"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) kpt_case_refused(bad[i].name, bad[i].needle);
}

/* Request r's tensors in a generation whose first request is `first`. */
static void expect_same_request(const kp_mla_case *mc, const gen *a, int64_t ra, const gen *b, int64_t rb, int64_t r) {
    const int64_t S = mc->s_q, P = a->s.pages_per_request, page_bytes = mc->page * a->s.token_bytes;
    const size_t qrow = (size_t)(mc->h_q * KP_MLA_D_QK) * 2;
    const size_t irow = sizeof(int32_t) * (size_t)mc->topk;
    cr_assert(!memcmp((char *)a->b.q + ra * S * qrow, (char *)b->b.q + rb * S * qrow, S * qrow), "q of request %lld",
              (long long)r);
    cr_assert(!memcmp((char *)a->b.indices + ra * S * irow, (char *)b->b.indices + rb * S * irow, S * irow),
              "indices of request %lld", (long long)r);
    if (mc->topk_length)
        cr_assert(!memcmp(a->b.topk_length + ra * S, b->b.topk_length + rb * S, sizeof(int32_t) * (size_t)S));
    cr_assert(!memcmp(a->b.page_table + ra * P, b->b.page_table + rb * P, sizeof(int32_t) * (size_t)P),
              "page table of request %lld", (long long)r);
    const uint8_t *ca = (const uint8_t *)a->b.cache + ra * P * page_bytes, *cb = (const uint8_t *)b->b.cache + rb * P * page_bytes;
    cr_assert(!memcmp(ca, cb, (size_t)(P * page_bytes)), "cache pages of request %lld", (long long)r);
    const int64_t kv_page = mc->page * KP_MLA_D_QK;
    cr_assert(!memcmp(a->b.kv + ra * P * kv_page, b->b.kv + rb * P * kv_page, sizeof(uint16_t) * (size_t)(P * kv_page)));
}

Test(cases_mla, a_request_is_the_same_whatever_the_batch_and_the_thread_count) {
    const char *fields = "h_q=64,page=64,profile=mixed,s_kv=300,s_q=2,seed=9,topk=128,topk_length=on)";
    char five[256], two[256];
    snprintf(five, sizeof five, "mla(batch=5,%s", fields), snprintf(two, sizeof two, "mla(batch=2,%s", fields);
    const kp_mla_case m5 = read_case(five, NULL), m2 = read_case(two, NULL);
    gen all = make(&m5, 0, 5);
    setenv("KPARITY_THREADS", "1", 1);
    gen first2 = make(&m2, 0, 2);
    setenv("KPARITY_THREADS", "7", 1);
    gen tail = make(&m5, 3, 2);
    unsetenv("KPARITY_THREADS");
    for (int64_t r = 0; r < 2; r++) expect_same_request(&m5, &all, r, &first2, r, r);
    for (int64_t r = 3; r < 5; r++) expect_same_request(&m5, &all, r, &tail, r - 3, r);
    /* and requests differ from each other: the comparisons above are not vacuous */
    const size_t qreq = (size_t)(2 * 64 * KP_MLA_D_QK) * 2;
    cr_assert(memcmp((char *)all.b.q + 3 * qreq, (char *)all.b.q + 4 * qreq, qreq));
    const size_t req_bytes = (size_t)(all.s.pages_per_request * m5.page * all.s.token_bytes);
    cr_assert(memcmp((uint8_t *)all.b.cache + 3 * req_bytes, (uint8_t *)all.b.cache + 4 * req_bytes, req_bytes));
    drop(&all), drop(&first2), drop(&tail);
}

Test(cases_mla, a_tokens_values_do_not_depend_on_the_page_size) {
    const kp_mla_case p64 = read_case("mla(batch=2,h_q=64,profile=uniform,s_kv=300,seed=12,topk=128)", NULL);
    const kp_mla_case p7 = read_case("mla(batch=2,h_q=64,page=7,profile=uniform,s_kv=300,seed=12,topk=128)", NULL);
    gen a = make(&p64, 0, 2), b = make(&p7, 0, 2);
    cr_assert(!memcmp(a.b.indices, b.b.indices, a.s.indices_bytes) && !memcmp(a.b.q, b.b.q, a.s.q_bytes));
    for (int64_t r = 0; r < 2; r++)
        for (int32_t t = 0; t < 300; t++) {
            const int64_t sa = kp_mla_cache_slot(&p64, a.b.page_table + r * a.s.pages_per_request, t);
            const int64_t sb = kp_mla_cache_slot(&p7, b.b.page_table + r * b.s.pages_per_request, t);
            cr_assert(!memcmp(a.b.kv + sa * 576, b.b.kv + sb * 576, 1152), "request %lld token %d", (long long)r, t);
            cr_assert(!memcmp((uint8_t *)a.b.cache + sa * 656, (uint8_t *)b.b.cache + sb * 656, 656));
        }
    drop(&a), drop(&b);
}

/* The tokens the counted slots of request r's rows reference: [s_kv]. */
static uint8_t *referenced_tokens(const kp_mla_case *mc, const gen *g, int64_t r) {
    uint8_t *ref = calloc((size_t)mc->s_kv, 1);
    for (int64_t i = 0; i < mc->s_q; i++) {
        const int64_t row = r * mc->s_q + i, counted = mc->topk_length ? g->b.topk_length[row] : mc->topk;
        for (int64_t j = 0; j < counted; j++)
            if (g->b.indices[row * mc->topk + j] >= 0) ref[g->b.indices[row * mc->topk + j]] = 1;
    }
    return ref;
}

/* Check one fp8_ds_mla token against the bf16 values it was made from. Returns how many tiles' scales are not
 * powers of two. */
static int expect_fp8_token(const uint8_t *token, const uint16_t *kv, kp_mla_scale_kind kind) {
    int raw_scales = 0;
    double values[KP_MLA_D_QK];
    kp_mla_token_values(KP_MLA_FP8_DS_MLA, token, values);
    for (int k = 0; k < 4; k++) {
        float amax = 0, scale;
        for (int i = 0; i < 128; i++) amax = fmaxf(amax, fabsf(bf16(kv[k * 128 + i])));
        memcpy(&scale, token + 512 + 4 * k, 4); /* bytes 512 + 4k: tile k's f32 scale, little-endian */
        const float raw = amax / 448.0f;
        if (kind == KP_MLA_SCALE_RAW) {
            cr_assert_eq(f32_bits(scale), f32_bits(raw), "tile %d: scale %a, amax / 448 %a", k, (double)scale, (double)raw);
        } else {
            cr_assert_eq(f32_bits(scale) & 0x807fffffu, 0, "tile %d: %a is not a power of two", k, (double)scale);
            cr_assert(scale >= raw && scale / 2 < raw, "tile %d: %a is not the power of two above %a", k, (double)scale,
                      (double)raw);
        }
        raw_scales += (f32_bits(scale) & 0x7fffffu) != 0;
        for (int i = 0; i < 128; i++) {
            const int c = k * 128 + i;
            const float v = bf16(kv[c]);
            cr_assert_eq(token[c], kp_e4m3_quantize(v / scale), "byte %d: code 0x%02x for %a / %a", c, token[c], (double)v,
                         (double)scale);
            const double back = (double)kp_e4m3_value(token[c]) * scale;
            cr_assert_eq(values[c], back);
            cr_assert(fabs(back - v) <= fmax(fabs(v) * 0x1p-4, scale * 0x1p-10), "value %d: %g back as %g", c, (double)v, back);
        }
    }
    cr_assert(!memcmp(token + 528, kv + 512, 128), "bytes 528..655: the 64 RoPE values in bf16");
    for (int j = 0; j < 64; j++) cr_assert_eq(values[512 + j], (double)bf16(kv[512 + j]));
    return raw_scales;
}

static void expect_nan_token(const kp_mla_case *mc, const uint8_t *token, const uint16_t *kv) {
    for (int c = 0; c < KP_MLA_D_QK; c++) cr_assert_eq(kv[c], KP_MLA_NAN_BF16);
    if (mc->cache == KP_MLA_BF16) {
        cr_assert(!memcmp(token, kv, KP_MLA_BF16_TOKEN_BYTES));
        return;
    }
    for (int c = 0; c < 512; c++) cr_assert_eq(token[c], 0x7f, "byte %d", c);
    for (int k = 0; k < 4; k++) {
        uint32_t bits;
        memcpy(&bits, token + 512 + 4 * k, 4);
        cr_assert_eq(bits, KP_MLA_NAN_F32);
    }
    cr_assert(!memcmp(token + 528, kv + 512, 128));
}

/* Every token of a case: referenced ones encode their values, the rest (and slots past s_kv) are NaN. */
static int64_t expect_cache(const kp_mla_case *mc, const gen *g, int64_t *referenced_count) {
    const int64_t P = g->s.pages_per_request, page = mc->page;
    int64_t raw_scales = 0;
    *referenced_count = 0;
    for (int64_t r = 0; r < mc->batch; r++) {
        uint8_t *ref = referenced_tokens(mc, g, r);
        for (int64_t t = 0; t < P * page; t++) {
            const int64_t slot = kp_mla_cache_slot(mc, g->b.page_table + r * P, (int32_t)t);
            const uint8_t *token = (const uint8_t *)g->b.cache + slot * g->s.token_bytes;
            const uint16_t *kv = g->b.kv + slot * KP_MLA_D_QK;
            if (t >= mc->s_kv || !ref[t]) {
                expect_nan_token(mc, token, kv);
                continue;
            }
            ++*referenced_count;
            for (int c = 0; c < KP_MLA_D_QK; c++)
                cr_assert(isfinite(bf16(kv[c])), "request %lld token %lld", (long long)r, (long long)t);
            if (mc->cache == KP_MLA_BF16) cr_assert(!memcmp(token, kv, KP_MLA_BF16_TOKEN_BYTES));
            else raw_scales += expect_fp8_token(token, kv, mc->scale);
        }
        free(ref);
    }
    return raw_scales;
}

Test(cases_mla, fp8_ds_mla_tokens_byte_for_byte_with_raw_and_pow2_scales) {
    const kp_mla_case raw = read_case("mla(batch=2,h_q=64,page=61,profile=holes,s_kv=400,seed=5,topk=256)", NULL);
    const kp_mla_case pow2 = read_case("mla(batch=2,h_q=64,page=61,profile=holes,s_kv=400,scale=pow2,seed=5,topk=256)", NULL);
    const kp_mla_case b16 = read_case("mla(batch=2,cache=bf16,h_q=64,page=61,profile=holes,s_kv=400,seed=5,topk=256)", NULL);
    gen gr = make(&raw, 0, 2), gp = make(&pow2, 0, 2), gb = make(&b16, 0, 2);
    cr_assert(!memcmp(gr.b.kv, gp.b.kv, gr.s.kv_bytes) && !memcmp(gr.b.kv, gb.b.kv, gr.s.kv_bytes),
              "the values before quantization do not depend on the cache format");
    cr_assert(!memcmp(gr.b.indices, gb.b.indices, gr.s.indices_bytes));
    cr_assert(!memcmp(gr.b.page_table, gp.b.page_table, gr.s.page_table_bytes));
    cr_assert(!memcmp(gb.b.cache, gb.b.kv, gb.s.kv_bytes), "the bf16 cache holds exactly the values");

    /* one token, spelled out: request 1's first referenced token */
    uint8_t *ref = referenced_tokens(&raw, &gr, 1);
    int32_t t = 0;
    while (!ref[t]) t++;
    free(ref);
    const int64_t slot = kp_mla_cache_slot(&raw, gr.b.page_table + gr.s.pages_per_request, t);
    cr_assert(slot >= 7 * 61 && slot < 14 * 61, "request 1's pages are physical pages 7..13");
    const uint8_t *token = (const uint8_t *)gr.b.cache + slot * 656;
    const uint16_t *kv = gr.b.kv + slot * 576;
    expect_fp8_token(token, kv, KP_MLA_SCALE_RAW);
    const uint8_t *token_pow2 = (const uint8_t *)gp.b.cache + slot * 656;
    cr_assert_eq(expect_fp8_token(token_pow2, kv, KP_MLA_SCALE_POW2), 0);
    cr_assert(memcmp(token + 512, token_pow2 + 512, 16), "raw and pow2 scales differ");
    float scale[4];
    memcpy(scale, token + 512, sizeof scale);
    for (int k = 0; k < 4; k++)
        for (int q = 0; q < k; q++) cr_assert_neq(scale[k], scale[q], "tiles %d and %d share a scale", k, q);

    /* every token of the three caches */
    int64_t nref, nref_pow2, nref_bf16;
    const int64_t raw_scales = expect_cache(&raw, &gr, &nref);
    cr_assert_eq(expect_cache(&pow2, &gp, &nref_pow2), 0, "pow2 scales are powers of two");
    expect_cache(&b16, &gb, &nref_bf16);
    cr_assert(nref > 300 && nref < 2 * 400 - 100 && nref == nref_pow2 && nref == nref_bf16, "%lld tokens referenced",
              (long long)nref);
    /* a raw scale is a power of two only where amax is 7 * 2^k: about 1 tile in 100 */
    cr_assert(raw_scales > 4 * nref * 95 / 100, "%lld of %lld raw scales are not powers of two", (long long)raw_scales,
              (long long)(4 * nref));
    drop(&gr), drop(&gp), drop(&gb);
}

Test(cases_mla, tokens_past_topk_length_and_unreferenced_ones_are_nan) {
    const kp_mla_case mc = read_case("mla(batch=3,h_q=64,profile=uniform,s_kv=700,s_q=2,seed=6,topk=256,topk_length=on)", NULL);
    gen g = make(&mc, 0, 3);
    int64_t nref, cut = 0;
    expect_cache(&mc, &g, &nref);
    for (int64_t row = 0; row < 6; row++) {
        const int32_t L = g.b.topk_length[row];
        cr_assert(L >= 0 && L <= 256, "row %lld: topk_length %d", (long long)row, L);
        cut += L < 256;
    }
    cr_assert(cut >= 5, "topk_length cuts rows");
    /* a token referenced only past its row's topk_length is NaN */
    int64_t nan_past = 0;
    for (int64_t r = 0; r < 3; r++) {
        uint8_t *ref = referenced_tokens(&mc, &g, r);
        for (int64_t i = 0; i < 2; i++) {
            const int64_t row = r * 2 + i;
            for (int64_t j = g.b.topk_length[row]; j < 256; j++) {
                const int32_t t = g.b.indices[row * 256 + j];
                if (t < 0 || ref[t]) continue;
                const int64_t slot = kp_mla_cache_slot(&mc, g.b.page_table + r * g.s.pages_per_request, t);
                cr_assert(isnan(bf16(g.b.kv[slot * 576])));
                nan_past++;
            }
        }
        free(ref);
    }
    cr_assert(nan_past > 100, "%lld tokens lie past topk_length only", (long long)nan_past);
    drop(&g);
}

Test(cases_mla, the_fast_e4m3_encoder_is_the_table_quantizer) {
    for (uint32_t b = 0; b < 0x44000000u; b += 331) { /* [0, 512), both signs */
        float x;
        memcpy(&x, &b, 4);
        cr_assert_eq(kp_mla_e4m3_code(x), kp_e4m3_quantize(x), "%a", (double)x);
        cr_assert_eq(kp_mla_e4m3_code(-x), kp_e4m3_quantize(-x), "%a", (double)-x);
    }
    for (int c = 0; c < 0x7e; c++) { /* every midpoint (a tie), and the floats either side */
        const float mid = (kp_e4m3_value((uint8_t)c) + kp_e4m3_value((uint8_t)(c + 1))) / 2;
        const float x[] = {mid, nextafterf(mid, 0), nextafterf(mid, 1000), kp_e4m3_value((uint8_t)c)};
        for (int i = 0; i < 4; i++) {
            cr_assert_eq(kp_mla_e4m3_code(x[i]), kp_e4m3_quantize(x[i]), "code %d: %a", c, (double)x[i]);
            cr_assert_eq(kp_mla_e4m3_code(-x[i]), kp_e4m3_quantize(-x[i]), "code %d: %a", c, (double)-x[i]);
        }
        if (c < 0x7d) cr_assert_eq(kp_mla_e4m3_code(mid), (c + (c & 1)), "a tie goes to the even code");
    }
    const float special[] = {0.0f, -0.0f, 448, 449, 463.9f, 464, 465, 480, 1e30f, INFINITY, -INFINITY, FLT_TRUE_MIN,
                             0x1p-6f, nextafterf(0x1p-6f, 0), 0x1p-10f, 3 * 0x1p-10f, 0x1p-9f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        cr_assert_eq(kp_mla_e4m3_code(special[i]), kp_e4m3_quantize(special[i]), "%a", (double)special[i]);
    cr_assert_eq(kp_mla_e4m3_code(NAN), 0x7f);
}

static int distinct(const int32_t *idx, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t q = 0; q < j; q++)
            if (idx[j] >= 0 && idx[j] == idx[q]) return 0;
    return 1;
}

/* Row `row` of a case: its count of -1 slots, valid ones all in its causal window, and whether the valid ones are a
 * prefix (every -1 after every valid one). */
static int64_t holes_in(const kp_mla_case *mc, const int32_t *idx, int64_t row, int *prefix) {
    const int64_t window = mc->s_kv - mc->s_q + row % mc->s_q + 1;
    int64_t holes = 0;
    *prefix = 1;
    for (int64_t j = 0; j < mc->topk; j++) {
        if (idx[j] < 0) {
            cr_assert_eq(idx[j], -1);
            holes++;
        } else {
            cr_assert(idx[j] < window, "row %lld slot %lld: token %d outside [0, %lld)", (long long)row, (long long)j, idx[j],
                      (long long)window);
            if (holes) *prefix = 0;
        }
    }
    return holes;
}

Test(cases_mla, index_profiles_have_what_they_promise) {
    const char *base = "batch=4,h_q=64,s_kv=1000,s_q=2,seed=2,topk=512,topk_length=on";
    char name[256];
    int prefix;
    /* uniform: topk distinct tokens, none -1, each in its row's causal window */
    snprintf(name, sizeof name, "mla(%s,profile=uniform)", base);
    kp_mla_case mc = read_case(name, NULL);
    gen g = make(&mc, 0, 4);
    int last_token_seen = 0;
    for (int64_t row = 0; row < 8; row++) {
        const int32_t *idx = g.b.indices + row * 512;
        cr_assert_eq(holes_in(&mc, idx, row, &prefix), 0, "row %lld", (long long)row);
        cr_assert(distinct(idx, 512), "row %lld", (long long)row);
        for (int j = 0; j < 512; j++) last_token_seen |= idx[j] == 999; /* only position 1 sees token 999 */
    }
    cr_assert(last_token_seen);
    drop(&g);
    /* uniform with s_kv < topk: as many distinct tokens as the window holds, then -1 */
    kp_mla_case narrow = read_case("mla(batch=2,h_q=64,profile=uniform,s_kv=300,s_q=2,seed=2,topk=512)", NULL);
    g = make(&narrow, 0, 2);
    for (int64_t row = 0; row < 4; row++) {
        cr_assert_eq(holes_in(&narrow, g.b.indices + row * 512, row, &prefix), 512 - (299 + row % 2));
        cr_assert(prefix && distinct(g.b.indices + row * 512, 512));
    }
    drop(&g);
    /* holes: about a quarter -1, anywhere */
    snprintf(name, sizeof name, "mla(%s,profile=holes)", base);
    mc = read_case(name, NULL);
    g = make(&mc, 0, 4);
    int64_t holes = 0;
    for (int64_t row = 0; row < 8; row++) {
        holes += holes_in(&mc, g.b.indices + row * 512, row, &prefix);
        cr_assert(!prefix && distinct(g.b.indices + row * 512, 512));
    }
    cr_assert(holes > 8 * 512 / 5 && holes < 8 * 512 * 3 / 10, "%lld of %d slots -1", (long long)holes, 8 * 512);
    drop(&g);
    /* invalid: every slot -1 */
    snprintf(name, sizeof name, "mla(%s,profile=invalid)", base);
    mc = read_case(name, NULL);
    g = make(&mc, 0, 4);
    for (int64_t row = 0; row < 8; row++) cr_assert_eq(holes_in(&mc, g.b.indices + row * 512, row, &prefix), 512);
    drop(&g);
    /* dup: every row repeats tokens, and none is -1 */
    snprintf(name, sizeof name, "mla(%s,profile=dup)", base);
    mc = read_case(name, NULL);
    g = make(&mc, 0, 4);
    for (int64_t row = 0; row < 8; row++) {
        const int32_t *idx = g.b.indices + row * 512;
        cr_assert_eq(holes_in(&mc, idx, row, &prefix), 0);
        int64_t repeats = 0;
        for (int64_t j = 1; j < 512; j++) {
            int earlier = 0;
            for (int64_t q = 0; q < j; q++) earlier |= idx[q] == idx[j];
            repeats += earlier;
        }
        cr_assert(repeats > 512 / 8 && repeats < 512 / 3, "row %lld: %lld slots repeat an earlier one", (long long)row,
                  (long long)repeats);
    }
    drop(&g);
    /* short: the first n valid and distinct, the rest -1, n < topk, and topk_length = n */
    snprintf(name, sizeof name, "mla(%s,profile=short)", base);
    mc = read_case(name, NULL);
    g = make(&mc, 0, 4);
    int32_t first_n = -1, varies = 0;
    for (int64_t row = 0; row < 8; row++) {
        const int64_t n = 512 - holes_in(&mc, g.b.indices + row * 512, row, &prefix);
        cr_assert(prefix && n >= 1 && n < 512 && distinct(g.b.indices + row * 512, 512), "row %lld: %lld valid", (long long)row,
                  (long long)n);
        cr_assert_eq(g.b.topk_length[row], n);
        if (first_n < 0) first_n = (int32_t)n;
        varies |= n != first_n;
    }
    cr_assert(varies, "short rows have different lengths");
    drop(&g);
    /* mixed: rows cycle uniform, holes, invalid, dup, short */
    mc = read_case("mla(batch=5,h_q=64,profile=mixed,s_kv=1000,s_q=2,seed=2,topk=512)", NULL);
    g = make(&mc, 0, 5);
    for (int64_t row = 0; row < 10; row++) {
        const int32_t *idx = g.b.indices + row * 512;
        const int64_t h = holes_in(&mc, idx, row, &prefix);
        switch (row % 5) {
        case 0: cr_assert(h == 0 && distinct(idx, 512), "row %lld uniform", (long long)row); break;
        case 1: cr_assert(h > 0 && h < 512 && !prefix && distinct(idx, 512), "row %lld holes", (long long)row); break;
        case 2: cr_assert_eq(h, 512, "row %lld invalid", (long long)row); break;
        case 3: cr_assert(h == 0 && !distinct(idx, 512), "row %lld dup", (long long)row); break;
        default: cr_assert(h > 0 && h < 512 && prefix && distinct(idx, 512), "row %lld short", (long long)row); break;
        }
    }
    drop(&g);
}

Test(cases_mla, page_tables_permute_each_requests_own_pages) {
    const kp_mla_case mc = read_case("mla(batch=3,h_q=64,page=16,profile=uniform,s_kv=500,seed=4,topk=64)", NULL);
    gen g = make(&mc, 0, 3);
    const int64_t P = g.s.pages_per_request;
    cr_assert_eq(P, 32, "ceil(500 / 16)");
    for (int64_t r = 0; r < 3; r++) {
        int seen[32] = {0}, moved = 0;
        for (int64_t p = 0; p < P; p++) {
            const int32_t phys = g.b.page_table[r * P + p];
            cr_assert(phys >= r * P && phys < (r + 1) * P, "request %lld page %lld -> %d", (long long)r, (long long)p, phys);
            cr_assert(!seen[phys - r * P]++, "physical page %d twice", phys);
            moved += phys != r * P + p;
        }
        cr_assert(moved > P / 2, "request %lld: the pages are shuffled", (long long)r);
    }
    cr_assert_eq(kp_mla_cache_slot(&mc, g.b.page_table, -1), -1);
    cr_assert_eq(kp_mla_cache_slot(&mc, g.b.page_table + P, 37), (int64_t)g.b.page_table[P + 2] * 16 + 5);
    drop(&g);
}

Test(cases_mla, values_have_realistic_magnitudes) {
    const kp_mla_case mc = read_case("mla(batch=2,h_q=64,profile=uniform,s_kv=600,seed=8,sink=on,topk=512)", NULL);
    gen g = make(&mc, 0, 2);
    double sum2 = 0;
    const int64_t nq = 2 * 64 * 576;
    for (int64_t e = 0; e < nq; e++) {
        const float v = bf16(g.b.q[e]);
        cr_assert(fabsf(v) < 1.75f, "q[%lld] = %g", (long long)e, (double)v);
        sum2 += (double)v * v;
    }
    cr_assert(fabs(sqrt(sum2 / (double)nq) - 0.5) < 0.02, "q's rms %g", sqrt(sum2 / (double)nq));
    /* tiles differ in amax: the mean scale of tile k follows its gain (1, 0.25, 0.5, 0.75) */
    double mean[4] = {0};
    int64_t n = 0;
    for (int64_t s = 0; s < g.s.pages * mc.page; s++) {
        const uint8_t *token = (const uint8_t *)g.b.cache + s * 656;
        if (token[0] == 0x7f && token[1] == 0x7f) continue; /* unreferenced */
        float scale[4];
        memcpy(scale, token + 512, sizeof scale);
        for (int k = 0; k < 4; k++) mean[k] += scale[k];
        n++;
    }
    cr_assert(n > 400);
    for (int k = 0; k < 4; k++) mean[k] /= (double)n;
    cr_assert(mean[0] > 1.2 * mean[3] && mean[3] > 1.3 * mean[2] && mean[2] > 1.6 * mean[1], "mean scales %g %g %g %g",
              mean[0], mean[1], mean[2], mean[3]);
    cr_assert(mean[0] > 1.5 / 448 && mean[0] < 2.2 / 448, "tile 0's amax about 1.8: %g", mean[0] * 448);
    /* no value's sd above 1 (FlashMLA's N(0, 1) test data, which its tolerances were set on): per channel over tokens */
    double worst_sd = 0;
    for (int c = 0; c < 576; c++) {
        double s2 = 0;
        int64_t m = 0;
        for (int64_t t = 0; t < g.s.pages * mc.page; t++) {
            const float v = bf16(g.b.kv[t * 576 + c]);
            if (isnan(v)) continue;
            s2 += (double)v * v, m++;
        }
        const double sd = sqrt(s2 / (double)m);
        if (sd > worst_sd) worst_sd = sd;
    }
    cr_assert(worst_sd < 0.9 && worst_sd > 0.6, "the largest channel sd %g", worst_sd);
    for (int h = 0; h < 64; h++) cr_assert(g.sink[h] > 1 && g.sink[h] < 15, "sink %d = %g", h, (double)g.sink[h]);
    const kp_mla_case inf = read_case("mla(batch=1,profile=uniform,seed=8,sink=inf)", NULL);
    const kp_mla_case off = read_case("mla(batch=1,profile=uniform,seed=8)", NULL);
    float sink[128];
    kp_error err = {0};
    int pos = 0, neg = 0, finite = 0;
    cr_assert_eq(kp_mla_case_sink(&inf, sink, &err), 0);
    for (int h = 0; h < 128; h++) pos += sink[h] == INFINITY, neg += sink[h] == -INFINITY, finite += isfinite(sink[h]);
    cr_assert(pos > 16 && neg > 16 && finite > 32, "sink=inf: %d +inf, %d -inf, %d finite", pos, neg, finite);
    cr_assert_eq(kp_mla_case_sink(&off, sink, &err), 0);
    for (int h = 0; h < 128; h++) cr_assert_eq(sink[h], 0.0f);
    drop(&g);
}

/* The same case name gives the same bytes on any machine (DESIGN.md "Inputs are bit-reproducible"): every tensor of
 * one case, pinned, and the other two caches of the same values. */
Test(cases_mla, digests_are_pinned) {
    const kp_mla_case mc = read_case("mla(batch=2,h_q=64,page=61,profile=mixed,s_kv=300,s_q=2,seed=11,sink=inf,topk=128,"
                                     "topk_length=on)", NULL);
    const kp_mla_case pow2 = read_case("mla(batch=2,h_q=64,page=61,profile=mixed,s_kv=300,s_q=2,scale=pow2,seed=11,sink=inf,"
                                       "topk=128,topk_length=on)", NULL);
    const kp_mla_case b16 = read_case("mla(batch=2,cache=bf16,h_q=64,page=61,profile=mixed,s_kv=300,s_q=2,seed=11,sink=inf,"
                                      "topk=128,topk_length=on)", NULL);
    gen g = make(&mc, 0, 2), gp = make(&pow2, 0, 2), gb = make(&b16, 0, 2);
    cr_assert_eq(g.s.pages, 10);
    cr_assert(!memcmp(gb.b.cache, g.b.kv, g.s.kv_bytes), "the bf16 cache is kv: the last two digests agree");
    char hex[KP_SHA256_HEX_LEN];
    const struct {
        kp_dtype dt;
        int ndim;
        int64_t shape[3];
        const void *data;
        const char *want;
    } t[] = {
        {KP_BF16, 3, {4, 64, 576}, g.b.q, "56f21be9f6c8f899cc7e58e6340a4c3bd29ffcfd7d46feb509065a47155712fd"},
        {KP_I32, 2, {4, 128}, g.b.indices, "0e78992d9b960430168da394c3fc2a766b44dd0f2dcd8b2f81a284117d5a8d1c"},
        {KP_I32, 1, {4}, g.b.topk_length, "af8b04ceb45361856ce994f070f0b2e98e9c872585b0baf5c568ee5dc8ab9cbe"},
        {KP_I32, 2, {2, 5}, g.b.page_table, "3b34323588f23135a5e7c31fd5265cd454048afd63c628e0173d0da9a0c22ec4"},
        {KP_U8, 3, {10, 61, 656}, g.b.cache, "ce03c46130d0314077fda7544161c783637766432d77e186171f33809c164d1d"},
        {KP_BF16, 3, {10, 61, 576}, g.b.kv, "ee998558fb2ceda14ccf43bc8fb795150b448e79edc9d034976e063684b599be"},
        {KP_F32, 1, {64}, g.sink, "095499a09edb5bf2f5e5960e867507c992037b50a16a9299ed9d4366635da4d4"},
        {KP_U8, 3, {10, 61, 656}, gp.b.cache, "93c26ef8dd6efe005c2d05067003d08c4c2863cc76479c1076a45cc61c77ad01"},
        {KP_BF16, 3, {10, 61, 576}, gb.b.cache, "ee998558fb2ceda14ccf43bc8fb795150b448e79edc9d034976e063684b599be"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        kp_buffer_digest(t[i].dt, t[i].ndim, t[i].shape, 0, t[i].data, hex);
        cr_expect_str_eq(hex, t[i].want, "tensor %zu: %s", i, hex);
    }
    drop(&g), drop(&gp), drop(&gb);
}

/* topk_length=request: one length a request (FlashMLA's decode interface), its first row's, on each of its s_q rows;
 * the indices and every other tensor are topk_length=on's, whose lengths differ within a request. A request is the
 * same whatever the batch it is made in, and the name round-trips. */
Test(cases_mla, topk_length_request_gives_each_request_one_length) {
    char canonical[KP_CASE_NAME_MAX];
    const char *name = "mla(batch=4,h_q=64,profile=mixed,s_kv=1024,s_q=2,scale=pow2,seed=9,topk=640,topk_length=request)";
    const kp_mla_case req = read_case("mla(topk_length=request,seed=09,profile=mixed,batch=4,s_q=2,h_q=64,topk=640,s_kv=1024,"
                                      "scale=pow2)", canonical);
    cr_assert_str_eq(canonical, name);
    cr_assert_eq(req.topk_length, KP_MLA_TOPK_LENGTH_REQUEST);
    const kp_mla_case on = read_case("mla(batch=4,h_q=64,profile=mixed,s_kv=1024,s_q=2,scale=pow2,seed=9,topk=640,topk_length=on)",
                                     canonical);
    cr_assert_eq(on.topk_length, KP_MLA_TOPK_LENGTH_ROW);
    gen a = make(&req, 0, 4), b = make(&on, 0, 4), part = make(&req, 1, 2);
    int differ_within = 0;
    for (int64_t r = 0; r < 4; r++) {
        for (int64_t i = 0; i < 2; i++) {
            cr_assert_eq(a.b.topk_length[2 * r + i], b.b.topk_length[2 * r], "request %lld row %lld: its first row's length",
                         (long long)r, (long long)i);
            if (r >= 1 && r < 3) cr_assert_eq(part.b.topk_length[2 * (r - 1) + i], a.b.topk_length[2 * r + i]);
        }
        differ_within |= b.b.topk_length[2 * r] != b.b.topk_length[2 * r + 1];
    }
    cr_assert(differ_within, "with on, some request's rows have lengths of their own (else this test shows nothing)");
    cr_assert_eq(memcmp(a.b.indices, b.b.indices, a.s.indices_bytes), 0, "the indices are on's");
    cr_assert_eq(memcmp(a.b.q, b.b.q, a.s.q_bytes), 0);
    drop(&a), drop(&b), drop(&part);
}
