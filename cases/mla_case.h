/* mla_case.h: the mla family's case fields, index profiles and seeded generation of sparse MLA decode inputs: q, a
 * paged KV cache in bf16 or `fp8_ds_mla`, top-k indices with -1 holes (DESIGN.md "mla", families.md §D and §E3).
 *
 * Fields: batch (requests), seed, profile; optional s_q (query rows a request, 1..4, default 1), h_q (64 or 128,
 * default 128), topk (a multiple of 64, default 2048), s_kv (tokens a request, default 4096), page (tokens a page,
 * default 64), cache (`fp8_ds_mla`, default, or `bf16`), scale (`raw`, default: f32 amax / 448 as vLLM writes it,
 * or `pow2`: 2^ceil(log2(max(amax / 448, 1e-4))) as FlashMLA's test quantizer; fp8_ds_mla only), topk_length (`off`,
 * default, `on`: a length per query row, or `request`: one per request, its first row's, the same for each of its
 * s_q rows, as FlashMLA's decode interface takes it), sink (`off`, default, `on`, or `inf`: some heads' sinks +inf
 * or -inf, as FlashMLA's tests do) and sm_scale (default 0.135234, DeepSeek-V3.2's).
 *
 * Tensors (row = request * s_q + i, i the request's query position; P = ceil(s_kv / page) pages a request):
 *   q            bf16 [batch * s_q, h_q, 576]       0.5 z, rounded to bf16 (nearest even).
 *   indices      int32 [batch * s_q, topk]           token positions in the row's request, in [0, s_kv), or -1.
 *   topk_length  int32 [batch * s_q]                 with topk_length=on or request: slot j of a row counts only when
 *                                                    j < topk_length (FlashMLA's prefill rule and its decode tests');
 *                                                    with request, a request's rows hold its first row's length
 *                                                    (the indices are the same as with on).
 *   page_table   int32 [batch, P]                    request r's logical page p lives in physical page
 *                                                    r * P + perm_r(p), perm_r a seeded permutation of [0, P).
 *   cache        [batch * P, page, 656] bytes (fp8_ds_mla) or bf16 [batch * P, page, 576] (bf16): token t of
 *                request r at physical page page_table[r][t / page], slot t % page.
 *   kv           bf16 [batch * P, page, 576]          the values before quantization, laid out as the cache (what
 *                                                    the model wrote; the bf16 cache holds exactly these).
 *   attn_sink    f32 [h_q]                           with sink=on or inf.
 * A fp8_ds_mla token: bytes [0, 512) the e4m3 codes of the 512 NoPE values, [512, 528) four f32 tile scales (one per
 * 128 values, little-endian), [528, 656) the 64 RoPE values in bf16. Code c of tile k is e4m3(kv_c / scale_k), nearest
 * even, saturating at 448; scale_k = fmaxf(amax_k / 448, FLT_MIN) in f32 (raw: a power of two only where amax_k is
 * 7 * 2^j, about 1 tile in 100), or the power of two above (pow2).
 * Values: z = ((h0 + h1 + h2 + h3 + 2) / 65536 - 2) * sqrt(3) from the four 16-bit halves of two draws: Irwin-Hall(4),
 * sd 1, |z| < 3.47. kv value c of a token = z * gain_c * m_t: m_t = 0.5 + 0.5 u per token, gain_c = {1, 0.25, 0.5,
 * 0.75}[c / 128] * (0.75 + 0.25 u_c) for NoPE, 0.75 + 0.25 u_c for RoPE, one gain per channel for the case: every
 * 128-value tile has its own amax (scales differ across tiles and tokens) and no value's sd exceeds 1, the scale of
 * FlashMLA's N(0, 1) test data that its decode tolerances were set on (mla/v1's x2 tile put 0.1-0.4% of out past them).
 * A score's sd at the default sm_scale is about 0.8. A sink is 8 + 2 z (near a full row's lse); with
 * sink=inf a head's sink is +inf or -inf with probability 1/4 each.
 * Tokens that no counted slot of their request references (and slots past s_kv in the last page) hold NaN: bf16
 * KP_MLA_NAN_BF16 in kv, the bf16 cache and the RoPE part, e4m3 0x7f codes and f32 KP_MLA_NAN_F32 scales; an impl that
 * reads one is caught (families.md §E3, as FlashMLA's decode tests fill unused KV).
 * Index profiles (row i of a request draws from its causal window [0, s_kv - s_q + i + 1); distinct picks, as many
 * as fit, by a partial Fisher-Yates; positions past them -1):
 *   uniform  topk distinct tokens in random order.
 *   holes    uniform, then each slot -1 with probability 1/4.
 *   invalid  every slot -1: out 0 and lse +inf.
 *   dup      uniform, then each slot j >= 1 with probability 1/4, and the last valid one always, repeats the token
 *            of an earlier slot: duplicates count twice.
 *   short    only the first n slots valid, n in [1, topk): rows shorter than topk (topk_length = n when on).
 *   mixed    rows cycle uniform, holes, invalid, dup, short by row index.
 * Elsewhere topk_length is uniform in [0, topk]: it cuts valid slots (and 0 empties a row).
 * Every value comes from raw Philox draws (kp_rng) with + - * / only, each tensor at its own slot and each request
 * (or row) at its own offset in it, so request r is the same whatever the batch; kv draws are per logical token,
 * so a token's values do not depend on page or the permutation. */
