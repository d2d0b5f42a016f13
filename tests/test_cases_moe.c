/* test_cases_moe.c: moe case names and generation: the model shapes and canonical names, bad fields
 * refused naming the field, a row the same whatever m, activations and routing weights that bf16 cannot
 * hold, each routing profile's expert counts, expert weights quantized to NVFP4 along their K, and the
 * device generator's hook and guard (fakes stand in for the GPU; tests/test_gpu_moe_gen.c has the real one). */
#define _GNU_SOURCE /* setenv, dup */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cases/kp_tensor.h"
#include "../cases/moe_case.h"
#include "kp_test_util.h"
#ifdef KP_HAVE_CUDA
#include "../cases/cuda/moe_gen_hook.h"
#endif

static kp_moe_case read_case(const char *name, char *canonical) {
    kp_case c;
    kp_moe_case mc;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_moe_case_read(&c, &mc, &err), 0, "%s",
                 err.msg);
    if (canonical) kp_case_format(&c, canonical, KP_CASE_NAME_MAX);
    return mc;
}

typedef struct rows {
    float *x, *w;
    int32_t *ids;
} rows;

static rows make_rows(const kp_moe_case *mc, int64_t first, int64_t n) {
    rows g = {malloc(sizeof(float) * (size_t)(n * mc->hidden)), malloc(sizeof(float) * (size_t)(n * mc->topk)),
              malloc(sizeof(int32_t) * (size_t)(n * mc->topk))};
    kp_error err = {0};
    cr_assert_eq(kp_moe_case_rows(mc, first, n, g.x, g.ids, g.w, &err), 0, "%s", err.msg);
    return g;
}
static void drop(rows *g) { free(g->x), free(g->w), free(g->ids); }

static int low16(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return (int)(b & 0xffffu);
}

