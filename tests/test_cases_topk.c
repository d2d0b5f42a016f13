/* test_cases_topk.c: topk case names and generation: pinned input digests, a row the same in any
 * batch and with any thread count, each window convention and profile doing what its comment says,
 * and bad fields refused naming the field. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_tensor.h"
#include "../cases/topk_case.h"
#include "kp_test_util.h"

typedef struct gen {
    kp_topk_case tc;
    float *x;
    int32_t *s, *e;
} gen;

static gen make(const char *name, int64_t rows) {
    gen g;
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_topk_case_read(&c, &g.tc, &err), 0,
                 "%s", err.msg);
    if (rows <= 0) rows = g.tc.rows;
    g.x = malloc(sizeof *g.x * (size_t)(rows * g.tc.stride));
    g.s = malloc(sizeof *g.s * (size_t)rows), g.e = malloc(sizeof *g.e * (size_t)rows);
    cr_assert_eq(kp_topk_case_rows(&g.tc, 0, rows, g.x, g.s, g.e, &err), 0, "%s", err.msg);
    return g;
}
static void drop(gen *g) { free(g->x), free(g->s), free(g->e); }

/* Pinned: computed once with cuRAND 10.4 (CUDA 13.0) on x86-64 glibc 2.36. A change here means a case
 * name no longer means the same bytes: every stored receipt would stop replaying. */
Test(cases_topk, pinned_input_digests) {
    struct {
        const char *name, *hex;
    } pins[] = {
        {"topk(k=2048,profile=narrow,rows=3,seed=1,width=16385)", "8b85884de95abe1bb442a9211de3190d4d1d3475a3ecee127e2a0c48fd556e48"},
        {"topk(k=512,profile=bits,rows=4,seed=2,stride=3001,width=3000,window=prefill)",
         "12955eada2d1f91b3d2a9b7b0d0da9393fdf131c1cb3b8265b154a36f542782c"},
        {"topk(ctx=700,k=1024,next_n=3,profile=bf16,rows=5,seed=6,width=3000,window=decode)",
         "ef0012efed75859221ec4756e559b94cafc7c69c28940557fe42c7059f7bfb9a"},
        {"topk(k=512,profile=relu,rows=2,seed=9,width=8000)", "a62f7cbd6b8f6ddbe548b8bd62ee7328ea418e88582b79856d592b4b12911fe8"},
    };
    for (size_t i = 0; i < sizeof pins / sizeof *pins; i++) {
        gen g = make(pins[i].name, 0);
        const int64_t shape[2] = {g.tc.rows, g.tc.width};
        char hex[KP_SHA256_HEX_LEN];
        kp_buffer_digest(KP_F32, 2, shape, g.tc.stride, g.x, hex);
        cr_expect_str_eq(hex, pins[i].hex, "%s", pins[i].name);
        drop(&g);
    }
}

Test(cases_topk, a_row_is_the_same_in_any_batch_and_with_any_thread_count) {
    setenv("KPARITY_THREADS", "1", 1);
    gen one = make("topk(k=64,profile=randn,rows=3,seed=4,width=1000,window=prefill)", 3);
    setenv("KPARITY_THREADS", "7", 1);
    gen many = make("topk(k=64,profile=randn,rows=40,seed=4,width=1000,window=prefill)", 40);
    cr_assert(!memcmp(one.x, many.x, sizeof *one.x * 3 * 1000), "the first rows of a larger batch");
    cr_assert(!memcmp(one.s, many.s, 3 * sizeof *one.s) && !memcmp(one.e, many.e, 3 * sizeof *one.e));
    drop(&one), drop(&many);
}

Test(cases_topk, windows_follow_their_conventions) {
    gen p = make("topk(k=64,profile=randn,rows=20,seed=1,width=1000,window=prefill)", 0);
    for (int r = 0; r < 20; r++) {
        cr_assert(p.s[r] >= 1 && p.s[r] < p.e[r] && p.e[r] <= 1000, "prefill row %d: [%d, %d)", r, p.s[r], p.e[r]);
        for (int c = 0; c < 1000; c++)
            cr_assert(isnan(p.x[r * 1000 + c]) == (c < p.s[r] || c >= p.e[r]), "row %d column %d: outside is the sentinel", r, c);
    }
    drop(&p);
    gen d = make("topk(ctx=700,k=64,next_n=3,profile=randn,rows=6,seed=1,width=1000,window=decode)", 0);
    for (int r = 0; r < 6; r++) cr_assert(d.s[r] == 0 && d.e[r] == 700 - 3 + r % 3 + 1, "decode row %d ends at %d", r, d.e[r]);
    drop(&d);
}

