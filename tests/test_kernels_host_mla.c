/* test_kernels_host_mla.c: the sparse MLA host ports (kernels/host/mla.c) through kp_mla_args: both within
 * FlashMLA's decode tolerances of the float64 reference on caches their bf16 scale rounding keeps exact, empty
 * rows out 0 and lse +inf, and the split plans' batch dependence: split_count's bits for a request change
 * between alone and in a batch of 64 (and its splits say why), split_size's never do. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_sha256.h"
#include "../cases/mla_case.h"
#include "../kernels/kp_registry.h"
#include "../kernels/mla_plan.h"
#include "../reference/mla_ref.h"

TestSuite(kernels_host_mla, .timeout = 240);

typedef struct gen {
    kp_mla_case mc;
    kp_mla_sizes s;
    kp_mla_buffers b;
    int32_t *slots; /* indices as cache slots, the form impls take */
    float sink[128];
} gen;

static gen make(const char *name) {
    gen g;
    memset(&g, 0, sizeof g);
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_mla_case_read(&c, &g.mc, &err), 0,
                 "%s: %s", name, err.msg);
    kp_mla_case_sizes(&g.mc, g.mc.batch, &g.s);
    g.b.q = malloc(g.s.q_bytes), g.b.indices = malloc(g.s.indices_bytes), g.b.page_table = malloc(g.s.page_table_bytes);
    g.b.topk_length = g.mc.topk_length ? malloc(g.s.topk_length_bytes) : NULL;
    g.b.cache = malloc(g.s.cache_bytes), g.b.kv = malloc(g.s.kv_bytes);
    g.slots = malloc(g.s.indices_bytes);
    cr_assert_eq(kp_mla_case_requests(&g.mc, 0, g.mc.batch, &g.b, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_mla_case_sink(&g.mc, g.sink, &err), 0, "%s", err.msg);
    for (int64_t r = 0; r < g.s.rows; r++)
        for (int64_t j = 0; j < g.mc.topk; j++)
            g.slots[r * g.mc.topk + j] = (int32_t)kp_mla_cache_slot(&g.mc, g.b.page_table + (r / g.mc.s_q) * g.s.pages_per_request,
                                                                   g.b.indices[r * g.mc.topk + j]);
    return g;
}

static void drop(gen *g) {
    free(g->b.q), free(g->b.indices), free(g->b.topk_length), free(g->b.page_table), free(g->b.cache), free(g->b.kv);
    free(g->slots);
}

typedef struct run_out {
    uint16_t *out;
    float *lse, *max;
    int32_t *splits;
} run_out;

/* Requests [first, first + n) of g through impl. */
static run_out run(const kp_impl *impl, const gen *g, int64_t first, int64_t n) {
    const int64_t rows = n * g->mc.s_q, heads = rows * g->mc.h_q, r0 = first * g->mc.s_q;
    run_out o = {malloc(sizeof(uint16_t) * (size_t)(heads * KP_MLA_D_V)), malloc(sizeof(float) * (size_t)heads),
                 malloc(sizeof(float) * (size_t)heads), malloc(sizeof(int32_t) * (size_t)n)};
    kp_mla_args a = {.q = g->b.q + r0 * g->mc.h_q * KP_MLA_D_QK, .cache = g->b.cache, .indices = g->slots + r0 * g->mc.topk,
                     .topk_length = g->b.topk_length ? g->b.topk_length + r0 : NULL,
                     .attn_sink = g->mc.sink ? g->sink : NULL, .out = o.out, .lse = o.lse, .max_logits = o.max,
                     .splits = o.splits, .batch = n, .s_q = g->mc.s_q, .h_q = g->mc.h_q, .topk = g->mc.topk,
                     .slots = g->s.pages * g->mc.page,
                     .cache_format = g->mc.cache == KP_MLA_BF16 ? KP_MLA_CACHE_BF16 : KP_MLA_CACHE_FP8_DS_MLA,
                     .sm_scale = (float)g->mc.sm_scale};
    a.workspace_bytes = impl->workspace_bytes(&a);
    a.workspace = malloc(a.workspace_bytes);
    char msg[256] = "";
    cr_assert_eq(impl->run(&a, msg, sizeof msg), KP_RUN_OK, "%s: %s", impl->name, msg);
    free(a.workspace);
    return o;
}
static void run_free(run_out *o) { free(o->out), free(o->lse), free(o->max), free(o->splits); }

