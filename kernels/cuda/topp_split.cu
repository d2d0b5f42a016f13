/* topp_split.cu: topp.split_logit@cuda (incumbent) and topp.split_prob@cuda (candidate), the steps
 * of kernels/topp_split.h. All launches ordered on args->stream (a split_prob batch of 64 rows or
 * more may run its second half on a stream of the impl's own, forked from and joined back into
 * args->stream with events); no host sync; graph-capturable. split_prob launches each kernel after
 * its first with programmatic dependent launch on a device that runs sm_90 code (pdl_wait,
 * kp_cuda.cuh), so a launch's latency hides behind the previous kernel's last blocks.
 *
 * split_logit (unchanged, vLLM's small-batch split pipeline with its defect): a 1-D grid of
 * batch * S programs (256 threads, program row * S + slice), S = the largest power of two <= 32 with
 * S * 2 * batch <= sm_count, 7 launches: stats, 5 rounds, mask.
 *   1. topp_stats_kernel: per piece, max / min / finite count (order-free) and sum exp(x - max)
 *      (lane t sums tokens t, t + 256, ... in order, then a halving tree over the 256 lanes, the
 *      last levels of which one warp runs with shuffles, in the same order).
 *   2. topp_round_kernel x5: every program replays the combine of the stored stats and of the
 *      earlier rounds' partials (sequential over pieces, in piece order), evaluates the round's 8
 *      pivots over its slice and stores (mass, smallest prob, count) per piece and pivot.
 *   3. topp_mask_kernel: replays the search, then masks; the tie budget is handed out in index
 *      order (dup counts of lower pieces from the stored partials, a ballot scan inside).
 *
 * split_prob: the search of topp_split.h with KP_TOPP_FANOUT_PROB_GPU = 2048 pivots a round spaced
 * by a power of two, so KP_TOPP_ROUNDS_PROB_GPU = 3 rounds decide (the host port takes 64 a round,
 * 5 rounds; the decision depends only on the multiset of f32 probs and P, not on the pivots on the
 * way). Two paths, the same bits (the tests compare both with the host port, and a row across them):
 * - fused, when a row fits in a cluster of at most 16 blocks of at most 16 tiles and the device can
 *   hold every row's cluster at once (topp_fused_plan): prob_fused_kernel, one thread-block cluster
 *   per row holding the row in shared memory, then prob_select_kernel (see there). Its mask lists a
 *   trimmed level's members per warp (one atomic per flush), and not at all when the level (its
 *   size known from the search) exceeds the list: the select rescans the row then.
 * - split, otherwise: a memset zeroes the bucket masses and counters, then 6 launches (a batch of 64
 *   rows or more whose halves do not fit the fused path runs as two halves, each such a chain, the
 *   second on a stream of its own, forked from and joined back into the call's: topp_prob_halves):
 *   1. prob_stats_kernel: one 256-thread block per 2048-token tile (thread t reads tokens t,
 *      t + 256, ...); the records are topp_stats_kernel's bit for bit (see there). The block that
 *      finishes a row's last tile (a fence, then a counter) combines the tiles in order and stores
 *      round 0's state.
 *   2. prob_round_kernel x3, programs per row chosen so the grid is about KP_TOPP_BLOCKS_PER_SM
 *      programs per SM (the tiles and the integer sums make every bit independent of that choice).
 *      A program reads the state entering its round (a decided row passes it on and returns); it
 *      buckets the tokens of its tiles with lo < prob <= hi (expf skipped outside a 1e-3-nat band)
 *      into a shared histogram of 64-bit fix-masses (32-bit atomics with carry; per warp group, by
 *      float, when the bracket is at most 255 floats wide), then adds them into the row's buckets
 *      with 64-bit global atomics: integer sums, exact and order-free. The row's last program (fence,
 *      counter) decides the round with a parallel suffix scan and stores the next state. Round 0
 *      computes each batch of 16 probs with no branch between them (its bracket holds nearly every
 *      token). Round 1 also masks: a token outside its bracket is kept (prob > hi) or dropped
 *      (prob <= lo) whatever the later rounds decide, so round 1 writes those outputs (no branch
 *      unless a token lies in the band) and lists the tokens in its bracket (through a per-block
 *      shared buffer); unless the list overflowed, its last program then runs round 2 (whose
 *      bracket lies inside) over that list itself, writes the listed tokens' outputs, and the
 *      round-2 launch only passes the state on. A row whose list overflowed is read again by round
 *      2's programs. A row decided before round 1 is masked by round 1's programs. Reads carry L2
 *      eviction priorities (evict_last in the statistics and round 0, evict_first after).
 *   3. prob_mask_kernel, for the rows round 1 could not finish (their list overflowed): the final
 *      state; keeps prob > lo and drops the rest, leaving the members of a level to be trimmed to
 *      prob_select_kernel, and lists them (logit key, index) in the workspace, in a varying order
 *      (shared buffer per tile, one global atomic per tile and block). Round 1 masks the other rows
 *      with the same rule (mask_pieces, mask_listed), listing level members the same way.
 *   4. prob_select_kernel: one 1024-thread block per row that needs a trim; it ranks a level of up to
 *      1024 members directly, selects over the list up to 16384 (cached in dynamic shared memory),
 *      or rescans the row past that.
 * Workspace: split_logit: stats [batch][32] and partials [batch][5][32][8] (16 bytes each);
 * split_prob: tile stats [batch][ceil(vocab / 2048)] (16 bytes), buckets [batch][3][2049] (8 bytes)
 * and counters [batch][8] (4 bytes; these two zeroed by the memset), states [batch][4], level
 * lists [batch][3][min(vocab, 16384) rounded up to 4] and round 1's bracket lists [batch][3 x that]
 * (4 bytes); the fused path uses only the last
 * state, the level count (which it zeroes) and the lists. Nothing is read from the workspace before
 * this call wrote it.
 * The host ports (kernels/host/topp_split.c) use the same order of f32 operations, so host and
 * CUDA differ only where CUDA's expf/logf differ from the host libm's in the last bits.
 * f32 products that feed a sum use __fmul_rn so nvcc cannot contract them into an FMA the host
 * port does not do; split_prob's prob = e / z is div.rn's fast path with the reciprocal once per row
 * (topp_div.cuh), the same bits wherever a kernel looks at them.
 *
 * Files: this one holds the checks, the workspace, the per-device driver answers and the two kp_impl
 * objects; topp_cuda.cuh the plan and the lane and tree helpers; kp_cuda.cuh the generic CUDA
 * helpers (error reporting, programmatic launch, hinted and strided loads); topp_split_logit.cu the
 * incumbent; topp_prob.cuh split_prob's shared device steps; topp_split_prob.cu its split kernels
 * and launches; topp_prob_fused.cu and topp_prob_select.cu its fused and select kernels;
 * topp_div.cuh the division. */
