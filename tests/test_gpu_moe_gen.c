/* test_gpu_moe_gen.c: the GPU's moe expert generator (cases/cuda/moe_gen.cu) against the host's, which is the
 * definition (cases/moe_case.c), over every input each piece can see: the E2M1 and E4M3 quantizers on all 2^32 f32
 * bit patterns, the draw-to-weight map on all 2^32 draws at every K of the model presets and the host gate, raw Philox
 * draws at offsets in every slot, and whole tensors of the nvfp4-moe gates' cases, in groups of every size; then the
 * hook: the guard's expert, no device, a timed GLM-5.3 case. The oracle is always the host code itself, called here.
 * Exit 77 without a GPU or the CUDA build; CUDA state only inside tests (Criterion forks; see kp_gpu_test.h). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_nvfp4.h"
#include "../cases/kp_rng.h"
#include "../cases/moe_case.h"
#include "../receipts/kp_json.h"
#include "kp_gpu_test.h"
#include "kp_test_util.h"

#ifdef KP_HAVE_CUDA
#include "../cases/cuda/moe_gen_cuda.h"
#include "../cases/cuda/moe_gen_hook.h"

static kp_moe_case case_named(const char *name);

/* ---- every input: the device's answers for [first, first + PASS) copied back, the host's computed beside them ---- */

#define PASS ((uint32_t)1 << 28) /* inputs a pass: 2^32 in 16 */
#define SPAN ((uint32_t)1 << 20) /* inputs a host thread takes at a time */

typedef enum piece { E2M1, E4M3, WEIGHT } piece;
static const char *const piece_names[] = {"E2M1", "E4M3", "weight"};

typedef struct pass {
    piece what;
    double scale; /* WEIGHT */
    uint32_t first;
    const void *got; /* [PASS] codes, or weights' bits */
    atomic_llong differ;
    atomic_uint first_bad; /* the lowest differing input (atomic_fetch_min is not C11: a CAS loop) */
    atomic_ullong seen[4]; /* codes the host gave, for the vacuity guard */
} pass;

static uint32_t bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}
static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}
static uint32_t host_answer(piece what, double scale, uint32_t in) {
    return what == E2M1 ? kp_e2m1_quantize(from_bits(in)) : what == E4M3 ? kp_e4m3_quantize(from_bits(in))
                                                                         : bits(kp_moe_weight(in, scale));
}
static uint32_t device_answer(const pass *p, uint32_t k) {
    return p->what == WEIGHT ? ((const uint32_t *)p->got)[k] : ((const uint8_t *)p->got)[k];
}

static void compare_span(void *ctx, int64_t i) {
    pass *p = ctx;
    const uint32_t lo = (uint32_t)i * SPAN;
    long long differ = 0;
    uint32_t bad = UINT32_MAX;
    uint64_t seen[4] = {0};
    if (p->what == WEIGHT) {
        const uint32_t *got = p->got;
        for (uint32_t k = lo; k < lo + SPAN; k++)
            if (bits(kp_moe_weight(p->first + k, p->scale)) != got[k]) differ++, bad = bad < k ? bad : k;
    } else {
        const uint8_t *got = p->got;
        for (uint32_t k = lo; k < lo + SPAN; k++) {
            const float x = from_bits(p->first + k);
            const uint8_t want = p->what == E2M1 ? kp_e2m1_quantize(x) : kp_e4m3_quantize(x);
            seen[want / 64] |= 1ull << (want % 64);
            if (want != got[k]) differ++, bad = bad < k ? bad : k;
        }
    }
    for (int w = 0; w < 4; w++) atomic_fetch_or(&p->seen[w], seen[w]);
    if (!differ) return;
    atomic_fetch_add(&p->differ, differ);
    unsigned cur = atomic_load(&p->first_bad);
    while (bad < cur && !atomic_compare_exchange_weak(&p->first_bad, &cur, bad)) {}
}

