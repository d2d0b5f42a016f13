/* mla_plan.h: how the sparse MLA decode impls cut each request's top-k slots into splits, shared by
 * the host ports and the CUDA kernels so both devices run the same plan (DESIGN.md "mla",
 * families.md §D4).
 *
 * split_count (incumbent, modelled on FlashMLA's SM90 sparse decode scheduler): slots go in blocks of
 * KP_MLA_BLOCK (64); request i has n_i = ceil(max(1, len_i) / 64) blocks, len_i its topk_length or topk.
 * num_sm_parts = max(sms / s_q / (h_q / 64), 1); every part gets the same payload =
 * ceil(sum over the batch of (n_i + 5) / num_sm_parts) + 5 (5: a fixed overhead a request); parts take
 * requests in order, a request that fits (its remaining blocks + 5 within the part's payload left)
 * whole, else the part takes payload left - 5 of its blocks (when that is positive) as one split and
 * the next part goes on with the rest. A request's split count so depends on the whole batch: on an
 * H200 (132 SMs, h_q 128, s_q 1, topk 2048) 32 splits alone, 16 at batch 2, 1 at batch 64.
 *
 * split_size (candidate): every request is cut every KP_MLA_SPLIT_BLOCKS blocks, whatever the batch. */
#ifndef KP_MLA_PLAN_H
#define KP_MLA_PLAN_H

#include <stdint.h>

#if defined(__CUDACC__)
#define KP_MLA_FN __host__ __device__ static inline
#else
#define KP_MLA_FN static inline
#endif

#define KP_MLA_BLOCK 64          /* top-k slots a block (FlashMLA's TOPK_BLOCK_SIZE) */
#define KP_MLA_OVERHEAD 5        /* the scheduler's fixed overhead a request, in blocks */
#define KP_MLA_SPLIT_BLOCKS 16   /* split_size: blocks a split (1024 slots), whatever the batch: at 16 it is
                                    within 10% of split_count at batch 64 and 128 on the H200 (MEASURED.md) */
#define KP_MLA_HOST_SMS 132      /* the host port's model of the device: an H200's multiprocessors */

KP_MLA_FN int64_t kp_mla_blocks(int64_t len) { return ((len > 1 ? len : 1) + KP_MLA_BLOCK - 1) / KP_MLA_BLOCK; }

KP_MLA_FN int64_t kp_mla_sm_parts(int64_t sms, int64_t s_q, int64_t h_q) {
    const int64_t heads = h_q / 64 > 0 ? h_q / 64 : 1;
    const int64_t parts = sms / (s_q > 0 ? s_q : 1) / heads;
    return parts > 1 ? parts : 1;
}

/* split_count's plan for a batch of n requests of blocks[i] blocks: splits[i] receives request i's split
 * count and, when first_block is not NULL, first_block[i * max_splits + k] the first block of its split k
 * (max_splits at least the largest split count: blocks[i] is always enough). Returns the parts used, or -1
 * when the parts ran out before the batch did (FlashMLA asserts that never happens). */
KP_MLA_FN int64_t kp_mla_split_count_plan(const int64_t *blocks, int64_t n, int64_t parts, int64_t *splits,
                                          int64_t *first_block, int64_t max_splits) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += blocks[i] + KP_MLA_OVERHEAD;
    const int64_t payload = (total + parts - 1) / parts + KP_MLA_OVERHEAD;
    int64_t req = 0, at = 0, split = 0, used = 0;
    for (int64_t p = 0; p < parts && req < n; p++, used++) {
        int64_t left = payload;
        while (req < n) {
            if (first_block) first_block[req * max_splits + split] = at;
            const int64_t rest = blocks[req] - at;
            if (left >= rest + KP_MLA_OVERHEAD) { /* the rest of the request fits in this part */
                splits[req] = split + 1;
                left -= rest + KP_MLA_OVERHEAD;
                req++, at = 0, split = 0;
            } else {
                if (left > KP_MLA_OVERHEAD) at += left - KP_MLA_OVERHEAD, split++;
                break;
            }
        }
    }
    return req == n ? used : -1;
}

/* split_size's split count of a request of `blocks` blocks; split k starts at block k * KP_MLA_SPLIT_BLOCKS. */
KP_MLA_FN int64_t kp_mla_split_size_splits(int64_t blocks) { return (blocks + KP_MLA_SPLIT_BLOCKS - 1) / KP_MLA_SPLIT_BLOCKS; }

#endif