#include <mutex>

#include "topp_prob.cuh"

/* The two kp_impl objects at the end are the ones kernels/kp_registry.h declares, with C linkage. */

static int64_t topp_piece_cap(int algo, int64_t vocab) {
    return algo == ALGO_SPLIT_LOGIT ? KP_TOPP_MAX_SLICES : (vocab + KP_TOPP_TILE - 1) / KP_TOPP_TILE;
}

/* Workspace bytes for valid args, 0 for args topp_check refuses.
 * split_logit: stats [batch][32] and partials [batch][5][32][8], 16 bytes each.
 * split_prob: tile stats [batch][ceil(vocab / 2048)] (16 bytes), bucket masses
 * [batch][ROUNDS_PROB][F + 1] (8 bytes), counters, search states [batch][ROUNDS_PROB + 1], level lists
 * (3 x level cap) and bracket lists (3 x level cap, 4 bytes each). */
static int64_t topp_workspace_per_row(int algo, int64_t vocab) {
    if (algo == ALGO_SPLIT_LOGIT)
        return topp_piece_cap(algo, vocab) *
               (int64_t)(sizeof(topp_stats) + KP_TOPP_ROUNDS_LOGIT * KP_TOPP_FANOUT * sizeof(topp_part));
    return topp_piece_cap(algo, vocab) * (int64_t)sizeof(topp_stats) + topp_zeroed_per_row() +
           (int64_t)((PROB_R + 1) * sizeof(kp_topp_search)) + 6 * topp_level_cap(vocab) * (int64_t)sizeof(uint32_t);
}

