/* moe_ref_hook.c: the CUDA build's moe reference (kp_moe_reference_fn, installed by reference_cuda.c): a reference's
 * inputs handed to moe_ref.cu, its statuses turned into kparity's exit classes. */
#include "moe_ref_hook.h"

#include <stdio.h>
#include <stdlib.h>

#include "../../cases/kp_nvfp4.h"
#include "moe_ref_cuda.h"

int kp_moe_reference_cuda_in(size_t weight_bytes, const kp_moe_ref_in *in, int sets, const float *const x[],
                             double *const out[], kp_error *err) {
    const kp_moe_case *mc = in->mc;
    const char *device = getenv("KPARITY_DEVICE"); /* the device kp_device_init runs the impls on */
    double e2m1[16], e4m3[256]; /* the host's decoders, so the device's values are theirs by construction */
    for (int c = 0; c < 16; c++) e2m1[c] = (double)kp_e2m1_value((uint8_t)c);
    for (int c = 0; c < 256; c++) e4m3[c] = (double)kp_e4m3_value((uint8_t)c);
    kp_moe_ref_cuda_job job = {.rows = in->rows, .hidden = mc->hidden, .inter = mc->inter, .experts = mc->experts,
                               .topk = mc->topk, .gated = mc->gated, .multiply = mc->scale_dir == KP_NVFP4_MULTIPLY,
                               .sets = sets, .device = device ? atoi(device) : 0, .weight_bytes = weight_bytes,
                               .ids = in->ids, .weights = in->weights, .w13 = in->w13, .s13 = in->s13, .w2 = in->w2,
                               .s2 = in->s2, .g13 = in->g13, .g2 = in->g2, .e2m1 = e2m1, .e4m3 = e4m3};
    if (sets < 1 || sets > 2) return kp_fail(err, KP_EXIT_USAGE, "moe reference on the GPU: %d activation sets", sets);
    for (int s = 0; s < sets; s++) job.x[s] = x[s], job.out[s] = out[s];
    char msg[512];
    switch (kp_moe_ref_cuda(&job, msg, sizeof msg)) {
    case KP_MOE_REF_CUDA_OK: return 0;
    case KP_MOE_REF_CUDA_NO_DEVICE: return KP_EXIT_SKIP; /* a machine without a GPU: the host's path, silently */
    case KP_MOE_REF_CUDA_NO_ROOM:
        fprintf(stderr, "kparity: note: moe reference (hidden %lld, inter %lld, %lld rows) computed on the host: an "
                "expert does not fit the device reference's %zu-byte weight budget or the device has not the memory\n",
                (long long)mc->hidden, (long long)mc->inter, (long long)in->rows, weight_bytes);
        return KP_EXIT_SKIP;
    default:
        return kp_fail(err, KP_EXIT_ENV, "moe reference on the GPU: %s. Hint: the host computes the same bits; "
                       "CUDA_VISIBLE_DEVICES= runs it (and hides the GPU from the CUDA impls too)", msg);
    }
}

int kp_moe_reference_cuda(const kp_moe_ref_in *in, int sets, const float *const x[], double *const out[], kp_error *err) {
    return kp_moe_reference_cuda_in(KP_MOE_REF_CUDA_WEIGHTS, in, sets, x, out, err);
}
