/* topp_prob_select.cu: topp.split_prob@cuda's select, the kept members of a trimmed level in the
 * rule's order (both paths end with it). Overview: topp_split.cu. */
#include "topp_prob.cuh"

/* Step 4 on the GPU: one block of SEL_THREADS per row whose boundary level must be trimmed.
 * At most SEL_THREADS listed members: each counts the members before it in the rule's order (larger
 * logit key, or the same key and a lower index) and is kept when fewer than numkeep are.
 * When the mask kernel listed every member (at most level_cap of them), steps 1-4 below run over
 * that list instead of the row: the keys (copied to shared memory up to SEL_CAP, else read from the
 * list), the ~indices of the members at T (shared memory or the list's scratch third), and the
 * writes of the listed members. The same multisets, the same selects: the same bits. Otherwise:
 * 1. A pass over the row collects the members' logit keys into shared memory (the order of the
 *    appends varies, the multiset does not).
 * 2. Radix select, 8 bits at a time from the top, of the numkeep-th largest key T: per pass a 256-bin
 *    integer histogram, counted once per distinct digit per warp (__match_any_sync). `need` members
 *    at T are kept.
 * 3. A pass collects ~index of the members at T; the same radix select finds the need-th largest
 *    ~index, i.e. the need lowest indices (indices are unique).
 * 4. A pass writes every member: kept when its key is above T, or at T with one of those indices.
 * Past SEL_CAP values a list is not cached: step 2 rescans the row per digit, and steps 3-4 become
 * one pass in index order with a block-wide ballot scan. */
#define SEL_THREADS 1024
#define SEL_LOADS 4 /* loads in flight per thread in the collecting passes */

__device__ __forceinline__ void count_digit(unsigned int *digit_count, int digit) { /* 256: none */
    const unsigned peers = __match_any_sync(0xffffffffu, digit);
    if (digit < 256 && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&digit_count[digit], __popc(peers));
}

/* Appends `val` where `take`, in a varying order; all threads of the block call it. */
__device__ __forceinline__ void append_value(bool take, uint32_t val, uint32_t *list, int *count,
                                             int cap) {
    const int lane = threadIdx.x & 31;
    const unsigned ballot = __ballot_sync(0xffffffffu, take);
    int base = 0;
    if (lane == 0 && ballot) base = atomicAdd(count, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    const int pos = base + __popc(ballot & ((1u << lane) - 1u));
    if (take && pos < cap) list[pos] = val;
}

/* The select state, in shared memory. */
struct sel_shared {
    unsigned int digit_count[256];
    uint32_t prefix;
    long long need;
};

/* One 8-bit digit step of a radix select from the top: after the histogram, pick the digit. With
 * S(d) = count[d] + ... + count[255], the digit is the largest d >= 1 with S(d) >= need (else 0) and
 * the need left at it is need - S(d + 1): found by warp 0, lane l holding digits 8l .. 8l + 7, with a
 * suffix scan over the lanes (integer sums, so exactly the top-down loop's result). */
__device__ __forceinline__ void digit_pick(sel_shared &sh, int shift) {
    __syncthreads();
    if (threadIdx.x < 32) {
        const int l = threadIdx.x;
        long long c[8], mine = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            c[k] = sh.digit_count[8 * l + k];
            mine += c[k];
        }
        long long suffix = mine; /* S(8l) */
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
            const long long other = __shfl_down_sync(0xffffffffu, suffix, off);
            if (l + off < 32) suffix += other;
        }
        const long long need = sh.need;
        __syncwarp(); /* every lane has read sh.need before one lane rewrites it (a ballot orders no memory) */
        const unsigned fits = __ballot_sync(0xffffffffu, suffix >= need || l == 0);
        if (l == 31 - __clz(fits)) { /* S falls as d rises: the answer lies in the highest such lane */
            long long above = suffix - mine; /* S(8l + 8) */
            int d = 8 * l;
#pragma unroll
            for (int k = 7; k >= 0; k--) {
                if (above + c[k] >= need || 8 * l + k == 0) {
                    d = 8 * l + k;
                    break;
                }
                above += c[k];
            }
            sh.need = need - above; /* above = S(d + 1) */
            sh.prefix |= (uint32_t)d << shift;
        }
    }
    __syncthreads();
}

/* The need-th largest of list[0 .. n) (shared, or global memory this block wrote before a barrier):
 * sh.prefix, and in sh.need how many at it. */
/* Between the two selects: every thread has read T and `need`; the list of the members at T starts
 * empty and the select over ~index starts afresh, keeping `need` of them. */