/* split_prob: the rows of a split batch's first half: even, so the second half's workspace starts
 * 16-byte aligned, a row's share being a multiple of 8 bytes (the tile records 16 bytes a tile, the
 * lists 24 bytes a level-cap entry, and the fixed part below) */
static int64_t topp_prob_first_half(int64_t batch) { return (batch / 2) & ~(int64_t)1; }
static_assert((topp_zeroed_per_row() + (PROB_R + 1) * sizeof(kp_topp_search)) % 8 == 0 && sizeof(topp_stats) == 16,
              "a row's share of split_prob's workspace is a multiple of 8 bytes");

static size_t topp_workspace(int algo, const kp_topp_args *a) {
    if (!a || a->batch <= 0 || a->vocab <= 0 || a->vocab > INT32_MAX - KP_TOPP_TILE) return 0;
    const int64_t per_row = topp_workspace_per_row(algo, a->vocab);
    if (a->batch > INT64_MAX / per_row) return 0;
    return (size_t)(a->batch * per_row);
}

/* Shape and pointer checks shared by supports() and run(); the message names the field. */
static int topp_check(const char *name, const kp_topp_args *a, char *message, size_t message_len) {
    const int ns = KP_RUN_NOT_SUPPORTED;
    if (!a) return kp_cuda_fail_msg(message, message_len, ns, "%s: args is NULL", name);
    if (!a->logits) return kp_cuda_fail_msg(message, message_len, ns, "%s: logits is NULL", name);
    if (!a->out) return kp_cuda_fail_msg(message, message_len, ns, "%s: out is NULL", name);
    if (!a->top_p) return kp_cuda_fail_msg(message, message_len, ns, "%s: top_p is NULL", name);
    if (a->batch <= 0)
        return kp_cuda_fail_msg(message, message_len, ns, "%s: batch %lld <= 0", name, (long long)a->batch);
    if (a->vocab <= 0)
        return kp_cuda_fail_msg(message, message_len, ns, "%s: vocab %lld <= 0", name, (long long)a->vocab);
    if (a->row_stride < a->vocab)
        return kp_cuda_fail_msg(message, message_len, ns, "%s: row_stride %lld < vocab %lld", name,
                                (long long)a->row_stride, (long long)a->vocab);
    if (a->sm_count < 0)
        return kp_cuda_fail_msg(message, message_len, ns, "%s: sm_count %d < 0", name, (int)a->sm_count);
    if (a->vocab > INT32_MAX - KP_TOPP_TILE)
        return kp_cuda_fail_msg(message, message_len, ns, "%s: vocab %lld above the 32-bit token index limit %d",
                                name, (long long)a->vocab, INT32_MAX - KP_TOPP_TILE);
    if (a->batch > INT32_MAX / KP_TOPP_MAX_SLICES)
        return kp_cuda_fail_msg(message, message_len, ns, "%s: batch %lld above the grid limit %d", name,
                                (long long)a->batch, INT32_MAX / KP_TOPP_MAX_SLICES);
    if ((a->batch - 1) > (INT64_MAX / (int64_t)sizeof(float) - a->vocab) / a->row_stride)
        return kp_cuda_fail_msg(message, message_len, ns, "%s: batch %lld x row_stride %lld overflows", name,
                                (long long)a->batch, (long long)a->row_stride);
    return KP_RUN_OK;
}

/* What split_prob's launcher asks the driver about a device, asked once per device (none of it
 * changes between calls; asking on every call cost several driver calls per call): the SM count,
 * whether the code the device runs was built for sm_90 or later (thread-block clusters, for the fused
 * path), the kernels' shared-memory limits (set once to the most any call needs), and, per fused
 * shape, how many clusters can run at once; and, made on the first call that splits a batch, the
 * stream and events of topp_prob_halves. The limits, the stream and the events belong to the device's
 * primary context, so this assumes nothing in the process calls cudaDeviceReset between calls
 * (nothing in kparity does; after one, the first launch needing more than 48 KiB of shared memory or
 * the first split batch would fail, reported). */
#define TOPP_MAX_DEVICES 64
static std::mutex topp_devices_lock; /* held for the whole split_prob launch sequence */
static topp_device_info topp_devices[TOPP_MAX_DEVICES];

