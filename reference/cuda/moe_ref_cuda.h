/* moe_ref_cuda.h: moe's float64 reference computed on a CUDA device with the host's bits (reference/moe_ref.c is the
 * definition; moe_ref.cu the kernels). Plain C and C++: no kparity header, whose C11 _Noreturn is not C++;
 * moe_ref_hook.c adapts it to a kp_moe_ref_in. */
#ifndef KP_MOE_REF_CUDA_H
#define KP_MOE_REF_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most device memory one group of experts' weights takes: experts go through it in groups. */
#define KP_MOE_REF_CUDA_WEIGHTS ((size_t)2 << 30)

enum {
    KP_MOE_REF_CUDA_OK = 0,
    KP_MOE_REF_CUDA_NO_DEVICE, /* no driver, no device, or the device refuses a context: nothing was written */
    KP_MOE_REF_CUDA_NO_ROOM,   /* one expert is larger than the weight budget, or the device has not the memory */
    KP_MOE_REF_CUDA_FAILED     /* a CUDA call failed: msg names it */
};

/* One reference: what kp_moe_reference is given, in plain numbers, on sets (1 or 2) activation arrays. */
typedef struct kp_moe_ref_cuda_job {
    int64_t rows, hidden, inter, experts, topk;
    int gated;            /* SiLU(gate) * up, else relu(up)^2 */
    int multiply;         /* the global scale multiplies (KP_NVFP4_MULTIPLY), else divides */
    int sets;             /* 1 or 2 */
    int device;           /* the CUDA device to run on */
    size_t weight_bytes;  /* the most device memory a group of experts' weights takes (KP_MOE_REF_CUDA_WEIGHTS) */
    const float *x[2];    /* [rows, hidden] each */
    const int32_t *ids;   /* [rows, topk], each in [0, experts) (the caller checked) */
    const float *weights; /* [rows, topk] */
    const uint8_t *w13, *s13, *w2, *s2; /* as cases/moe_case.h lays them out */
    const float *g13, *g2;              /* [experts] each */
    const double *e2m1;   /* [16]: kp_e2m1_value of each code, widened */
    const double *e4m3;   /* [256]: kp_e4m3_value of each scale byte, widened */
    double *out[2];       /* [rows, hidden] each, host memory */
} kp_moe_ref_cuda_job;

int kp_moe_ref_cuda(const kp_moe_ref_cuda_job *job, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif

#endif
