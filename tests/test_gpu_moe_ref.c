/* test_gpu_moe_ref.c: moe's float64 reference on the GPU (reference/cuda/moe_ref.cu) against the host's, which is the
 * definition (reference/moe_ref.c), bit for bit on every output element: the host gate's cases, the model presets at
 * host shapes, top-k 1, odd row counts, experts in small groups, two full-shape cases; then the installed hook with its
 * guard. The oracle is always the host code itself, called here. Exit 77 without a GPU or the CUDA build; CUDA state
 * only inside tests (Criterion forks; see kp_gpu_test.h). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/moe_case.h"
#include "../kernels/kp_formats.h"
#include "../receipts/kp_json.h"
#include "../reference/moe_ref.h"
#include "kp_gpu_test.h"
#include "kp_test_util.h"

#ifdef KP_HAVE_CUDA
#include "../cases/cuda/moe_gen_hook.h"
#include "../reference/cuda/kp_reference_cuda.h"
#include "../reference/cuda/moe_ref_cuda.h"
#include "../reference/cuda/moe_ref_hook.h"

TestSuite(gpu_moe_ref, .timeout = 600);

/* A case's rows (x and x rounded to bf16) and every expert's weights. */
typedef struct moe_in {
    kp_moe_case mc;
    float *x[2];
    int32_t *ids;
    float *weights, *g; /* g: [2, experts] */
    uint8_t *w13, *s13, *w2, *s2;
    int64_t unused_experts;
} moe_in;

static moe_in load(const char *name, int device_generator) {
    moe_in in = {0};
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_moe_case_read(&c, &in.mc, &err), 0,
                 "%s: %s", name, err.msg);
    const kp_moe_case *mc = &in.mc;
    const int64_t H = mc->hidden, I = mc->inter, E = mc->experts, K = mc->topk, R = kp_moe_w13_rows(mc), m = mc->m;
    in.x[0] = malloc(sizeof(float) * (size_t)(m * H)), in.x[1] = malloc(sizeof(float) * (size_t)(m * H));
    in.ids = malloc(sizeof *in.ids * (size_t)(m * K)), in.weights = malloc(sizeof(float) * (size_t)(m * K));
    in.g = malloc(sizeof(float) * (size_t)(2 * E));
    in.w13 = malloc((size_t)(E * R * H / 2)), in.s13 = malloc((size_t)(E * R * H / 16));
    in.w2 = malloc((size_t)(E * H * I / 2)), in.s2 = malloc((size_t)(E * H * I / 16));
    cr_assert(in.x[0] && in.x[1] && in.ids && in.weights && in.g && in.w13 && in.s13 && in.w2 && in.s2);
    cr_assert_eq(kp_moe_case_rows(mc, 0, m, in.x[0], in.ids, in.weights, &err), 0, "%s", err.msg);
    for (int64_t i = 0; i < m * H; i++) in.x[1][i] = kp_bf16_round(in.x[0][i]);
    /* full shapes: the GPU generator, itself held to the host's bytes by test_gpu_moe_gen and its own guard */
    kp_moe_case_set_device_generator(device_generator ? kp_moe_experts_cuda : NULL);
    cr_assert_eq(kp_moe_case_all_experts(mc, in.w13, in.s13, in.g, in.w2, in.s2, in.g + E, &err), 0, "%s", err.msg);
    kp_moe_case_set_device_generator(NULL);
    uint8_t *used = calloc((size_t)E, 1);
    cr_assert(used);
    for (int64_t i = 0; i < m * K; i++) used[in.ids[i]] = 1;
    for (int64_t e = 0; e < E; e++) in.unused_experts += !used[e];
    free(used);
    return in;
}

static void drop(moe_in *in) {
    free(in->x[0]), free(in->x[1]), free(in->ids), free(in->weights), free(in->g);
    free(in->w13), free(in->s13), free(in->w2), free(in->s2);
}

