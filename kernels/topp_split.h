/* topp_split.h: the split top-p algorithms shared by the host ports and the CUDA kernels, so the
 * two devices run the same steps with the same constants, and split_prob's whole search (below)
 * is one set of inline functions compiled for both.
 *
 * 1. Statistics (both). The row is cut into pieces. Per piece, in f32: max finite logit m, sum of
 *    exp(x - m) over finite x, min finite logit, finite count. NaN counts as absent.
 *    - split_logit (incumbent): pieces are S slices, S = the largest power of two <= 32 with
 *      S * 2 * batch <= sm_count (at least 1); slice s covers [s*L, min((s+1)*L, vocab)),
 *      L = ceil(vocab / S). So the reduction order, hence Z's bits, depend on the batch size.
 *    - split_prob (candidate): pieces are fixed tiles of KP_TOPP_TILE elements whatever the
 *      batch; slices only decide which program handles which tiles.
 *    Pieces combine in index order: M = max m_i, Z = sum_i s_i * exp(m_i - M) (f32, sequential).
 *    prob(x) = exp(x - M) / Z in f32, the same expression everywhere below.
 *
 * split_logit (incumbent, the defect model of vLLM's split pipeline; unchanged):
 * 2. Pivot ladder. lo = max(exp(min - M) / Z, 1e-30), hi = 1 / Z. Each of 5 rounds evaluates
 *    F = KP_TOPP_FANOUT (8) pivots lo * exp(log(hi / lo) * (f + 1) / (F + 1)), and for each: mass =
 *    f32 sum of prob over prob > pivot, the smallest such prob and how many tokens share it. A pivot
 *    is ok when mass >= p and mass - minprob * nmin < p; the highest ok pivot wins. Otherwise lo
 *    becomes the largest pivot with mass >= p and hi the smallest with mass < p; `best` is the
 *    largest pivot seen with mass >= p. Stops when a pivot is ok, when hi <= lo * (1 + 1e-7), or
 *    after 5 rounds. No ok pivot: fall back to `best`, else keep every finite token.
 * 3. Ties. dup = the boundary f32 prob; numkeep = numdup - floor(max(mass - p, 0) / dup), clamped
 *    to [1, numdup]; copies kept lowest index first.
 * 4. Mask. keep x > log(pivot) + log(Z) + M (the seed's defect: with M = 1e9 the threshold rounds
 *    to M and every token is dropped).
 *
 * split_prob (candidate): the boundary is an f32 probability LEVEL, found exactly.
 *    Distinct logits can share one f32 prob (on near-uniform rows a level holds thousands of
 *    tokens), so the set {prob > pivot} moves a whole level at a time; the unit of the search is
 *    the level, and the members of the boundary level are ranked by the rule's order.
 * 2. Exact masses. Every prob is turned into the 64-bit integer fix(prob) = trunc(prob * 2^62)
 *    (exact for prob >= 2^-38; a level's members all add the same integer), and masses are integer
 *    sums: exact, independent of order, slicing and batch (the CUDA kernels add them with integer
 *    atomics), so P = fix(top_p) is compared exactly.
 * 3. Pivot ladder in the bits of the prob. Positive floats order like their bit patterns. lo = the
 *    float just below max(prob(min), 1e-30) (so at first every token is above lo), hi = 1 / Z (no
 *    token is above it), mass(hi) = 0. Each round evaluates F = KP_TOPP_FANOUT_PROB (64) pivots
 *    pivot_f = lo + floor(f * (hi - lo) / F) in bits, f = 0 .. F-1 (pivot_0 = lo): each token with
 *    lo < prob <= hi lands in bucket k = #{f : pivot_f < prob}, and mass(f) = mass(hi) + the sum of
 *    buckets above f. j = the largest f with mass(f) >= P (none: the row's f32 mass never reaches P,
 *    keep every finite token). lo = pivot_j, hi = the next pivot (or hi), mass(hi) = its mass. Once
 *    hi = lo + 1 bit the boundary level is q = hi: with mass(lo) >= P and mass(lo) - q * n < P, which
 *    is the ok test (mass >= p and mass - q * n_level < p) made exact, n_level = (mass(lo) -
 *    mass(hi)) / fix(q). The bracket (< 2^30 bits: 1e-30 .. 1.0) shrinks 64-fold per round, so
 *    after 4 rounds it is at most 64 floats wide and the 5th round's pivots are every float in it:
 *    KP_TOPP_ROUNDS_PROB = 5 rounds always decide (near-uniform rows decide in round 1); a round
 *    after the decision does nothing. The decision depends only on the multiset of f32 probs and P,
 *    not on the path: q is the one f32 prob with mass(prob > q) < P <= mass(prob >= q). So the CUDA
 *    kernels take F = KP_TOPP_FANOUT_PROB_GPU (2048) pivots a round spaced by a power of two,
 *    pivot_f = lo + f * 2^sh with sh the smallest such that F * 2^sh >= hi - lo (a token's bucket is
 *    then ((prob_bits - lo - 1) >> sh) + 1; pivots at or past hi count nothing and hi caps the next
 *    bracket): < 2^30 -> 2^19 -> 2^8 -> 1 bits, so KP_TOPP_ROUNDS_PROB_GPU = 3 rounds decide. They
 *    find j with a parallel scan; both devices share kp_topp_advance_to, which applies a round's j
 *    whatever the pivots.
 * 4. Ties. numkeep = n_level - floor((mass(lo) - P) / fix(q)), clamped to [1, n_level]. The kept
 *    members of the level are the first numkeep in the rule's order: logit descending (-0 = +0),
 *    then index ascending. Host: sort the level. CUDA: the mask (many blocks per row) lists the
 *    members (order-preserving logit key, index) in the workspace, up to 16384 per row; then one
 *    1024-thread block per row that needs a trim either ranks them directly (at most 1024: each
 *    counts the members before it) or runs a radix select over the list (4 passes of 8 bits,
 *    integer histograms, the digit picked by a warp's integer suffix scan) for the numkeep-th
 *    largest key T, and the same select over ~index for the `need` members at T with the lowest
 *    indices. A larger level is rescanned from the row instead. No order-dependent atomics (appends
 *    vary in order, the selected values do not).
 * 5. Mask. Keep prob > lo (prob >= q) except the level members not selected; drop the rest; rows
 *    with top_p >= 1 keep every finite token; rows with no finite token are copied unchanged. Kept
 *    tokens are copied bit for bit, dropped ones become -inf. The CUDA kernels skip expf for tokens
 *    whose f32 x - M lies 1e-3 nats or more outside the band of interest (KP_TOPP_BAND_MARGIN); that
 *    only saves work, the outcome is the one computing every prob would give. The CUDA bucket
 *    masses are added as 64-bit integers (32-bit shared atomics with carry per warp, 64-bit global
 *    atomics per block), and each kernel zeroes the buckets the next one fills: nothing is read
 *    from the workspace before the call wrote it.
 */