static int topp_device_ready(topp_device_info *d, int device, char *message, size_t message_len) {
    if (d->ready) return KP_RUN_OK;
    *d = topp_device_info{};
    KP_CUDA_CHECK(cudaDeviceGetAttribute(&d->sm_count, cudaDevAttrMultiProcessorCount, device));
    cudaError_t e = cudaSuccess;
    d->sm90 = prob_fused_has_clusters(&e);
    KP_CUDA_CHECK(e);
    const int sel_bytes = (int)(topp_level_cap(LEVEL_CAP) < SEL_CAP_MAX ? topp_level_cap(LEVEL_CAP) : SEL_CAP_MAX) * 4;
    KP_CUDA_CHECK(prob_select_set_limit(sel_bytes));
    if (d->sm90) KP_CUDA_CHECK(prob_fused_set_limits());
    d->ready = true;
    return KP_RUN_OK;
}

/* split_prob: a batch of at least PROB_SPLIT_ROWS rows whose halves take the split path runs as two
 * halves, the second on the device's own stream, both started after the call's stream and joined back
 * into it with events (so the call stays ordered on its stream and graph-capturable). Each half is a
 * call of its own on its rows and its share of the workspace (rows are independent, and a row's bits
 * do not depend on its batch), and the two chains of launches overlap: one half's row tails and
 * small launches run beside the other's passes. From 64 rows and in two halves, started together:
 * halves of 16 rows, four quarters and staggered halves were slower (measured variants: MEASURED.md). */
#define PROB_SPLIT_ROWS 64
static int topp_prob_split_batch(topp_device_info *dev, const kp_topp_args *a, bool *split, char *message,
                                 size_t message_len) {
    *split = false;
    if (a->batch < PROB_SPLIT_ROWS) return KP_RUN_OK;
    bool fused = true; /* a half that fits the fused path is better left whole */
    const int rc = topp_prob_fused_rows(dev, a->vocab, topp_prob_first_half(a->batch), &fused, message, message_len);
    *split = !fused;
    return rc;
}

static int topp_prob_halves(const topp_plan &plan, const kp_topp_args *a, topp_device_info *dev, int sm_count,
                            cudaStream_t stream, char *message, size_t message_len) {
    if (!dev->half) {
        KP_CUDA_CHECK(cudaStreamCreateWithFlags(&dev->half, cudaStreamNonBlocking));
        KP_CUDA_CHECK(cudaEventCreateWithFlags(&dev->fork, cudaEventDisableTiming));
        KP_CUDA_CHECK(cudaEventCreateWithFlags(&dev->join, cudaEventDisableTiming));
    }
    const int64_t first = topp_prob_first_half(a->batch), per_row = topp_workspace_per_row(ALGO_SPLIT_PROB, a->vocab);
    KP_CUDA_CHECK(cudaEventRecord(dev->fork, stream));
    KP_CUDA_CHECK(cudaStreamWaitEvent(dev->half, dev->fork, 0));
    for (int h = 0; h < 2; h++) {
        const int64_t row = h ? first : 0;
        kp_topp_args part = *a; /* topp_prob_launch reads its batch and vocab; the pointers go in p */
        part.batch = h ? a->batch - first : first;
        topp_plan p = plan;
        p.logits = a->logits + row * a->row_stride;
        p.out = a->out + row * a->row_stride;
        p.top_p = a->top_p + row;
        /* the half's share of the workspace, 16-byte aligned: row is even */
        p.stats = reinterpret_cast<topp_stats *>(static_cast<char *>(a->workspace) + row * per_row);
        const int rc = topp_prob_launch(p, &part, dev, sm_count, h ? dev->half : stream, message, message_len);
        if (rc != KP_RUN_OK) return rc;
    }
    KP_CUDA_CHECK(cudaEventRecord(dev->join, dev->half));
    KP_CUDA_CHECK(cudaStreamWaitEvent(stream, dev->join, 0));
    return KP_RUN_OK;
}