static kp_moe_ref_in ref_in(const moe_in *in, int set) {
    return (kp_moe_ref_in){.mc = &in->mc, .rows = in->mc.m, .x = in->x[set], .ids = in->ids, .weights = in->weights,
                           .w13 = in->w13, .s13 = in->s13, .w2 = in->w2, .s2 = in->s2, .g13 = in->g,
                           .g2 = in->g + in->mc.experts};
}

static double *host_reference(const moe_in *in, int set, double *seconds) {
    const kp_moe_ref_in r = ref_in(in, set);
    double *out = malloc(sizeof *out * (size_t)(in->mc.m * in->mc.hidden));
    kp_error err = {0};
    cr_assert(out);
    kp_moe_reference_set_device(NULL);
    const double t0 = kp_now();
    cr_assert_eq(kp_moe_reference(&r, out, &err), 0, "%s", err.msg);
    if (seconds) *seconds = kp_now() - t0;
    return out;
}

/* The device's answer on `sets` activation sets through a weight budget of `budget` bytes. */
static void device_reference(const char *name, const moe_in *in, int sets, size_t budget, double *out[2], double *seconds) {
    const kp_moe_ref_in r = ref_in(in, 0);
    const float *x[2] = {in->x[0], in->x[1]};
    kp_error err = {0};
    const int64_t n = in->mc.m * in->mc.hidden;
    for (int s = 0; s < sets; s++) {
        out[s] = malloc(sizeof *out[s] * (size_t)n);
        cr_assert(out[s]);
        memset(out[s], 0xa5, sizeof *out[s] * (size_t)n); /* not a plausible answer: every element must be written */
    }
    const double t0 = kp_now();
    const int rc = kp_moe_reference_cuda_in(budget, &r, sets, x, out, &err);
    if (seconds) *seconds = kp_now() - t0;
    cr_assert_eq(rc, 0, "%s: the device reference: exit %d: %s", name, rc, err.msg);
}

/* Every element's bits equal; the answer not vacuous (not all zero). */
static void assert_identical(const char *name, const char *what, const kp_moe_case *mc, const double *host, const double *dev) {
    const int64_t n = mc->m * mc->hidden;
    int64_t differ = 0, first = -1, nonzero = 0;
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&host[i], &dev[i], sizeof *host)) differ++, first = first < 0 ? i : first;
        nonzero += host[i] != 0.0;
    }
    cr_assert_gt(nonzero, n / 2, "%s: the host's answer is mostly zero", name);
    cr_assert_eq(differ, 0, "%s (%s): %lld of %lld elements differ, first [%lld, %lld]: host %a, device %a", name, what,
                 (long long)differ, (long long)n, (long long)(first / mc->hidden), (long long)(first % mc->hidden),
                 first >= 0 ? host[first] : 0.0, first >= 0 ? dev[first] : 0.0);
}


/* The budget that holds `g` experts of mc a group. */
static size_t budget_for(const kp_moe_case *mc, int64_t g) {
    const int64_t R = kp_moe_w13_rows(mc), H = mc->hidden, I = mc->inter;
    return (size_t)g * (size_t)(R * H / 2 + R * H / 16 + H * I / 2 + H * I / 16);
}

/* nvfp4-moe.json's cases (several models, relu^2 nemotron, scale_dir=multiply, straddle, hot and single profiles),
 * the presets at host shapes, top-k 1, odd m: on x and on x rounded to bf16 in one call with every expert a group,
 * and on x through groups of 5 experts (a last partial group). */
