/* moe_f32.cuh: gemv32's f32 path (moe.marlin_gemv32@cuda), steps 4 and 5 of moe_cuda.cuh for experts of at
 * most KP_MOE_GEMV_ROWS rows: moe_f32_kernel<GEMM>, f32 chains where the tensor-core path has bf16 inputs. */
#ifndef KP_MOE_F32_CUH
#define KP_MOE_F32_CUH

#include "moe_common.cuh"

/* ---- gemv32's f32 path (experts of at most 32 rows) ---- */

/* GEMM 1: actf[pos] = activation(alpha13 (W13 x)) with x unrounded; GEMM 2: y[pair] = (W2 actf[pos]) *
 * (alpha2 * weight). Each sum one f32 chain in ascending k. A CTA: one expert (one m tile) by 64
 * weight rows (gated: 32 gate, the same 32 up); warp w owns 8 of them, lane l the expert's row l.
 * Codes, scales and activations for the next MOE_F32_KC of k are loaded into registers while the
 * current ones are multiplied. */
template <int GEMM>
static __global__ void __launch_bounds__(MOE_F32_THREADS) moe_f32_kernel(moe_run r) {
    extern __shared__ __align__(16) unsigned char moe_smem[];
    float *ws = reinterpret_cast<float *>(moe_smem);  /* [64][KC] dequantized weights */
    float *xs = ws + 64 * MOE_F32_KC;                 /* [32][KC + 1] activations */
    pdl_wait();
    const int n_tiles = GEMM == 1 ? r.f32_tiles1 : r.f32_tiles2;
    const int64_t tile = blockIdx.x / (unsigned)n_tiles;
    const int nt = (int)(blockIdx.x % (unsigned)n_tiles);
    const int4 d = r.tiles[tile];
    if (tile >= r.info[MOE_INFO_TILES]) return;
    const int e = d.x, pos0 = d.z, count = d.w; /* m0 = 0: at most 32 rows */
    if (count > KP_MOE_GEMV_ROWS) return;
    const bool gated1 = GEMM == 1 && r.gated;
    const int64_t K = GEMM == 1 ? r.hidden : r.inter, N = GEMM == 1 ? r.w13_rows : r.hidden;
    const int64_t n_cols = GEMM == 1 ? r.inter : r.hidden;
    const int n0 = nt * (gated1 ? 32 : 64);
    const uint8_t *codes = (GEMM == 1 ? r.w13 : r.w2) + (int64_t)e * N * (K / 2);
    const uint8_t *scales = (GEMM == 1 ? r.s13 : r.s2) + (int64_t)e * N * (K / 16);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    /* loads: weight row tid >> 2, k quarter tid & 3 (32 codes); activation row tid >> 3, 16 of k */
    const int lr = tid >> 2, kq = tid & 3;
    int64_t brow;
    bool bvalid;
    if (gated1) {
        const int64_t c = n0 + (lr & 31);
        bvalid = c < r.inter;
        brow = (lr < 32 ? 0 : r.inter) + c;
    } else {
        brow = n0 + lr;
        bvalid = brow < n_cols;
    }
    const uint8_t *crow = codes + (bvalid ? brow : 0) * (K / 2), *srow = scales + (bvalid ? brow : 0) * (K / 16);
    const int xr = tid >> 3, xq = tid & 7;
    const float *xrow = NULL;
    if (xr < count) {
        const int32_t pair = r.order[pos0 + xr];
        xrow = GEMM == 1 ? r.x + (int64_t)(pair / r.topk) * r.hidden : r.actf + (int64_t)(pos0 + xr) * r.inter;
    }
    uint2 cw[2];
    uint8_t sb[2];
    float4 xv[4];
    auto fetch = [&](int64_t k0) {
#pragma unroll
        for (int h = 0; h < 2; h++) { /* 16 codes and their scale */
            const int64_t k = k0 + kq * 32 + h * 16;
            const bool ok = bvalid && k < K;
            cw[h] = ok ? __ldg(reinterpret_cast<const uint2 *>(crow + k / 2)) : make_uint2(0, 0);
            sb[h] = ok ? __ldg(srow + k / 16) : (uint8_t)0;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t k = k0 + xq * 16 + u * 4;
            xv[u] = xrow && k < K ? __ldg(reinterpret_cast<const float4 *>(xrow + k)) : make_float4(0, 0, 0, 0);
        }
    };
    float accv[8];
#pragma unroll
    for (int c = 0; c < 8; c++) accv[c] = 0.0f;
    int wr[8]; /* this warp's weight rows */
#pragma unroll
    for (int c = 0; c < 8; c++) wr[c] = gated1 ? (c < 4 ? 4 * warp + c : 32 + 4 * warp + c - 4) : 8 * warp + c;
    fetch(0);
    for (int64_t k0 = 0; k0 < K; k0 += MOE_F32_KC) {
        __syncthreads(); /* the last step's reads are done */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float sf = kp_e4m3_decode(sb[h]);
            float *dst = ws + lr * MOE_F32_KC + kq * 32 + h * 16;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const uint32_t byte = ((q < 4 ? cw[h].x : cw[h].y) >> (8 * (q & 3))) & 0xffu;
                dst[2 * q] = kp_moe_e2m1(byte & 15u) * sf;
                dst[2 * q + 1] = kp_moe_e2m1(byte >> 4) * sf;
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float *dst = xs + xr * (MOE_F32_KC + 1) + xq * 16 + u * 4;
            dst[0] = xv[u].x, dst[1] = xv[u].y, dst[2] = xv[u].z, dst[3] = xv[u].w;
        }
        __syncthreads();
        if (k0 + MOE_F32_KC < K) fetch(k0 + MOE_F32_KC);
        if (lane < count) {
            const float *xl = xs + lane * (MOE_F32_KC + 1);
            for (int k = 0; k < MOE_F32_KC; k++) {
                const float a = xl[k];
#pragma unroll
                for (int c = 0; c < 8; c++) accv[c] = __fadd_rn(accv[c], __fmul_rn(a, ws[wr[c] * MOE_F32_KC + k]));
            }
        }
    }
    if (lane >= count) return;
    const int32_t pos = pos0 + lane, pair = r.order[pos];
    if constexpr (GEMM == 1) {
        const float alpha = kp_moe_alpha(r.g13[e], r.scale_dir);
        float *dst = r.actf + (int64_t)pos * r.inter;
        if (gated1) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int64_t n = n0 + 4 * warp + c;
                if (n < r.inter) dst[n] = __fmul_rn(silu(accv[c] * alpha), accv[c + 4] * alpha);
            }
        } else {
#pragma unroll
            for (int c = 0; c < 8; c++) {
                const int64_t n = n0 + 8 * warp + c;
                const float hu = accv[c] * alpha;
                if (n < r.inter) dst[n] = hu > 0.0f ? __fmul_rn(hu, hu) : 0.0f;
            }
        }
    } else {
        const float scale = __fmul_rn(kp_moe_alpha(r.g2[e], r.scale_dir), r.weights[pair]);
#pragma unroll
        for (int c = 0; c < 8; c++) {
            const int64_t n = n0 + 8 * warp + c;
            if (n < r.hidden) r.y[(int64_t)pair * r.hidden + n] = __fmul_rn(accv[c], scale);
        }
    }
}

#endif
