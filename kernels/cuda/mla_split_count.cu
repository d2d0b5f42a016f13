/* mla_split_count.cu: mla.split_count@cuda, the incumbent: FlashMLA's SM90 sparse decode scheduler
 * (kernels/mla_plan.h, kp_mla_split_count_plan over num_sm_parts from the device's or args->sm_count
 * multiprocessors), so a request's split count, and with it its bits, depend on the whole batch. The
 * kernels, numerics and workspace are mla_cuda.cuh's. */
#include "mla_cuda.cuh"

static const char *const split_count_name = "mla.split_count@cuda";

static size_t split_count_workspace_bytes(const void *args) { return mla_cuda_workspace_bytes(args, MLA_SPLIT_COUNT); }

static int split_count_supports(const void *args, char *message, size_t message_len) {
    return mla_cuda_check(split_count_name, args, message, message_len);
}

static int split_count_run(const void *args, char *message, size_t message_len) {
    return mla_cuda_run<MLA_SPLIT_COUNT>(split_count_name, args, message, message_len);
}

extern "C" {
extern const kp_impl kp_mla_split_count_cuda;
}

extern "C" const kp_impl kp_mla_split_count_cuda = {
    KP_ABI_VERSION, "mla", "mla.split_count@cuda", KP_MEMORY_CUDA,
    split_count_workspace_bytes, split_count_supports, split_count_run,
};