static float bf16f(uint16_t h) {
    const uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* The gates' element rule for lse and max_logits (ci/gates/sparse-mla*.json: atol 1e-6, rtol 8.01/65536, "both": an
 * element fails only past both bounds, against the reference rounded to f32, as harness/tolerance.c applies it);
 * non-finite values must be the same value. */
#define GATE_LSE_ATOL 1e-6
#define GATE_LSE_RTOL 0.0001222229
static bool within_gate(float x, double ref) {
    const double y = (float)ref, d = fabs((double)x - y), rel = GATE_LSE_RTOL * fabs(y);
    if (!isfinite(x) || !isfinite(y)) return x == y;
    return d <= (rel > GATE_LSE_ATOL ? rel : GATE_LSE_ATOL);
}

/* Both impls against the reference, on a pow2-scaled fp8 cache and a bf16 one (where rounding the scales to bf16 is
 * exact): lse and max_logits within the gates' bounds (abs 1e-6, rel 8.01/65536, failing past both, against the
 * reference rounded to f32; 1294f26 computed max_logits' reference and never compared it) on every head, out's cosine
 * difference within its 5e-6, and no out element past both abs 1e-3 and rel 2.01/128 (FlashMLA's rule: an element fails when it
 * exceeds both). The cases keep every value's sd at or below 1 as FlashMLA's tests do (mla/v2): on mla/v1's x2 tile
 * the bf16 P put 0.1-0.4% of near-zero elements past both bounds. */
