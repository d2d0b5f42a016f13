/* kp_registry.h: every impl kparity can run, built in or loaded from a plugin, found by name.
 * Roles (incumbent, candidate) come from the gate config, never from here. */
#ifndef KP_REGISTRY_H
#define KP_REGISTRY_H

#include "../cases/kp_common.h"
#include "kparity_kernel.h"

/* Built-in host impls (kernels/host/). */
extern const kp_impl kp_topp_split_logit_host;
extern const kp_impl kp_topp_split_prob_host;
extern const kp_impl kp_topk_radix_buffer_host;
extern const kp_impl kp_topk_radix_exact_host;
extern const kp_impl kp_moe_marlin_like_host;
extern const kp_impl kp_moe_marlin_gemv32_host;
extern const kp_impl kp_moe_invariant_host;
extern const kp_impl kp_mla_split_count_host;
extern const kp_impl kp_mla_split_size_host;
#ifdef KP_HAVE_CUDA
/* Built-in CUDA impls (kernels/cuda/). */
extern const kp_impl kp_topp_split_logit_cuda;
extern const kp_impl kp_topp_split_prob_cuda;
extern const kp_impl kp_topk_radix_buffer_cuda;
extern const kp_impl kp_topk_radix_exact_cuda;
extern const kp_impl kp_moe_marlin_like_cuda;
extern const kp_impl kp_moe_marlin_gemv32_cuda;
extern const kp_impl kp_moe_invariant_cuda;
extern const kp_impl kp_mla_split_count_cuda;
extern const kp_impl kp_mla_split_size_cuda;
extern const kp_impl kp_mla_split_size_wg_cuda; /* kernels/cuda/sm90a/: refuses all but compute capability 9.0 */
#endif

/* The number of registered impls, and the i-th. */
int kp_impl_count(void);
const kp_impl *kp_impl_at(int i);
/* The impl with this exact name, or NULL. */
const kp_impl *kp_impl_find(const char *name);
/* The plugin file an impl came from (NULL for built-ins) and that file's SHA-256 (hex). */
const char *kp_impl_origin(const kp_impl *impl, const char **sha256_hex);

/* Load a plugin (a shared library exporting kparity_impls), check every entry's ABI, family and
 * name, and register its impls. Exit class 2 naming the path and the field on any mismatch. */
int kp_plugin_load(const char *path, kp_error *err);
/* The same, for a plugin whose SHA-256 (hex) is pinned: a file with another digest is refused before
 * dlopen, so none of its code (constructors included) runs; one that changes during the load is refused
 * after it. pin NULL: kp_plugin_load. */
int kp_plugin_load_pinned(const char *path, const char *pin, kp_error *err);

/* Register an impl that stands for outputs made outside kparity (`kparity judge`): origin names the files and
 * sha256_hex is its identity (recorded where a plugin's digest would be). Its name must be new. */
int kp_impl_register_judged(const kp_impl *impl, const char *origin, const char *sha256_hex, kp_error *err);
/* The same for an impl whose runs kparity hands to something outside it (an exec program): judged 0, and its runs
 * are runs like any impl's. */
int kp_impl_register_outside(const kp_impl *impl, const char *origin, const char *sha256_hex, int judged, kp_error *err);
/* Whether impl was registered by kp_impl_register_judged: its runs serve given outputs and refuse row sets it was
 * given none for, which a batch check records as not given rather than as a failed run. */
int kp_impl_is_judged(const kp_impl *impl);

/* Outputs an impl does not produce (FlashMLA's decode has no max_logits): declared once, before any run, and
 * honoured by every check, which leaves the output out and says so instead of judging a stand-in. The registry
 * keeps the names only: kp_family_declare_absent (harness/kp_harness.h) checks the name is an output of the
 * impl's family first, and is what a config or command line should call. KP_EXIT_USAGE for an empty or overlong
 * name (at most 63 bytes), KP_EXIT_ENV out of memory; declaring a name twice is one declaration. */
int kp_impl_declare_absent(const kp_impl *impl, const char *output_name, kp_error *err);
/* Whether impl declared output_name absent (0 for NULL arguments). */
int kp_impl_output_absent(const kp_impl *impl, const char *output_name);

/* Whether this build has CUDA impls compiled in. */
int kp_registry_has_cuda(void);

#endif
