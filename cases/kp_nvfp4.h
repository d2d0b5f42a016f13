/* kp_nvfp4.h: the NVFP4 format, exactly (shared/reference/families.md §A): E2M1 codes, E4M3 block
 * scales (one per 16 elements along K, sign bit 0), a global scale in either declared direction,
 * low-nibble-first packing, linear and 128x4-swizzled scale layouts, a round-to-nearest-even saturating
 * quantizer and an exact dequantizer. Basic operations only, so every machine gets the same bytes.
 *
 * E2M1: bit 3 the sign, bits 2..0 index 0, .5, 1, 1.5, 2, 3, 4, 6. E4M3 (e4m3fn): bias 7, no infinity,
 * S.1111.111 is NaN, 448 the largest finite value, subnormals m/8 * 2^-6.
 * Quantizing a [rows, K] tensor (the recipe of vLLM's scaled_fp4_quant): amax = max |x| over the tensor,
 * gs = 2688 / amax (448 * 6 / amax) in f32; per block of 16, sf = e4m3(gs * block_amax / 6) and each
 * code = e2m1(x * gs / sf) (0 where sf is 0). Dequantizing: x = e2m1 * sf / gs where the global scale is
 * stored as gs (kernel APIs), x = e2m1 * sf * g where it is stored as g = amax / 2688 (ModelOpt
 * checkpoints); a case declares which, and a receipt records it. */
#ifndef KP_NVFP4_H
#define KP_NVFP4_H

#include <stddef.h>
#include <stdint.h>

#include "kp_common.h"

#define KP_NVFP4_BLOCK 16 /* elements along K that share one E4M3 scale */

float kp_e2m1_value(uint8_t code);  /* code in [0, 15] */
uint8_t kp_e2m1_quantize(float x);  /* nearest, ties to the even code, |x| > 6 -> 6; NaN -> +0 */
float kp_e4m3_value(uint8_t bits);  /* NaN for 0x7f and 0xff */
uint8_t kp_e4m3_quantize(float x);  /* nearest, ties to the even code, |x| > 448 -> 448; NaN -> 0x7f */

/* Codes of element i of a packed row: element 2j in the low nibble of byte j, 2j + 1 in the high one. */
static inline uint8_t kp_nvfp4_code_at(const uint8_t *packed, int64_t i) {
    return (uint8_t)((packed[i / 2] >> (4 * (i % 2))) & 0xfu);
}

/* Where the global scale goes in dequantization. */
typedef enum kp_nvfp4_scale_dir {
    KP_NVFP4_DIVIDE = 0,  /* stored as gs = 2688 / amax, dequant divides (vLLM, FlashInfer, CUTLASS kernel APIs) */
    KP_NVFP4_MULTIPLY = 1 /* stored as g = amax / 2688, dequant multiplies (ModelOpt weight_scale_2) */
} kp_nvfp4_scale_dir;

/* x [rows, k] (k a multiple of 16, every x finite) into packed codes [rows, k / 2], linear E4M3 scales
 * [rows, k / 16] and the global scale as stored in direction `dir`. KP_EXIT_USAGE for a bad shape or a
 * non-finite input. */
int kp_nvfp4_quantize(const float *x, int64_t rows, int64_t k, kp_nvfp4_scale_dir dir, uint8_t *packed, uint8_t *scales,
                      float *global, kp_error *err);
/* The exact values of a quantized tensor in float64 (one rounding: the global scale's), [rows, k]. */
void kp_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales, int64_t rows, int64_t k, float global,
                         kp_nvfp4_scale_dir dir, double *out);

/* The 128x4 swizzled scale layout of CUTLASS, cuBLASLt and FlashInfer: rows padded to 128 and kb = k / 16
 * to 4 (zeros), then tile (r / 128, c / 4) of 512 bytes at (r / 128) * ceil(kb / 4) + c / 4, within it
 * (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4. */
size_t kp_nvfp4_swizzled_bytes(int64_t rows, int64_t kb);
int64_t kp_nvfp4_swizzle_offset(int64_t r, int64_t c, int64_t kb);
void kp_nvfp4_swizzle(const uint8_t *linear, int64_t rows, int64_t kb, uint8_t *swizzled);
void kp_nvfp4_unswizzle(const uint8_t *swizzled, int64_t rows, int64_t kb, uint8_t *linear);

#endif