Test(kernels_host_mla, both_within_flashmla_tolerances_of_the_reference) {
    const char *names[] = {"mla(batch=3,cache=bf16,h_q=64,profile=mixed,s_kv=700,s_q=2,seed=5,topk=256)",
                           "mla(batch=2,h_q=64,profile=holes,s_kv=600,scale=pow2,seed=6,topk=128,topk_length=on)"};
    const kp_impl *impls[] = {&kp_mla_split_count_host, &kp_mla_split_size_host};
    for (size_t c = 0; c < 2; c++) {
        gen g = make(names[c]);
        const int64_t heads = g.s.rows * g.mc.h_q;
        double *ro = malloc(sizeof(double) * (size_t)(heads * KP_MLA_D_V)), *rl = malloc(sizeof(double) * (size_t)heads),
               *rm = malloc(sizeof(double) * (size_t)heads);
        const kp_mla_ref_in in = {.mc = &g.mc, .first = 0, .rows = g.s.rows, .q = g.b.q, .indices = g.b.indices,
                                  .topk_length = g.b.topk_length, .page_table = g.b.page_table, .cache = g.b.cache,
                                  .kv = g.b.kv, .sink = g.sink};
        const kp_mla_ref_out out = {.cache = {ro, rl, rm}};
        kp_error err = {0};
        cr_assert_eq(kp_mla_reference(&in, &out, &err), 0, "%s", err.msg);
        int64_t empty = 0;
        int controlled = 0;
        for (size_t i = 0; i < 2; i++) {
            run_out o = run(impls[i], &g, 0, g.mc.batch);
            double sxx = 0, srr = 0, sxr = 0, worst = 0;
            int64_t n_el = 0, over_sum = 0, over_both = 0;
            for (int64_t h = 0; h < heads; h++) {
                if (isinf(rl[h])) { /* an empty row: out 0, lse +inf */
                    empty += i == 0;
                    cr_assert(isinf(o.lse[h]) && o.lse[h] > 0, "%s head %lld: lse %g", impls[i]->name, (long long)h, o.lse[h]);
                    cr_assert(within_gate(o.max[h], rm[h]), "%s head %lld: empty row's max_logits %g, reference %g",
                              impls[i]->name, (long long)h, o.max[h], rm[h]);
                    for (int v = 0; v < KP_MLA_D_V; v++) cr_assert_eq(bf16f(o.out[h * KP_MLA_D_V + v]), 0.0f);
                    continue;
                }
                cr_assert(within_gate(o.lse[h], rl[h]), "%s %s head %lld: lse %.9g, reference %.9g", impls[i]->name,
                          names[c], (long long)h, o.lse[h], rl[h]);
                cr_assert(within_gate(o.max[h], rm[h]), "%s %s head %lld: max_logits %.9g, reference %.9g",
                          impls[i]->name, names[c], (long long)h, o.max[h], rm[h]);
                if (!controlled) { /* positive control: the same check on a max_logits moved just past its bound */
                    const double bound = fmax(GATE_LSE_ATOL, GATE_LSE_RTOL * fabs((float)rm[h]));
                    cr_assert(!within_gate((float)((float)rm[h] + 1.5 * bound), rm[h]) &&
                                  !within_gate((float)((float)rm[h] - 1.5 * bound), rm[h]),
                              "a max_logits 1.5 bounds off passed");
                    cr_assert(within_gate((float)rm[h], rm[h]), "the rounded reference itself failed");
                    controlled = 1;
                }
                for (int v = 0; v < KP_MLA_D_V; v++) {
                    const double x = bf16f(o.out[h * KP_MLA_D_V + v]), r = ro[h * KP_MLA_D_V + v], d = fabs(x - r);
                    sxx += x * x, srr += r * r, sxr += x * r, n_el++;
                    over_sum += d > 1e-3 + 2.01 / 128 * fabs(r);
                    over_both += d > 1e-3 && d > 2.01 / 128 * fabs(r);
                    if (d > worst) worst = d;
                }
            }
            const double cos_diff = 1.0 - 2.0 * sxr / (sxx + srr);
            fprintf(stderr, "%s %s: cosine diff %.3g, worst abs %.3g, %lld/%lld over abs+rel, %lld over both\n", impls[i]->name,
                    names[c], cos_diff, worst, (long long)over_sum, (long long)n_el, (long long)over_both);
            cr_assert_leq(cos_diff, 5e-6, "%s %s: cosine diff %g", impls[i]->name, names[c], cos_diff);
            cr_assert_eq(over_both, 0, "%s %s: %lld out elements past both bounds", impls[i]->name, names[c],
                         (long long)over_both);
            run_free(&o);
        }
        if (c == 0) cr_assert_gt(empty, 0, "the mixed profile must have empty rows");
        free(ro), free(rl), free(rm);
        drop(&g);
    }
}

/* A request alone and first in a batch of 64: split_count cuts it into other splits (8 against 2 on its H200
 * model) and its bits change; split_size keeps its splits and its bits. */
Test(kernels_host_mla, split_count_depends_on_the_batch_and_split_size_does_not) {
    gen g = make("mla(batch=64,h_q=64,profile=uniform,s_kv=1024,scale=pow2,seed=7,topk=512)");
    const int64_t per = g.mc.s_q * g.mc.h_q * KP_MLA_D_V;
    run_out ca = run(&kp_mla_split_count_host, &g, 0, 1), cb = run(&kp_mla_split_count_host, &g, 0, 64);
    cr_assert_eq(ca.splits[0], 8);
    cr_assert_eq(cb.splits[0], 2);
    cr_assert(memcmp(ca.out, cb.out, sizeof(uint16_t) * (size_t)per) || memcmp(ca.lse, cb.lse, sizeof(float) * (size_t)g.mc.h_q),
              "split_count gave request 0 the same bits with 8 and 2 splits: the control is vacuous");
    run_out sa = run(&kp_mla_split_size_host, &g, 0, 1), sb = run(&kp_mla_split_size_host, &g, 0, 64);
    cr_assert(sa.splits[0] == sb.splits[0] && sa.splits[0] == kp_mla_split_size_splits(512 / 64));
    cr_assert(!memcmp(sa.out, sb.out, sizeof(uint16_t) * (size_t)per) && !memcmp(sa.lse, sb.lse, sizeof(float) * (size_t)g.mc.h_q) &&
              !memcmp(sa.max, sb.max, sizeof(float) * (size_t)g.mc.h_q));
    run_free(&ca), run_free(&cb), run_free(&sa), run_free(&sb);
    drop(&g);
}

