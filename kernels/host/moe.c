/* moe.c: the host ports of moe.invariant (candidate), moe.marlin_like (incumbent) and its gemv_rows
 * variant moe.marlin_gemv32: the steps of kernels/moe_plan.h in f32, one expert per kp_parallel_for
 * item. The incumbent's atomic arrival order is a seeded shuffle of the routed pairs, a new one each
 * call, as atomics give on a GPU. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kp_registry.h"
#include "../moe_plan.h"

enum { ALGO_INVARIANT = 0, ALGO_MARLIN = 1, ALGO_MARLIN_GEMV = 2 };

typedef struct moe_plan_host {
    const kp_moe_args *a;
    int algo;
    int64_t pairs, w13_rows;
    int32_t *order;        /* [pairs]: pair indices (t * topk + j) grouped by expert, each expert's in slot order */
    int64_t *first;        /* [experts + 1]: expert e's pairs are order[first[e] .. first[e + 1]) */
    int64_t *block0;       /* [experts]: the launch-wide index of expert e's first block (marlin) */
    int bsm;               /* marlin's block_size_m */
    int64_t tile_n, tile_k, iters1, iters2, n_tiles1, n_tiles2, k_tiles1, k_tiles2;
    float *act;            /* [pairs, inter]: the second GEMM's input, by pair index */
    float *y;              /* [pairs, hidden]: each pair's contribution (before the routing weight, for invariant) */
    atomic_int failed;
} moe_plan_host;

static int moe_host_check(const char *name, const void *args, char *message, size_t message_len) {
    const char *why = kp_moe_args_problem(args);
    if (!why) return KP_RUN_OK;
    if (message && message_len) snprintf(message, message_len, "%s: %s", name, why);
    return KP_RUN_NOT_SUPPORTED;
}