#ifndef KP_TOPP_SPLIT_H
#define KP_TOPP_SPLIT_H

#include <stdint.h>

#define KP_TOPP_TILE 2048
#define KP_TOPP_FANOUT 8
#define KP_TOPP_MAX_SLICES 32
#define KP_TOPP_ROUNDS_LOGIT 5
#define KP_TOPP_PIVOT_FLOOR 1e-30f
#define KP_TOPP_COLLAPSE 1e-7f
#define KP_TOPP_HOST_SM_COUNT 132 /* the H200's SM count: host ports pick slices as it would */

#define KP_TOPP_FANOUT_PROB 64
#define KP_TOPP_ROUNDS_PROB 5
#define KP_TOPP_FANOUT_PROB_GPU 2048   /* split_prob@cuda: 2048 pivots a round ... */
#define KP_TOPP_ROUNDS_PROB_GPU 3      /* ... so 3 rounds decide (< 2^30 -> 2^19 -> 2^8 -> 1 bits) */
#define KP_TOPP_FIX_SCALE 0x1p62f      /* fix(prob) = trunc(prob * 2^62) */
#define KP_TOPP_BLOCKS_PER_SM 4        /* split_prob@cuda: programs per SM it aims the grid at */
#define KP_TOPP_BAND_MARGIN 1e-3       /* nats: expf's error is ~1e-7 relative, far inside */

#ifdef __CUDACC__
#define KP_TOPP_HD static inline __host__ __device__
/* run once per block by one thread: kept out of line so the kernels' register budgets stay small */
#define KP_TOPP_HD_ONCE static __host__ __device__ __noinline__ __attribute__((unused))
#else
#define KP_TOPP_HD static inline
#define KP_TOPP_HD_ONCE static inline
#endif

/* split_prob's search state for one row. */
enum { KP_TOPP_COPY = 0, KP_TOPP_KEEP_FINITE = 1, KP_TOPP_LIVE = 2, KP_TOPP_LEVEL = 3, KP_TOPP_ABOVE = 4 };
typedef struct kp_topp_search {
    float row_max, z;
    int32_t mode;      /* LIVE: searching; LEVEL: keep prob > lo, the level prob == hi trimmed to numkeep;
                          ABOVE: keep prob > lo (a search not decided in its rounds: cannot happen, see 3.) */
    uint32_t lo, hi;   /* prob bits */
    uint32_t unused;
    uint64_t hi_mass;  /* fix-mass of the tokens with prob > hi */
    uint64_t target;   /* fix(top_p) */
    int64_t numdup, numkeep;
} kp_topp_search;