__device__ __forceinline__ void restart_select(sel_shared &sh, int *nlist, long long need) {
    __syncthreads();
    if (threadIdx.x == 0) {
        *nlist = 0;
        sh.prefix = 0;
        sh.need = need;
    }
    __syncthreads();
}

__device__ void select_cached(sel_shared &sh, const uint32_t *list, int n) {
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += SEL_THREADS) sh.digit_count[d] = 0;
        __syncthreads();
        const uint32_t prefix = sh.prefix;
        for (int base = 0; base < n; base += SEL_THREADS) {
            const int j = base + (int)threadIdx.x;
            int digit = 256;
            if (j < n && (list[j] & mask) == prefix) digit = (int)((list[j] >> shift) & 255u);
            count_digit(sh.digit_count, digit);
        }
        digit_pick(sh, shift);
        mask |= 255u << shift;
    }
}

__global__ void __launch_bounds__(SEL_THREADS) prob_select_kernel(topp_plan plan) {
    pdl_wait();
    __shared__ kp_topp_search s;
    __shared__ float below, above;
    __shared__ sel_shared sh;
    extern __shared__ uint32_t list[]; /* SEL_CAP entries */
    const int SEL_CAP = plan.sel_cap;
    __shared__ int nlist;
    __shared__ int warp_eq[SEL_THREADS / 32];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int64_t row = blockIdx.x;
    if (t == 0) s = plan.search[row * (PROB_R + 1) + PROB_R];
    __syncthreads();
    if (!level_trimmed(s)) return;
    if (t == 0) {
        prob_band(s.z, s.lo, s.hi, &below, &above);
        sh.prefix = 0;
        sh.need = s.numkeep;
        nlist = 0;
    }
    __syncthreads();
    const float *x = plan.logits + row * plan.row_stride;
    float *y = plan.out + row * plan.row_stride;
    const unsigned listed = plan.counts[row * CNT_WORDS + CNT_LEVEL];
    if (listed <= (unsigned)plan.level_cap) {
        /* the mask kernel listed every member: steps 1-4 over the list, not the row */
        const int n = (int)listed, cap = plan.level_cap;
        const uint32_t *gkey = row_level_list(plan, row), *gidx = gkey + cap;
        uint32_t *scratch = const_cast<uint32_t *>(gidx) + cap;
        if (n <= SEL_THREADS) { /* a small level: each member counts those before it in the rule's order */
            __shared__ uint32_t small_key[SEL_THREADS], small_idx[SEL_THREADS];
            if (t < n) {
                small_key[t] = gkey[t];
                small_idx[t] = gidx[t];
            }
            __syncthreads();
            if (t < n) {
                const uint32_t key = small_key[t], i = small_idx[t];
                int before = 0; /* larger logit, or the same logit and a lower index (indices are unique) */
                for (int j = 0; j < n; j++)
                    before += (small_key[j] > key) | ((small_key[j] == key) & (small_idx[j] < i));
                y[i] = before < s.numkeep ? x[i] : -INFINITY;
            }
            return;
        }
        const bool cached = n <= SEL_CAP;
        if (cached) {
            for (int j = t; j < n; j += SEL_THREADS) list[j] = gkey[j];
            __syncthreads();
        }
        select_cached(sh, cached ? list : gkey, n);
        const uint32_t pivot_key = sh.prefix;
        const long long need = sh.need;
        restart_select(sh, &nlist, need);
        uint32_t *eq = cached ? list : scratch; /* members at T: at most n of them */
        for (int base = 0; base < n; base += SEL_THREADS) {
            const int j = base + t;
            const bool m = j < n && gkey[j] == pivot_key;
            append_value(m, m ? ~gidx[j] : 0u, eq, &nlist, cached ? SEL_CAP : cap);
        }
        __syncthreads();
        select_cached(sh, eq, nlist);
        const uint32_t index_key = sh.prefix; /* members at T with ~index >= it are the need lowest */
        for (int j = t; j < n; j += SEL_THREADS) {
            const uint32_t i = gidx[j], key = gkey[j];
            y[i] = (key > pivot_key || (key == pivot_key && ~i >= index_key)) ? x[i] : -INFINITY;
        }
        return;
    }
    const float row_max = s.row_max, z = s.z, recip = topp_recip(s.z), lo_band = below, hi_band = above;
    const uint32_t level = s.hi;
    const int vocab = plan.vocab;
    auto member = [&](float v) -> bool {
        if (!finite_logit(v)) return false;
        const float d = v - row_max;
        if (d < lo_band || d > hi_band) return false;
        return kp_topp_bits(topp_div(expf(d), z, recip)) == level;
    };
    /* 1. the members' keys (all threads run the same number of chunks: full warps) */
    for (int chunk = 0; chunk < vocab; chunk += SEL_THREADS * SEL_LOADS) {
        float v[SEL_LOADS];
        load_strided<SEL_LOADS, SEL_THREADS>(v, x, chunk, vocab, -INFINITY);
#pragma unroll
        for (int u = 0; u < SEL_LOADS; u++) {
            const bool m = member(v[u]);
            append_value(m, m ? kp_topp_logit_key(v[u]) : 0u, list, &nlist, SEL_CAP);
        }
    }
    __syncthreads();
    /* 2. the key T */
    if (nlist <= SEL_CAP) {
        select_cached(sh, list, nlist);
    } else {
        uint32_t mask = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int d = t; d < 256; d += SEL_THREADS) sh.digit_count[d] = 0;
            __syncthreads();
            const uint32_t prefix = sh.prefix;
            for (int chunk = 0; chunk < vocab; chunk += SEL_THREADS) {
                const int i = chunk + t;
                int digit = 256;
                if (i < vocab) {
                    const float v = x[i];
                    if (member(v)) {
                        const uint32_t key = kp_topp_logit_key(v);
                        if ((key & mask) == prefix) digit = (int)((key >> shift) & 255u);
                    }
                }
                count_digit(sh.digit_count, digit);
            }
            digit_pick(sh, shift);
            mask |= 255u << shift;
        }
    }
    const uint32_t pivot_key = sh.prefix;
    const long long need = sh.need;
    /* 3. ~index of the members at T */
    restart_select(sh, &nlist, need);
    for (int chunk = 0; chunk < vocab; chunk += SEL_THREADS * SEL_LOADS) {
        float v[SEL_LOADS];
        load_strided<SEL_LOADS, SEL_THREADS>(v, x, chunk, vocab, -INFINITY);
#pragma unroll
        for (int u = 0; u < SEL_LOADS; u++) {
            const bool m = member(v[u]) && kp_topp_logit_key(v[u]) == pivot_key;
            append_value(m, ~(uint32_t)(chunk + u * SEL_THREADS + t), list, &nlist, SEL_CAP);
        }
    }
    __syncthreads();
    if (nlist <= SEL_CAP) {
        select_cached(sh, list, nlist);
        const uint32_t index_key = sh.prefix; /* members at T with ~index >= it are the need lowest */
        /* 4. write the members */
#pragma unroll 4
        for (int i = t; i < vocab; i += SEL_THREADS) {
            const float v = x[i];
            if (!member(v)) continue;
            const uint32_t key = kp_topp_logit_key(v);
            y[i] = (key > pivot_key || (key == pivot_key && ~(uint32_t)i >= index_key)) ? v : -INFINITY;
        }
        return;
    }
    /* 3-4 without the list: in index order, a block-wide ballot scan */
    long long rank_base = 0;
    for (int chunk = 0; chunk < vocab; chunk += SEL_THREADS) {
        const int i = chunk + t;
        bool is_member = false, eq = false;
        float v = 0.0f;
        uint32_t key = 0;
        if (i < vocab) {
            v = x[i];
            is_member = member(v);
            if (is_member) {
                key = kp_topp_logit_key(v);
                eq = key == pivot_key;
            }
        }
        const unsigned ballot = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) warp_eq[warp] = __popc(ballot);
        __syncthreads();
        long long rank = rank_base + __popc(ballot & ((1u << lane) - 1u));
        int chunk_eq = 0;
        for (int w = 0; w < SEL_THREADS / 32; w++) {
            if (w < warp) rank += warp_eq[w];
            chunk_eq += warp_eq[w];
        }
        __syncthreads();
        rank_base += chunk_eq;
        if (is_member) y[i] = (key > pivot_key || (eq && rank < need)) ? v : -INFINITY;
    }
}

cudaError_t prob_select_set_limit(int bytes) {
    return cudaFuncSetAttribute(prob_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

/* After the fused kernel or prob_mask_kernel; programmatic: with programmatic dependent launch (pdl_wait). */
cudaError_t prob_select_launch(const topp_plan &plan, int64_t batch, size_t sel_bytes, bool programmatic,
                               cudaStream_t stream) {
    return launch_after(programmatic, prob_select_kernel, (unsigned)batch, SEL_THREADS, sel_bytes, stream, plan);
}
