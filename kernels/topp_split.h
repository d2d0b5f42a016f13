/* topp_split.h: the split top-p algorithm shared by the host ports and the CUDA kernels, so the
 * two devices run the same steps with the same constants. The steps, per row:
 *
 * 1. Statistics. The row is cut into pieces. Per piece, in f32: max finite logit m, sum of
 *    exp(x - m) over finite x, min finite logit, finite count. NaN counts as absent.
 *    - split_logit (incumbent): pieces are S slices, S = the largest power of two <= 32 with
 *      S * 2 * batch <= sm_count (at least 1); slice s covers [s*L, min((s+1)*L, vocab)),
 *      L = ceil(vocab / S). So the reduction order, hence Z's bits, depend on the batch size.
 *    - split_prob (candidate): pieces are fixed tiles of KP_TOPP_TILE elements whatever the
 *      batch; slices only decide which program handles which tiles.
 *    Pieces combine in index order: M = max m_i, Z = sum_i s_i * exp(m_i - M) (f32, sequential).
 * 2. Pivot ladder. prob(x) = exp(x - M) / Z in f32. lo = max(exp(min - M) / Z, 1e-30), hi = 1 / Z.
 *    Each round evaluates F = KP_TOPP_FANOUT pivots lo * exp(log(hi / lo) * (f + 1) / (F + 1)),
 *    and for each: mass = sum of prob over prob > pivot, the smallest such prob (its logit for
 *    split_prob) and how many tokens share it. A pivot is ok when mass >= p and
 *    mass - minprob * nmin < p; the highest ok pivot wins. Otherwise lo becomes the largest pivot
 *    with mass >= p and hi the smallest with mass < p; `best` is the largest pivot seen with
 *    mass >= p. The search stops when a pivot is ok, when hi <= lo * (1 + 1e-7), or after the
 *    impl's rounds (split_logit: 5, the pipeline it models; split_prob: 16, enough to close a
 *    60-nat bracket to adjacent floats; 5 rounds leave ~1e-3 nats and keep extra tokens).
 *    No ok pivot: fall back to `best`, else keep every finite token. Rows with top_p >= 1 keep
 *    every finite token; rows with no finite token are copied unchanged.
 * 3. Ties. dup = the boundary prob (split_logit: tokens whose f32 prob equals it; split_prob:
 *    tokens whose logit is bit-equal to the boundary logit). numkeep = numdup -
 *    floor(max(mass - p, 0) / dup), clamped to [1, numdup]; copies are kept lowest index first.
 * 4. Mask. split_logit keeps x > log(pivot) + log(Z) + M (the seed's defect: with M = 1e9 the
 *    threshold rounds to M and every token is dropped); split_prob keeps prob(x) > pivot. A dup
 *    token whose rank among dups (by index) is >= numkeep is dropped. Dropped tokens become -inf;
 *    kept tokens are copied bit for bit.
 */
#ifndef KP_TOPP_SPLIT_H
#define KP_TOPP_SPLIT_H

#define KP_TOPP_TILE 2048
#define KP_TOPP_FANOUT 8
#define KP_TOPP_MAX_SLICES 32
#define KP_TOPP_ROUNDS_LOGIT 5
#define KP_TOPP_ROUNDS_PROB 16
#define KP_TOPP_PIVOT_FLOOR 1e-30f
#define KP_TOPP_COLLAPSE 1e-7f
#define KP_TOPP_HOST_SM_COUNT 132 /* the H200's SM count: host ports pick slices as it would */

#endif