/* All 2^32 inputs of one piece, device against host; codes the host gave over them into seen. */
static void every_input(piece what, double scale, uint64_t seen[4]) {
    const size_t size = what == WEIGHT ? 4 : 1;
    void *dev = NULL, *host = NULL;
    CUDA_OK(cudaMalloc(&dev, PASS * size));
    CUDA_OK(cudaMallocHost(&host, PASS * size));
    memset(seen, 0, 4 * sizeof *seen);
    for (uint64_t first = 0; first < ((uint64_t)1 << 32); first += PASS) {
        const uint32_t f = (uint32_t)first;
        const int e = what == E2M1 ? kp_moe_gen_cuda_e2m1(f, PASS, dev)
                      : what == E4M3 ? kp_moe_gen_cuda_e4m3(f, PASS, dev)
                                     : kp_moe_gen_cuda_weights(f, PASS, scale, dev);
        cr_assert_eq(e, 0, "the %s kernel failed to launch: %s", piece_names[what], cudaGetErrorString((cudaError_t)e));
        CUDA_OK(cudaMemcpy(host, dev, PASS * size, cudaMemcpyDeviceToHost)); /* reports the kernel's own errors too */
        pass p = {.what = what, .scale = scale, .first = f, .got = host};
        atomic_init(&p.differ, 0), atomic_init(&p.first_bad, UINT32_MAX);
        for (int w = 0; w < 4; w++) atomic_init(&p.seen[w], 0);
        kp_parallel_for(PASS / SPAN, compare_span, &p);
        for (int w = 0; w < 4; w++) seen[w] |= atomic_load(&p.seen[w]);
        const long long differ = atomic_load(&p.differ);
        const uint32_t k = atomic_load(&p.first_bad);
        cr_assert_eq(differ, 0, "%s (scale %.17g): %lld of the inputs [%#x, %#llx] differ from the host's; the first, "
                     "input %#x: device %#x, host %#x", piece_names[what], scale, differ, f,
                     (unsigned long long)(first + PASS - 1), f + k, device_answer(&p, k), host_answer(what, scale, f + k));
        if (what == WEIGHT) /* not vacuous: a pass's weights run from one end of the range to the other */
            cr_assert_neq(device_answer(&p, 0), device_answer(&p, PASS - 1), "weight: a constant pass at %#x", f);
    }
    CUDA_OK(cudaFreeHost(host));
    CUDA_OK(cudaFree(dev));
}

static int seen_count(const uint64_t seen[4]) {
    int n = 0;
    for (int w = 0; w < 4; w++) n += __builtin_popcountll(seen[w]);
    return n;
}

Test(gpu_moe_gen, the_e2m1_quantizer_matches_the_host_on_every_f32) {
    uint64_t seen[4];
    every_input(E2M1, 0, seen);
    cr_assert_eq(seen_count(seen), 16, "every E2M1 code, +-0 to +-6, met (%d were)", seen_count(seen));
}

Test(gpu_moe_gen, the_e4m3_quantizer_matches_the_host_on_every_f32) {
    uint64_t seen[4];
    every_input(E4M3, 0, seen);
    /* every finite E4M3 value of either sign and the one NaN code it gives (0x7f: NaN's sign is not kept) */
    cr_assert_eq(seen_count(seen), 255, "every E4M3 code but 0xff met (%d were)", seen_count(seen));
    cr_assert(!(seen[3] >> 63), "0xff (negative NaN) given");
}

/* Every K the generator sees with the shipped presets: each model's hidden and inter, and the host gate's 256 and
 * 128, read from the model field's names so that a new preset is covered when it is added. */
static int add_k(int64_t *ks, int n, int most, int64_t k) {
    for (int i = 0; i < n; i++)
        if (ks[i] == k) return n;
    cr_assert(n < most);
    ks[n] = k;
    return n + 1;
}
static int preset_ks(int64_t *ks, int most) {
    const kp_case_field *model = NULL;
    for (int f = 0; f < kp_moe_case_family.nfields; f++)
        if (!strcmp(kp_moe_case_family.fields[f].name, "model")) model = &kp_moe_case_family.fields[f];
    cr_assert(model && model->names, "moe has a model field with names");
    int n = add_k(ks, add_k(ks, 0, most, 256), most, 128);
    for (int m = 0; model->names[m]; m++) {
        char name[128];
        snprintf(name, sizeof name, "moe(m=1,model=%s,profile=single,seed=1)", model->names[m]);
        const kp_moe_case mc = case_named(name);
        n = add_k(ks, add_k(ks, n, most, mc.hidden), most, mc.inter);
    }
    return n;
}

