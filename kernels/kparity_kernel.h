/* kparity_kernel.h: the public C ABI (v1) between kparity and any implementation of a family.
 * Self-contained on purpose: an outside project includes this file alone to build a plugin. */
#ifndef KPARITY_KERNEL_H
#define KPARITY_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KP_ABI_VERSION 1u

/* What run() and supports() return. Anything else is treated as KP_RUN_FAILED. */
enum {
    KP_RUN_OK = 0,
    KP_RUN_NOT_SUPPORTED = 1, /* the impl refuses this shape; says why in the message */
    KP_RUN_FAILED = 2         /* launch or runtime error; says which call in the message */
};

/* Where an impl's pointers live. */
typedef enum kp_memory { KP_MEMORY_HOST = 0, KP_MEMORY_CUDA = 1 } kp_memory;

/* topp: split top-p filter (DESIGN.md "topp").
 * Dropped tokens become -inf; kept tokens are copied bit for bit. Elements in [vocab, row_stride)
 * of out are not part of the output and must not be written. */
typedef struct kp_topp_args {
    const float *logits;  /* [batch, row_stride], f32, row-major; row_stride >= vocab */
    float *out;           /* [batch, row_stride], f32 */
    const float *top_p;   /* [batch], f32, 0 < top_p; top_p >= 1 keeps every finite token */
    int64_t batch;
    int64_t vocab;
    int64_t row_stride;   /* in elements */
    void *stream;         /* cudaStream_t for KP_MEMORY_CUDA impls, NULL for host impls */
    void *workspace;      /* workspace_bytes() bytes, same memory as the tensors, may be NULL if 0 */
    size_t workspace_bytes;
    int32_t sm_count;     /* multiprocessors of the device (CUDA impls); 0 for host impls */
} kp_topp_args;

/* topk: indexer top-k (DESIGN.md "topk"). Per row r, over its window [starts[r], ends[r]) of scores row
 * r, the count = min(k, window length) largest scores in the total order (value descending, then index
 * ascending; -0 and +0 are one value; NaN below every number): their indices (relative to the row, or
 * to starts[r] when index_base is KP_TOPK_BASE_WINDOW) and their values, bit for bit, in the first
 * count entries of the row's output, in the impl's order; entries [count, k) hold `fill` and -inf. */
enum { KP_TOPK_BASE_ROW = 0, KP_TOPK_BASE_WINDOW = 1 };
typedef struct kp_topk_args {
    const float *scores;   /* [rows, row_stride], f32; row_stride >= width */
    const int32_t *starts; /* [rows]: 0 <= starts[r] <= ends[r] <= width */
    const int32_t *ends;   /* [rows] */
    int32_t *indices;      /* [rows, k], int32 */
    float *values;         /* [rows, k], f32 */
    int64_t rows;
    int64_t width;
    int64_t row_stride;    /* in elements */
    int32_t k;
    int32_t index_base;    /* KP_TOPK_BASE_ROW or KP_TOPK_BASE_WINDOW */
    int32_t fill;          /* the index of an unused entry: -1 or INT32_MAX */
    int32_t sm_count;      /* multiprocessors of the device (CUDA impls); 0 for host impls */
    void *stream;          /* cudaStream_t for KP_MEMORY_CUDA impls, NULL for host impls */
    void *workspace;       /* workspace_bytes() bytes, same memory as the tensors, may be NULL if 0 */
    size_t workspace_bytes;
} kp_topk_args;

/* One implementation. `args` points at the family's argument struct (kp_topp_args for "topp",
 * kp_topk_args for "topk").
 * run() must be callable repeatedly on the same args; it may return before the device finishes
 * (the harness synchronizes the stream). `message` receives a one-line reason on refusal or failure. */
typedef struct kp_impl {
    uint32_t abi;         /* KP_ABI_VERSION */
    const char *family;   /* "topp", "moe", "topk", "mla" */
    const char *name;     /* "family.algorithm@device", e.g. "topp.split_prob@cuda" */
    kp_memory memory;     /* where args' pointers must live */
    size_t (*workspace_bytes)(const void *args);
    int (*supports)(const void *args, char *message, size_t message_len);
    int (*run)(const void *args, char *message, size_t message_len);
} kp_impl;

/* A plugin is a shared library exporting this symbol; the array lives as long as the library. */
typedef const kp_impl *(*kp_plugin_entry)(int *count);
#define KP_PLUGIN_ENTRY_NAME "kparity_impls"

#ifdef __cplusplus
}
#endif

#endif
