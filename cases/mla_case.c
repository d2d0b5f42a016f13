/* mla_case.c: mla fields, their canonical form, and the seeded generator of q, top-k indices, the page table and
 * the paged KV cache (bf16 or fp8_ds_mla). Built with -ffp-contract=off and no libm transcendental, so inputs are
 * bit-identical anywhere. */
#include "mla_case.h"

#include <float.h>
#include <math.h> /* fabsf and INFINITY: exact, like + - * / */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_nvfp4.h"
#include "kp_rng.h"

static const char *const profile_names[] = {"uniform", "holes", "invalid", "dup", "short", "mixed", NULL};
static const char *const cache_names[] = {"fp8_ds_mla", "bf16", NULL};
static const char *const scale_names[] = {"raw", "pow2", NULL};
static const char *const length_names[] = {"off", "on", "request", NULL}; /* kp_mla_topk_length's order */
static const char *const sink_names[] = {"off", "on", "inf", NULL};

/* Draws: each tensor its own slot (slot << 56), each request or row its own span in it. */
enum { SLOT_Q = 0, SLOT_INDEX = 1, SLOT_PAGES = 2, SLOT_KV = 3, SLOT_GAIN = 4, SLOT_SINK = 5 };
enum { TOKEN_DRAWS = 1 + 2 * KP_MLA_D_QK }; /* a token's magnitude, then two draws a value */
static uint64_t slot_offset(int slot, uint64_t at) { return ((uint64_t)slot << 56) + at; }
static int64_t index_draws(const kp_mla_case *mc) { return 3 * mc->topk + 2; } /* a row: picks, coins, sources, n, length */
static int64_t q_draws(const kp_mla_case *mc) { return mc->h_q * KP_MLA_D_QK * 2; }
static int64_t pages_per_request(const kp_mla_case *mc) { return (mc->s_kv + mc->page - 1) / mc->page; }

/* ---- fields --------------------------------------------------------------------------------- */

#define AT(member) KP_FIELD_AT(kp_mla_case, member)
static const kp_case_field fields[] = {
    {"batch", KP_FIELD_INT, AT(batch), .min = 1, .max = 4096, .help = "requests"},
    {"seed", KP_FIELD_UINT, AT(seed), .help = "the generator's seed"},
    {"profile", KP_FIELD_NAME, AT(profile), .names = profile_names, .help = "the top-k indices' shape (mla_case.h)"},
    {"s_q", KP_FIELD_INT, AT(s_q), .min = 1, .max = 4, .fallback = "1", .help = "query rows a request"},
    {"h_q", KP_FIELD_INT, AT(h_q), .min = 1, .max = 1024, .fallback = "128", .help = "query heads: 64 or 128"},
    {"topk", KP_FIELD_INT, AT(topk), .min = KP_MLA_TOPK_BLOCK, .max = 16384, .fallback = "2048",
     .help = "index slots a row, a multiple of 64"},
    {"s_kv", KP_FIELD_INT, AT(s_kv), .min = 1, .max = 1 << 20, .fallback = "4096", .help = "tokens a request, at least s_q"},
    {"page", KP_FIELD_INT, AT(page), .min = 1, .max = 1024, .fallback = "64",
     .help = "tokens a page (vLLM's FLASHMLA_SPARSE supports only 64)"},
    {"cache", KP_FIELD_NAME, AT(cache), .names = cache_names, .fallback = "fp8_ds_mla", .help = "the KV cache's format"},
    {"scale", KP_FIELD_NAME, AT(scale), .names = scale_names, .fallback = "raw", .when = "cache", .when_is = "fp8_ds_mla",
     .help = "tile scales: vLLM's f32 amax / 448 (raw) or FlashMLA's test quantizer's power of two (pow2)"},
    {"topk_length", KP_FIELD_NAME, AT(topk_length), .names = length_names, .fallback = "off",
     .help = "a length array with the indices: per row (on) or per request (request)"},
    {"sink", KP_FIELD_NAME, AT(sink), .names = sink_names, .fallback = "off", .help = "attention sinks, some infinite (inf)"},
    {"sm_scale", KP_FIELD_NUMBER, AT(sm_scale), .nmin = 0, .nmax = 1e30, .nmin_open = true, .fallback = "0.135234",
     .help = "the softmax scale (DeepSeek-V3.2's by default)"},
};
#undef AT