Test(kernels_host_mla, bad_args_are_refused) {
    gen g = make("mla(batch=1,h_q=64,profile=uniform,s_kv=200,seed=8,topk=64)");
    kp_mla_args a = {.q = g.b.q, .cache = g.b.cache, .indices = g.slots, .batch = 1, .s_q = 1, .h_q = 64, .topk = 64,
                     .slots = g.s.pages * g.mc.page, .cache_format = KP_MLA_CACHE_FP8_DS_MLA, .sm_scale = 0.1f};
    char msg[256];
    kp_mla_args bad = a;
    bad.h_q = 48;
    cr_assert_eq(kp_mla_split_count_host.supports(&bad, msg, sizeof msg), KP_RUN_NOT_SUPPORTED);
    cr_assert(strstr(msg, "h_q"), "%s", msg);
    bad = a, bad.topk = 100;
    cr_assert_eq(kp_mla_split_size_host.supports(&bad, msg, sizeof msg), KP_RUN_NOT_SUPPORTED);
    bad = a, bad.cache_format = 7;
    cr_assert_eq(kp_mla_split_size_host.supports(&bad, msg, sizeof msg), KP_RUN_NOT_SUPPORTED);
    g.slots[5] = (int32_t)a.slots; /* out of the cache: refused before anything is read */
    uint16_t out[64 * 512];
    float lse[64], mx[64];
    int32_t splits[1];
    a.out = out, a.lse = lse, a.max_logits = mx, a.splits = splits;
    a.workspace_bytes = kp_mla_split_count_host.workspace_bytes(&a);
    a.workspace = malloc(a.workspace_bytes);
    cr_assert_eq(kp_mla_split_count_host.run(&a, msg, sizeof msg), KP_RUN_NOT_SUPPORTED);
    cr_assert(strstr(msg, "indices[5]"), "%s", msg);
    free(a.workspace);
    drop(&g);
}

/* The bits of both ports' outputs, pinned: SHA-256 of out (bf16), lse, max_logits (f32) and splits (int32),
 * little-endian, per case and impl (each case's whole batch, then request 0 alone), computed with the scalar ports
 * of 340885f. A host port may be rewritten for speed only if every product and sum keeps its order (and its two
 * roundings: no contraction to FMA), so these must never move. The cases: the host gate's fp8 caches with raw
 * f32 and power-of-two scales, a bf16 cache, holes, duplicates, short and invalid rows, topk_length, s_q 2 and
 * both sinks (on, +inf); split_count alone (many splits) and in a batch of 20 (fewer). */
