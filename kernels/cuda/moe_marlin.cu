/* moe_marlin.cu: moe.marlin_like@cuda, the incumbent's defect model (vLLM's Marlin MoE, families.md
 * §B1, kernels/moe_plan.h), and moe.marlin_gemv32@cuda, the same with gllm's f32 path for experts of at
 * most KP_MOE_GEMV_ROWS rows. Slots from atomicAdd arrival over many CTAs (rows * topk >= 1024 or more
 * than 64 experts), else token order; each f32 sum cut into partials at marlin's stream-K points for
 * the row's block and added in order; bf16 epilogues; the bf16 or f32 sum over slots. The GEMMs run on
 * the candidate's tensor-core core (moe_gemm.cuh, through moe_cuda.cuh), with the cuts replayed in one CTA per tile rather
 * than spread over stream-K CTAs, so the two compare like with like. */
#include "moe_cuda.cuh"

static const char *const marlin_name = "moe.marlin_like@cuda";
static const char *const gemv_name = "moe.marlin_gemv32@cuda";

static size_t marlin_workspace_bytes(const void *args) { return moe_cuda_workspace_bytes(args, MOE_MARLIN); }
static size_t gemv_workspace_bytes(const void *args) { return moe_cuda_workspace_bytes(args, MOE_MARLIN_GEMV); }

static int marlin_supports(const void *args, char *message, size_t message_len) {
    return moe_cuda_check(marlin_name, args, message, message_len);
}
static int gemv_supports(const void *args, char *message, size_t message_len) {
    return moe_cuda_check(gemv_name, args, message, message_len);
}

static int marlin_run(const void *args, char *message, size_t message_len) {
    return moe_cuda_run<MOE_MARLIN>(marlin_name, args, message, message_len);
}
static int gemv_run(const void *args, char *message, size_t message_len) {
    return moe_cuda_run<MOE_MARLIN_GEMV>(gemv_name, args, message, message_len);
}

extern "C" {
extern const kp_impl kp_moe_marlin_like_cuda;
extern const kp_impl kp_moe_marlin_gemv32_cuda;
}

extern "C" const kp_impl kp_moe_marlin_like_cuda = {
    KP_ABI_VERSION, "moe", "moe.marlin_like@cuda", KP_MEMORY_CUDA,
    marlin_workspace_bytes, marlin_supports, marlin_run,
};
extern "C" const kp_impl kp_moe_marlin_gemv32_cuda = {
    KP_ABI_VERSION, "moe", "moe.marlin_gemv32@cuda", KP_MEMORY_CUDA,
    gemv_workspace_bytes, gemv_supports, gemv_run,
};