/* What the decode kernels take, and a causal window for every query row. */
static int check(void *fields_, kp_error *err) {
    const kp_mla_case *mc = fields_;
    if (mc->h_q != 64 && mc->h_q != 128)
        return kp_fail(err, KP_EXIT_USAGE, "case mla: field 'h_q': %lld is not 64 or 128 (the decode kernels' head counts; "
                       "vLLM pads a rank's heads to one of them)", (long long)mc->h_q);
    if (mc->topk % KP_MLA_TOPK_BLOCK)
        return kp_fail(err, KP_EXIT_USAGE, "case mla: field 'topk': %lld is not a multiple of 64 (the decode kernels' "
                       "TOPK_BLOCK_SIZE)", (long long)mc->topk);
    if (mc->s_kv < mc->s_q)
        return kp_fail(err, KP_EXIT_USAGE, "case mla: field 's_kv': %lld tokens are fewer than s_q %lld (query position i "
                       "sees tokens [0, s_kv - s_q + i + 1))", (long long)mc->s_kv, (long long)mc->s_q);
    return 0;
}

const kp_case_family kp_mla_case_family = {
    .name = "mla",
    .generator_version = KP_MLA_GENERATOR_VERSION,
    KP_CASE_FIELDS(fields, kp_mla_case),
    .check = check,
};

void kp_mla_case_sizes(const kp_mla_case *mc, int64_t n, kp_mla_sizes *out) {
    memset(out, 0, sizeof *out);
    out->rows = n * mc->s_q;
    out->pages_per_request = pages_per_request(mc);
    out->pages = n * out->pages_per_request;
    out->token_bytes = mc->cache == KP_MLA_FP8_DS_MLA ? KP_MLA_FP8_TOKEN_BYTES : KP_MLA_BF16_TOKEN_BYTES;
    out->q_bytes = (size_t)(out->rows * mc->h_q * KP_MLA_D_QK) * 2;
    out->indices_bytes = (size_t)(out->rows * mc->topk) * sizeof(int32_t);
    out->topk_length_bytes = mc->topk_length ? (size_t)out->rows * sizeof(int32_t) : 0;
    out->page_table_bytes = (size_t)out->pages * sizeof(int32_t);
    out->cache_bytes = (size_t)(out->pages * mc->page) * (size_t)out->token_bytes;
    out->kv_bytes = (size_t)(out->pages * mc->page) * KP_MLA_BF16_TOKEN_BYTES;
    out->sink_bytes = mc->sink ? (size_t)mc->h_q * sizeof(float) : 0;
}

/* ---- formats -------------------------------------------------------------------------------- */

static float f32_of(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}
static uint16_t bf16_round(float v) { /* to nearest even, v finite */
    uint32_t b = bits_of(v);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}
static float bf16_value(uint16_t h) { return f32_of((uint32_t)h << 16); }

