/* test_kernels_mla_plan.c: the sparse MLA split plans (kernels/mla_plan.h) against the split counts
 * families.md §D4 derives for an H200 from FlashMLA's scheduler, and their invariants: every block of
 * every request in exactly one split, in order; split_size's counts independent of the batch. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../kernels/mla_plan.h"

/* Request `r`'s split count in a batch of n requests of topk 2048 on 132 SMs, h_q 128, s_q 1. */
static int64_t splits_of(int64_t n, int64_t r) {
    int64_t *blocks = calloc((size_t)n, sizeof *blocks), *splits = calloc((size_t)n, sizeof *splits);
    for (int64_t i = 0; i < n; i++) blocks[i] = kp_mla_blocks(2048);
    cr_assert_gt(kp_mla_split_count_plan(blocks, n, kp_mla_sm_parts(132, 1, 128), splits, NULL, 0), 0);
    const int64_t s = splits[r];
    free(blocks), free(splits);
    return s;
}

Test(mla_plan, split_count_depends_on_the_batch_as_families_md_derives) {
    cr_assert_eq(kp_mla_blocks(2048), 32);
    cr_assert_eq(kp_mla_sm_parts(132, 1, 128), 66);
    cr_assert_eq(kp_mla_sm_parts(132, 2, 64), 66);
    cr_assert_eq(kp_mla_sm_parts(1, 2, 128), 1);
    cr_assert_eq(splits_of(1, 0), 32);
    cr_assert_eq(splits_of(2, 0), 16);
    cr_assert_eq(splits_of(8, 0), 7);
    cr_assert_eq(splits_of(32, 0), 2);
    const int64_t at33 = splits_of(33, 0);
    cr_assert(at33 == 2 || at33 == 3, "request 0 at batch 33: %lld splits", (long long)at33);
    int64_t differ = 0; /* at 33, the count depends on the position */
    for (int64_t r = 1; r < 33; r++) differ += splits_of(33, r) != at33;
    cr_assert_gt(differ, 0, "every request of a batch of 33 got %lld splits", (long long)at33);
    for (int64_t n = 64; n <= 128; n += 10) cr_assert_eq(splits_of(n, 0), 1, "batch %lld", (long long)n);
}

/* Every block of every request lies in exactly one split, splits ascending, for mixed lengths. */
Test(mla_plan, split_count_covers_every_block_once) {
    enum { N = 37 };
    int64_t blocks[N], splits[N], first[N * 64];
    for (int n = 1; n <= N; n++) {
        for (int i = 0; i < n; i++) blocks[i] = kp_mla_blocks((i * 977) % 2049); /* 1 to 32 blocks, 0 slots too */
        for (int64_t sms = 1; sms <= 264; sms += 37) {
            cr_assert_gt(kp_mla_split_count_plan(blocks, n, kp_mla_sm_parts(sms, 1, 64), splits, first, 64), 0);
            for (int i = 0; i < n; i++) {
                cr_assert(splits[i] >= 1 && splits[i] <= blocks[i], "request %d: %lld splits of %lld blocks", i,
                          (long long)splits[i], (long long)blocks[i]);
                cr_assert_eq(first[i * 64], 0);
                for (int64_t k = 1; k < splits[i]; k++)
                    cr_assert(first[i * 64 + k] > first[i * 64 + k - 1] && first[i * 64 + k] < blocks[i]);
            }
        }
    }
    /* one part holds the whole batch unsplit */
    int64_t two[2] = {32, 32}, s[2];
    cr_assert_eq(kp_mla_split_count_plan(two, 2, 1, s, NULL, 0), 1);
    cr_assert(s[0] == 1 && s[1] == 1);
}

Test(mla_plan, split_size_ignores_the_batch) {
    cr_assert_eq(kp_mla_split_size_splits(kp_mla_blocks(2048)), 32 / KP_MLA_SPLIT_BLOCKS);
    cr_assert_eq(kp_mla_split_size_splits(kp_mla_blocks(0)), 1);
    cr_assert_eq(kp_mla_split_size_splits(kp_mla_blocks(65)), 1);
    cr_assert_eq(kp_mla_split_size_splits(KP_MLA_SPLIT_BLOCKS + 1), 2);
}
