/* mla_split_size.cu: mla.split_size@cuda, the candidate: every request cut every KP_MLA_SPLIT_BLOCKS
 * (16) blocks of 64 slots whatever the batch (kernels/mla_plan.h), the splits combined in split order, so
 * a request's bits cannot depend on the batch. The kernels, numerics and workspace are mla_cuda.cuh's. */
#include "mla_cuda.cuh"

static const char *const split_size_name = "mla.split_size@cuda";

static size_t split_size_workspace_bytes(const void *args) { return mla_cuda_workspace_bytes(args, MLA_SPLIT_SIZE); }

static int split_size_supports(const void *args, char *message, size_t message_len) {
    return mla_cuda_check(split_size_name, args, message, message_len);
}

static int split_size_run(const void *args, char *message, size_t message_len) {
    return mla_cuda_run<MLA_SPLIT_SIZE>(split_size_name, args, message, message_len);
}

extern "C" {
extern const kp_impl kp_mla_split_size_cuda;
}

extern "C" const kp_impl kp_mla_split_size_cuda = {
    KP_ABI_VERSION, "mla", "mla.split_size@cuda", KP_MEMORY_CUDA,
    split_size_workspace_bytes, split_size_supports, split_size_run,
};