Test(gpu_moe_gen, the_draw_to_weight_map_matches_the_host_on_every_draw_at_every_preset_k) {
    int64_t ks[64];
    const int n = preset_ks(ks, 64);
    cr_assert_geq(n, 9, "glm53, qwen3, nemotron, glm47, deepseek_v3, kimi_k2, qwen3_235b and the host gate: %d Ks", n);
    for (int i = 0; i < n; i++) {
        uint64_t seen[4];
        every_input(WEIGHT, kp_moe_weight_scale(ks[i]), seen);
        fprintf(stderr, "test_gpu_moe_gen: weights at K %lld: all 2^32 draws identical\n", (long long)ks[i]);
    }
}

/* ---- raw draws ---- */

Test(gpu_moe_gen, device_philox_draws_equal_the_host_generators_at_any_offset) {
    const uint64_t per_glm53 = 3ull * 2048 * 4096, slot = 1ull << 56;
    const uint64_t offsets[] = {0, 1, 2, 3, 5, 4097, (1ull << 32) - 3, (1ull << 32) + 1, slot, slot + 12345,
                                2 * slot, 2 * slot + 287 * per_glm53, 2 * slot + 7 * per_glm53 + 13, 3 * slot - 2};
    const size_t sizes[] = {1, 3, 4, 1001, ((size_t)1 << 22) + 3};
    const uint64_t seeds[] = {1, 15, 0x9e3779b97f4a7c15ull};
    uint32_t *dev = alloc_or_die(sizeof *dev * sizes[4]), *host = alloc_or_die(sizeof *host * sizes[4]);
    int nonzero = 0;
    for (int s = 0; s < 3; s++) {
        kp_rng rng;
        kp_error err = {0};
        cr_assert_eq(kp_rng_open(&rng, seeds[s], &err), 0, "%s", err.msg);
        for (size_t o = 0; o < sizeof offsets / sizeof *offsets; o++)
            for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
                char msg[512];
                memset(dev, 0, sizeof *dev * sizes[z]);
                cr_assert_eq(kp_rng_draw(&rng, offsets[o], host, sizes[z], &err), 0, "%s", err.msg);
                cr_assert_eq(kp_moe_gen_cuda_draws(seeds[s], offsets[o], sizes[z], dev, msg, sizeof msg), 0, "%s", msg);
                for (size_t i = 0; i < sizes[z]; i++)
                    cr_assert_eq(dev[i], host[i], "seed %llu, offset %#llx, %zu draws: draw %zu is %#x on the device, "
                                 "%#x on the host", (unsigned long long)seeds[s], (unsigned long long)offsets[o],
                                 sizes[z], i, dev[i], host[i]);
                nonzero += dev[0] != 0;
            }
        kp_rng_close(&rng);
    }
    cr_assert_gt(nonzero, 100, "draws were made (%d nonzero first draws)", nonzero);
    free(dev), free(host);
}

/* ---- whole tensors ---- */

typedef struct experts {
    uint8_t *w13, *s13, *w2, *s2;
    float *g; /* [2, experts]: g13 then g2 */
} experts;

typedef struct sizes {
    int64_t E, b13, q13, b2, q2; /* experts, and one expert's bytes of each tensor */
} sizes;

static sizes sizes_of(const kp_moe_case *mc) {
    const int64_t R = kp_moe_w13_rows(mc), H = mc->hidden, I = mc->inter;
    return (sizes){mc->experts, R * H / 2, R * H / 16, H * I / 2, H * I / 16};
}
static experts experts_alloc(const sizes *z) {
    return (experts){alloc_or_die((size_t)(z->E * z->b13)), alloc_or_die((size_t)(z->E * z->q13)),
                     alloc_or_die((size_t)(z->E * z->b2)), alloc_or_die((size_t)(z->E * z->q2)),
                     alloc_or_die(sizeof(float) * (size_t)(2 * z->E))};
}
static void experts_free(experts *x) { free(x->w13), free(x->s13), free(x->w2), free(x->s2), free(x->g); }

