/* moe_gen_hook.h: the CUDA build's moe expert generator, a kp_moe_experts_fn (cases/moe_case.h): experts made on
 * the GPU (cases/cuda/moe_gen.cu) with the host generator's bytes. Built only with CUDA (KP_HAVE_CUDA). */
#ifndef KP_MOE_GEN_HOOK_H
#define KP_MOE_GEN_HOOK_H

#include "../moe_case.h"

/* Experts [e0, e0 + ne) on the device: 0; KP_EXIT_SKIP with no device (or no room), nothing written; KP_EXIT_ENV
 * naming the CUDA or cuRAND call that failed. */
int kp_moe_experts_cuda(const kp_moe_case *mc, int64_t e0, int64_t ne, uint8_t *w13, uint8_t *s13, float *g13,
                        uint8_t *w2, uint8_t *s2, float *g2, kp_error *err);
/* The same through a scratch of scratch_bytes (tests: groups of a few experts), the output's pages touched first over
 * every core or not (kp_moe_experts_cuda does: tests time both). */
int kp_moe_experts_cuda_in(size_t scratch_bytes, int touch, const kp_moe_case *mc, int64_t e0, int64_t ne, uint8_t *w13,
                           uint8_t *s13, float *g13, uint8_t *w2, uint8_t *s2, float *g2, kp_error *err);

#endif