uint8_t kp_mla_e4m3_code(float x) {
    const uint32_t bits = bits_of(x), sign = (bits >> 24) & 0x80u, mag = bits & 0x7fffffffu;
    if (mag > 0x7f800000u) return 0x7f;                 /* NaN */
    if (mag >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* |x| >= 448: saturate */
    if (mag < 0x3c800000u) { /* |x| < 2^-6: subnormal steps of 2^-9; adding 2^23 rounds to an integer, ties to even */
        const float steps = f32_of(mag) * 512.0f; /* exact: a power of two */
        return (uint8_t)(sign | (uint32_t)((steps + 8388608.0f) - 8388608.0f)); /* 8 is 2^-6, code 0x08: contiguous */
    }
    /* normal: round the f32 mantissa to 3 bits at bit 20, ties to even; a carry moves into the exponent, whose bias
       is 127 in f32 and 7 in e4m3 */
    const uint32_t code = ((mag + 0x7ffffu + ((mag >> 20) & 1u)) >> 20) - (120u << 3);
    return (uint8_t)(sign | (code > 0x7eu ? 0x7eu : code));
}

/* A tile's scale from its amax: vLLM's raw f32 (fmaxf(amax / 448, FLT_MIN)), or FlashMLA's test quantizer's power of
 * two, 2^ceil(log2(max(amax / 448, 1e-4))), taken from the bits (the next power of two up unless one already). */
static float tile_scale(float amax, kp_mla_scale_kind kind) {
    float s = amax / 448.0f;
    if (kind == KP_MLA_SCALE_RAW) return s > FLT_MIN ? s : FLT_MIN;
    if (s < 1e-4f) s = 1e-4f;
    uint32_t b = bits_of(s);
    if (b & 0x7fffffu) b = (b & 0xff800000u) + 0x800000u;
    return f32_of(b);
}

/* One token's 576 bf16 values into its fp8_ds_mla bytes. */
static void encode_fp8(const uint16_t *v, kp_mla_scale_kind kind, uint8_t *token) {
    for (int k = 0; k < KP_MLA_D_NOPE / KP_MLA_TILE; k++) {
        const uint16_t *tile = v + k * KP_MLA_TILE;
        float amax = 0.0f;
        for (int i = 0; i < KP_MLA_TILE; i++) {
            const float a = fabsf(bf16_value(tile[i]));
            if (a > amax) amax = a;
        }
        const float scale = tile_scale(amax, kind);
        memcpy(token + KP_MLA_FP8_SCALES_AT + 4 * k, &scale, sizeof scale); /* hosts are little-endian (kp_tensor.c) */
        for (int i = 0; i < KP_MLA_TILE; i++) token[k * KP_MLA_TILE + i] = kp_mla_e4m3_code(bf16_value(tile[i]) / scale);
    }
    memcpy(token + KP_MLA_FP8_ROPE_AT, v + KP_MLA_D_NOPE, 2 * KP_MLA_D_ROPE);
}

/* An unreferenced token: NaN everywhere an impl could read it. */
static void nan_token(kp_mla_cache_format format, uint8_t *token, uint16_t *kv) {
    for (int c = 0; kv && c < KP_MLA_D_QK; c++) kv[c] = KP_MLA_NAN_BF16;
    if (!token) return;
    const uint16_t nan16 = KP_MLA_NAN_BF16;
    if (format == KP_MLA_BF16) {
        for (int c = 0; c < KP_MLA_D_QK; c++) memcpy(token + 2 * c, &nan16, 2);
        return;
    }
    const uint32_t nan32 = KP_MLA_NAN_F32;
    memset(token, 0x7f, KP_MLA_D_NOPE);
    for (int k = 0; k < 4; k++) memcpy(token + KP_MLA_FP8_SCALES_AT + 4 * k, &nan32, 4);
    for (int j = 0; j < KP_MLA_D_ROPE; j++) memcpy(token + KP_MLA_FP8_ROPE_AT + 2 * j, &nan16, 2);
}

void kp_mla_token_values(kp_mla_cache_format format, const void *token, double *out) {
    const uint8_t *b = token;
    uint16_t h;
    if (format == KP_MLA_BF16) {
        for (int c = 0; c < KP_MLA_D_QK; c++) memcpy(&h, b + 2 * c, 2), out[c] = bf16_value(h);
        return;
    }
    for (int k = 0; k < KP_MLA_D_NOPE / KP_MLA_TILE; k++) {
        float scale;
        memcpy(&scale, b + KP_MLA_FP8_SCALES_AT + 4 * k, sizeof scale);
        /* kp_e4m3_value with its branches made selects between the same values, so the loop vectorizes (the
           reference decodes every token it reads this way); 4 significant bits times 24: exact in float64 */
        for (int i = 0; i < KP_MLA_TILE; i++) {
            const uint32_t code = b[k * KP_MLA_TILE + i], e = (code >> 3) & 15u, m = code & 7u;
            const float sub = (float)(int32_t)m / 512.0f; /* e == 0: m / 8 * 2^-6 */
            uint32_t sub_bits;
            memcpy(&sub_bits, &sub, sizeof sub_bits);
            const uint32_t is_sub = 0u - (uint32_t)(e == 0), is_nan = 0u - (uint32_t)(e == 15u && m == 7u);
            uint32_t bits = (sub_bits & is_sub) | ((((e + 120u) << 23) | (m << 20)) & ~is_sub);
            bits = (0x7fc00000u & is_nan) | (bits & ~is_nan);
            const float v = f32_of(bits ^ (((code & 0x80u) << 24) & ~is_nan)); /* NaN unsigned, as returned */
            out[k * KP_MLA_TILE + i] = (double)v * (double)scale;
        }
    }
    for (int j = 0; j < KP_MLA_D_ROPE; j++)
        memcpy(&h, b + KP_MLA_FP8_ROPE_AT + 2 * j, 2), out[KP_MLA_D_NOPE + j] = bf16_value(h);
}

/* ---- generation ----------------------------------------------------------------------------- */

/* Irwin-Hall(4) from the four 16-bit halves of two draws, centred and scaled to sd 1: |z| < 3.47. */
static double irwin_hall(uint32_t d0, uint32_t d1) {
    const uint32_t sum = (d0 & 0xffffu) + (d0 >> 16) + (d1 & 0xffffu) + (d1 >> 16);
    return (((double)sum + 2.0) / 65536.0 - 2.0) * 1.7320508075688772; /* sqrt(3) */
}

static kp_mla_profile row_kind(const kp_mla_case *mc, int64_t row) {
    static const kp_mla_profile cycle[] = {KP_MLA_UNIFORM, KP_MLA_HOLES, KP_MLA_INVALID, KP_MLA_DUP, KP_MLA_SHORT};
    return mc->profile == KP_MLA_MIXED ? cycle[row % 5] : mc->profile;
}

/* Row `row`'s indices [topk] and topk_length from its draws d [3 topk + 2]. Picks are a partial Fisher-Yates over
 * perm (the identity on entry and on return) within the row's causal window. */
static void index_row(const kp_mla_case *mc, int64_t row, const uint32_t *d, int32_t *perm, int32_t *idx, int32_t *length) {
    const int64_t K = mc->topk, window = mc->s_kv - mc->s_q + row % mc->s_q + 1;
    const kp_mla_profile kind = row_kind(mc, row);
    int64_t picks = K < window ? K : window;
    if (kind == KP_MLA_SHORT) picks = 1 + kp_index(d[3 * K], picks - 1); /* [1, topk): shorter than topk */
    if (kind == KP_MLA_INVALID) picks = 0;
    for (int64_t j = 0; j < picks; j++) {
        const int64_t at = j + kp_index(d[j], window - j);
        const int32_t t = perm[j];
        perm[j] = perm[at], perm[at] = t;
        idx[j] = perm[j];
    }
    for (int64_t j = picks - 1; j >= 0; j--) { /* undo the swaps, so perm is the identity again */
        const int64_t at = j + kp_index(d[j], window - j);
        const int32_t t = perm[j];
        perm[j] = perm[at], perm[at] = t;
    }
    for (int64_t j = picks; j < K; j++) idx[j] = -1;
    if (kind == KP_MLA_HOLES)
        for (int64_t j = 0; j < picks; j++)
            if (d[K + j] < (1u << 30)) idx[j] = -1;
    if (kind == KP_MLA_DUP)
        for (int64_t j = 1; j < picks; j++)
            if (d[K + j] < (1u << 30) || j == picks - 1) idx[j] = idx[kp_index(d[2 * K + j], j)];
    *length = (int32_t)(kind == KP_MLA_SHORT ? picks : kp_index(d[3 * K + 1], K + 1));
}

/* Requests [a, a + m) into out, whose pointers are at request a. */
static int gen_block(const kp_mla_case *mc, const kp_mla_buffers *out, const double *gain, int64_t a, int64_t m,
                     kp_error *err) {
    const int64_t S = mc->s_q, K = mc->topk, T = mc->s_kv, page = mc->page, P = pages_per_request(mc);
    const int64_t span = index_draws(mc), qspan = q_draws(mc), chunk = 1024; /* tokens a cuRAND call */
    const int want_kv = out->kv || out->cache, want_idx = out->indices || out->topk_length || want_kv;
    const int64_t token_bytes = mc->cache == KP_MLA_FP8_DS_MLA ? KP_MLA_FP8_TOKEN_BYTES : KP_MLA_BF16_TOKEN_BYTES;
    int64_t most = want_idx ? S * span : 0; /* the largest read: the draw buffer's size */
    if (out->page_table || want_kv) most = P > most ? P : most;
    if (out->q) most = qspan > most ? qspan : most;
    if (want_kv) most = chunk * TOKEN_DRAWS > most ? chunk * TOKEN_DRAWS : most;
    /* what the caller did not ask for but the cache needs is made in scratch (own_*) */
    const int scratch_len = want_idx && !(mc->topk_length && out->topk_length);
    int32_t *own_idx = want_idx && !out->indices ? kp_calloc((size_t)(m * S * K), sizeof(int32_t), "mla indices", err) : NULL;
    int32_t *own_len = scratch_len ? kp_calloc((size_t)(m * S), sizeof(int32_t), "mla lengths", err) : NULL;
    int32_t *own_pages = want_kv && !out->page_table ? kp_calloc((size_t)(m * P), sizeof(int32_t), "mla pages", err) : NULL;
    int32_t *idx = out->indices ? out->indices : own_idx, *len = own_len ? own_len : out->topk_length;
    int32_t *pages = out->page_table ? out->page_table : own_pages;
    uint8_t *referenced = want_kv ? kp_calloc((size_t)(m * T), 1, "mla referenced tokens", err) : NULL;
    int32_t *perm = want_idx || pages ? kp_calloc((size_t)(T > P ? T : P), sizeof *perm, "mla permutation", err) : NULL;
    uint32_t *d = kp_calloc((size_t)most, sizeof *d, "mla draws", err);
    int rc = !d || (want_idx && (!idx || !len)) || (want_kv && (!pages || !referenced)) || ((want_idx || pages) && !perm)
                 ? err->code
                 : 0;
    kp_rng rng;
    if (!rc) rc = kp_rng_open(&rng, mc->seed, err);
    const int opened = rc == 0;
    for (int64_t t = 0; perm && t < (T > P ? T : P); t++) perm[t] = (int32_t)t;

    /* indices and lengths, row by row; the tokens their counted slots reference */
    if (!rc && want_idx) rc = kp_rng_seek(&rng, slot_offset(SLOT_INDEX, (uint64_t)(a * S * span)), err);
    for (int64_t k = 0; !rc && want_idx && k < m; k++) {
        if ((rc = kp_rng_next(&rng, d, (size_t)(S * span), err))) break;
        for (int64_t i = 0; i < S; i++) index_row(mc, (a + k) * S + i, d + i * span, perm, idx + (k * S + i) * K, len + k * S + i);
        /* one length a request (FlashMLA's decode interface): its first row's, for each of its rows */
        for (int64_t i = 1; mc->topk_length == KP_MLA_TOPK_LENGTH_REQUEST && i < S; i++) len[k * S + i] = len[k * S];
        for (int64_t i = 0; i < S; i++) {
            const int64_t r = k * S + i;
            const int64_t counted = mc->topk_length ? len[r] : K;
            for (int64_t j = 0; referenced && j < counted; j++)
                if (idx[r * K + j] >= 0) referenced[k * T + idx[r * K + j]] = 1;
        }
    }
    /* the page table: request r's pages are physical pages [r P, (r + 1) P), in a seeded order (full Fisher-Yates) */
    if (!rc && pages) rc = kp_rng_seek(&rng, slot_offset(SLOT_PAGES, (uint64_t)(a * P)), err);
    for (int64_t k = 0; !rc && pages && k < m; k++) {
        if ((rc = kp_rng_next(&rng, d, (size_t)P, err))) break;
        for (int64_t p = 0; p < P; p++) perm[p] = (int32_t)p;
        for (int64_t p = 0; p < P; p++) {
            const int64_t at = p + kp_index(d[p], P - p);
            const int32_t t = perm[p];
            perm[p] = perm[at], perm[at] = t;
            pages[k * P + p] = (int32_t)((a + k) * P + perm[p]);
        }
        for (int64_t p = 0; p < P; p++) perm[p] = (int32_t)p;
    }
    /* q, row by row */
    if (!rc && out->q) rc = kp_rng_seek(&rng, slot_offset(SLOT_Q, (uint64_t)(a * S * qspan)), err);
    for (int64_t r = 0; !rc && out->q && r < m * S; r++) {
        if ((rc = kp_rng_next(&rng, d, (size_t)qspan, err))) break;
        uint16_t *q = out->q + r * mc->h_q * KP_MLA_D_QK;
        for (int64_t e = 0; e < mc->h_q * KP_MLA_D_QK; e++)
            q[e] = bf16_round((float)(0.5 * irwin_hall(d[2 * e], d[2 * e + 1])));
    }
    /* the cache: logical tokens in order, chunk by chunk (draws run on across requests), each to its physical slot */
    if (!rc && want_kv) rc = kp_rng_seek(&rng, slot_offset(SLOT_KV, (uint64_t)(a * T * TOKEN_DRAWS)), err);
    for (int64_t k = 0; !rc && want_kv && k < m; k++) {
        uint16_t v[KP_MLA_D_QK];
        for (int64_t t0 = 0, nt; !rc && t0 < P * page; t0 += nt) {
            nt = t0 >= T ? P * page - t0 : (T - t0 < chunk ? T - t0 : chunk); /* past T (the last page's rest): no draws */
            if (t0 < T && (rc = kp_rng_next(&rng, d, (size_t)(nt * TOKEN_DRAWS), err))) break;
            for (int64_t t = t0; t < t0 + nt; t++) {
                const int64_t slot = (pages[k * P + t / page] - a * P) * page + t % page; /* from request a's first page */
                uint16_t *kv = out->kv ? out->kv + slot * KP_MLA_D_QK : NULL;
                uint8_t *token = out->cache ? (uint8_t *)out->cache + slot * token_bytes : NULL;
                if (t >= T || !referenced[k * T + t]) {
                    nan_token(mc->cache, token, kv);
                    continue;
                }
                const uint32_t *td = d + (t - t0) * TOKEN_DRAWS;
                const double magnitude = 0.5 + 0.5 * kp_unit(td[0]);
                for (int c = 0; c < KP_MLA_D_QK; c++)
                    v[c] = bf16_round((float)(irwin_hall(td[1 + 2 * c], td[2 + 2 * c]) * gain[c] * magnitude));
                if (kv) memcpy(kv, v, sizeof v);
                if (token && mc->cache == KP_MLA_BF16) memcpy(token, v, sizeof v);
                if (token && mc->cache == KP_MLA_FP8_DS_MLA) encode_fp8(v, mc->scale, token);
            }
        }
    }
    if (opened) kp_rng_close(&rng);
    free(own_idx), free(own_len), free(own_pages), free(d), free(referenced), free(perm);
    return rc;
}

typedef struct gen_job {
    const kp_mla_case *mc;
    const kp_mla_buffers *out;
    const double *gain;
    int64_t first, n, block;
    int failed;
    kp_error err;
} gen_job;

static void gen_worker(void *ctx, int64_t b) {
    gen_job *job = ctx;
    const kp_mla_case *mc = job->mc;
    const int64_t r0 = b * job->block, m = job->n - r0 < job->block ? job->n - r0 : job->block;
    kp_mla_sizes one;
    kp_mla_case_sizes(mc, 1, &one);
    const int64_t rows = r0 * mc->s_q, tokens = r0 * one.pages_per_request * mc->page; /* at request r0 of the call */
    const kp_mla_buffers *o = job->out;
    const kp_mla_buffers at = {
        .q = o->q ? o->q + rows * mc->h_q * KP_MLA_D_QK : NULL,
        .indices = o->indices ? o->indices + rows * mc->topk : NULL,
        .topk_length = o->topk_length && mc->topk_length ? o->topk_length + rows : NULL,
        .page_table = o->page_table ? o->page_table + r0 * one.pages_per_request : NULL,
        .cache = o->cache ? (uint8_t *)o->cache + tokens * one.token_bytes : NULL,
        .kv = o->kv ? o->kv + tokens * KP_MLA_D_QK : NULL,
    };
    kp_error err = {0};
    if (gen_block(mc, &at, job->gain, job->first + r0, m, &err) && !__atomic_exchange_n(&job->failed, 1, __ATOMIC_SEQ_CST))
        job->err = err;
}

/* The case's per-channel gains: a tile's gain, so every tile has its own amax, times 0.75 + 0.25 u: no
 * value's sd above 1, FlashMLA's test data's (mla_case.h). */
static int channel_gains(const kp_mla_case *mc, double *gain, kp_error *err) {
    static const double tile_gain[] = {1.0, 0.25, 0.5, 0.75, 1.0}; /* four NoPE tiles, then RoPE */
    uint32_t d[KP_MLA_D_QK];
    kp_rng rng;
    int rc = kp_rng_open(&rng, mc->seed, err);
    if (rc) return rc;
    rc = kp_rng_draw(&rng, slot_offset(SLOT_GAIN, 0), d, KP_MLA_D_QK, err);
    kp_rng_close(&rng);
    for (int c = 0; !rc && c < KP_MLA_D_QK; c++) gain[c] = tile_gain[c / KP_MLA_TILE] * (0.75 + 0.25 * kp_unit(d[c]));
    return rc;
}

int kp_mla_case_requests(const kp_mla_case *mc, int64_t first, int64_t n, const kp_mla_buffers *out, kp_error *err) {
    if (n <= 0) return 0;
    const uint64_t last = (uint64_t)(first + n); /* the farthest draw offset must stay inside its slot */
    if (first < 0 || last * (uint64_t)mc->s_kv * TOKEN_DRAWS >= (1ull << 56) ||
        last * (uint64_t)(mc->s_q * q_draws(mc)) >= (1ull << 56))
        return kp_fail(err, KP_EXIT_USAGE, "case mla: requests [%lld, %lld) lie past the generator's draw slots",
                       (long long)first, (long long)last);
    double gain[KP_MLA_D_QK];
    int rc = out->kv || out->cache ? channel_gains(mc, gain, err) : 0;
    if (rc) return rc;
    /* one block of requests per worker: a cuRAND host seek costs milliseconds, so seek as rarely as possible */
    const int64_t threads = kp_thread_count();
    gen_job job = {.mc = mc, .out = out, .gain = gain, .first = first, .n = n, .block = (n + threads - 1) / threads};
    kp_parallel_for((n + job.block - 1) / job.block, gen_worker, &job);
    if (job.failed) {
        *err = job.err;
        return err->code;
    }
    return 0;
}

int kp_mla_case_sink(const kp_mla_case *mc, float *sink, kp_error *err) {
    KP_ASSERT(mc->h_q <= 128);
    memset(sink, 0, sizeof *sink * (size_t)mc->h_q);
    if (mc->sink == KP_MLA_SINK_OFF) return 0;
    uint32_t d[3 * 128];
    kp_rng rng;
    int rc = kp_rng_open(&rng, mc->seed, err);
    if (rc) return rc;
    rc = kp_rng_draw(&rng, slot_offset(SLOT_SINK, 0), d, (size_t)(3 * mc->h_q), err);
    kp_rng_close(&rng);
    for (int64_t h = 0; !rc && h < mc->h_q; h++) {
        sink[h] = (float)(8.0 + 2.0 * irwin_hall(d[3 * h], d[3 * h + 1]));
        if (mc->sink == KP_MLA_SINK_INF && d[3 * h + 2] % 4 < 2) sink[h] = d[3 * h + 2] % 4 ? -INFINITY : INFINITY;
    }
    return rc;
}
