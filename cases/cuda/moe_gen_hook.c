/* moe_gen_hook.c: the CUDA build's moe expert generator (kp_moe_experts_fn, installed by cases_cuda.c): a case's
 * numbers handed to moe_gen.cu, its statuses turned into kparity's exit classes. */
#include "moe_gen_hook.h"

#include <stdio.h>
#include <stdlib.h>

#include "moe_gen_cuda.h"

/* One write a page over every core: fresh pages are faulted in in parallel here rather than one at a time by the
 * driver's copy into pageable memory (MEASURED.md has both), and a page already in costs a store. */
#define TOUCH_CHUNK ((size_t)64 << 20)
typedef struct touch_job {
    uint8_t *at[4];
    size_t bytes[4], chunks[4];
} touch_job;

static void touch_chunk(void *ctx, int64_t i) {
    const touch_job *t = ctx;
    int k = 0;
    while ((size_t)i >= t->chunks[k]) i -= (int64_t)t->chunks[k++];
    const size_t from = (size_t)i * TOUCH_CHUNK, to = from + TOUCH_CHUNK < t->bytes[k] ? from + TOUCH_CHUNK : t->bytes[k];
    volatile uint8_t *p = t->at[k];
    for (size_t b = from; b < to; b += 4096) p[b] = 0;
}

static void touch_pages(touch_job *t) {
    int64_t chunks = 0;
    for (int k = 0; k < 4; k++) chunks += (int64_t)(t->chunks[k] = (t->bytes[k] + TOUCH_CHUNK - 1) / TOUCH_CHUNK);
    kp_parallel_for(chunks, touch_chunk, t);
}

int kp_moe_experts_cuda_in(size_t scratch_bytes, int touch, const kp_moe_case *mc, int64_t e0, int64_t ne, uint8_t *w13,
                           uint8_t *s13, float *g13, uint8_t *w2, uint8_t *s2, float *g2, kp_error *err) {
    const char *device = getenv("KPARITY_DEVICE"); /* the device kp_device_init runs the impls on */
    const kp_moe_gen_job job = {
        .w13_rows = kp_moe_w13_rows(mc), .hidden = mc->hidden, .inter = mc->inter, .experts = ne, .seed = mc->seed,
        .offset = kp_moe_case_weight_offset(mc, e0), .scale13 = kp_moe_weight_scale(mc->hidden),
        .scale2 = kp_moe_weight_scale(mc->inter), .multiply = mc->scale_dir == KP_NVFP4_MULTIPLY,
        .device = device ? atoi(device) : 0, .scratch_bytes = scratch_bytes, .w13 = w13, .s13 = s13, .w2 = w2,
        .s2 = s2, .g13 = g13, .g2 = g2};
    if (touch) {
        const int64_t R = job.w13_rows, H = mc->hidden, I = mc->inter;
        touch_job t = {{w13, s13, w2, s2}, {(size_t)(ne * R * (H / 2)), (size_t)(ne * R * (H / 16)), (size_t)(ne * H * (I / 2)),
                                            (size_t)(ne * H * (I / 16))}, {0}};
        touch_pages(&t);
    }
    char msg[512];
    switch (kp_moe_gen_cuda_experts(&job, msg, sizeof msg)) {
    case KP_MOE_GEN_CUDA_OK: return 0;
    case KP_MOE_GEN_CUDA_NO_DEVICE: return KP_EXIT_SKIP; /* a machine without a GPU: the host's path, silently */
    case KP_MOE_GEN_CUDA_NO_ROOM:
        /* the same bytes from the host, slower: worth a line, not a failure */
        fprintf(stderr, "kparity: note: moe expert weights (hidden %lld, inter %lld) generated on the host: an expert "
                "does not fit the device generator's %zu-byte scratch or the device has not that much free\n",
                (long long)mc->hidden, (long long)mc->inter, scratch_bytes);
        return KP_EXIT_SKIP;
    default:
        return kp_fail(err, KP_EXIT_ENV, "moe expert weights on the GPU: %s. Hint: the host generator makes the "
                       "same bytes; CUDA_VISIBLE_DEVICES= runs it (and hides the GPU from the CUDA impls too)", msg);
    }
}

int kp_moe_experts_cuda(const kp_moe_case *mc, int64_t e0, int64_t ne, uint8_t *w13, uint8_t *s13, float *g13,
                        uint8_t *w2, uint8_t *s2, float *g2, kp_error *err) {
    return kp_moe_experts_cuda_in(KP_MOE_GEN_CUDA_SCRATCH, 1, mc, e0, ne, w13, s13, g13, w2, s2, g2, err);
}