#ifndef KP_MLA_CASE_H
#define KP_MLA_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "kp_case.h"

#define KP_MLA_GENERATOR_VERSION "mla/v2"

#define KP_MLA_D_QK 576   /* 512 NoPE + 64 RoPE (absorbed MQA, one KV head) */
#define KP_MLA_D_V 512    /* V is the first 512 columns of the cache */
#define KP_MLA_D_NOPE 512
#define KP_MLA_D_ROPE 64
#define KP_MLA_TILE 128   /* NoPE values sharing one fp8_ds_mla scale */
#define KP_MLA_TOPK_BLOCK 64
#define KP_MLA_FP8_TOKEN_BYTES 656
#define KP_MLA_FP8_SCALES_AT 512
#define KP_MLA_FP8_ROPE_AT 528
#define KP_MLA_BF16_TOKEN_BYTES (2 * KP_MLA_D_QK)
#define KP_MLA_NAN_BF16 0x7fdeu     /* unreferenced tokens, bf16 */
#define KP_MLA_NAN_F32 0x7fc0deadu  /* unreferenced tokens' scales (the topk padding's NaN) */

typedef enum kp_mla_profile {
    KP_MLA_UNIFORM = 0,
    KP_MLA_HOLES,
    KP_MLA_INVALID,
    KP_MLA_DUP,
    KP_MLA_SHORT,
    KP_MLA_MIXED,
    KP_MLA_PROFILE_COUNT
} kp_mla_profile;

typedef enum kp_mla_cache_format { KP_MLA_FP8_DS_MLA = 0, KP_MLA_BF16 } kp_mla_cache_format;
typedef enum kp_mla_scale_kind { KP_MLA_SCALE_RAW = 0, KP_MLA_SCALE_POW2 } kp_mla_scale_kind;
typedef enum kp_mla_sink { KP_MLA_SINK_OFF = 0, KP_MLA_SINK_ON, KP_MLA_SINK_INF } kp_mla_sink;
/* Whether a topk_length array comes with the indices (non-zero), and whether per row or per request. */
typedef enum kp_mla_topk_length {
    KP_MLA_TOPK_LENGTH_OFF = 0,
    KP_MLA_TOPK_LENGTH_ROW,    /* `on`: drawn per query row */
    KP_MLA_TOPK_LENGTH_REQUEST /* `request`: one per request, repeated over its s_q rows */
} kp_mla_topk_length;

typedef struct kp_mla_case {
    int64_t batch, s_q, h_q, topk, s_kv, page;
    uint64_t seed;
    kp_mla_profile profile;
    kp_mla_cache_format cache;
    kp_mla_scale_kind scale; /* raw for a bf16 cache (unused) */
    kp_mla_topk_length topk_length; /* non-zero: a topk_length array comes with the indices */
    kp_mla_sink sink;
    double sm_scale; /* as written in the name; kernels taking f32 use (float)sm_scale */
} kp_mla_case;