KP_TOPP_HD uint32_t kp_topp_bits(float x) {
    union {
        float f;
        uint32_t u;
    } c;
    c.f = x;
    return c.u;
}
KP_TOPP_HD float kp_topp_float(uint32_t u) {
    union {
        float f;
        uint32_t u;
    } c;
    c.u = u;
    return c.f;
}
KP_TOPP_HD uint64_t kp_topp_fix(float prob) { return (uint64_t)(prob * KP_TOPP_FIX_SCALE); }

/* Order-preserving key of a logit (larger logit, larger key); -0 and +0 share one key. */
KP_TOPP_HD uint32_t kp_topp_logit_key(float x) {
    uint32_t u = kp_topp_bits(x);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Step 3's start from the row statistics. */
KP_TOPP_HD_ONCE void kp_topp_start(kp_topp_search *s, float row_max, float z, float row_min, int64_t finite, float p,
                              float min_prob) {
    s->row_max = row_max;
    s->z = z;
    s->unused = 0;
    s->hi_mass = 0;
    s->numdup = s->numkeep = 0;
    s->lo = s->hi = 0;
    s->target = 0;
    (void)row_min;
    if (finite == 0) {
        s->mode = KP_TOPP_COPY;
        return;
    }
    if (!(p < 1.0f)) {
        s->mode = KP_TOPP_KEEP_FINITE;
        return;
    }
    float floor_prob = min_prob < KP_TOPP_PIVOT_FLOOR ? KP_TOPP_PIVOT_FLOOR : min_prob;
    s->lo = kp_topp_bits(floor_prob) - 1u;
    s->hi = kp_topp_bits(1.0f / z);
    s->target = kp_topp_fix(p);
    s->mode = s->hi > s->lo ? KP_TOPP_LIVE : KP_TOPP_KEEP_FINITE;
}

KP_TOPP_HD uint32_t kp_topp_pivot(const kp_topp_search *s, int f) {
    return s->lo + (uint32_t)(((uint64_t)(uint32_t)f * (uint64_t)(s->hi - s->lo)) / KP_TOPP_FANOUT_PROB);
}

/* Bucket of a prob with lo < prob <= hi: #{f : pivot_f < prob}, in 1 .. F (pivots non-decreasing). */
KP_TOPP_HD int kp_topp_bucket(const uint32_t pivots[KP_TOPP_FANOUT_PROB], uint32_t prob_bits) {
    int lo = 0, n = KP_TOPP_FANOUT_PROB; /* lower bound: first f with pivots[f] >= prob_bits */
    while (n > 0) {
        int half = n / 2;
        if (pivots[lo + half] < prob_bits) {
            lo += half + 1;
            n -= half + 1;
        } else {
            n = half;
        }
    }
    return lo;
}

/* A round's outcome applied to the state: j = the largest f with mass(f) >= P (-1: none), mass_j =
 * mass(j), mass_next = mass(j + 1) (mass(F) = mass(hi)), new_lo = pivot j and new_hi = pivot j + 1
 * (or hi). Shared by both devices, whatever their pivots. */
KP_TOPP_HD_ONCE void kp_topp_advance_to(kp_topp_search *s, int j, uint64_t mass_j, uint64_t mass_next, uint32_t new_lo,
                                        uint32_t new_hi) {
    if (s->mode != KP_TOPP_LIVE) return;
    if (j < 0) { /* even every token above lo misses P: the f32 mass never reaches it */
        s->mode = KP_TOPP_KEEP_FINITE;
        return;
    }
    uint64_t new_hi_mass = mass_next;
    s->lo = new_lo;
    s->hi = new_hi;
    s->hi_mass = new_hi_mass;
    if (new_hi - new_lo > 1u) return; /* still LIVE */
    /* decided: the level prob == hi */
    uint64_t q = kp_topp_fix(kp_topp_float(new_hi));
    uint64_t level_mass = mass_j - new_hi_mass;
    if (q == 0 || level_mass == 0) { /* cannot happen (mass(lo) >= P > mass(hi)); keep prob > lo */
        s->mode = KP_TOPP_ABOVE;
        return;
    }
    int64_t n = (int64_t)(level_mass / q);
    int64_t drop = (int64_t)((mass_j - s->target) / q);
    int64_t keep = drop < n ? n - drop : 1;
    s->mode = KP_TOPP_LEVEL;
    s->numdup = n;
    s->numkeep = keep < 1 ? 1 : keep;
}

/* One round's buckets (hist[1 .. F], F = KP_TOPP_FANOUT_PROB; hist[0] unused) applied to the state:
 * mass(f) = mass(hi) + hist[f+1] + ... + hist[F] falls as f rises, so scan down from F-1 for the
 * largest f with mass(f) >= P. */
KP_TOPP_HD_ONCE void kp_topp_advance(kp_topp_search *s, const uint64_t hist[KP_TOPP_FANOUT_PROB + 1]) {
    if (s->mode != KP_TOPP_LIVE) return;
    uint64_t run = s->hi_mass, mass_j = 0, mass_next = 0;
    int j = -1;
    for (int f = KP_TOPP_FANOUT_PROB - 1; f >= 0; f--) {
        uint64_t before = run;
        run += hist[f + 1];
        if (run >= s->target) {
            j = f;
            mass_j = run;
            mass_next = before;
            break;
        }
    }
    if (j < 0) {
        kp_topp_advance_to(s, j, 0, 0, 0, 0);
        return;
    }
    kp_topp_advance_to(s, j, mass_j, mass_next, kp_topp_pivot(s, j),
                       j + 1 < KP_TOPP_FANOUT_PROB ? kp_topp_pivot(s, j + 1) : s->hi);
}

/* split_prob@cuda's pivot schedule (3. above), kept here so that its kernels (kernels/cuda/topp_prob.cuh:
 * pivot_shift, decide_round, round_counter) and the host test that holds the schedule to the host ladder
 * (tests/test_kernels_host_topp.c, through tests/fixtures/topp_gpu_schedule.h) run the same code:
 * pivot_f = lo + f * 2^sh, sh the smallest with F * 2^sh >= W = hi - lo. */
KP_TOPP_HD int kp_topp_gpu_shift(uint32_t lo, uint32_t hi) {
    /* 2^sh >= ceil(W / F) = ((W - 1) >> 11) + 1: sh = the bit length of (W - 1) >> 11 */
#ifdef __CUDA_ARCH__
    return 32 - __clz((int)((hi - lo - 1) >> 11));
#else
    uint32_t c = (hi - lo - 1) >> 11;
    int sh = 0;
    while (c) sh++, c >>= 1;
    return sh;
#endif
}

/* Test-only: 1 leaves the pivots at or past hi in a round's decision (the defect an H200 run found), so the schedule
 * test's positive control plants into this code rather than into a model of it. Production builds never set it. */
#ifndef KP_TOPP_PLANT_PIVOTS_PAST_HI
#define KP_TOPP_PLANT_PIVOTS_PAST_HI 0
#endif

/* The largest pivot index a round may pick: pivots at or past hi are left out (they count nothing, and with P = 0,
 * top_p under 2^-62, they would all pass). */
KP_TOPP_HD int kp_topp_gpu_last_pivot(uint32_t lo, uint32_t hi, int sh) {
    const uint32_t below_hi = (hi - lo - 1) >> sh;
    if (KP_TOPP_PLANT_PIVOTS_PAST_HI || below_hi >= KP_TOPP_FANOUT_PROB_GPU - 1) return KP_TOPP_FANOUT_PROB_GPU - 1;
    return (int)below_hi;
}

/* The bucket #{f : pivot_f < prob_bits} = ((D - 1) >> sh) + 1 of prob bits pb, D = pb - lo, 1 <= D <= W. */
KP_TOPP_HD int kp_topp_gpu_bucket(uint32_t pb, uint32_t lo, int sh) { return (int)((pb - lo - 1) >> sh) + 1; }

/* A round's new bracket for its pick j (>= 0): pivot j and pivot j + 1 (or hi). */
KP_TOPP_HD void kp_topp_gpu_bracket(uint32_t lo, uint32_t hi, int sh, int j, uint32_t *new_lo, uint32_t *new_hi) {
    *new_lo = lo + ((uint32_t)j << sh);
    *new_hi = hi;
    if (j + 1 < KP_TOPP_FANOUT_PROB_GPU && lo + ((uint32_t)(j + 1) << sh) < hi) *new_hi = lo + ((uint32_t)(j + 1) << sh);
}

/* After the last round: a search still LIVE keeps prob > lo (a superset reaching P). */
KP_TOPP_HD void kp_topp_finish(kp_topp_search *s) {
    if (s->mode == KP_TOPP_LIVE) s->mode = KP_TOPP_ABOVE;
}

#endif