Test(kernels_host_mla, every_ports_output_has_its_pinned_digest) {
    static const struct {
        const char *name;
        const char *hex[4]; /* split_count batch, split_count alone, split_size batch, split_size alone */
    } pins[] = {
        {"mla(batch=20,h_q=64,profile=uniform,s_kv=1024,scale=pow2,seed=1,topk=640)",
         {"47f7d153c6bec095ca17128dfd2996d5d93950fe76dae748d5881e8eca92810d",
          "3d43794771cfe43c3d7ff6132cef5c9e82e6342151629b391b488f21b3f988dc",
          "d86ea69277164a2b2a6f4ca510ea40105571205c358699a181d1508f2decb202",
          "0dae23b90aa7fd15cbe01ba9fc05e2e2afe8711e9ebfbf0bd5ac089ab1251afb"}},
        {"mla(batch=3,h_q=128,profile=holes,s_kv=1024,seed=2,topk=640)",
         {"e7005ed0ab2eba8b72458f25a446311b8c33248087473680ea49c709edfecc34",
          "7e8f5f077e168401cb29e8442466ad583c47831c433b0bc2ab1006fac19362b1",
          "4cd6132731bb1717436ac3d1180ca1bfb6d8055d4169b892f0743ffcca3001ef",
          "a66e354e91795512719e0d77bc1dd8acb5fdb5f7474327f91d9a25d216724648"}},
        {"mla(batch=5,cache=bf16,h_q=64,profile=mixed,s_kv=2048,s_q=2,seed=3,sink=inf,topk=1088,topk_length=on)",
         {"c7d79a6323d42a40d1ca074198c1077c9128e66500dc206369a18c00ced70174",
          "728b84f17f2ffff83cf812ce04a329561d10c1713adb0c7d1c0a8f2706be2a8f",
          "28439467eb3220f6f2b47e2468ac574b6e2f91c37aed2533da2639517ca01cb1",
          "20fde27d557e0069fd0c819fe6f522edf14906607f3c077a88e29cc1ad65b6d5"}},
        {"mla(batch=2,h_q=128,profile=dup,s_kv=2048,s_q=2,scale=pow2,seed=4,sink=on,topk=1088)",
         {"a77f0ad1b973f90e9ae824ab2220ed3b6d6fd1fdbf32e7fa0084580b16eeb3f7",
          "5866d580601ae389b4150b5b84b063a04fcf48305165283b5a1378a31e102ca9",
          "fbca3db150cb95945954c9981f948c2e9f6eb3a157c60fed968eb884961ebda5",
          "6b2ed498bd344f4a0b1afbdfb71539943fefc627e0423ab767cc3fa9ca3d2235"}},
        {"mla(batch=4,h_q=64,profile=short,s_kv=1024,scale=pow2,seed=5,topk=640,topk_length=on)",
         {"d18e3b74809df2bd87327bc2d9c09fd538a9bdb52bbc0e4cb1131b01184f8d1a",
          "da4a8b814bcde3dbee7c974d33298d421ee2a8bd34cb77bda4a0d156f1a7929c",
          "907e4e81b7fa12948f22fb48a1986bc599afca646a6b8c3bad3a5550c1846605",
          "da4a8b814bcde3dbee7c974d33298d421ee2a8bd34cb77bda4a0d156f1a7929c"}},
        {"mla(batch=1,h_q=64,profile=invalid,s_kv=1024,scale=pow2,seed=6,topk=640)",
         {"04755745b7269bbf747185cf42d5d87b54bfa63754a0293f10cb52970a20f5f2",
          "04755745b7269bbf747185cf42d5d87b54bfa63754a0293f10cb52970a20f5f2",
          "49d46101fa0190b00a5a32e26da06909ba33e5844c610e2a9ecfa10b85aa5e56",
          "49d46101fa0190b00a5a32e26da06909ba33e5844c610e2a9ecfa10b85aa5e56"}},
    };
    const kp_impl *impls[] = {&kp_mla_split_count_host, &kp_mla_split_size_host};
    int wrong = 0;
    for (size_t c = 0; c < sizeof pins / sizeof *pins; c++) {
        gen g = make(pins[c].name);
        for (int k = 0; k < 4; k++) {
            const int64_t n = k % 2 ? 1 : g.mc.batch, heads = n * g.mc.s_q * g.mc.h_q;
            run_out o = run(impls[k / 2], &g, 0, n);
            kp_sha256 h;
            kp_error err = {0};
            char hex[KP_SHA256_HEX_LEN];
            cr_assert_eq(kp_sha256_init(&h, &err), 0, "%s", err.msg);
            kp_sha256_update(&h, o.out, sizeof(uint16_t) * (size_t)(heads * KP_MLA_D_V));
            kp_sha256_update(&h, o.lse, sizeof(float) * (size_t)heads);
            kp_sha256_update(&h, o.max, sizeof(float) * (size_t)heads);
            kp_sha256_update(&h, o.splits, sizeof(int32_t) * (size_t)n);
            kp_sha256_final_hex(&h, hex);
            if (strcmp(hex, pins[c].hex[k])) {
                fprintf(stderr, "%s on %s (%lld requests): output digest %s, pinned %s\n", impls[k / 2]->name, pins[c].name,
                        (long long)n, hex, pins[c].hex[k]);
                wrong++;
            }
            run_free(&o);
        }
        drop(&g);
    }
    cr_assert_eq(wrong, 0, "%d outputs are not the pinned bits (each named above)", wrong);
}