/* Sizes for n requests (n = batch for the case itself). */
typedef struct kp_mla_sizes {
    int64_t rows;              /* n * s_q: rows of q, indices and topk_length */
    int64_t pages_per_request; /* P = ceil(s_kv / page) */
    int64_t pages;             /* n * P */
    int64_t token_bytes;       /* 656 (fp8_ds_mla) or 1152 (bf16) */
    size_t q_bytes, indices_bytes, topk_length_bytes, page_table_bytes, cache_bytes, kv_bytes, sink_bytes;
} kp_mla_sizes;

/* Where generation writes; a NULL member is not made (topk_length is made only with topk_length=on). */
typedef struct kp_mla_buffers {
    uint16_t *q;          /* [n * s_q, h_q, 576] bf16 bits */
    int32_t *indices;     /* [n * s_q, topk] */
    int32_t *topk_length; /* [n * s_q] */
    int32_t *page_table;  /* [n, P]: global physical page ids, r * P + perm_r(p) */
    void *cache;          /* [n * P, page, token_bytes]: physical pages [first * P, (first + n) * P), the first at 0 */
    uint16_t *kv;         /* [n * P, page, 576] bf16 bits, laid out as cache */
} kp_mla_buffers;

/* mla's row of the case-family table (cases/case_families.c). */
extern const kp_case_family kp_mla_case_family;
/* Decode a case (normalized or not) from mla's field table (kp_case_decode): errors name the field. */
static inline int kp_mla_case_read(const kp_case *c, kp_mla_case *out, kp_error *err) {
    return kp_case_decode(c, &kp_mla_case_family, out, err);
}
/* A normalized mla case's typed fields, decoded once by kp_case_normalize. */
static inline const kp_mla_case *kp_mla_case_of(const kp_case *c) { return kp_case_fields(c, &kp_mla_case_family); }
void kp_mla_case_sizes(const kp_mla_case *mc, int64_t n, kp_mla_sizes *out);
/* Requests [first, first + n) into out (requests past mc->batch are valid too: a batch probe's extra ones). */
int kp_mla_case_requests(const kp_mla_case *mc, int64_t first, int64_t n, const kp_mla_buffers *out, kp_error *err);
/* attn_sink [h_q] (all 0 with sink=off). */
int kp_mla_case_sink(const kp_mla_case *mc, float *sink, kp_error *err);

/* The exact values of one cache token (fp8_ds_mla: e4m3 value times its f32 scale, exact in float64; bf16: the
 * value), [576]; NaN for an unreferenced token. */
void kp_mla_token_values(kp_mla_cache_format format, const void *token, double *out);
/* kp_e4m3_quantize's code for x (nearest, ties to the even code, saturating at 448), computed from x's bits:
 * the table search costs 40 ns a value, too slow for a cache of millions (test_cases_mla checks they agree). */
uint8_t kp_mla_e4m3_code(float x);

/* A token position of request r's row (index, -1 for none) as a slot of the whole cache: physical page * page +
 * offset, the form FlashMLA's decode kernel takes (indices_in_kvcache); -1 stays -1. */
static inline int64_t kp_mla_cache_slot(const kp_mla_case *mc, const int32_t *page_table_row, int32_t index) {
    return index < 0 ? -1 : (int64_t)page_table_row[index / mc->page] * mc->page + index % mc->page;
}
/* Every row's token positions [rows, topk] as cache slots (kp_mla_cache_slot, each request's row of the page table
 * [requests, pages_per_request]): the indices the impls take. */
static inline void kp_mla_case_slots(const kp_mla_case *mc, int64_t rows, int64_t pages_per_request, const int32_t *pages,
                                     const int32_t *positions, int32_t *slots) {
    for (int64_t row = 0; row < rows; row++)
        for (int64_t j = 0; j < mc->topk; j++)
            slots[row * mc->topk + j] = (int32_t)kp_mla_cache_slot(mc, pages + (row / mc->s_q) * pages_per_request,
                                                                   positions[row * mc->topk + j]);
}

#endif
