/* moe_case.c: moe fields, their canonical form, the model shapes and the seeded generator of expert
 * weights (quantized to NVFP4), activations and routing. Built with -ffp-contract=off and no libm
 * transcendental, so inputs are bit-identical anywhere. */
#include "moe_case.h"

#include <math.h> /* sqrt: correctly rounded, like + - * / */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_rng.h"

static const struct {
    const char *name;
    int64_t hidden, inter, experts, topk;
    int gated;
} models[] = {
    {"glm53", 4096, 2048, 288, 8, 1},    /* GLM-5.3-Flash, the seed's model */
    {"qwen3", 2048, 768, 128, 8, 1},     /* Qwen3-30B-A3B */
    {"nemotron", 2688, 1856, 128, 6, 0}, /* Nemotron-3-Nano: relu^2, non-gated */
    {"glm47", 2048, 1536, 64, 4, 1},     /* GLM-4.7-Flash: below 1024 routed slots, a deterministic align path */
    {"deepseek_v3", 7168, 2048, 256, 8, 1}, /* DeepSeek-V3's routed experts */
    {"kimi_k2", 7168, 2048, 384, 8, 1},     /* Kimi-K2 */
    {"qwen3_235b", 4096, 1536, 128, 8, 1},  /* Qwen3-235B-A22B */
};
#define NMODELS ((int)(sizeof models / sizeof models[0]))

static const char *const model_names[] = {"glm53", "qwen3", "nemotron", "glm47", "deepseek_v3", "kimi_k2", "qwen3_235b",
                                          NULL}; /* models' order */
static const char *const act_names[] = {"silu_gated", "relu2", NULL};
static const int64_t act_codes[] = {1, 0}; /* kp_moe_case.gated */
static const char *const profile_names[] = {"uniform", "hot", "straddle", "single", NULL};
static const char *const scale_dir_names[] = {"divide", "multiply", NULL};
static const int64_t scale_dir_codes[] = {KP_NVFP4_DIVIDE, KP_NVFP4_MULTIPLY};

enum { SLOT_X = 0, SLOT_ROUTE = 1, SLOT_WEIGHTS = 2 };

static uint64_t slot_offset(int slot, uint64_t at) { return ((uint64_t)slot << 56) + at; }

static int64_t preset_hidden(const void *mc) { return models[((const kp_moe_case *)mc)->model_index].hidden; }
static int64_t preset_inter(const void *mc) { return models[((const kp_moe_case *)mc)->model_index].inter; }
static int64_t preset_experts(const void *mc) { return models[((const kp_moe_case *)mc)->model_index].experts; }
static int64_t preset_topk(const void *mc) { return models[((const kp_moe_case *)mc)->model_index].topk; }
static int64_t preset_act(const void *mc) { return models[((const kp_moe_case *)mc)->model_index].gated; }

#define AT(member) KP_FIELD_AT(kp_moe_case, member)
static const kp_case_field fields[] = {
    {"model", KP_FIELD_NAME, AT(model_index), .names = model_names,
     .help = "the layer's model: the preset of hidden, inter, experts, topk and act (any may be overridden)"},
    {"m", KP_FIELD_INT, AT(m), .min = 1, .max = 65536, .help = "rows (tokens)"},
    {"seed", KP_FIELD_UINT, AT(seed), .help = "the generator's seed"},
    {"profile", KP_FIELD_NAME, AT(profile), .names = profile_names, .help = "the routing (moe_case.h)"},
    {"hidden", KP_FIELD_INT, AT(hidden), .min = 16, .max = 65536, .preset = preset_hidden,
     .help = "the hidden size, a multiple of 16 (NVFP4 blocks along K)"},
    {"inter", KP_FIELD_INT, AT(inter), .min = 16, .max = 65536, .preset = preset_inter,
     .help = "the intermediate size, a multiple of 16"},
    {"experts", KP_FIELD_INT, AT(experts), .min = 1, .max = 4096, .preset = preset_experts, .help = "routed experts"},
    {"topk", KP_FIELD_INT, AT(topk), .min = 1, .max = 64, .preset = preset_topk,
     .help = "experts a token is routed to, at most experts"},
    {"act", KP_FIELD_NAME, AT(gated), .names = act_names, .codes = act_codes, .preset = preset_act,
     .help = "silu_gated (SiLU(gate) * up, W13 holds both) or relu2 (relu(up)^2)"},
    {"scale_dir", KP_FIELD_NAME, AT(scale_dir), .names = scale_dir_names, .codes = scale_dir_codes, .fallback = "divide",
     .help = "the NVFP4 global scale stored as 2688 / amax (divide) or amax / 2688 (multiply)"},
};
#undef AT
_Static_assert(sizeof model_names / sizeof *model_names == NMODELS + 1, "a name for every model");