/* Expert e of a and expert f of b: the first tensor that differs, or NULL. */
static const char *expert_differs(const sizes *z, const experts *a, int64_t e, const experts *b, int64_t f) {
    if (memcmp(a->w13 + e * z->b13, b->w13 + f * z->b13, (size_t)z->b13)) return "w13";
    if (memcmp(a->s13 + e * z->q13, b->s13 + f * z->q13, (size_t)z->q13)) return "s13";
    if (memcmp(a->w2 + e * z->b2, b->w2 + f * z->b2, (size_t)z->b2)) return "w2";
    if (memcmp(a->s2 + e * z->q2, b->s2 + f * z->q2, (size_t)z->q2)) return "s2";
    if (memcmp(&a->g[e], &b->g[f], sizeof(float))) return "global_scales (g13)";
    if (memcmp(&a->g[z->E + e], &b->g[z->E + f], sizeof(float))) return "global_scales (g2)";
    return NULL;
}
static void assert_same(const char *name, const char *what, const sizes *z, const experts *a, const experts *b) {
    for (int64_t e = 0; e < z->E; e++) {
        const char *t = expert_differs(z, a, e, b, e);
        cr_assert(!t, "%s: %s: expert %lld's %s differ", name, what, (long long)e, t ? t : "");
    }
}

static kp_moe_case case_named(const char *name) {
    kp_case c;
    kp_moe_case mc;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_moe_case_read(&c, &mc, &err), 0,
                 "%s: %s", name, err.msg);
    return mc;
}

static void on_device(const char *name, const kp_moe_case *mc, size_t scratch, experts *x) {
    kp_error err = {0};
    const int rc = kp_moe_experts_cuda_in(scratch, 1, mc, 0, mc->experts, x->w13, x->s13, x->g, x->w2, x->s2,
                                          x->g + mc->experts, &err);
    cr_assert_eq(rc, 0, "%s: the device generator: exit %d: %s", name, rc, err.msg);
}
static void on_host(const char *name, const kp_moe_case *mc, experts *x) {
    kp_error err = {0};
    kp_moe_case_set_device_generator(NULL);
    cr_assert_eq(kp_moe_case_all_experts(mc, x->w13, x->s13, x->g, x->w2, x->s2, x->g + mc->experts, &err), 0, "%s: %s",
                 name, err.msg);
}

/* The scratch that holds exactly `g` experts of mc a group. */
static size_t scratch_for(const kp_moe_case *mc, int64_t g) {
    const sizes z = sizes_of(mc);
    const size_t per = (size_t)(z.b13 * 2 + z.b2 * 2) * 4 + (size_t)(z.b13 + z.q13 + z.b2 + z.q2) + 16;
    const size_t s = 7 * 256 + (size_t)g * per;
    cr_assert_eq(kp_moe_gen_cuda_group(kp_moe_w13_rows(mc), mc->hidden, mc->inter, s), g, "a scratch of %zu bytes holds %lld experts", s, (long long)g);
    return s;
}

/* Some experts of a case regenerated on the host, one a thread. */
typedef struct some {
    const kp_moe_case *mc;
    const int64_t *ids;
    int64_t nids;
    experts host; /* [nids] experts */
    atomic_int failed;
} some;
static void some_expert(void *ctx, int64_t i) {
    some *s = ctx;
    const sizes z = sizes_of(s->mc);
    kp_error err = {0};
    if (kp_moe_case_experts(s->mc, s->ids[i], 1, s->host.w13 + i * z.b13, s->host.s13 + i * z.q13, &s->host.g[i],
                            s->host.w2 + i * z.b2, s->host.s2 + i * z.q2, &s->host.g[s->nids + i], &err))
        atomic_store(&s->failed, 1);
}


/* The host gate's cases, hidden 256 and inter 128: whole tensors on both, the device's in one group and in groups of
 * 5 (a last group of 3, 4 or 1 experts for 288, 64 and 256 experts). */
Test(gpu_moe_gen, whole_tensors_equal_the_hosts_for_the_host_gates_cases_in_groups_of_any_size) {
    char names[64][KP_CASE_NAME_MAX];
    const int n = kpt_gate_cases("nvfp4-moe.json", names, 64);
    cr_assert_geq(n, 15);
    for (int c = 0; c < n; c++) {
        const kp_moe_case mc = case_named(names[c]);
        const sizes z = sizes_of(&mc);
        experts host = experts_alloc(&z), one = experts_alloc(&z), fives = experts_alloc(&z);
        on_host(names[c], &mc, &host);
        on_device(names[c], &mc, KP_MOE_GEN_CUDA_SCRATCH, &one);
        on_device(names[c], &mc, scratch_for(&mc, 5), &fives);
        assert_same(names[c], "one group", &z, &host, &one);
        assert_same(names[c], "groups of 5", &z, &host, &fives);
        cr_assert(host.g[0] != 0 && host.g[0] != 1, "%s: a global scale from an amax (%g)", names[c], host.g[0]);
        experts_free(&host), experts_free(&one), experts_free(&fives);
    }
}

