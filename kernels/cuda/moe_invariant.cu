/* moe_invariant.cu: moe.invariant@cuda, the candidate (kernels/moe_plan.h): token-order slots from a
 * stable counting sort, x and the intermediate in bf16, every GEMM output one f32 chain over all of K
 * in a fixed order times alpha in f32, the combine in f32 in slot order; one tile and one path for
 * every row count. The steps, tiling and workspace are moe_cuda.cuh's. */
#include "moe_cuda.cuh"

static const char *const invariant_name = "moe.invariant@cuda";

static size_t invariant_workspace_bytes(const void *args) { return moe_cuda_workspace_bytes(args, MOE_INVARIANT); }

static int invariant_supports(const void *args, char *message, size_t message_len) {
    return moe_cuda_check(invariant_name, args, message, message_len);
}

static int invariant_run(const void *args, char *message, size_t message_len) {
    return moe_cuda_run<MOE_INVARIANT>(invariant_name, args, message, message_len);
}

extern "C" {
extern const kp_impl kp_moe_invariant_cuda;
}

extern "C" const kp_impl kp_moe_invariant_cuda = {
    KP_ABI_VERSION, "moe", "moe.invariant@cuda", KP_MEMORY_CUDA,
    invariant_workspace_bytes, invariant_supports, invariant_run,
};
