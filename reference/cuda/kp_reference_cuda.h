/* kp_reference_cuda.h: the CUDA build's references, which compute a family's reference on the GPU with the host's
 * bits, installed as the reference stage's hooks. Built only with CUDA (KP_HAVE_CUDA); the CLI installs them. */
#ifndef KP_REFERENCE_CUDA_H
#define KP_REFERENCE_CUDA_H

/* Set every family's device reference (reference_cuda.c lists them). Once, at startup, before any reference. */
void kp_reference_cuda_install(void);

#endif
