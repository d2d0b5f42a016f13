/* moe_case.h: the moe family's case fields, model shapes, routing profiles and seeded generation of
 * NVFP4 expert weights (cases/kp_nvfp4.h), activations and routing (DESIGN.md "moe", families.md §E1).
 *
 * Fields: model (glm53, qwen3, nemotron, glm47), m (rows), seed, profile; optional hidden and inter
 * (smaller sizes of the model's layer for host gates; multiples of 16), scale_dir (`divide`: the global
 * scale stored as 2688 / amax, or `multiply`: stored as amax / 2688).
 * Every value comes from raw Philox draws (kp_rng) with + - * / only, each tensor at its own slot:
 *   weights   expert e's W13 ([2 inter, hidden] gate then up, or [inter, hidden] for relu^2) and W2
 *             ([hidden, inter]) drawn as (u - 1/2) * sqrt(12 / K) (variance 1 / K, K = hidden, then inter, so
 *             outputs have one scale at any size: RMS about 0.1) and quantized to NVFP4 along their K (hidden,
 *             then inter), one global scale per expert and tensor;
 *   x         [m, hidden]: (u - 1/2) * 2 with the lowest mantissa bit set, so every activation has
 *             nonzero low 16 bits and rounding it to bf16 changes it;
 *   ids       [m, topk] distinct experts per row, by profile:
 *               uniform   topk experts drawn without replacement;
 *               hot       expert 0 in every row (> 32 and > 64 rows once m > 64), the rest uniform;
 *               straddle  experts 0, 1 and 2 in the first 31, 32 and 33 rows: their counts straddle 32;
 *               single    m = 1;
 *   weights   [m, topk] positive, normalized to sum 1 over a row, then each with its lowest mantissa bit
 *             set: not bf16-representable.
 * Row r of x, ids and weights is the same whatever m. */
#ifndef KP_MOE_CASE_H
#define KP_MOE_CASE_H

#include <stdint.h>

#include "kp_case.h"
#include "kp_nvfp4.h"

typedef enum kp_moe_profile { KP_MOE_UNIFORM = 0, KP_MOE_HOT, KP_MOE_STRADDLE, KP_MOE_SINGLE, KP_MOE_PROFILE_COUNT } kp_moe_profile;

typedef struct kp_moe_case {
    const char *model;
    int model_index; /* the model's preset in moe_case.c */
    int64_t hidden, inter, experts, topk, m;
    int gated; /* SiLU(gate) * up when 1, relu(up)^2 when 0 */
    uint64_t seed;
    kp_moe_profile profile;
    kp_nvfp4_scale_dir scale_dir;
} kp_moe_case;

#define KP_MOE_GENERATOR_VERSION "moe/v2"

/* moe's row of the case-family table (cases/case_families.c). */
extern const kp_case_family kp_moe_case_family;
/* Decode a case (normalized or not) from moe's field table (kp_case_decode): errors name the field. */
static inline int kp_moe_case_read(const kp_case *c, kp_moe_case *out, kp_error *err) {
    return kp_case_decode(c, &kp_moe_case_family, out, err);
}
/* A normalized moe case's typed fields, decoded once by kp_case_normalize. */
static inline const kp_moe_case *kp_moe_case_of(const kp_case *c) { return kp_case_fields(c, &kp_moe_case_family); }
/* Rows of W13 (2 inter when gated, else inter). */
int64_t kp_moe_w13_rows(const kp_moe_case *mc);
/* Expert e's quantized weights: w13 [w13_rows, hidden / 2] with scales [w13_rows, hidden / 16] and its
 * global scale, w2 [hidden, inter / 2] with scales [hidden, inter / 16] and its global scale. */
int kp_moe_case_expert(const kp_moe_case *mc, int64_t e, uint8_t *w13, uint8_t *s13, float *g13, uint8_t *w2,
                       uint8_t *s2, float *g2, kp_error *err);
/* Experts [e0, e0 + ne), each laid out as above, one after another (w13 + q * w13_rows * hidden / 2, ...). */
int kp_moe_case_experts(const kp_moe_case *mc, int64_t e0, int64_t ne, uint8_t *w13, uint8_t *s13, float *g13, uint8_t *w2,
                        uint8_t *s2, float *g2, kp_error *err);
/* The generator's definition, which any faster generator must reproduce bit for bit: expert e's draws begin at
 * Philox offset kp_moe_case_weight_offset(mc, e), W13's [w13_rows, hidden] then W2's [hidden, inter], and draw d
 * becomes the weight kp_moe_weight(d, kp_moe_weight_scale(K)), K = hidden for W13 and inter for W2, which
 * kp_nvfp4_quantize quantizes along K. */
uint64_t kp_moe_case_weight_offset(const kp_moe_case *mc, int64_t e);
double kp_moe_weight_scale(int64_t k);           /* sqrt(12 / k) in double */
float kp_moe_weight(uint32_t draw, double scale); /* (kp_unit(draw) - 0.5) * scale in double, rounded to f32 */
/* Draws in one group of experts kp_moe_case_all_experts hands a thread (its scratch: 4 bytes a draw). */
#define KP_MOE_GEN_DRAWS (8 << 20)
/* Every expert, as kp_moe_case_experts lays them out (g13 and g2: [experts] each): on the device generator when
 * one is set and can run here, else drawn in groups over kp_thread_count() threads (each expert draws from its own
 * offset, so any order gives the same bytes). A device generator's expert kp_moe_case_guard_expert(mc) is checked
 * against the host's; should it ever differ, a warning goes to stderr and the host generates every expert. */
int kp_moe_case_all_experts(const kp_moe_case *mc, uint8_t *w13, uint8_t *s13, float *g13, uint8_t *w2, uint8_t *s2,
                            float *g2, kp_error *err);
/* A generator of experts [e0, e0 + ne) as kp_moe_case_experts lays them out, with its bytes exactly (the CUDA build's:
 * cases/cuda/moe_gen.cu). Returns 0; KP_EXIT_SKIP when it cannot run here (no device, or too little device memory)
 * with err untouched, the host then generating; or an error class with err filled. */
typedef int (*kp_moe_experts_fn)(const kp_moe_case *mc, int64_t e0, int64_t ne, uint8_t *w13, uint8_t *s13, float *g13,
                                 uint8_t *w2, uint8_t *s2, float *g2, kp_error *err);
/* Make kp_moe_case_all_experts use fn (NULL: the host only). Set once at startup, before any generation. */
void kp_moe_case_set_device_generator(kp_moe_experts_fn fn);
/* The expert the guard regenerates on the host: seed mod experts, so cases check different ones. */
int64_t kp_moe_case_guard_expert(const kp_moe_case *mc);
/* Rows [first, first + n): x [n, hidden], ids [n, topk], weights [n, topk]. */
int kp_moe_case_rows(const kp_moe_case *mc, int64_t first, int64_t n, float *x, int32_t *ids, float *weights, kp_error *err);

#endif