/* The CUDA gate's cases at the models' full shapes: whole tensors where the host makes them in seconds (at most 2^31
 * draws: GLM-4.7-Flash, Qwen3, Nemotron), else (GLM-5.3, DeepSeek-V3: 7.2G and 11G draws) the experts at the ends
 * and middle, at the first group boundaries and the guard's, against the device's whole generation. GLM-5.3 seed 1's
 * weights are compared whole by the timed test below (weights depend on the model, seed and scale_dir only). */
Test(gpu_moe_gen, whole_tensors_equal_the_hosts_for_the_cuda_gates_cases) {
    char names[64][KP_CASE_NAME_MAX];
    const int n = kpt_gate_cases("nvfp4-moe-cuda.json", names, 64);
    cr_assert_geq(n, 11);
    for (int c = 0; c < n; c++) {
        const kp_moe_case mc = case_named(names[c]);
        const sizes z = sizes_of(&mc);
        experts dev = experts_alloc(&z);
        const double t0 = kp_now();
        on_device(names[c], &mc, KP_MOE_GEN_CUDA_SCRATCH, &dev);
        const double t_dev = kp_now() - t0;
        const int64_t draws = z.E * 2 * (z.b13 + z.b2);
        if (draws <= ((int64_t)1 << 31)) {
            experts host = experts_alloc(&z);
            on_host(names[c], &mc, &host);
            assert_same(names[c], "whole", &z, &host, &dev);
            experts_free(&host);
            fprintf(stderr, "test_gpu_moe_gen: %s: all %lld experts identical (device %.2f s)\n", names[c], (long long)z.E, t_dev);
        } else {
            const int64_t g = kp_moe_gen_cuda_group(kp_moe_w13_rows(&mc), mc.hidden, mc.inter, KP_MOE_GEN_CUDA_SCRATCH);
            const int64_t want[] = {0, 1, g - 1, g, g + 1, 2 * g - 1, 2 * g, z.E / 2, z.E - 2, z.E - 1, kp_moe_case_guard_expert(&mc)};
            int64_t ids[16];
            int nids = 0;
            for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
                int known = want[i] < 0 || want[i] >= z.E;
                for (int j = 0; j < nids; j++) known |= ids[j] == want[i];
                if (!known) ids[nids++] = want[i];
            }
            const sizes zs = {nids, z.b13, z.q13, z.b2, z.q2};
            some s = {.mc = &mc, .ids = ids, .nids = nids, .host = experts_alloc(&zs)};
            atomic_init(&s.failed, 0);
            kp_parallel_for(nids, some_expert, &s);
            cr_assert(!atomic_load(&s.failed), "%s: the host generator failed", names[c]);
            char list[256] = "";
            for (int i = 0; i < nids; i++) {
                /* g: [2, E] on the device's side, [2, nids] on the host's */
                cr_assert(!memcmp(dev.w13 + ids[i] * z.b13, s.host.w13 + i * z.b13, (size_t)z.b13) &&
                          !memcmp(dev.s13 + ids[i] * z.q13, s.host.s13 + i * z.q13, (size_t)z.q13) &&
                          !memcmp(dev.w2 + ids[i] * z.b2, s.host.w2 + i * z.b2, (size_t)z.b2) &&
                          !memcmp(dev.s2 + ids[i] * z.q2, s.host.s2 + i * z.q2, (size_t)z.q2) &&
                          !memcmp(&dev.g[ids[i]], &s.host.g[i], sizeof(float)) &&
                          !memcmp(&dev.g[z.E + ids[i]], &s.host.g[nids + i], sizeof(float)),
                          "%s: expert %lld differs from the host's", names[c], (long long)ids[i]);
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%lld", i ? "," : "", (long long)ids[i]);
            }
            experts_free(&s.host);
            fprintf(stderr, "test_gpu_moe_gen: %s: experts %s of %lld identical (device %.2f s, groups of %lld)\n",
                    names[c], list, (long long)z.E, t_dev, (long long)g);
        }
        experts_free(&dev);
    }
}

/* ---- the hook ---- */

/* GLM-5.3 seed 1 (the CUDA gate's first case's weights), whole, on the host, on the device and through
 * kp_moe_case_all_experts with the device generator set and its guard; the times go to stderr for MEASURED.md. */
