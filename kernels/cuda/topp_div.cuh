/* topp_div.cuh: the f32 division prob = e / z of the split_prob kernels, without div.rn's branch.
 *
 * nvcc expands `e / z` (div.rn.f32) per division into: y0 = rcp.approx(z) (MUFU.RCP); y = y0 + y0 *
 * (1 - z * y0); q0 = e * y; r = e - z * q0; q = q0 + y * r (all FMAs, round to nearest), then FCHK
 * (e, z) and, when it flags operands the fast path may get wrong (zero, denormal, infinite or NaN
 * operands, or a quotient near the ends of the exponent range), a call to a slow path. The branch and
 * its convergence barriers kept the kernels from overlapping consecutive tokens' divisions, and the
 * reciprocal was recomputed per token. Here y comes once per row (topp_recip) and a token costs three
 * FMAs (topp_div), which is the fast path's arithmetic, step for step.
 *
 * It must equal e / z wherever the kernels look at the result: z is a row's sum of exp terms, 1 <= z
 * < 2^31, and 0 <= e <= 1 (or NaN / infinity for non-finite logits). Wherever FCHK passes, the fast
 * path is e / z, and for these operands FCHK has no reason to flag a quotient at or above 2^-100
 * (about 7.9e-31, below every pivot: the search's floor is 1e-30): both are normal and the quotient is
 * far from both ends of the exponent range. Below 2^-100, or for NaN / infinite e, both results are
 * below the floor, NaN or above every pivot, so every test the kernels make on them agrees. A GPU test
 * (test_gpu_topp_kernels: division_matches_ieee_wherever_it_counts) checks every e from 2^-100 to 1
 * against `/` for 173 values of z, with a planted variant (e * y, no correction) that must differ
 * (its result on an H200: MEASURED.md). */
#ifndef KP_TOPP_DIV_CUH
#define KP_TOPP_DIV_CUH

__device__ __forceinline__ float topp_recip(float z) {
    float y0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(z));
    return __fmaf_rn(y0, __fmaf_rn(-z, y0, 1.0f), y0);
}

__device__ __forceinline__ float topp_div(float e, float z, float y) {
    const float q0 = __fmul_rn(e, y);
    return __fmaf_rn(y, __fmaf_rn(-z, q0, e), q0);
}

#endif