Test(cases_moe, models_have_their_shapes_and_names_are_canonical) {
    char name[KP_CASE_NAME_MAX];
    kp_moe_case g = read_case("moe(m=800,model=glm53,profile=uniform,scale_dir=divide,seed=1)", name);
    cr_assert(g.hidden == 4096 && g.inter == 2048 && g.experts == 288 && g.topk == 8 && g.gated);
    cr_assert_str_eq(name, "moe(m=800,model=glm53,profile=uniform,seed=1)", "defaults dropped");
    kp_moe_case n = read_case("moe(hidden=256,inter=128,m=2,model=nemotron,profile=hot,scale_dir=multiply,seed=2)", name);
    cr_assert(n.experts == 128 && n.topk == 6 && !n.gated && n.hidden == 256 && n.inter == 128 && n.scale_dir == KP_NVFP4_MULTIPLY);
    cr_assert_eq(kp_moe_w13_rows(&n), 128, "relu^2 is not gated: W13 is the up projection alone");
    cr_assert_eq(kp_moe_w13_rows(&g), 4096, "gated: gate and up");
    struct {
        const char *name, *needle;
    } bad[] = {
        {"moe(m=1,model=glm5,profile=uniform,seed=1)", "'model': 'glm5' is unknown"},
        {"moe(m=2,model=qwen3,profile=single,seed=1)", "profile=single is one row"},
        {"moe(hidden=100,m=2,model=qwen3,profile=uniform,seed=1)", "multiples of 16"},
        {"moe(m=0,model=qwen3,profile=uniform,seed=1)", "'m'"},
        {"moe(m=1,model=qwen3,profile=uniform,scale_dir=up,seed=1)", "'scale_dir': 'up' is unknown"},
        {"moe(m=1,model=qwen3,profile=uniform,seed=1,tokens=3)", "'tokens' is unknown"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) kpt_case_refused(bad[i].name, bad[i].needle);
}

/* experts, topk and act are fields the model presets (issue 30): a preset's own values drop from the canonical name, so
 * today's names stay as they are; any may be overridden; the new presets carry their models' shapes; a top-k above the
 * expert count and an unknown activation are refused naming the field. */
Test(cases_moe, the_shape_is_fields_a_model_presets) {
    char name[KP_CASE_NAME_MAX];
    kp_moe_case g = read_case("moe(act=silu_gated,experts=288,m=4,model=glm53,profile=uniform,seed=1,topk=8)", name);
    cr_assert(g.experts == 288 && g.topk == 8 && g.gated);
    cr_assert_str_eq(name, "moe(m=4,model=glm53,profile=uniform,seed=1)", "the preset's own values dropped");
    kp_moe_case o = read_case("moe(act=relu2,experts=16,hidden=64,inter=32,m=4,model=glm53,profile=uniform,seed=1,topk=4)", name);
    cr_assert(o.experts == 16 && o.topk == 4 && !o.gated && o.hidden == 64 && o.inter == 32);
    cr_assert_str_eq(name, "moe(act=relu2,experts=16,hidden=64,inter=32,m=4,model=glm53,profile=uniform,seed=1,topk=4)");
    cr_assert_eq(kp_moe_w13_rows(&o), 32, "relu2 is not gated");
    const struct {
        const char *model;
        int64_t hidden, inter, experts, topk;
    } presets[] = {{"deepseek_v3", 7168, 2048, 256, 8}, {"kimi_k2", 7168, 2048, 384, 8}, {"qwen3_235b", 4096, 1536, 128, 8}};
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        char case_name[200];
        snprintf(case_name, sizeof case_name, "moe(m=1,model=%s,profile=single,seed=1)", presets[i].model);
        kp_moe_case p = read_case(case_name, name);
        cr_assert(p.hidden == presets[i].hidden && p.inter == presets[i].inter && p.experts == presets[i].experts &&
                  p.topk == presets[i].topk && p.gated, "%s", case_name);
        cr_assert_str_eq(name, case_name);
    }
    struct {
        const char *name, *needle;
    } bad[] = {
        {"moe(experts=4,m=1,model=glm53,profile=uniform,seed=1)", "'topk': 8 experts a token from 4 experts"},
        {"moe(m=1,model=glm53,profile=uniform,seed=1,topk=0)", "'topk'"},
        {"moe(act=gelu,m=1,model=glm53,profile=uniform,seed=1)", "'act': 'gelu' is unknown"},
        {"moe(experts=0,m=1,model=glm53,profile=uniform,seed=1,topk=1)", "'experts'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) kpt_case_refused(bad[i].name, bad[i].needle);
}

Test(cases_moe, rows_are_the_same_whatever_m_and_bf16_cannot_hold_them) {
    kp_moe_case mc = read_case("moe(hidden=64,inter=32,m=40,model=qwen3,profile=uniform,seed=3)", NULL);
    rows all = make_rows(&mc, 0, 40), tail = make_rows(&mc, 30, 10);
    cr_assert(!memcmp(all.x + 30 * 64, tail.x, sizeof(float) * 10 * 64), "activations of rows 30..39");
    cr_assert(!memcmp(all.ids + 30 * 8, tail.ids, sizeof(int32_t) * 10 * 8), "routing of rows 30..39");
    cr_assert(!memcmp(all.w + 30 * 8, tail.w, sizeof(float) * 10 * 8));
    for (int i = 0; i < 40 * 64; i++) cr_assert(low16(all.x[i]) != 0 && fabsf(all.x[i]) < 2.0f, "x[%d]", i);
    for (int r = 0; r < 40; r++) {
        double sum = 0;
        for (int j = 0; j < 8; j++) {
            const float w = all.w[r * 8 + j];
            cr_assert(w > 0 && low16(w) != 0, "row %d weight %d: %a", r, j, (double)w);
            sum += w;
            const int32_t e = all.ids[r * 8 + j];
            cr_assert(e >= 0 && e < 128, "row %d expert %d", r, e);
            for (int q = 0; q < j; q++) cr_assert_neq(all.ids[r * 8 + q], e, "row %d routes to expert %d twice", r, e);
        }
        cr_assert(fabs(sum - 1.0) < 1e-5, "row %d's weights sum to %g", r, sum);
    }
    drop(&all), drop(&tail);
}

static int64_t count_rows_with(const kp_moe_case *mc, const rows *g, int32_t expert) {
    int64_t n = 0;
    for (int64_t r = 0; r < mc->m; r++)
        for (int64_t j = 0; j < mc->topk; j++) n += g->ids[r * mc->topk + j] == expert;
    return n;
}

Test(cases_moe, routing_profiles_give_their_expert_counts) {
    kp_moe_case hot = read_case("moe(hidden=32,inter=32,m=100,model=glm53,profile=hot,seed=4)", NULL);
    rows h = make_rows(&hot, 0, hot.m);
    cr_assert_eq(count_rows_with(&hot, &h, 0), 100, "the hot expert is in every row: > 32 and > 64");
    drop(&h);
    kp_moe_case st = read_case("moe(hidden=32,inter=32,m=50,model=qwen3,profile=straddle,seed=5)", NULL);
    rows s = make_rows(&st, 0, st.m);
    cr_assert_eq(count_rows_with(&st, &s, 0), 31);
    cr_assert_eq(count_rows_with(&st, &s, 1), 32);
    cr_assert_eq(count_rows_with(&st, &s, 2), 33);
    drop(&s);
    kp_moe_case one = read_case("moe(hidden=32,inter=32,m=1,model=glm47,profile=single,seed=6)", NULL);
    rows o = make_rows(&one, 0, 1);
    for (int j = 0; j < 4; j++) cr_assert(o.ids[j] >= 0 && o.ids[j] < 64);
    drop(&o);
}

Test(cases_moe, expert_weights_are_nvfp4_along_k_and_differ_between_experts) {
    kp_moe_case mc = read_case("moe(hidden=64,inter=32,m=1,model=qwen3,profile=single,seed=7)", NULL);
    const int64_t r13 = kp_moe_w13_rows(&mc); /* 64 rows of 64 */
    uint8_t w13[2][64 * 64 / 2], s13[2][64 * 64 / 16], w2[2][64 * 32 / 2], s2[2][64 * 32 / 16];
    float g13[2], g2[2];
    kp_error err = {0};
    for (int e = 0; e < 2; e++)
        cr_assert_eq(kp_moe_case_expert(&mc, e * 100, w13[e], s13[e], &g13[e], w2[e], s2[e], &g2[e], &err), 0, "%s", err.msg);
    cr_assert(memcmp(w13[0], w13[1], sizeof w13[0]), "experts 0 and 100 drew the same weights");
    double *deq = malloc(sizeof *deq * (size_t)(r13 * 64));
    kp_nvfp4_dequantize(w13[0], s13[0], r13, 64, g13[0], KP_NVFP4_DIVIDE, deq);
    double amax = 0;
    for (int64_t i = 0; i < r13 * 64; i++) amax = fmax(amax, fabs(deq[i]));
    cr_assert(amax > 0.2 && amax < 0.2166, "weights drawn in [-sqrt(3 / 64), sqrt(3 / 64)): dequantized amax %g", amax);
    for (int i = 0; i < 64 * 64 / 16; i++) cr_assert_eq(s13[0][i] & 0x80, 0, "scale %d has its sign bit set", i);
    /* the same expert again: the same bytes */
    uint8_t again[64 * 64 / 2], sa[64 * 64 / 16], wa[64 * 32 / 2], sb[64 * 32 / 16];
    float ga, gb;
    cr_assert_eq(kp_moe_case_expert(&mc, 0, again, sa, &ga, wa, sb, &gb, &err), 0);
    cr_assert(!memcmp(again, w13[0], sizeof again) && !memcmp(sa, s13[0], sizeof sa) && ga == g13[0]);
    free(deq);
}

/* The same case name gives the same bytes on any machine (DESIGN.md "Inputs are bit-reproducible"): the
 * digests of one case's tensors, pinned; experts drawn in one group or one at a time give the same bytes. */
Test(cases_moe, digests_are_pinned_and_expert_grouping_changes_nothing) {
    const kp_moe_case mc = read_case("moe(hidden=256,inter=128,m=1,model=glm53,profile=single,seed=3)", NULL);
    const int64_t R = kp_moe_w13_rows(&mc), H = mc.hidden, I = mc.inter, E = mc.experts;
    uint8_t *w13 = malloc((size_t)(E * R * H / 2)), *s13 = malloc((size_t)(E * R * H / 16));
    uint8_t *w2 = malloc((size_t)(E * H * I / 2)), *s2 = malloc((size_t)(E * H * I / 16)), *one = malloc((size_t)(R * H / 2));
    float *g = malloc(sizeof(float) * (size_t)(2 * E)), g1, g2;
    uint8_t *o13 = malloc((size_t)(R * H / 16)), *ow2 = malloc((size_t)(H * I / 2)), *os2 = malloc((size_t)(H * I / 16));
    kp_error err = {0};
    cr_assert_eq(kp_moe_case_experts(&mc, 0, E, w13, s13, g, w2, s2, g + E, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_moe_case_expert(&mc, 201, one, o13, &g1, ow2, os2, &g2, &err), 0, "%s", err.msg);
    cr_assert(!memcmp(one, w13 + 201 * R * H / 2, (size_t)(R * H / 2)) && !memcmp(ow2, w2 + 201 * H * I / 2, (size_t)(H * I / 2)));
    cr_assert(!memcmp(o13, s13 + 201 * R * H / 16, (size_t)(R * H / 16)) && !memcmp(os2, s2 + 201 * H * I / 16, (size_t)(H * I / 16)));
    cr_assert(g1 == g[201] && g2 == g[E + 201]);
    rows r = make_rows(&mc, 0, 1);
    char hex[KP_SHA256_HEX_LEN];
    const struct {
        kp_dtype dt;
        int ndim;
        int64_t shape[3];
        const void *data;
        const char *want;
    } t[] = {
        {KP_F32, 2, {1, H}, r.x, "8d5c4cb33c11832a9d0ffe85a4e1cff7a87e90a8d839eaef464523d639130e8e"},
        {KP_I32, 2, {1, mc.topk}, r.ids, "93ff746ee0e4da7c391c8d281d231942f216d42d8084bfdb7089e15843335763"},
        {KP_F32, 2, {1, mc.topk}, r.w, "e0b835f371b5ce68d735b61eaa0acb88caffc52987cb65018ca3034f101053e4"},
        {KP_U8, 3, {E, R, H / 2}, w13, "41a187d42fc8620542397abfc605c6368478c706bdcfc11c734e7ddefd243907"},
        {KP_U8, 3, {E, R, H / 16}, s13, "1368a0ee50f45fe3e09eee8fa2924eeb2a9aba2d3e6ec2bca3a28a4738f189c6"},
        {KP_U8, 3, {E, H, I / 2}, w2, "8af9f437d397d9953b1f00805e518fa4027766da2f1da62d4ea8aec7c5426012"},
        {KP_U8, 3, {E, H, I / 16}, s2, "972fbc2868af404e292205bae8c2fe330bc080f657b6f78e8096853570709de2"},
        {KP_F32, 2, {2, E}, g, "8dea328b17dff44d04a4b47c7b900b020aee78f0aea6e7098ccc8c8846374509"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        kp_buffer_digest(t[i].dt, t[i].ndim, t[i].shape, 0, t[i].data, hex);
        cr_assert_str_eq(hex, t[i].want, "tensor %zu", i);
    }
    drop(&r);
    free(w13), free(s13), free(w2), free(s2), free(one), free(g), free(o13), free(ow2), free(os2);
}

/* ---- the device generator's hook (kp_moe_case_set_device_generator) and its guard ---- */

enum fake_mode { FAKE_EXACT, FAKE_OTHER_EXPERT_BYTE, FAKE_GUARD_EXPERT_BYTE, FAKE_NO_DEVICE, FAKE_FAILS };
static enum fake_mode fake_mode;
static int fake_calls;

/* A device generator as the hook sees one: the host's bytes, one code of an expert's W2 flipped, or a refusal. */
static int fake_device(const kp_moe_case *mc, int64_t e0, int64_t ne, uint8_t *w13, uint8_t *s13, float *g13, uint8_t *w2,
                       uint8_t *s2, float *g2, kp_error *err) {
    fake_calls++;
    if (fake_mode == FAKE_NO_DEVICE) return KP_EXIT_SKIP;
    if (fake_mode == FAKE_FAILS) return kp_fail(err, KP_EXIT_ENV, "fake: cudaMemcpyAsync failed");
    const int rc = kp_moe_case_experts(mc, e0, ne, w13, s13, g13, w2, s2, g2, err);
    const int64_t guard = kp_moe_case_guard_expert(mc), e = fake_mode == FAKE_GUARD_EXPERT_BYTE ? guard : (guard + 1) % ne;
    if (fake_mode != FAKE_EXACT) w2[e * mc->hidden * (mc->inter / 2) + 7] ^= 0x10;
    return rc;
}

typedef struct all {
    uint8_t *w13, *s13, *w2, *s2;
    float *g;
    int rc;
    kp_error err;
    char said[2048]; /* what went to stderr */
} all;

static all all_experts(const kp_moe_case *mc, kp_moe_experts_fn device) {
    const int64_t R = kp_moe_w13_rows(mc), H = mc->hidden, I = mc->inter, E = mc->experts;
    all a = {malloc((size_t)(E * R * H / 2)), malloc((size_t)(E * R * H / 16)), malloc((size_t)(E * H * I / 2)),
             malloc((size_t)(E * H * I / 16)), malloc(sizeof(float) * (size_t)(2 * E)), 0, {0}, ""};
    fflush(stderr);
    FILE *said = tmpfile();
    const int saved = dup(2);
    cr_assert(said && saved >= 0 && dup2(fileno(said), 2) >= 0);
    kp_moe_case_set_device_generator(device);
    a.rc = kp_moe_case_all_experts(mc, a.w13, a.s13, a.g, a.w2, a.s2, a.g + E, &a.err);
    kp_moe_case_set_device_generator(NULL);
    fflush(stderr);
    dup2(saved, 2), close(saved);
    rewind(said);
    a.said[fread(a.said, 1, sizeof a.said - 1, said)] = '\0';
    fclose(said);
    return a;
}
static int all_same(const kp_moe_case *mc, const all *a, const all *b) {
    const int64_t R = kp_moe_w13_rows(mc), H = mc->hidden, I = mc->inter, E = mc->experts;
    return !memcmp(a->w13, b->w13, (size_t)(E * R * H / 2)) && !memcmp(a->s13, b->s13, (size_t)(E * R * H / 16)) &&
           !memcmp(a->w2, b->w2, (size_t)(E * H * I / 2)) && !memcmp(a->s2, b->s2, (size_t)(E * H * I / 16)) &&
           !memcmp(a->g, b->g, sizeof(float) * (size_t)(2 * E));
}
static void all_free(all *a) { free(a->w13), free(a->s13), free(a->w2), free(a->s2), free(a->g); }

/* The device's bytes are used when its guard expert agrees with the host's (a flip elsewhere stays: the guard is one
 * expert, the proof is tests/test_gpu_moe_gen.c), and dropped for the host's, with a warning, when it does not. */
Test(cases_moe, a_device_generator_is_kept_while_its_guard_expert_agrees_and_replaced_when_not) {
    const kp_moe_case mc = read_case("moe(hidden=64,inter=32,m=1,model=glm47,profile=single,seed=70)", NULL);
    cr_assert_eq(kp_moe_case_guard_expert(&mc), 70 % 64);
    all host = all_experts(&mc, NULL);
    cr_assert_eq(host.rc, 0, "%s", host.err.msg);
    fake_mode = FAKE_EXACT, fake_calls = 0;
    all exact = all_experts(&mc, fake_device);
    cr_assert(exact.rc == 0 && fake_calls == 1 && all_same(&mc, &host, &exact) && !exact.said[0], "%s", exact.said);
    fake_mode = FAKE_OTHER_EXPERT_BYTE;
    all other = all_experts(&mc, fake_device);
    cr_assert(other.rc == 0 && !all_same(&mc, &host, &other) && !other.said[0], "the device's bytes were kept: %s", other.said);
    fake_mode = FAKE_GUARD_EXPERT_BYTE;
    all guarded = all_experts(&mc, fake_device);
    cr_assert_eq(guarded.rc, 0, "%s", guarded.err.msg);
    cr_assert(all_same(&mc, &host, &guarded), "the host's bytes replaced the device's");
    cr_assert(strstr(guarded.said, "warning") && strstr(guarded.said, "expert 6 differs from the host's in w2"),
              "the warning names the expert and the tensor: %s", guarded.said);
    all_free(&host), all_free(&exact), all_free(&other), all_free(&guarded);
}

/* No device (KP_EXIT_SKIP): the host's bytes, silently; a device that fails: its error, not the host's bytes. */
Test(cases_moe, a_device_generator_without_a_device_leaves_it_to_the_host_and_its_failure_is_an_error) {
    const kp_moe_case mc = read_case("moe(hidden=64,inter=32,m=1,model=qwen3,profile=single,seed=7)", NULL);
    all host = all_experts(&mc, NULL);
    fake_mode = FAKE_NO_DEVICE, fake_calls = 0;
    all none = all_experts(&mc, fake_device);
    cr_assert(none.rc == 0 && fake_calls == 1 && all_same(&mc, &host, &none) && !none.said[0], "%d %s", none.rc, none.said);
    fake_mode = FAKE_FAILS;
    all failed = all_experts(&mc, fake_device);
    cr_assert_eq(failed.rc, KP_EXIT_ENV);
    cr_assert_str_eq(failed.err.msg, "fake: cudaMemcpyAsync failed");
#ifdef KP_HAVE_CUDA
    /* the CUDA build's own generator where no device is visible (this machine, or the variable): declines */
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    all cuda = all_experts(&mc, kp_moe_experts_cuda);
    cr_assert(cuda.rc == 0 && all_same(&mc, &host, &cuda) && !cuda.said[0], "%d %s: %s", cuda.rc, cuda.err.msg, cuda.said);
    all_free(&cuda);
#endif
    all_free(&host), all_free(&none), all_free(&failed);
}