Test(gpu_moe_gen, glm53_whole_on_every_path_timed) {
    const char *name = "moe(m=1,model=glm53,profile=single,seed=1)";
    const kp_moe_case mc = case_named(name);
    const sizes z = sizes_of(&mc);
    double t = kp_now();
    CUDA_OK(cudaFree(NULL)); /* the context, outside the timings */
    const double t_context = kp_now() - t;
    experts host = experts_alloc(&z), dev = experts_alloc(&z), plain = experts_alloc(&z), hooked = experts_alloc(&z);
    kp_error err = {0};
    t = kp_now();
    on_host(name, &mc, &host);
    const double t_host = kp_now() - t;
    t = kp_now();
    on_device(name, &mc, KP_MOE_GEN_CUDA_SCRATCH, &dev);
    const double t_dev = kp_now() - t;
    t = kp_now();
    on_device(name, &mc, KP_MOE_GEN_CUDA_SCRATCH, &dev); /* again, into pages already in */
    const double t_dev_again = kp_now() - t;
    t = kp_now();
    cr_assert_eq(kp_moe_experts_cuda_in(KP_MOE_GEN_CUDA_SCRATCH, 0, &mc, 0, z.E, plain.w13, plain.s13, plain.g, plain.w2,
                                        plain.s2, plain.g + z.E, &err), 0, "%s", err.msg);
    const double t_untouched = kp_now() - t;
    kp_moe_case_set_device_generator(kp_moe_experts_cuda);
    t = kp_now();
    cr_assert_eq(kp_moe_case_all_experts(&mc, hooked.w13, hooked.s13, hooked.g, hooked.w2, hooked.s2, hooked.g + z.E, &err),
                 0, "%s", err.msg);
    const double t_hooked = kp_now() - t;
    kp_moe_case_set_device_generator(NULL);
    assert_same(name, "device", &z, &host, &dev);
    assert_same(name, "device, pages not touched first", &z, &host, &plain);
    assert_same(name, "kp_moe_case_all_experts with the device generator", &z, &host, &hooked);
    fprintf(stderr, "test_gpu_moe_gen: %s, %lld experts, %.3g draws, all identical: host on %d threads %.2f s; device "
            "%.2f s into fresh pages touched first over every core, %.2f s into fresh pages untouched, %.2f s into pages "
            "already in; kp_moe_case_all_experts with the device generator and its guard %.2f s (fresh pages); context "
            "%.2f s\n", name, (long long)z.E, (double)(z.E * 2 * (z.b13 + z.b2)), kp_thread_count(), t_host, t_dev,
            t_untouched, t_dev_again, t_hooked, t_context);
    experts_free(&host), experts_free(&dev), experts_free(&plain), experts_free(&hooked);
}

/* With no device visible the CUDA generator declines (KP_EXIT_SKIP, err untouched) and kp_moe_case_all_experts
 * makes the host's bytes. CUDA is not yet initialized in this forked test, so the variable still counts. */
Test(gpu_moe_gen, no_visible_device_means_the_host_generates) {
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    const char *name = "moe(hidden=64,inter=32,m=1,model=qwen3,profile=single,seed=7)";
    const kp_moe_case mc = case_named(name);
    const sizes z = sizes_of(&mc);
    experts host = experts_alloc(&z), hooked = experts_alloc(&z);
    kp_error err = {0};
    cr_assert_eq(kp_moe_experts_cuda(&mc, 0, z.E, hooked.w13, hooked.s13, hooked.g, hooked.w2, hooked.s2, hooked.g + z.E, &err),
                 KP_EXIT_SKIP);
    cr_assert_eq(err.code, 0, "no error recorded: %s", err.msg);
    on_host(name, &mc, &host);
    kp_moe_case_set_device_generator(kp_moe_experts_cuda);
    cr_assert_eq(kp_moe_case_all_experts(&mc, hooked.w13, hooked.s13, hooked.g, hooked.w2, hooked.s2, hooked.g + z.E, &err),
                 0, "%s", err.msg);
    kp_moe_case_set_device_generator(NULL);
    assert_same(name, "no device", &z, &host, &hooked);
    experts_free(&host), experts_free(&hooked);
}

#endif

/* kpt_gpu_main skips (77) in a build without the CUDA impls too */
int main(int argc, char *argv[]) { return kpt_gpu_main(argc, argv, "test_gpu_moe_gen", "moe.invariant@cuda"); }
