/* moe_gen_cuda.h: moe's expert weights made on a CUDA device with the host generator's bytes (cases/moe_case.c
 * is the definition; moe_gen.cu the kernels), and the device's pieces alone for tests/test_gpu_moe_gen.c.
 * Plain C and C++: no kparity header, whose C11 _Noreturn is not C++; moe_gen_hook.c adapts it to a kp_moe_case. */
#ifndef KP_MOE_GEN_CUDA_H
#define KP_MOE_GEN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The device scratch the generator allocates at most: experts go through it in groups. */
#define KP_MOE_GEN_CUDA_SCRATCH ((size_t)1 << 30)

/* kp_moe_gen_cuda_experts's statuses. */
enum {
    KP_MOE_GEN_CUDA_OK = 0,
    KP_MOE_GEN_CUDA_NO_DEVICE, /* no driver, no device, or the device refuses a context: nothing was touched */
    KP_MOE_GEN_CUDA_NO_ROOM,   /* one expert is larger than the scratch, or the device has not that much free */
    KP_MOE_GEN_CUDA_FAILED     /* a CUDA or cuRAND call failed: msg names it */
};

/* Experts [e0, e0 + experts) of one case: what kp_moe_case_experts is given, in plain numbers. */
typedef struct kp_moe_gen_job {
    int64_t w13_rows, hidden, inter, experts;
    uint64_t seed, offset;  /* offset: kp_moe_case_weight_offset(mc, e0) */
    double scale13, scale2; /* kp_moe_weight_scale(hidden), kp_moe_weight_scale(inter) */
    int multiply;           /* the global scale stored as amax / 2688 (KP_NVFP4_MULTIPLY), else 2688 / amax */
    int device;             /* the CUDA device to run on */
    size_t scratch_bytes;   /* the most device memory to take (KP_MOE_GEN_CUDA_SCRATCH) */
    /* host outputs, laid out as kp_moe_case_experts lays them out */
    uint8_t *w13, *s13, *w2, *s2; /* [experts, w13_rows, hidden / 2], [.., hidden / 16], [experts, hidden, inter / 2], [.., inter / 16] */
    float *g13, *g2;              /* [experts] each */
} kp_moe_gen_job;

int kp_moe_gen_cuda_experts(const kp_moe_gen_job *job, char *msg, size_t msg_len);
/* Experts a group holds in `scratch_bytes` (0: not one fits). */
int64_t kp_moe_gen_cuda_group(int64_t w13_rows, int64_t hidden, int64_t inter, size_t scratch_bytes);

/* The device's pieces, for tests; each returns a cudaError_t, 0 on success, on the legacy stream. Inputs i of
 * [0, n) are first + i. */
int kp_moe_gen_cuda_e2m1(uint32_t first, uint32_t n, uint8_t *dev_codes); /* codes of the f32 bit patterns */
int kp_moe_gen_cuda_e4m3(uint32_t first, uint32_t n, uint8_t *dev_codes); /* likewise, E4M3 */
int kp_moe_gen_cuda_weights(uint32_t first, uint32_t n, double scale, float *dev_weights); /* draws to weights */
/* n raw draws at offset from the generator kp_moe_gen_cuda_experts draws with, into host memory: a
 * KP_MOE_GEN_CUDA_* status, msg filled when it is not OK. */
int kp_moe_gen_cuda_draws(uint64_t seed, uint64_t offset, size_t n, uint32_t *draws, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif

#endif