Test(cases_topk, profiles_have_their_shape) {
    gen n = make("topk(k=2048,profile=narrow,rows=2,seed=1,width=20000)", 0);
    for (int i = 0; i < 2 * 20000; i++) cr_assert(n.x[i] >= 1.0f && n.x[i] < 1.245f);
    drop(&n);
    gen r = make("topk(k=2048,profile=relu,rows=2,seed=1,width=20000)", 0);
    for (int row = 0; row < 2; row++) {
        int positive = 0, zero = 0;
        for (int i = 0; i < 20000; i++) {
            const float v = r.x[row * 20000 + i];
            positive += v > 0, zero += v == 0 && !signbit(v);
        }
        cr_assert(positive > 0 && positive < 2048 && positive + zero == 20000, "relu row %d: %d positive", row, positive);
    }
    drop(&r);
    gen b = make("topk(k=64,profile=bf16,rows=1,seed=1,width=5000)", 0);
    int distinct_low = 0;
    for (int i = 0; i < 5000; i++) {
        uint32_t bits;
        memcpy(&bits, &b.x[i], sizeof bits);
        distinct_low |= bits & 0xffffu;
    }
    cr_assert_eq(distinct_low, 0, "bf16 scores have no low mantissa bits");
    drop(&b);
    gen t = make("topk(k=64,profile=bits,rows=1,seed=1,width=8000)", 0);
    int pz = 0, nz = 0, sub = 0, pinf = 0, ninf = 0;
    for (int i = 0; i < 8000; i++) {
        const float v = t.x[i];
        pz += v == 0 && !signbit(v), nz += v == 0 && signbit(v), sub += fpclassify(v) == FP_SUBNORMAL;
        pinf += isinf(v) && v > 0, ninf += isinf(v) && v < 0;
    }
    cr_assert(pz > 500 && nz > 500 && sub > 1000 && pinf > 500 && ninf > 500, "%d %d %d %d %d", pz, nz, sub, pinf, ninf);
    drop(&t);
    gen s = make("topk(k=64,profile=same,rows=1,seed=1,width=100)", 0);
    for (int i = 0; i < 100; i++) cr_assert_eq(s.x[i], 1.0f);
    drop(&s);
    gen q = make("topk(k=64,profile=nan,rows=1,seed=1,width=64000)", 0);
    int nans = 0;
    for (int i = 0; i < 64000; i++) nans += isnan(q.x[i]);
    cr_assert(nans > 500 && nans < 1500, "about 1 in 64 is NaN: %d", nans);
    drop(&q);
}

Test(cases_topk, bad_fields_are_refused_naming_the_field) {
    struct {
        const char *name, *needle;
    } bad[] = {
        {"topk(k=64,profile=randn,rows=1,seed=1)", "'width' is required"},
        {"topk(k=9000,profile=randn,rows=1,seed=1,width=100)", "'k'"},
        {"topk(k=64,profile=gauss,rows=1,seed=1,width=100)", "'profile': 'gauss' is unknown"},
        {"topk(k=64,next_n=2,profile=randn,rows=1,seed=1,width=100)", "'next_n' only applies to window=decode"},
        {"topk(ctx=50,k=64,profile=randn,rows=1,seed=1,width=100,window=prefill)", "'ctx' only applies to window=decode"},
        {"topk(ctx=5,k=64,next_n=6,profile=randn,rows=1,seed=1,width=100,window=decode)", "'next_n'"},
        {"topk(ctx=500,k=64,profile=randn,rows=1,seed=1,width=100,window=decode)", "'ctx'"},
        {"topk(k=64,profile=randn,rows=1,seed=1,width=1,window=prefill)", "width >= 2"},
        {"topk(fill=0,k=64,profile=randn,rows=1,seed=1,width=100)", "'fill': '0' is unknown"},
        {"topk(base=col,k=64,profile=randn,rows=1,seed=1,width=100)", "'base'"},
        {"topk(colour=1,k=64,profile=randn,rows=1,seed=1,width=100)", "'colour' is unknown"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) kpt_case_refused(bad[i].name, bad[i].needle);
    /* and the canonical name drops defaults */
    kp_case c;
    kp_error err = {0};
    char name[KP_CASE_NAME_MAX];
    cr_assert_eq(kp_case_parse("topk(base=row,fill=-1,k=64,profile=randn,rows=1,seed=1,width=100,window=full)", &c, &err) ||
                     kp_case_normalize(&c, &err), 0, "%s", err.msg);
    kp_case_format(&c, name, sizeof name);
    cr_assert_str_eq(name, "topk(k=64,profile=randn,rows=1,seed=1,width=100)");
}
