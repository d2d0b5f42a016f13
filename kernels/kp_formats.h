/* kp_formats.h: the number formats impls on either device read and round to (bf16, E4M3), as inline functions
 * callable from host and device code alike. The cases stage's codec (cases/kp_nvfp4.h) makes inputs; these are
 * what kernels and their host ports compute with. */
#ifndef KP_FORMATS_H
#define KP_FORMATS_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define KP_FORMAT_FN __host__ __device__ static inline
#else
#define KP_FORMAT_FN static inline
#endif

/* f32 to the nearest bf16, ties to even, as an f32 (NaN and inf as they are). */
KP_FORMAT_FN float kp_bf16_round(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    if ((b & 0x7f800000u) == 0x7f800000u) return x;
    b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* A bf16's bits as an f32 (exact), and an f32 rounded to bf16 as its bits. */
KP_FORMAT_FN float kp_bf16_value(uint16_t h) {
    const uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}
KP_FORMAT_FN uint16_t kp_bf16_bits(float x) {
    const float r = kp_bf16_round(x);
    uint32_t b;
    memcpy(&b, &r, sizeof b);
    return (uint16_t)(b >> 16);
}

/* An E4M3 (e4m3fn) byte's value: bias 7, subnormals m/8 * 2^-6, S.1111.111 NaN. */
KP_FORMAT_FN float kp_e4m3_decode(uint32_t b) {
    const uint32_t e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 15u && m == 7u) {
        const uint32_t nan = 0x7fc00000u;
        memcpy(&v, &nan, sizeof v);
        return v;
    }
    if (e == 0) v = (float)m * 0.001953125f; /* m / 8 * 2^-6 */
    else {
        const uint32_t bits = ((e + 120u) << 23) | (m << 20); /* (1 + m/8) * 2^(e - 7) */
        memcpy(&v, &bits, sizeof v);
    }
    return b & 0x80u ? -v : v;
}

#endif