/* The model's preset, NVFP4's blocks along K, and single's one row. */
static int check(void *fields_, kp_error *err) {
    kp_moe_case *mc = fields_;
    mc->model = models[mc->model_index].name;
    if (mc->topk > mc->experts)
        return kp_fail(err, KP_EXIT_USAGE, "case moe: field 'topk': %lld experts a token from %lld experts",
                       (long long)mc->topk, (long long)mc->experts);
    if (mc->hidden % KP_NVFP4_BLOCK || mc->inter % KP_NVFP4_BLOCK)
        return kp_fail(err, KP_EXIT_USAGE, "case moe: fields 'hidden' and 'inter': %lld and %lld must be multiples of 16 "
                       "(NVFP4 blocks along K)", (long long)mc->hidden, (long long)mc->inter);
    if (mc->profile == KP_MOE_SINGLE && mc->m != 1)
        return kp_fail(err, KP_EXIT_USAGE, "case moe: field 'm': profile=single is one row, not %lld", (long long)mc->m);
    return 0;
}

const kp_case_family kp_moe_case_family = {
    .name = "moe",
    .generator_version = KP_MOE_GENERATOR_VERSION,
    KP_CASE_FIELDS(fields, kp_moe_case),
    .check = check,
};

int64_t kp_moe_w13_rows(const kp_moe_case *mc) { return mc->gated ? 2 * mc->inter : mc->inter; }

uint64_t kp_moe_case_weight_offset(const kp_moe_case *mc, int64_t e) {
    const int64_t per = (kp_moe_w13_rows(mc) + mc->inter) * mc->hidden;
    return slot_offset(SLOT_WEIGHTS, (uint64_t)e * (uint64_t)per);
}

/* (u - 1/2) * sqrt(12 / K) in f32: variance 1 / K, so outputs keep one scale at any hidden and inter */
double kp_moe_weight_scale(int64_t k) { return sqrt(12.0 / (double)k); }

float kp_moe_weight(uint32_t draw, double scale) { return (float)((kp_unit(draw) - 0.5) * scale); }

int kp_moe_case_experts(const kp_moe_case *mc, int64_t e0, int64_t ne, uint8_t *w13, uint8_t *s13, float *g13, uint8_t *w2,
                        uint8_t *s2, float *g2, kp_error *err) {
    /* experts' draws are contiguous (expert e's W13 then W2 from e * per): one cuRAND call for all ne, whose
       host generator costs milliseconds a call whatever its size */
    const int64_t R = kp_moe_w13_rows(mc), H = mc->hidden, I = mc->inter, n13 = R * H, n2 = H * I, per = n13 + n2;
    float *w = kp_calloc((size_t)per, sizeof *w, "expert weights", err);
    uint32_t *draws = w ? kp_calloc((size_t)(per * ne), sizeof *draws, "expert draws", err) : NULL;
    kp_rng rng;
    int rc = draws ? kp_rng_open(&rng, mc->seed, err) : err->code, opened = rc == 0;
    if (!rc) rc = kp_rng_draw(&rng, kp_moe_case_weight_offset(mc, e0), draws, (size_t)(per * ne), err);
    const double scale13 = kp_moe_weight_scale(H), scale2 = kp_moe_weight_scale(I);
    for (int64_t q = 0; !rc && q < ne; q++) {
        const uint32_t *d = draws + q * per;
        for (int64_t i = 0; i < n13; i++) w[i] = kp_moe_weight(d[i], scale13);
        rc = kp_nvfp4_quantize(w, R, H, mc->scale_dir, w13 + q * R * (H / 2), s13 + q * R * (H / 16), g13 + q, err);
        for (int64_t i = 0; !rc && i < n2; i++) w[i] = kp_moe_weight(d[n13 + i], scale2);
        if (!rc) rc = kp_nvfp4_quantize(w, H, I, mc->scale_dir, w2 + q * H * (I / 2), s2 + q * H * (I / 16), g2 + q, err);
    }
    if (opened) kp_rng_close(&rng);
    free(w), free(draws);
    return rc;
}

int kp_moe_case_expert(const kp_moe_case *mc, int64_t e, uint8_t *w13, uint8_t *s13, float *g13, uint8_t *w2,
                       uint8_t *s2, float *g2, kp_error *err) {
    return kp_moe_case_experts(mc, e, 1, w13, s13, g13, w2, s2, g2, err);
}

