/* moe_ref_hook.h: the CUDA build's moe reference, a kp_moe_reference_fn (reference/moe_ref.h): the rule computed on
 * the GPU (reference/cuda/moe_ref.cu) with the host's bits. Built only with CUDA (KP_HAVE_CUDA). */
#ifndef KP_MOE_REF_HOOK_H
#define KP_MOE_REF_HOOK_H

#include "../moe_ref.h"

/* 0; KP_EXIT_SKIP with no device (or no room), nothing written; KP_EXIT_ENV naming the CUDA call that failed. */
int kp_moe_reference_cuda(const kp_moe_ref_in *in, int sets, const float *const x[], double *const out[], kp_error *err);
/* The same with a weight budget of weight_bytes a group of experts (tests: groups of a few experts). */
int kp_moe_reference_cuda_in(size_t weight_bytes, const kp_moe_ref_in *in, int sets, const float *const x[],
                             double *const out[], kp_error *err);

#endif