/* The same with planted fp8 codes the generator never makes (NaN 0x7f and 0xff, -0 0x80, 0, the smallest subnormal
 * 0x01, -448 0xfe) in one token of every 61, NaN in five tokens only: NaN scores through the softmax, pinned with the
 * scalar ports of 340885f as above. */
Test(kernels_host_mla, outputs_with_planted_fp8_codes_have_their_pinned_digest) {
    static const char *const name = "mla(batch=6,h_q=64,profile=uniform,s_kv=1024,seed=9,topk=640)";
    static const char *const pinned[4] = {"9801c056fd574b917547a56246b3c03913ac4a4bb6d36d8a67b538fdd1001a7b",
                                               "1ac688a1edacf5eccf9f38c9bcddceb82ae414b25018fd174d34575075f8caba",
                                               "d57188e6dcc52d5136b7f42f69ddf16877c235b00b92a58b17d4505c6579491c",
                                               "af1810d3f63e63e0f46c1ffe06baea05d9b81229e348903d59937088d72811c2"};
    static const uint8_t planted[6] = {0x7f, 0xff, 0x80, 0x00, 0x01, 0xfe};
    const kp_impl *impls[] = {&kp_mla_split_count_host, &kp_mla_split_size_host};
    gen g = make(name);
    const int64_t tokens = (int64_t)(g.s.cache_bytes / KP_MLA_FP8_TOKEN_BYTES);
    uint8_t *cache = g.b.cache;
    for (int64_t t = 0; t < tokens; t += 61) cache[t * KP_MLA_FP8_TOKEN_BYTES + (t * 5) % 512] = planted[2 + (t / 61) % 4];
    cache[3 * KP_MLA_FP8_TOKEN_BYTES + 100] = planted[0]; /* NaN in 5 tokens of 2 requests: the rest stay finite */
    for (int64_t t = 2000; t < 2004; t++) cache[t * KP_MLA_FP8_TOKEN_BYTES + 7] = planted[1];
    int wrong = 0;
    for (int k = 0; k < 4; k++) {
        const int64_t n = k % 2 ? 1 : g.mc.batch, heads = n * g.mc.s_q * g.mc.h_q;
        run_out o = run(impls[k / 2], &g, 0, n);
        int64_t nan = 0;
        for (int64_t h = 0; h < heads; h++) nan += isnan(o.lse[h]);
        cr_assert(n == 1 || (nan > 0 && nan < heads), "%s: %lld NaN lse of %lld: the planted NaN codes must reach some, not all",
                  impls[k / 2]->name, (long long)nan, (long long)heads);
        kp_sha256 h;
        kp_error err = {0};
        char hex[KP_SHA256_HEX_LEN];
        cr_assert_eq(kp_sha256_init(&h, &err), 0, "%s", err.msg);
        kp_sha256_update(&h, o.out, sizeof(uint16_t) * (size_t)(heads * KP_MLA_D_V));
        kp_sha256_update(&h, o.lse, sizeof(float) * (size_t)heads);
        kp_sha256_update(&h, o.max, sizeof(float) * (size_t)heads);
        kp_sha256_update(&h, o.splits, sizeof(int32_t) * (size_t)n);
        kp_sha256_final_hex(&h, hex);
        if (strcmp(hex, pinned[k])) {
            fprintf(stderr, "%s on %s (%lld requests), planted codes: output digest %s, pinned %s\n", impls[k / 2]->name,
                    name, (long long)n, hex, pinned[k]);
            wrong++;
        }
        run_free(&o);
    }
    drop(&g);
    cr_assert_eq(wrong, 0, "%d outputs are not the pinned bits (each named above)", wrong);
}
