/* kp_cases_cuda.h: the CUDA build's generators, which make a family's inputs on the GPU with the host generator's
 * bytes, installed as the cases stage's hooks. Built only with CUDA (KP_HAVE_CUDA); the CLI installs them. */
#ifndef KP_CASES_CUDA_H
#define KP_CASES_CUDA_H

/* Set every family's device generator (cases_cuda.c lists them). Once, at startup, before any generation. */
void kp_cases_cuda_install(void);

#endif
