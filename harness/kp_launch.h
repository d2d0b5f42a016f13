/* kp_launch.h: the machinery every family shares: a prepared case (its inputs, its reference, export),
 * runs of an impl on any rows in cached guarded buffers, output rows for comparison, and the bench loop.
 * A family only describes tensors and fills its args (kp_family); everything here is family-blind. */
#ifndef KP_LAUNCH_H
#define KP_LAUNCH_H

#include <string.h>

#include "kp_harness.h"

/* A family's judgements of outputs, one per (output, rule parameters), so the checks of a case judge an output once
 * whatever asks; past KP_MEMO_MAX the oldest is freed (harness/rule.c). Parameters compare by their bytes: keep them in
 * zeroed storage (check specs are). */
#define KP_MEMO_MAX 8
struct kp_judgements {
    const kp_family *fam;
    void *data; /* the family's prepared case */
    struct {
        const kp_output *out;
        unsigned char params[KP_PARAMS_MAX];
        void *value;
    } e[KP_MEMO_MAX];
    int n;
};
void kp_judgements_clear(kp_judgements *js);
/* The rule check of one impl's full-batch output (findings and summary into check), and an exact check's explanation:
 * per differing row (rows, the entries of rows_json), the reference's row, each impl's record and who meets the rule. */
kp_result kp_rule_check(kp_judgements *js, const void *params, const kp_output *out, const kp_impl *impl, cJSON *check,
                        kp_evidence *ev, kp_error *err);
int kp_rule_explain_exact(kp_judgements *js, const void *params, const kp_impl *const impls[2],
                          const kp_output *const outs[2], const int64_t *rows, int64_t nrows, cJSON *rows_json,
                          kp_evidence *ev, kp_error *err);

/* One case, prepared: the family's inputs (rows [0, batch + extra)) and, once asked, its reference. */
typedef struct kp_prepared {
    const kp_family *fam;
    kp_case c;
    kp_case_view v;
    kp_judgements judged; /* the rule's judgements of this case's outputs */
    uint64_t generation; /* which prepared case this is: the launch cache uploads inputs once per case */
    bool have_ref;
    kp_reference ref;
    char ref_digest[KP_SHA256_HEX_LEN];
    double ref_seconds;
    /* The cache (harness/kp_cache.h): whether this case may read it (inputs, reference), where each came from */
    bool cache_inputs, cache_reference;
    char input_sha[KP_MAX_TENSORS][KP_SHA256_HEX_LEN]; /* each input's digest (of the case's rows), once known */
    kp_sha256_points input_points[KP_MAX_TENSORS];     /* and its checkpoints, from the receipt's hashing */
    kp_sha256_points ref_points;                       /* the reference digest's */
    bool inputs_cached, ref_cached;
    bool digests_checked; /* generated inputs proven to hash to the digests entry's digests (not hashed again) */
    char digests_note[200]; /* the digests entry: refused, or why none was used */
    char inputs_note[200], ref_note[200]; /* a present entry refused, or why none was read */
    bool inputs_store, ref_store;         /* made here and worth an entry: written at release */
    char inputs_skip[240], ref_skip[240]; /* why not, when not */
    char inputs_key[KP_SHA256_HEX_LEN], ref_key[KP_SHA256_HEX_LEN];
    bool ref_has_params; /* the rule parameters the reference was computed with (its entry's key) */
    void *map;           /* the inputs' cache entry, mapped: the view's tensors point into it */
    size_t map_len;
    void *ref_map;       /* the reference's cache entry, mapped: the family's adopted reference points into it */
    size_t ref_map_len;
    alignas(max_align_t) unsigned char ref_params[KP_PARAMS_MAX];
} kp_prepared;

/* Whether two tensors are declared alike: name, dtype, shape, row stride, batched (data aside). */
static inline bool kp_tensors_alike(const kp_tensor *a, const kp_tensor *b) {
    bool same = !strcmp(a->name, b->name) && a->dtype == b->dtype && a->ndim == b->ndim &&
                kp_tensor_stride(a) == kp_tensor_stride(b) && !a->batched == !b->batched;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    return same;
}

/* cached.c: a prepared case's cache entries. The inputs from their entry when it holds the tensors s declares and
 * every byte checks out (the view's tensors then point into its map, which p keeps); whether inputs made in `seconds`
 * are worth an entry (why not into p->inputs_skip), and writing it. The reference the same way (read: when the family
 * takes it back, then described into p->ref; its key waits for the inputs' digests). What the reference digest hashes
 * after its tag (every array's bytes). */