static size_t moe_host_workspace_bytes(const void *args) {
    const kp_moe_args *a = args;
    const double pairs = (double)a->rows * a->topk;
    const double bytes = pairs * (double)(a->inter + a->hidden) * 4.0 + pairs * 4.0 + (double)(a->experts + 1) * 16.0 + 256;
    return bytes > 1.8e19 ? 0 : (size_t)bytes;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Slots and the per-expert order: token order, or (atomic) the arrival order of a seeded shuffle. */
static void route(moe_plan_host *p, uint64_t call, int64_t *count) {
    const kp_moe_args *a = p->a;
    const int atomic = p->algo != ALGO_INVARIANT && kp_marlin_atomic_order(a->rows, a->topk, a->experts);
    int32_t *arrival = p->order; /* the arrival order, then overwritten by the per-expert order */
    for (int64_t i = 0; i < p->pairs; i++) arrival[i] = (int32_t)i;
    if (atomic) {
        uint64_t s = call * 0x9e3779b97f4a7c15ull;
        for (int64_t i = p->pairs - 1; i > 0; i--) {
            const int64_t k = (int64_t)(splitmix(&s) % (uint64_t)(i + 1));
            const int32_t t = arrival[i];
            arrival[i] = arrival[k], arrival[k] = t;
        }
    }
    memset(count, 0, sizeof *count * (size_t)a->experts);
    for (int64_t q = 0; q < p->pairs; q++) {
        const int32_t i = arrival[q];
        a->slots[i] = (int32_t)count[a->ids[i]]++;
    }
    p->first[0] = 0;
    for (int64_t e = 0; e < a->experts; e++) p->first[e + 1] = p->first[e] + count[e];
    for (int64_t i = 0; i < p->pairs; i++) p->order[p->first[a->ids[i]] + a->slots[i]] = (int32_t)i;
    int64_t blocks = 0;
    for (int64_t e = 0; e < a->experts; e++) p->block0[e] = blocks, blocks += (count[e] + p->bsm - 1) / p->bsm;
    p->k_tiles1 = (a->hidden + p->tile_k - 1) / p->tile_k, p->n_tiles1 = (p->w13_rows + p->tile_n - 1) / p->tile_n;
    p->k_tiles2 = (a->inter + p->tile_k - 1) / p->tile_k, p->n_tiles2 = (a->hidden + p->tile_n - 1) / p->tile_n;
    const int64_t grid = a->sm_count > 0 ? a->sm_count : KP_MOE_HOST_SMS;
    p->iters1 = kp_marlin_iters(p->k_tiles1, p->n_tiles1, blocks, grid);
    p->iters2 = kp_marlin_iters(p->k_tiles2, p->n_tiles2, blocks, grid);
}

/* The GEMMs' inner loop runs across weight rows: LANES rows of one expert side by side, each lane one output's
 * own f32 chain over k in ascending order, a product then a sum (two roundings: -std=c11 keeps gcc from
 * contracting them to an FMA), so each output's bits are the scalar chain's. Rows, not pairs, fill the lanes
 * because an expert has any number of pairs (one, in a batch probe) but always N >= 16 rows. LANES = 32 divides
 * both of marlin's tile_n (128, 256), so a chunk of rows sits in one n tile and a pair's stream-K cut at a k tile
 * is one decision for the whole chunk. PAIRS pairs share each chunk's weight loads: 2 x 4 vectors of 8 lanes are
 * 8 independent accumulators, enough to cover an add's latency, and they leave AVX2's 16 registers room for
 * the weights. The AVX2 clone is chosen at run time (the same bits as the default one: same per-lane order). */
#define LANES 32
#define PAIRS 2
typedef float lanes8 __attribute__((vector_size(32)));
typedef float lanes8u __attribute__((vector_size(32), aligned(4), may_alias)); /* a view of floats */
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef uint32_t u32x8u __attribute__((vector_size(32), aligned(4), may_alias));

#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define MOE_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef MOE_CLONES
#define MOE_CLONES
#endif

/* Rows r0 .. r0 + nr - 1 of an NVFP4 tensor [N, K], transposed into wt[k * LANES + l] (exact: e2m1 * sf, as
 * kp_moe_e2m1(code) * kp_e4m3_decode(scale), the latter from the table e4m3); lanes past nr are 0 (a code times
 * 0). A 16-element block at a time: its codes and scales gathered lane by lane, then each k decoded across 8
 * lanes at once: E2M1 code c is the magnitude of c & 7 (a table lookup where gcc has __builtin_shuffle, one
 * vpermps on AVX2; else 0, 0.5 or (1 + (c & 1) / 2) 2^((c >> 1) - 1) from bits) with the sign bit c & 8. */
MOE_CLONES static void dequant_chunk(const uint8_t *codes, const uint8_t *scales, int64_t r0, int64_t nr, int64_t K,
                                     const float *e4m3, float *restrict wt) {
    for (int64_t b = 0; b < K / 16; b++) {
        uint32_t lo[LANES], hi[LANES]; /* codes 0..7 and 8..15 of the block, code i at bits 4 i */
        float sf[LANES];
        for (int64_t l = 0; l < LANES; l++) { /* lanes past nr: row r0 again, times 0 */
            const int64_t r = r0 + (l < nr ? l : 0);
            const uint8_t *c = codes + r * (K / 2) + b * 8;
            lo[l] = (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
            hi[l] = (uint32_t)c[4] | (uint32_t)c[5] << 8 | (uint32_t)c[6] << 16 | (uint32_t)c[7] << 24;
            sf[l] = l < nr ? e4m3[scales[r * (K / 16) + b]] : 0.0f;
        }
        for (int k = 0; k < 16; k++) {
            const uint32_t *words = k < 8 ? lo : hi;
            for (int v = 0; v < LANES / 8; v++) {
                const u32x8 code = *(const u32x8u *)(words + 8 * v) >> (uint32_t)(4 * (k & 7));
#if defined(__GNUC__) && !defined(__clang__)
                const lanes8 table = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
                const u32x8 mag = (u32x8)__builtin_shuffle(table, code & 7u);
#else
                const u32x8 c = code & 7u, normal = ((126u + (c >> 1)) << 23) | ((c & 1u) << 22);
                const u32x8 mag = (normal & (c >= 2u)) | (0x3f000000u & (c == 1u));
#endif
                const lanes8 w = (lanes8)(mag | ((code & 8u) << 28));
                *(lanes8u *)(wt + (b * 16 + k) * LANES + 8 * v) = w * *(const lanes8u *)(sf + 8 * v);
            }
        }
    }
}

/* acc[p * LANES + l] += x_p[k] * wt[k * LANES + l] for k in [k0, k1), ascending (p < PAIRS; x_1 may repeat x_0).
 * The accumulators are named vectors, not an array filled by memcpy, so they stay in registers. */
MOE_CLONES static void chunk_span(const float *restrict wt, const float *restrict x0, const float *restrict x1, int64_t k0,
                                  int64_t k1, float *restrict acc) {
    lanes8u *const a = (lanes8u *)acc;
    lanes8 a00 = a[0], a01 = a[1], a02 = a[2], a03 = a[3], a10 = a[4], a11 = a[5], a12 = a[6], a13 = a[7];
    for (int64_t k = k0; k < k1; k++) {
        const lanes8u *w = (const lanes8u *)(wt + k * LANES);
        const lanes8 w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
        const float b0 = x0[k], b1 = x1[k];
        a00 += b0 * w0, a01 += b0 * w1, a02 += b0 * w2, a03 += b0 * w3;
        a10 += b1 * w0, a11 += b1 * w1, a12 += b1 * w2, a13 += b1 * w3;
    }
    a[0] = a00, a[1] = a01, a[2] = a02, a[3] = a03, a[4] = a10, a[5] = a11, a[6] = a12, a[7] = a13;
}

static float silu(float g) { return g / (1.0f + expf(-g)); }

/* kp_bf16_round with its branch made a select between the same two values (inf and NaN as they are, else
 * rounded to nearest even), so the loops that round every element vectorize. */
static inline float bf16r(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    const uint32_t keep = 0u - (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
    b = (b & keep) | (rounded & ~keep);
    memcpy(&x, &b, sizeof x);
    return x;
}

/* One GEMM of expert e for its n pairs: sum[q * N + r] = the f32 dot of weight row r of the NVFP4 tensor
 * (codes, scales) [N, K] with in[q], one chain in ascending k; where `cut` (GEMM `gemm`, 1 or 2, of marlin), a
 * new partial sum starts at every k tile marlin's stream-K cuts for the pair's block and the row's n tile, and
 * each partial is added to the bf16 running total in f32 and rounded to bf16 again. wt is scratch for LANES
 * transposed weight rows, [K, LANES]. */
static void expert_gemm(const moe_plan_host *p, int64_t e, const uint8_t *codes, const uint8_t *scales, int64_t N,
                        int64_t K, const float *const *in, int64_t n, int gemm, int cut, float *wt, float *sum) {
    const int64_t n_tiles = gemm == 1 ? p->n_tiles1 : p->n_tiles2, k_tiles = gemm == 1 ? p->k_tiles1 : p->k_tiles2;
    const int64_t iters = gemm == 1 ? p->iters1 : p->iters2, step = cut ? p->tile_k : K;
    float e4m3[256]; /* every scale byte's value */
    for (uint32_t v = 0; v < 256; v++) e4m3[v] = kp_e4m3_decode(v);
    for (int64_t r0 = 0; r0 < N; r0 += LANES) {
        const int64_t nr = N - r0 < LANES ? N - r0 : LANES, nt = r0 / p->tile_n;
        dequant_chunk(codes, scales, r0, nr, K, e4m3, wt);
        for (int64_t q0 = 0; q0 < n; q0 += PAIRS) {
            const int np = (int)(n - q0 < PAIRS ? n - q0 : PAIRS);
            float part[PAIRS * LANES] = {0}, total[PAIRS * LANES] = {0};
            for (int64_t k0 = 0; k0 < K; k0 += step) {
                if (cut && k0 > 0)
                    for (int g = 0; g < np; g++)
                        if (kp_marlin_cut(p->block0[e] + (q0 + g) / p->bsm, nt, k0 / step, n_tiles, k_tiles, iters))
                            for (int l = 0; l < LANES; l++) {
                                total[g * LANES + l] = bf16r(total[g * LANES + l] + part[g * LANES + l]);
                                part[g * LANES + l] = 0.0f;
                            }
                chunk_span(wt, in[q0], in[q0 + np - 1], k0, k0 + step < K ? k0 + step : K, part);
            }
            for (int g = 0; g < np; g++) {
                float *dst = sum + (q0 + g) * N + r0;
                const float *t = total + g * LANES, *pt = part + g * LANES;
                if (cut)
                    for (int64_t l = 0; l < nr; l++) dst[l] = bf16r(t[l] + pt[l]);
                else
                    memcpy(dst, pt, sizeof *dst * (size_t)nr);
            }
        }
    }
}

/* Expert e: both GEMMs for all its pairs, into p->act and p->y. */
static void expert_item(void *ctx, int64_t e) {
    moe_plan_host *p = ctx;
    const kp_moe_args *a = p->a;
    const int64_t n = p->first[e + 1] - p->first[e], H = a->hidden, I = a->inter, R = p->w13_rows;
    if (n == 0) return;
    const int f32_path = p->algo == ALGO_MARLIN_GEMV && n <= KP_MOE_GEMV_ROWS;
    const int marlin = p->algo != ALGO_INVARIANT && !f32_path, round_in = !f32_path;
    const int32_t *pairs = p->order + p->first[e];
    const float alpha13 = kp_moe_alpha(a->g13[e], a->scale_dir), alpha2 = kp_moe_alpha(a->g2[e], a->scale_dir);
    const int64_t K_most = H > I ? H : I, N_most = R > H ? R : H;
    float *w = aligned_alloc(32, sizeof *w * (size_t)(K_most * LANES)), *xin = malloc(sizeof *xin * (size_t)(n * H));
    float *sum = malloc(sizeof *sum * (size_t)(n * N_most));
    const float **in = malloc(sizeof *in * (size_t)n);
    if (!w || !xin || !sum || !in) {
        atomic_store(&p->failed, 1);
        free(w), free(xin), free(sum), free(in);
        return;
    }
    for (int64_t q = 0; q < n; q++) { /* the expert's activations, rounded to bf16 unless f32 */
        const float *x = a->x + (pairs[q] / a->topk) * H;
        if (round_in)
            for (int64_t k = 0; k < H; k++) xin[q * H + k] = bf16r(x[k]);
        else
            memcpy(xin + q * H, x, sizeof *x * (size_t)H);
        in[q] = xin + q * H;
    }
    /* GEMM1, then the activation: the second GEMM's input */
    expert_gemm(p, e, a->w13 + e * R * (H / 2), a->s13 + e * R * (H / 16), R, H, in, n, 1, marlin, w, sum);
    const float alpha13_b = kp_bf16_round(alpha13);
    for (int64_t q = 0; q < n; q++) {
        float *hq = sum + q * R, *act = p->act + (int64_t)pairs[q] * I;
        if (marlin)
            for (int64_t r = 0; r < R; r++) hq[r] = bf16r(bf16r(hq[r]) * alpha13_b);
        else
            for (int64_t r = 0; r < R; r++) hq[r] = hq[r] * alpha13;
        if (a->gated)
            for (int64_t i = 0; i < I; i++) act[i] = silu(hq[i]) * hq[I + i];
        else
            for (int64_t i = 0; i < I; i++) act[i] = hq[i] > 0.0f ? hq[i] * hq[i] : 0.0f;
        if (!f32_path)
            for (int64_t i = 0; i < I; i++) act[i] = bf16r(act[i]);
        in[q] = act;
    }
    /* GEMM2: y[pair, r], with the routing weight in its epilogue for marlin */
    expert_gemm(p, e, a->w2 + e * H * (I / 2), a->s2 + e * H * (I / 16), H, I, in, n, 2, marlin, w, sum);
    const float alpha2_b = kp_bf16_round(alpha2);
    for (int64_t q = 0; q < n; q++) {
        const float wt = a->weights[pairs[q]];
        const float scale = marlin ? kp_bf16_round(alpha2_b * kp_bf16_round(wt)) : f32_path ? alpha2 * wt : alpha2;
        const float *v = sum + q * H;
        float *y = p->y + (int64_t)pairs[q] * H;
        if (marlin)
            for (int64_t r = 0; r < H; r++) y[r] = bf16r(bf16r(v[r]) * scale);
        else
            for (int64_t r = 0; r < H; r++) y[r] = v[r] * scale;
    }
    free(w), free(xin), free(sum), free(in);
}

/* Row t: the sum over its slots in ascending j, each column its own chain (the loops over h vectorize). */
static void combine_item(void *ctx, int64_t t) {
    moe_plan_host *p = ctx;
    const kp_moe_args *a = p->a;
    const int64_t H = a->hidden, K = a->topk;
    float *out = a->out + t * H;
    const float *y = p->y + t * K * H;
    if (p->algo == ALGO_INVARIANT) {
        for (int64_t h = 0; h < H; h++) out[h] = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            const float wj = a->weights[t * K + j];
            for (int64_t h = 0; h < H; h++) out[h] += wj * y[j * H + h];
        }
    } else if (K >= 2 && K <= 4) { /* moe_sum accumulates in the bf16 scalar type */
        memcpy(out, y, sizeof *out * (size_t)H);
        for (int64_t j = 1; j < K; j++)
            for (int64_t h = 0; h < H; h++) out[h] = bf16r(out[h] + y[j * H + h]);
    } else {
        for (int64_t h = 0; h < H; h++) out[h] = 0.0f;
        for (int64_t j = 0; j < K; j++)
            for (int64_t h = 0; h < H; h++) out[h] += y[j * H + h];
        for (int64_t h = 0; h < H; h++) out[h] = bf16r(out[h]);
    }
}

static int moe_host_run(const void *args, char *message, size_t message_len, int algo, const char *name) {
    static atomic_uint_fast64_t calls;
    const kp_moe_args *a = args;
    int rc = moe_host_check(name, args, message, message_len);
    if (rc) return rc;
    if (!a->workspace || a->workspace_bytes < moe_host_workspace_bytes(args)) {
        snprintf(message, message_len, "%s: the workspace is missing or smaller than workspace_bytes()", name);
        return KP_RUN_FAILED;
    }
    for (int64_t i = 0; i < a->rows * a->topk; i++)
        if (a->ids[i] < 0 || a->ids[i] >= a->experts) {
            snprintf(message, message_len, "%s: ids[%lld] = %d is outside [0, %lld)", name, (long long)i, a->ids[i],
                     (long long)a->experts);
            return KP_RUN_NOT_SUPPORTED;
        }
    moe_plan_host p = {.a = a, .algo = algo, .pairs = a->rows * a->topk, .w13_rows = kp_moe_w13_rows_of(a)};
    p.bsm = kp_marlin_block_size_m(a->rows, a->topk, a->experts);
    kp_marlin_tile(p.bsm, &p.tile_n, &p.tile_k);
    unsigned char *ws = a->workspace;
    p.act = (float *)ws, ws += sizeof(float) * (size_t)(p.pairs * a->inter);
    p.y = (float *)ws, ws += sizeof(float) * (size_t)(p.pairs * a->hidden);
    p.first = (int64_t *)ws, ws += sizeof(int64_t) * (size_t)(a->experts + 1);
    p.block0 = (int64_t *)ws, ws += sizeof(int64_t) * (size_t)a->experts;
    p.order = (int32_t *)ws;
    atomic_init(&p.failed, 0);
    int64_t *count = malloc(sizeof *count * (size_t)a->experts);
    if (!count) {
        snprintf(message, message_len, "%s: out of host memory", name);
        return KP_RUN_FAILED;
    }
    route(&p, atomic_fetch_add(&calls, 1) + 1, count);
    free(count);
    kp_parallel_for(a->experts, expert_item, &p);
    if (atomic_load(&p.failed)) {
        snprintf(message, message_len, "%s: out of host memory", name);
        return KP_RUN_FAILED;
    }
    kp_parallel_for(a->rows, combine_item, &p);
    return KP_RUN_OK;
}

static int marlin_like_run(const void *args, char *message, size_t message_len) {
    return moe_host_run(args, message, message_len, ALGO_MARLIN, "moe.marlin_like@host");
}
static int marlin_gemv32_run(const void *args, char *message, size_t message_len) {
    return moe_host_run(args, message, message_len, ALGO_MARLIN_GEMV, "moe.marlin_gemv32@host");
}
static int invariant_run(const void *args, char *message, size_t message_len) {
    return moe_host_run(args, message, message_len, ALGO_INVARIANT, "moe.invariant@host");
}
static int marlin_like_supports(const void *args, char *message, size_t message_len) {
    return moe_host_check("moe.marlin_like@host", args, message, message_len);
}
static int marlin_gemv32_supports(const void *args, char *message, size_t message_len) {
    return moe_host_check("moe.marlin_gemv32@host", args, message, message_len);
}
static int invariant_supports(const void *args, char *message, size_t message_len) {
    return moe_host_check("moe.invariant@host", args, message, message_len);
}

const kp_impl kp_moe_marlin_like_host = {KP_ABI_VERSION, "moe", "moe.marlin_like@host", KP_MEMORY_HOST,
                                         moe_host_workspace_bytes, marlin_like_supports, marlin_like_run};
const kp_impl kp_moe_marlin_gemv32_host = {KP_ABI_VERSION, "moe", "moe.marlin_gemv32@host", KP_MEMORY_HOST,
                                           moe_host_workspace_bytes, marlin_gemv32_supports, marlin_gemv32_run};
const kp_impl kp_moe_invariant_host = {KP_ABI_VERSION, "moe", "moe.invariant@host", KP_MEMORY_HOST,
                                       moe_host_workspace_bytes, invariant_supports, invariant_run};
