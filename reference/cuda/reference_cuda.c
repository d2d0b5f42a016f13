/* reference_cuda.c: the table of the families' device references (kp_reference_cuda.h): each family whose reference
 * the GPU computes faster, with the host's bits, and the hook its reference file calls. */
#include "kp_reference_cuda.h"

#include "moe_ref_hook.h"

void kp_reference_cuda_install(void) {
    kp_moe_reference_set_device(kp_moe_reference_cuda); /* moe's float64 reference: reference/cuda/moe_ref.cu */
}
