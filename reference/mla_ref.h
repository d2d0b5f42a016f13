/* mla_ref.h: the float64 reference for sparse MLA decode (DESIGN.md "mla", families.md §D), written from the rule,
 * never from an impl. For query row `row` (buffer request r = row / s_q) and head h, over the row's counted slots j
 * (indices[row][j] != -1 and, when the case has topk_length, j < topk_length[row]), ascending:
 *   k_j = the 576 values of token t_j = indices[row][j] of request r (through the page table), v_j = its first 512;
 *   s_j = sm_scale * (q[row, h, :] . k_j)         (sm_scale the case's double; q's bf16 read exactly)
 *   M = max_j s_j,  L = sum_j exp(s_j - M)
 *   max_logits = M,  lse = M + ln(L)              (natural log; the sink is not part of lse: FlashMLA's decode and
 *                                                  its tests/ref.py return the lse of the scores alone)
 *   out = sum_j exp(s_j - M) v_j / (L + exp(sink_h - M))   with a sink (families.md §D5: o_scale = 1/(L + exp(sink -
 *                                                  M)), ref.py's out * 1/(1 + exp(sink - lse))): the sink adds
 *                                                  exp(sink) to the denominator and no value. A sink of -inf adds
 *                                                  nothing; +inf makes out 0 (lse and max_logits stay those of the
 *                                                  scores).
 *   A row with no counted slot: out 0, lse +inf, max_logits -inf (whatever the sink); exp(-inf - -inf) is never
 *   computed. A duplicated index counts once per slot (twice for two slots). topk_length applies as in FlashMLA's
 *   decode tests and prefill rule (a slot at or past it does not count); -1 is the only invalid index (§D3): any
 *   other index outside [0, s_kv), in any slot, is refused (KP_EXIT_USAGE, naming row and slot) before anything is
 *   read, as is a page id outside the buffers.
 * Values: `cache` dequantized exactly (kp_mla_token_values: e4m3 times its f32 scale, unrounded; bf16 as is), or
 * `kv`, the bf16 values before quantization; each asked for separately, both in one call when both are asked.
 * exp is kp_exp_det and ln kp_log_det (kp_detmath.h), dot products run in 4 lanes (k mod 4) added in order, and every sum
 * over slots is in ascending j, so the bits are the same on every machine and every thread count. */
#ifndef KP_MLA_REF_H
#define KP_MLA_REF_H

#include <stdint.h>

#include "../cases/kp_common.h"
#include "../cases/mla_case.h"

/* A case's tensors for requests [first, first + rows / s_q), as kp_mla_case_requests lays them out. */
typedef struct kp_mla_ref_in {
    const kp_mla_case *mc;
    int64_t first;              /* the global index of the buffers' first request (page ids are global) */
    int64_t rows;               /* n * s_q */
    const uint16_t *q;          /* [rows, h_q, 576] bf16 bits */
    const int32_t *indices;     /* [rows, topk] */
    const int32_t *topk_length; /* [rows]; required when mc->topk_length, unused otherwise */
    const int32_t *page_table;  /* [n, P] global physical page ids; page g at buffer page g - first * P */
    const void *cache;          /* [n * P, page, token_bytes] in mc->cache's format; required for the cache result */
    const uint16_t *kv;         /* [n * P, page, 576] bf16 bits; required for the kv result */
    const float *sink;          /* [h_q]; required when mc->sink != KP_MLA_SINK_OFF, unused otherwise */
} kp_mla_ref_in;

/* One computation's outputs; out NULL: not asked (then lse and max_logits are unused too). */
typedef struct kp_mla_ref_result {
    double *out;        /* [rows, h_q, 512] */
    double *lse;        /* [rows, h_q], natural log */
    double *max_logits; /* [rows, h_q] */
} kp_mla_ref_result;

typedef struct kp_mla_ref_out {
    kp_mla_ref_result cache; /* on the dequantized cache: what impls are checked against */
    kp_mla_ref_result kv;    /* on the values before quantization: the quantization error, reported */
} kp_mla_ref_out;

/* Items of (row, 16 heads) run in parallel (kp_parallel_for); the bits do not depend on the thread count.
 * KP_EXIT_USAGE for an invalid index, topk_length or page id, a missing input, or nothing asked; KP_EXIT_ENV when
 * memory runs out. */
int kp_mla_reference(const kp_mla_ref_in *in, const kp_mla_ref_out *out, kp_error *err);
/* Host bytes kp_mla_reference needs besides its inputs and outputs. */
double kp_mla_reference_bytes(const kp_mla_case *mc, int64_t rows);

#endif
