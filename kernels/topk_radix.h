/* topk_radix.h: the indexer top-k algorithms shared by the host ports and the CUDA kernels, so both
 * devices run the same steps with the same constants (DESIGN.md "topk").
 *
 * Keys. Every score maps to a 32-bit key that orders like the total order's values: larger key, larger
 * value; -0 folds onto +0 (one value); NaN maps to 0, below -inf. A row's answer is the count =
 * min(k, len) entries first in (key descending, index ascending) over its window.
 *
 * radix_exact (candidate): the count-th largest key T by a 4-pass descent over the key's bytes, most
 * significant first (per pass a 256-bin histogram of the entries that share the digits found so far);
 * then every entry with key > T and the `need` lowest-index entries with key == T. The output lists
 * the selected indices in ascending index order: deterministic, and the same in any batch.
 *
 * radix_buffer (incumbent, modelled on vLLM's persistent_topk and SGLang's fast_topk_v2; the defects
 * are kept on purpose, each named in families.md §C):
 * - batch size dispatch: at most KP_TOPK_EXACT_MAX_ROWS rows take the exact 32-bit descent, more take
 *   the coarse path, so a row's answer depends on how many rows share the launch;
 * - coarse path: a 256-bin histogram of the top 8 bits of the score's fp16 key (every score in
 *   [1.0, 1.25) lands in one bin) finds the bin B holding the count-th entry; entries above B are
 *   selected, entries in B are appended to a candidate buffer of KP_TOPK_BUFFER_CAP entries in arrival
 *   order, and those arriving after it is full are dropped without a word; the rest of the count comes
 *   from the buffered entries by the exact descent;
 * - ties at the boundary are taken in arrival order, and the output is in arrival order: atomics on
 *   the GPU, a seeded arrival order in the host port (a new one each call), so repeated runs differ.
 */
#ifndef KP_TOPK_RADIX_H
#define KP_TOPK_RADIX_H

#include <stdint.h>
#include <string.h>

#include "kparity_kernel.h"

#if defined(__CUDACC__)
#define KP_TOPK_FN __host__ __device__ static inline
#else
#define KP_TOPK_FN static inline
#endif

#define KP_TOPK_EXACT_MAX_ROWS 32    /* radix_buffer: more rows than this take the coarse path */
#define KP_TOPK_BUFFER_CAP 16384     /* radix_buffer: candidate buffer entries (vllm#51782: 16384 clean, 16385 drops) */
#define KP_TOPK_MAX_K 8192           /* both impls refuse a larger k */

/* What both devices refuse, as a reason; NULL when the args can run. */
KP_TOPK_FN const char *kp_topk_args_problem(const kp_topk_args *a) {
    if (a->rows < 1 || a->width < 1 || a->width > INT32_MAX || a->row_stride < a->width) return "rows, width or row_stride";
    if (a->k < 1 || a->k > KP_TOPK_MAX_K) return "k outside [1, 8192]";
    if (a->fill != -1 && a->fill != INT32_MAX) return "fill is neither -1 nor INT32_MAX";
    if (a->index_base != KP_TOPK_BASE_ROW && a->index_base != KP_TOPK_BASE_WINDOW) return "index_base";
    return NULL;
}

KP_TOPK_FN uint32_t kp_topk_bits(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

/* The total order's key of a score. */
KP_TOPK_FN uint32_t kp_topk_key(float v) {
    uint32_t b = kp_topk_bits(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0; /* NaN: below every number */
    if (b == 0x80000000u) b = 0;                   /* -0 is +0 */
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* f32 -> fp16 bits, rounding to nearest even, in integer arithmetic (the host port and the kernels get
 * the same bits without relying on a half type). */
KP_TOPK_FN uint16_t kp_topk_f16_bits(float v) {
    const uint32_t b = kp_topk_bits(v), sign = (b >> 16) & 0x8000u, mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);      /* NaN */
    if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);     /* rounds to or past 65520: inf */
    if (mag < 0x38800000u) {                                       /* below 2^-14: subnormal or zero */
        if (mag < 0x33000000u) return (uint16_t)sign;              /* below 2^-25: rounds to zero */
        const uint32_t e = mag >> 23, m = (mag & 0x7fffffu) | 0x800000u, shift = 126u - e;
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((mag - 0x38000000u) >> 13); /* rebias 127 -> 15 */
    const uint32_t rem = mag & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* radix_buffer's coarse bin: the top 8 bits of the fp16 value's order key (NaN lowest). */
KP_TOPK_FN uint32_t kp_topk_coarse_bin(float v) {
    const uint32_t b = kp_topk_bits(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0;
    uint32_t h = kp_topk_f16_bits(v);
    if (h == 0x8000u) h = 0;
    const uint32_t key16 = (h & 0x8000u) ? (~h & 0xffffu) : (h | 0x8000u);
    return key16 >> 8;
}

/* The digit of pass p (0 = most significant byte) of a key. */
KP_TOPK_FN uint32_t kp_topk_digit(uint32_t key, int pass) { return (key >> (24 - 8 * pass)) & 0xffu; }

/* After a pass's histogram: the digit d (from 255 down) whose bin holds the need-th largest entry among
 * those matching so far; *above receives how many of them lie in bins above d. need >= 1 and the bins
 * hold at least need entries. */
KP_TOPK_FN uint32_t kp_topk_pick_digit(const uint32_t *hist, uint32_t need, uint32_t *above) {
    uint32_t sum = 0;
    for (int d = 255; d >= 0; d--) {
        if (sum + hist[d] >= need) {
            *above = sum;
            return (uint32_t)d;
        }
        sum += hist[d];
    }
    *above = sum;
    return 0;
}

#endif
