/* moe_ref.h: the float64 reference for the NVFP4 MoE (DESIGN.md "moe"), written from the rule, never
 * from an impl: for each row t and slot j with e = ids[t, j], h = W13_e x_t, a = silu(gate) * up (or
 * relu(up)^2), y = W2_e a, and out[t] = sum over j ascending of weights[t, j] * y.
 * Weights are the NVFP4 codes times their E4M3 scales, exactly (cases/kp_nvfp4.h); the global scale is
 * applied to each dot product in float64 (divided or multiplied, as the case declares). Activations and
 * routing weights are read as the f32 inputs are, unrounded. exp is kp_exp_det and every sum is in a
 * fixed order (4 lanes over K, then the lanes in order), so the digest is the same on every machine. */
#ifndef KP_MOE_REF_H
#define KP_MOE_REF_H

#include <stdint.h>

#include "../cases/kp_common.h"
#include "../cases/moe_case.h"

/* A case's tensors, as cases/moe_case.h lays them out (weights of expert e at e times its size). */
typedef struct kp_moe_ref_in {
    const kp_moe_case *mc;
    int64_t rows;
    const float *x;       /* [rows, hidden] */
    const int32_t *ids;   /* [rows, topk] */
    const float *weights; /* [rows, topk] */
    const uint8_t *w13, *s13, *w2, *s2;
    const float *g13, *g2;
    /* optional: where the reference was computed, a static string ("host", "cuda (host-identical; ...)") */
    const char **computed_on;
} kp_moe_ref_in;

/* out [rows, hidden]. Experts and blocks of weight rows run in parallel (kp_parallel_for).
 * KP_EXIT_USAGE for an id outside [0, experts); KP_EXIT_ENV when memory runs out. */
int kp_moe_reference(const kp_moe_ref_in *in, double *out, kp_error *err);
/* kp_moe_reference on in->x into out and on x2 ([rows, hidden], e.g. x rounded to bf16) into out2 in one call (the
 * host dequantizes each weight block once for both; a device reference gets both sets): each output bit for bit what
 * kp_moe_reference gives on its activations alone. */
int kp_moe_reference_x2(const kp_moe_ref_in *in, const float *x2, double *out, double *out2, kp_error *err);
/* Host bytes either call needs besides its inputs and outputs (an upper bound). */
double kp_moe_reference_bytes(const kp_moe_case *mc, int64_t rows);

/* A faster computation of the same rule with the host's bits (the CUDA build's GPU: reference/cuda/moe_ref.cu), on
 * `sets` (1 or 2) activation arrays x[s] ([rows, hidden] each; in->x is not read) into out[s]. Returns 0; KP_EXIT_SKIP
 * when it cannot run here (no device, too little device memory) with err untouched, the host then computing; or an
 * error class with err filled. */
typedef int (*kp_moe_reference_fn)(const kp_moe_ref_in *in, int sets, const float *const x[], double *const out[],
                                   kp_error *err);
/* Make kp_moe_reference use fn (NULL: the host only). Set once at startup, before any reference. Every call is then
 * guarded: KP_MOE_REF_GUARD_ROWS rows (0, rows / 2, rows - 1) are computed on the host too (a row depends on its own
 * token alone), and should one differ by a bit, a warning goes to stderr and the host computes everything. */
void kp_moe_reference_set_device(kp_moe_reference_fn fn);
#define KP_MOE_REF_GUARD_ROWS 3
/* The guard's rows of a batch of `rows`, ascending and distinct, into at[]: how many. */
int kp_moe_reference_guard_rows(int64_t rows, int64_t at[KP_MOE_REF_GUARD_ROWS]);

#endif