bool kp_cache_inputs_read(kp_prepared *p, const kp_shapes *s, int64_t extra_rows);
/* Inputs made here, checked against the digests entry (their digests and checkpoints, stored when the inputs were not
 * worth an entry of their own) on every thread: true when each input hashes to its recorded digest, which p->input_sha
 * then holds; false when there is none or they differ (why in p->digests_note; a difference is named on stderr). */
bool kp_cache_digests_read(kp_prepared *p, int64_t extra_rows);
void kp_cache_digests_write(kp_prepared *p);
bool kp_cache_inputs_worth(kp_prepared *p, double seconds);
void kp_cache_inputs_write(kp_prepared *p);
bool kp_cache_ref_read(kp_prepared *p, const void *params, kp_error *err);
bool kp_cache_ref_worth(kp_prepared *p);
void kp_cache_ref_write(kp_prepared *p, const void *params);
void kp_reference_parts(const kp_reference *ref, kp_span parts[KP_MAX_TENSORS]);

/* prepared.c */
/* Prepare a case: its inputs from the cache when an entry checks out, else generated (and stored at release). */
int kp_prepare(const kp_family *fam, const kp_case *c, int64_t extra_rows, kp_prepared *p, kp_error *err);
/* The same, never reading or writing the cache (what `verify --replay` regenerates with). */
int kp_prepare_uncached(const kp_family *fam, const kp_case *c, int64_t extra_rows, kp_prepared *p, kp_error *err);
/* Release a case: what it made that is worth an entry is written (on a thread of its own while the next case runs,
 * when it fits: kp_prepared_flush waits for it; the process's end does too). */
void kp_prepared_release(kp_prepared *p);
/* Wait for the entries a released case is still writing. */
void kp_prepared_flush(void);
/* Each input tensor's dtype, shape and digest (of the case's rows) into `inputs`. */
void kp_describe_inputs(kp_prepared *p, cJSON *inputs);
/* Where the inputs (reference false) or the reference came from, into obj: {"from": "cache", "entry"} or
 * {"from": "generated" / "computed", "why"}; nothing when the case does not use the cache. */
void kp_describe_cache(const kp_prepared *p, bool reference, cJSON *obj);
/* The reference, computed once (params: the rule parameters of the check asking first, or NULL),
 * its digest started on a worker thread; desc (when not NULL and not described yet) gets the provider,
 * the digest, the rule, seconds and threads. */
int kp_reference_run(kp_prepared *p, const void *params, cJSON *desc, kp_error *err);

/* launch.c */
/* What a case holds at once, from its family's declaration (kp_family.shapes) and the layout below: on the host the
 * inputs, the family's own bytes, each impl's full output, one repeat or probe output and the pool's, the checks'
 * scratch, and a host impl's cached buffers and workspace; on the device every input once and each CUDA impl's
 * cached buffers and workspace. extra_rows as the case's checks ask (kp_case_extra_rows). KP_EXIT_USAGE when a size
 * overflows. */
typedef struct kp_case_bytes {
    uint64_t host, device;
    int ncuda;         /* CUDA impls the device bytes are for */
    char largest[200]; /* the largest tensor declared, for an error: "input 'w13' [288, 4096, 2048] u8, 2.25 GiB" */
} kp_case_bytes;
int kp_launch_estimate(const kp_case_spec *cs, int64_t extra_rows, kp_case_bytes *est, kp_error *err);
/* The case is done (kp_prepared_release): its pooled outputs are freed. */
void kp_launch_case_done(void);
/* Room in the per-impl buffer cache for this many impls (the config's count, at load); it grows past
 * that on demand. KP_EXIT_ENV when out of host memory. */
int kp_launch_reserve(int nimpls, kp_error *err);
/* Run impl on rows (indices into the prepared rows) as one batch: inputs gathered into the impl's cached
 * buffers, outputs between guard regions and filled with guard bytes, one launch, sync, every guard and
 * the row padding checked, outputs copied back into *out (kp_output_free). info (when not NULL) gets the
 * wall and kernel time of the launch. NOT_RUN without a device, NOT_SUPPORTED when the impl refuses. */