static float with_low_bit(double v) { /* nonzero low 16 bits: bf16 rounding changes the value */
    float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    b |= 1u;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Row r's experts: the profile's forced ones first, then the rest drawn without replacement from
 * [pool, experts) (a partial Fisher-Yates over perm, which is the identity on entry and on return). */
static void route_row(const kp_moe_case *mc, int64_t r, const uint32_t *d, int32_t *perm, int32_t *ids) {
    int64_t n = 0, pool = 0;
    if (mc->profile == KP_MOE_HOT) ids[n++] = 0, pool = 1;
    if (mc->profile == KP_MOE_STRADDLE) {
        if (r < 31) ids[n++] = 0;
        if (r < 32) ids[n++] = 1;
        if (r < 33) ids[n++] = 2;
        pool = 3;
    }
    const int64_t size = mc->experts - pool, picks = mc->topk - n;
    for (int64_t j = 0; j < picks; j++) {
        const int64_t pick = j + kp_index(d[j], size - j);
        const int32_t t = perm[j];
        perm[j] = perm[pick], perm[pick] = t;
        ids[n + j] = (int32_t)pool + perm[j];
    }
    for (int64_t j = picks - 1; j >= 0; j--) { /* undo the swaps, so perm is the identity again */
        const int64_t pick = j + kp_index(d[j], size - j);
        const int32_t t = perm[j];
        perm[j] = perm[pick], perm[pick] = t;
    }
}

int kp_moe_case_rows(const kp_moe_case *mc, int64_t first, int64_t n, float *x, int32_t *ids, float *weights, kp_error *err) {
    const int64_t H = mc->hidden, K = mc->topk, span = 2 * K; /* routing draws a row: picks, then weights */
    uint32_t *d = kp_calloc((size_t)(H > span ? H : span), sizeof *d, "moe draws", err);
    int32_t *perm = kp_calloc((size_t)mc->experts, sizeof *perm, "moe routing", err);
    kp_rng rng;
    int rc = d && perm ? kp_rng_open(&rng, mc->seed, err) : err->code, opened = rc == 0;
    for (int64_t e = 0; perm && e < mc->experts; e++) perm[e] = (int32_t)e;
    if (!rc) rc = kp_rng_seek(&rng, slot_offset(SLOT_X, (uint64_t)first * (uint64_t)H), err);
    for (int64_t i = 0; !rc && i < n; i++) {
        if ((rc = kp_rng_next(&rng, d, (size_t)H, err))) break;
        for (int64_t h = 0; h < H; h++) x[i * H + h] = with_low_bit((kp_unit(d[h]) - 0.5) * 2.0);
    }
    if (!rc) rc = kp_rng_seek(&rng, slot_offset(SLOT_ROUTE, (uint64_t)first * (uint64_t)span), err);
    for (int64_t i = 0; !rc && i < n; i++) {
        if ((rc = kp_rng_next(&rng, d, (size_t)span, err))) break;
        route_row(mc, first + i, d, perm, ids + i * K);
        double sum = 0;
        for (int64_t j = 0; j < K; j++) sum += kp_unit(d[K + j]) + 0.25;
        for (int64_t j = 0; j < K; j++) weights[i * K + j] = with_low_bit((kp_unit(d[K + j]) + 0.25) / sum);
    }
    if (opened) kp_rng_close(&rng);
    free(d), free(perm);
    return rc;
}

/* Experts are drawn in groups of about KP_MOE_GEN_DRAWS draws, one group per kp_parallel_for item. */
typedef struct gen_job {
    const kp_moe_case *mc;
    uint8_t *w13, *s13, *w2, *s2;
    float *g13, *g2;
    int64_t group;
    kp_error err;
    atomic_int failed;
} gen_job;

static void gen_group(void *ctx, int64_t i) {
    gen_job *g = ctx;
    const kp_moe_case *mc = g->mc;
    const int64_t H = mc->hidden, I = mc->inter, R = kp_moe_w13_rows(mc), e = i * g->group;
    const int64_t ne = mc->experts - e < g->group ? mc->experts - e : g->group;
    kp_error err = {0};
    if (kp_moe_case_experts(mc, e, ne, g->w13 + e * R * (H / 2), g->s13 + e * R * (H / 16), g->g13 + e,
                            g->w2 + e * H * (I / 2), g->s2 + e * H * (I / 16), g->g2 + e, &err) &&
        !atomic_exchange(&g->failed, 1))
        g->err = err;
}

/* The host's generator over every core. */
static int host_all_experts(const kp_moe_case *mc, uint8_t *w13, uint8_t *s13, float *g13, uint8_t *w2, uint8_t *s2,
                            float *g2, kp_error *err) {
    const int64_t E = mc->experts, per = (kp_moe_w13_rows(mc) + mc->inter) * mc->hidden, threads = kp_thread_count();
    int64_t group = KP_MOE_GEN_DRAWS / per > 1 ? KP_MOE_GEN_DRAWS / per : 1;
    if ((E + group - 1) / group < threads) group = (E + threads - 1) / threads; /* every core busy */
    gen_job g = {.mc = mc, .w13 = w13, .s13 = s13, .w2 = w2, .s2 = s2, .g13 = g13, .g2 = g2, .group = group};
    atomic_init(&g.failed, 0);
    kp_parallel_for((E + group - 1) / group, gen_group, &g);
    if (atomic_load(&g.failed)) return *err = g.err, err->code;
    return 0;
}

/* The device generator is a hook, not a call: cases/ is plain C built without nvcc, and a CPU-only build links
 * no CUDA symbol, so the CUDA build hands its generator in (cases/cuda/cases_cuda.c, installed by the CLI). */
static kp_moe_experts_fn device_generator;

void kp_moe_case_set_device_generator(kp_moe_experts_fn fn) { device_generator = fn; }

int64_t kp_moe_case_guard_expert(const kp_moe_case *mc) { return (int64_t)(mc->seed % (uint64_t)mc->experts); }

/* The guard: one expert on the host, on a thread of its own while the device makes them all, so it costs one
 * expert's host time (0.3 s for GLM-5.3's) hidden behind the device's. */
typedef struct guard_job {
    const kp_moe_case *mc;
    int64_t e;
    uint8_t *w13, *s13, *w2, *s2;
    float g13, g2;
    kp_error err;
    int rc;
} guard_job;

static void *guard_run(void *arg) {
    guard_job *g = arg;
    g->rc = kp_moe_case_experts(g->mc, g->e, 1, g->w13, g->s13, &g->g13, g->w2, g->s2, &g->g2, &g->err);
    return NULL;
}

/* The first of expert e's tensors whose bytes differ from the guard's, or NULL. */
static const char *guard_differs(const guard_job *g, const uint8_t *w13, const uint8_t *s13, const float *g13,
                                 const uint8_t *w2, const uint8_t *s2, const float *g2) {
    const int64_t R = kp_moe_w13_rows(g->mc), H = g->mc->hidden, I = g->mc->inter, e = g->e;
    if (memcmp(g->w13, w13 + e * R * (H / 2), (size_t)(R * (H / 2)))) return "w13";
    if (memcmp(g->s13, s13 + e * R * (H / 16), (size_t)(R * (H / 16)))) return "s13";
    if (memcmp(g->w2, w2 + e * H * (I / 2), (size_t)(H * (I / 2)))) return "w2";
    if (memcmp(g->s2, s2 + e * H * (I / 16), (size_t)(H * (I / 16)))) return "s2";
    if (memcmp(&g->g13, g13 + e, sizeof *g13) || memcmp(&g->g2, g2 + e, sizeof *g2)) return "global_scales";
    return NULL;
}

int kp_moe_case_all_experts(const kp_moe_case *mc, uint8_t *w13, uint8_t *s13, float *g13, uint8_t *w2, uint8_t *s2,
                            float *g2, kp_error *err) {
    if (!device_generator) return host_all_experts(mc, w13, s13, g13, w2, s2, g2, err);
    const int64_t R = kp_moe_w13_rows(mc), H = mc->hidden, I = mc->inter;
    const size_t b13 = (size_t)(R * (H / 2)), q13 = (size_t)(R * (H / 16)), b2 = (size_t)(H * (I / 2)),
                 q2 = (size_t)(H * (I / 16));
    uint8_t *one = kp_alloc(b13 + q13 + b2 + q2, "the guard expert", err);
    if (!one) return err->code;
    guard_job g = {.mc = mc, .e = kp_moe_case_guard_expert(mc), .w13 = one, .s13 = one + b13, .w2 = one + b13 + q13,
                   .s2 = one + b13 + q13 + b2};
    pthread_t thread;
    const int threaded = pthread_create(&thread, NULL, guard_run, &g) == 0;
    int rc = device_generator(mc, 0, mc->experts, w13, s13, g13, w2, s2, g2, err);
    if (threaded) pthread_join(thread, NULL);
    else if (rc == 0) guard_run(&g); /* no thread to be had: the guard after the device, not never */
    const char *differs = NULL;
    if (rc == 0 && g.rc) *err = g.err, rc = g.rc;
    else if (rc == 0 && (differs = guard_differs(&g, w13, s13, g13, w2, s2, g2)))
        fprintf(stderr, "kparity: warning: moe(model=%s,hidden=%lld,inter=%lld,experts=%lld,seed=%llu): the device "
                "generator's expert %lld differs from the host's in %s; generating every expert on the host instead "
                "(a defect in the device generator: please report it)\n", mc->model ? mc->model : "?", (long long)H, (long long)I,
                (long long)mc->experts, (unsigned long long)mc->seed, (long long)g.e, differs);
    free(one);
    /* KP_EXIT_SKIP: no device here, nothing written; the host's bytes are the definition either way */
    if (rc == KP_EXIT_SKIP || differs) return host_all_experts(mc, w13, s13, g13, w2, s2, g2, err);
    return rc;
}