template <int ALGO>
static int topp_cuda_run(const char *name, const void *vargs, char *message, size_t message_len) {
    const kp_topp_args *a = static_cast<const kp_topp_args *>(vargs);
    int rc = topp_check(name, a, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    const size_t need = topp_workspace(ALGO, a);
    if (!a->workspace)
        return kp_cuda_fail_msg(message, message_len, KP_RUN_FAILED, "%s: workspace is NULL but %zu bytes are needed",
                                name, need);
    if (a->workspace_bytes < need)
        return kp_cuda_fail_msg(message, message_len, KP_RUN_FAILED, "%s: workspace_bytes %zu < %zu needed", name,
                                a->workspace_bytes, need);
    if (reinterpret_cast<uintptr_t>(a->workspace) % 16 != 0)
        return kp_cuda_fail_msg(message, message_len, KP_RUN_FAILED, "%s: workspace is not 16-byte aligned", name);

    int device = 0;
    KP_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> hold(topp_devices_lock);
    topp_device_info scratch = {}; /* a device past the table is asked on every call */
    topp_device_info *dev = device < TOPP_MAX_DEVICES ? &topp_devices[device] : &scratch;
    rc = topp_device_ready(dev, device, message, message_len);
    if (rc != KP_RUN_OK) return rc;
    const int sm_count = a->sm_count ? a->sm_count : dev->sm_count;
    topp_plan plan;
    plan.logits = a->logits;
    plan.out = a->out;
    plan.top_p = a->top_p;
    plan.row_stride = a->row_stride;
    plan.vocab = (int)a->vocab;
    plan.piece_cap = (int)topp_piece_cap(ALGO, a->vocab);
    plan.hist = NULL;
    plan.search = NULL;
    plan.counts = NULL;
    plan.level_list = NULL;
    plan.cand_list = NULL;
    plan.level_cap = 0;
    plan.sel_cap = 0;
    plan.parts = NULL;
    plan.stats = static_cast<topp_stats *>(a->workspace);
    cudaStream_t stream = static_cast<cudaStream_t>(a->stream);
    if (ALGO == ALGO_SPLIT_LOGIT) return topp_logit_launch(plan, a, sm_count, stream, message, message_len);
    if (ALGO == ALGO_SPLIT_PROB) {
        bool split = false;
        rc = topp_prob_split_batch(dev, a, &split, message, message_len);
        if (rc != KP_RUN_OK) return rc;
        if (split && dev != &scratch) return topp_prob_halves(plan, a, dev, sm_count, stream, message, message_len);
    }
    return topp_prob_launch(plan, a, dev, sm_count, stream, message, message_len);
}

static size_t split_logit_workspace_bytes(const void *args) {
    return topp_workspace(ALGO_SPLIT_LOGIT, static_cast<const kp_topp_args *>(args));
}
static size_t split_prob_workspace_bytes(const void *args) {
    return topp_workspace(ALGO_SPLIT_PROB, static_cast<const kp_topp_args *>(args));
}
static int split_logit_supports(const void *args, char *message, size_t message_len) {
    return topp_check("topp.split_logit@cuda", static_cast<const kp_topp_args *>(args), message, message_len);
}
static int split_prob_supports(const void *args, char *message, size_t message_len) {
    return topp_check("topp.split_prob@cuda", static_cast<const kp_topp_args *>(args), message, message_len);
}
static int split_logit_run(const void *args, char *message, size_t message_len) {
    return topp_cuda_run<ALGO_SPLIT_LOGIT>("topp.split_logit@cuda", args, message, message_len);
}
static int split_prob_run(const void *args, char *message, size_t message_len) {
    return topp_cuda_run<ALGO_SPLIT_PROB>("topp.split_prob@cuda", args, message, message_len);
}

extern "C" {
extern const kp_impl kp_topp_split_logit_cuda;
extern const kp_impl kp_topp_split_prob_cuda;
}

extern "C" const kp_impl kp_topp_split_logit_cuda = {
    KP_ABI_VERSION, "topp", "topp.split_logit@cuda", KP_MEMORY_CUDA,
    split_logit_workspace_bytes, split_logit_supports, split_logit_run,
};

extern "C" const kp_impl kp_topp_split_prob_cuda = {
    KP_ABI_VERSION, "topp", "topp.split_prob@cuda", KP_MEMORY_CUDA,
    split_prob_workspace_bytes, split_prob_supports, split_prob_run,
};
