/* cases_cuda.c: the table of the families' device generators (kp_cases_cuda.h): each family whose inputs the GPU
 * makes faster, with the host's bytes, and the hook its case file calls. */
#include "kp_cases_cuda.h"

#include "moe_gen_hook.h"

void kp_cases_cuda_install(void) {
    kp_moe_case_set_device_generator(kp_moe_experts_cuda); /* expert weights: cases/cuda/moe_gen.cu */
}