Test(gpu_moe_ref, every_element_equals_the_hosts_for_the_host_gates_cases_presets_and_edges) {
    char names[64][KP_CASE_NAME_MAX];
    int n = kpt_gate_cases("nvfp4-moe.json", names, 48);
    cr_assert_geq(n, 15);
    const char *more[] = {"moe(hidden=256,inter=128,m=33,model=deepseek_v3,profile=uniform,seed=16)",
                          "moe(hidden=256,inter=128,m=33,model=kimi_k2,profile=straddle,seed=17)",
                          "moe(hidden=256,inter=128,m=201,model=qwen3_235b,profile=hot,seed=18)",
                          "moe(hidden=256,inter=128,m=7,model=glm53,profile=uniform,seed=19,topk=1)",
                          "moe(hidden=256,inter=128,m=1,model=nemotron,profile=single,seed=20,topk=1)",
                          "moe(hidden=256,inter=128,m=13,model=qwen3,profile=uniform,scale_dir=multiply,seed=21)"};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) snprintf(names[n++], KP_CASE_NAME_MAX, "%s", more[i]);
    int64_t with_unused = 0;
    for (int c = 0; c < n; c++) {
        moe_in in = load(names[c], 0);
        with_unused += in.unused_experts > 0;
        double *host[2] = {host_reference(&in, 0, NULL), host_reference(&in, 1, NULL)}, *dev[2], *grouped[2];
        cr_assert(memcmp(host[0], host[1], sizeof *host[0] * (size_t)(in.mc.m * in.mc.hidden)),
                  "%s: bf16 activations moved nothing", names[c]);
        device_reference(names[c], &in, 2, KP_MOE_REF_CUDA_WEIGHTS, dev, NULL);
        assert_identical(names[c], "x", &in.mc, host[0], dev[0]);
        assert_identical(names[c], "x in bf16", &in.mc, host[1], dev[1]);
        device_reference(names[c], &in, 1, budget_for(&in.mc, 5), grouped, NULL);
        assert_identical(names[c], "x, groups of 5 experts", &in.mc, host[0], grouped[0]);
        free(host[0]), free(host[1]), free(dev[0]), free(dev[1]), free(grouped[0]);
        drop(&in);
    }
    cr_assert_geq(with_unused, 3, "cases with an expert no token routes to");
    fprintf(stderr, "test_gpu_moe_ref: %d host-shape cases identical, x and bf16 x, whole and in groups of 5\n", n);
}

/* Full shapes: the host reference on every core takes tens of seconds each, so two cases. */
Test(gpu_moe_ref, every_element_equals_the_hosts_for_full_shape_glm53_and_deepseek_v3) {
    const char *names[] = {"moe(m=800,model=glm53,profile=uniform,seed=1)", "moe(m=64,model=deepseek_v3,profile=uniform,seed=4)"};
    for (int c = 0; c < 2; c++) {
        moe_in in = load(names[c], 1);
        double th = 0, td = 0, *dev[2];
        double *host = host_reference(&in, 0, &th);
        device_reference(names[c], &in, 1, KP_MOE_REF_CUDA_WEIGHTS, dev, &td);
        assert_identical(names[c], "x", &in.mc, host, dev[0]);
        fprintf(stderr, "test_gpu_moe_ref: %s identical: host %.2f s on %d threads, device %.2f s\n", names[c], th,
                kp_thread_count(), td);
        free(host), free(dev[0]);
        drop(&in);
    }
}

/* The installed hook: kp_moe_reference's answer is the host's, and it says it came from the GPU, guarded. */
Test(gpu_moe_ref, the_installed_hook_gives_the_hosts_bits_and_says_where) {
    const char *name = "moe(hidden=256,inter=128,m=800,model=glm53,profile=hot,seed=7)";
    moe_in in = load(name, 0);
    double *host = host_reference(&in, 0, NULL), *got = malloc(sizeof *got * (size_t)(in.mc.m * in.mc.hidden));
    cr_assert(got);
    const char *where = NULL;
    kp_moe_ref_in r = ref_in(&in, 0);
    r.computed_on = &where;
    kp_error err = {0};
    kp_reference_cuda_install();
    cr_assert_eq(kp_moe_reference(&r, got, &err), 0, "%s", err.msg);
    kp_moe_reference_set_device(NULL);
    assert_identical(name, "through kp_moe_reference", &in.mc, host, got);
    cr_assert_str_eq(where, "cuda (host-identical; 3 guard rows checked on the host)");
    free(host), free(got);
    drop(&in);
}

#endif

/* kpt_gpu_main skips (77) in a build without the CUDA impls too */
int main(int argc, char *argv[]) { return kpt_gpu_main(argc, argv, "test_gpu_moe_ref", "moe.invariant@cuda"); }
