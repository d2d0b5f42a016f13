/* mla_split_size_wg.cu: mla.split_size_wg@cuda, split_size's plan and combine (mla_cuda.cuh) around a warpgroup-MMA core
 * (mla_wg.cuh) with the dequantization overlapped with the matrix work. Built for sm_90a alone (wgmma and setmaxnreg
 * exist nowhere else), so it refuses any device but compute capability 9.0. */
#include "../mla_cuda.cuh"
#include "../mla_wg.cuh"

static const char *const split_size_wg_name = "mla.split_size_wg@cuda";

static size_t split_size_wg_workspace_bytes(const void *args) { return mla_cuda_workspace_bytes(args, MLA_SPLIT_SIZE); }

static int split_size_wg_supports(const void *args, char *message, size_t message_len) {
    const int rc = mla_cuda_check(split_size_wg_name, args, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    int device = 0, major = 0, minor = 0;
    KP_CUDA_CHECK(cudaGetDevice(&device));
    KP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    KP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major != 9 || minor != 0)
        return kp_cuda_fail_msg(message, message_len, KP_RUN_NOT_SUPPORTED,
                                "%s: built for sm_90a (wgmma), the device is compute capability %d.%d", split_size_wg_name,
                                major, minor);
    return KP_RUN_OK;
}

static int split_size_wg_run(const void *args, char *message, size_t message_len) {
    const int rc = split_size_wg_supports(args, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    return mla_cuda_run<MLA_SPLIT_SIZE, mla_core_wg>(split_size_wg_name, args, message, message_len);
}

extern "C" {
extern const kp_impl kp_mla_split_size_wg_cuda;
}

extern "C" const kp_impl kp_mla_split_size_wg_cuda = {
    KP_ABI_VERSION, "mla", "mla.split_size_wg@cuda", KP_MEMORY_CUDA,
    split_size_wg_workspace_bytes, split_size_wg_supports, split_size_wg_run,
};
