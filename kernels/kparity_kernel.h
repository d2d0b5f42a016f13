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

/* moe: NVFP4 mixture of experts, W4A16 (DESIGN.md "moe"). For each row t and slot j < topk, with
 * e = ids[t, j]: h = W13_e x_t (W13_e = [gate; up] when gated), a = silu(gate) * up (gated) or
 * relu(up)^2, y = W2_e a, and out[t] = sum over j of weights[t, j] * y. Weights are NVFP4: packed E2M1
 * codes (element 2i in the low nibble of byte i), one E4M3 scale per 16 elements along K (linear
 * layout, [N, K / 16]), and one f32 global scale per expert and tensor, which dequantization divides
 * by (KP_MOE_SCALE_DIVIDE: stored as 2688 / amax) or multiplies by (KP_MOE_SCALE_MULTIPLY). The
 * precision an impl computes in is its own (the harness holds it to a tolerance), but it must say
 * where each routed pair went: slots[t, j] = the position of pair (t, j) among the rows the impl ran
 * for expert e (0 for the first), the token order a batch probe or a repeated run may change. */
enum { KP_MOE_SCALE_DIVIDE = 0, KP_MOE_SCALE_MULTIPLY = 1 };
typedef struct kp_moe_args {
    const float *x;         /* [rows, hidden] f32 activations */
    const int32_t *ids;     /* [rows, topk] experts, in [0, experts), distinct within a row */
    const float *weights;   /* [rows, topk] routing weights, f32 */
    const uint8_t *w13;     /* [experts, w13_rows, hidden / 2]; w13_rows = 2 inter (gated) or inter */
    const uint8_t *s13;     /* [experts, w13_rows, hidden / 16] E4M3 */
    const float *g13;       /* [experts] */
    const uint8_t *w2;      /* [experts, hidden, inter / 2] */
    const uint8_t *s2;      /* [experts, hidden, inter / 16] E4M3 */
    const float *g2;        /* [experts] */
    float *out;             /* [rows, hidden] f32 */
    int32_t *slots;         /* [rows, topk] int32 */
    int64_t rows;
    int64_t hidden;         /* a multiple of 16 */
    int64_t inter;          /* a multiple of 16 */
    int64_t experts;
    int32_t topk;
    int32_t gated;          /* 1: silu(gate) * up; 0: relu(up)^2 */
    int32_t scale_dir;      /* KP_MOE_SCALE_DIVIDE or KP_MOE_SCALE_MULTIPLY */
    int32_t sm_count;       /* multiprocessors of the device (CUDA impls); 0 for host impls */
    void *stream;           /* cudaStream_t for KP_MEMORY_CUDA impls, NULL for host impls */
    void *workspace;        /* workspace_bytes() bytes, same memory as the tensors, may be NULL if 0 */
    size_t workspace_bytes;
} kp_moe_args;

/* mla: sparse MLA attention, decode (DESIGN.md "mla"). For request b, query position i and head h, over
 * the counted slots j of row (b, i) (indices[b, i, j] != -1 and, when topk_length is given,
 * j < topk_length[b, i]): s_j = sm_scale * q[b, i, h] . K_j (576 values), K_j the cache token at slot
 * indices[b, i, j], V_j its first 512 values; out = sum_j softmax(s)_j V_j, the attention sink (when
 * given) adding exp(sink[h]) to the denominator; lse = ln(sum_j exp(s_j)) and max_logits = max_j s_j.
 * A row with no counted slot: out 0, lse +inf, max_logits -inf. Duplicate slots count twice. A slot of
 * -1 must never be read. Dim 0 of every batched tensor is the request, so a batch probe moves whole
 * requests. splits[b] says how many splits the impl cut request b's slots into (the order it worked in,
 * which a batch may change). */
enum { KP_MLA_CACHE_FP8_DS_MLA = 0, KP_MLA_CACHE_BF16 = 1 };
typedef struct kp_mla_args {
    const uint16_t *q;          /* [batch, s_q, h_q, 576] bf16 bits */
    const void *cache;          /* [slots, 656] bytes (fp8_ds_mla: 512 e4m3, 4 f32 tile scales, 64 bf16 RoPE)
                                   or [slots, 576] bf16 */
    const int32_t *indices;     /* [batch, s_q, topk]: cache slots in [0, slots), or -1 */
    const int32_t *topk_length; /* [batch, s_q], or NULL */
    const float *attn_sink;     /* [h_q], or NULL */
    uint16_t *out;              /* [batch, s_q, h_q, 512] bf16 bits */
    float *lse;                 /* [batch, s_q, h_q], natural log */
    float *max_logits;          /* [batch, s_q, h_q] */
    int32_t *splits;            /* [batch] */
    int64_t batch;
    int64_t s_q;
    int64_t h_q;                /* a multiple of 64 */
    int64_t topk;               /* a multiple of 64 */
    int64_t slots;              /* tokens the cache holds */
    int32_t cache_format;       /* KP_MLA_CACHE_FP8_DS_MLA or KP_MLA_CACHE_BF16 */
    float sm_scale;
    int32_t sm_count;           /* multiprocessors of the device (CUDA impls); 0 for host impls */
    void *stream;               /* cudaStream_t for KP_MEMORY_CUDA impls, NULL for host impls */
    void *workspace;            /* workspace_bytes() bytes, same memory as the tensors, may be NULL if 0 */
    size_t workspace_bytes;
} kp_mla_args;

/* One implementation. `args` points at the family's argument struct (kp_topp_args for "topp",
 * kp_topk_args for "topk", kp_moe_args for "moe", kp_mla_args for "mla").
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