kp_result kp_run_rows(kp_prepared *p, const kp_impl *impl, const int64_t *rows, int64_t nrows, kp_output **out,
                      cJSON *info, kp_error *err);
/* As kp_run_rows, for a run the caller compares row by row with `against`, an earlier output of this impl and case:
 * row i with against's row against_rows[i] (NULL: row i). A CUDA impl's rows are compared on the device first, bit
 * for bit with a copy of against's host bytes: bits[i] gets bit k where tensor k's rows differ (row padding included),
 * and only rows with bits, and those past against's rows (not compared), are copied back into *out; the other rows of
 * *out hold nothing and must not be read. Any other impl's run is copied back whole, every bit of bits set (compare
 * on the host). A repeat or batch check moves only the rows that differ across the bus. */
kp_result kp_run_rows_against(kp_prepared *p, const kp_impl *impl, const int64_t *rows, int64_t nrows,
                              const kp_output *against, const int64_t *against_rows, uint8_t *bits, kp_output **out,
                              kp_error *err);
void kp_output_free(kp_output *o);
/* Where the kernels stage's seconds go, summed over the process's runs since kp_run_parts_reset (bundle.json's
 * kernels_parts_s): the set-up (row gathers, guard fills, the wait before the launch; uploads are a stage of their
 * own; a device copy of the output a run is compared with, once an output), the host output blocks, the impl's run
 * call, waiting for the device with every guard checked (and the rows compared there: kp_run_rows_against), the
 * comparison's answer gathered a row, and the copies back with their row padding checked. */
typedef enum kp_run_part {
    KP_RUN_SETUP,
    KP_RUN_OUTPUT_BLOCKS,
    KP_RUN_LAUNCH,
    KP_RUN_WAIT_AND_GUARDS,
    KP_RUN_COMPARE,
    KP_RUN_COPIES_BACK,
    KP_RUN_PARTS
} kp_run_part;
void kp_run_parts_reset(void);
const char *kp_run_part_name(kp_run_part part);
double kp_run_part_seconds(kp_run_part part);
int64_t kp_run_count(void); /* kp_run_rows and kp_run_rows_against calls since the reset */
/* The run in progress on this thread, for an impl that stands for outputs made elsewhere (harness/judge.c) or by
 * an outside program (harness/exec.c): the case and which preparation of it, the rows it runs, the family's input
 * tensors (as the case describes them: a batched one's shape[0] is the case's batch) and their host buffers for this
 * run (a batched input's holds the run's nrows slices, gathered; a shared one's is the whole tensor), and the output
 * tensors for the run (shape[0] = nrows) with their host buffers. NULL outside an impl's run(). */
typedef struct kp_launch_view {
    const kp_case *c;
    uint64_t generation;
    const int64_t *rows;
    int64_t nrows;
    const kp_tensor *ins;
    int nin;
    const void *const *in;
    const kp_tensor *outs;
    int nout;
    void *const *out;
} kp_launch_view;
const kp_launch_view *kp_launch_current(void);
/* An impl that times itself (an outside program: CUDA events around its own call) says so from its run(); the bench
 * loop asks for it (kp_launch_timing_wanted) and reports those figures beside its own wall clock. */
int kp_launch_timing_wanted(void);
void kp_launch_report_time(double us);
/* Time impl on the whole case: inputs uploaded once, 3 warm-ups, `reps` timed runs (CUDA events with L2
 * flushed before each on a GPU, wall clock on the host); timing gets median/min/p10/p90/max us and, where
 * the family says, bytes and GB/s, FLOPs and TFLOP/s. The last run's output is checked like any other. */
int kp_bench_impl(kp_prepared *p, const kp_impl *impl, int reps, cJSON *timing, kp_error *err);

/* Output rows for comparisons. Row i of output tensor k as `elems` contiguous elements: in place when the
 * tensor is dense, else copied; in the family's canonical form when `canonical` and the family has one. */
typedef struct kp_rowbuf {
    unsigned char *p;
    size_t cap;
} kp_rowbuf;
const void *kp_output_row(const kp_prepared *p, const kp_output *o, int k, int64_t i, bool canonical, int64_t *elems,
                          kp_rowbuf *buf);
void kp_rowbuf_free(kp_rowbuf *b);
/* Every output tensor's logical elements, rows in order and tensors in order within a row: what an
 * output's digest hashes (malloc'd spans). */
kp_span *kp_output_spans(const kp_output *o, size_t *nspans);

#endif
