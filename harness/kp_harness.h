/* kp_harness.h: the harness's shared vocabulary: check specs, the gate config, and the family record
 * (kp_family): the hooks and tables by which a family plugs into machinery the harness owns.
 *
 * Adding a family (name it F; the files, in this order, then the one table row each):
 *   1. cases/F_case.{h,c}       its fields, canonical form and seeded generator; defines the
 *                               kp_case_family row, listed in cases/case_families.c.
 *   2. reference/F_ref.{h,c}    the float64 reference written from the rule (kp_detmath.h for exp and
 *                               compensated sums), and its judge where the family has a rule check.
 *   3. kernels/kparity_kernel.h a kp_F_args struct; kernels/host/F_*.c and kernels/cuda/F_*.cu the
 *                               impls, each listed in kernels/registry.c's builtin_impls.
 *   4. harness/F_family.c       the kp_family record below: its tensors, fill_args, reference arrays,
 *                               array_docs (what an export says of each array) and whichever optional
 *                               hooks apply; listed in harness/families.c.
 *   5. tests/test_reference_F.c, tests/test_kernels_host_F.c, tests/test_gpu_F_kernels.c, a defect
 *                               plugin under tests/fixtures/, and gate configs under ci/gates/.
 * The harness owns everything else: buffers with guard regions on the host or the device, gathering
 * rows for batch probes, launches, timing and the bench loop, digests, export, every check and the
 * receipts. tests/test_family_seam.c registers a small family of its own the same way. */
#ifndef KP_HARNESS_H
#define KP_HARNESS_H

#include <cjson/cJSON.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../cases/kp_case.h"
#include "../cases/kp_common.h"
#include "../cases/kp_sha256.h"
#include "../cases/kp_tensor.h"
#include "../kernels/kp_registry.h"
#include "../receipts/kp_bundle.h"

#define KP_MAX_TENSORS 8     /* inputs, outputs or reference arrays of one family */
#define KP_PARAMS_MAX 64     /* bytes of a family's parsed rule parameters */
#define KP_ARGS_MAX 256      /* bytes of a family's kp_*_args struct */

typedef enum kp_check_kind {
    KP_CHECK_EXACT = 0,
    KP_CHECK_RULE,
    KP_CHECK_TOLERANCE,
    KP_CHECK_REPEAT,
    KP_CHECK_BATCH,
    KP_CHECK_EXPECT,
    KP_CHECK_KIND_COUNT
} kp_check_kind;
const char *kp_check_name(kp_check_kind k);
int kp_check_parse(const char *name); /* the kind, or -1 */

/* Declared bounds of a tolerance check on one output tensor (DESIGN.md "tolerance"); the effective
 * values go into the receipt. atol and rtol are required: an element fails when
 * |x - r| > atol + rtol * |r| ("element_rule": "sum", the default, torch.allclose's), or when it exceeds
 * both, |x - r| > max(atol, rtol * |r|) ("both", as some kernels' own tests hold). With "round_reference" the
 * reference is first rounded to the output's dtype (nearest even), as a kernel's own test may
 * compare a bf16 output with a bf16 reference; every metric then uses the rounded value. The others
 * bound an aggregate only where declared. */
typedef struct kp_tolerance {
    double atol, rtol;
    bool both;            /* element_rule "both" */
    bool round_reference; /* the reference in the output's dtype */
    bool has_nmse, has_cosine, has_ulp;
    double nmse, cosine; /* upper bounds of NMSE and of the cosine difference */
    int64_t ulp;         /* upper bound of the largest bf16 ulp distance */
} kp_tolerance;

struct kp_family;

/* One declared check with its effective parameters (defaults from the config already applied). */
typedef struct kp_check_spec {
    kp_check_kind kind;
    kp_check_kind of;        /* expect: the check whose result is expected */
    int nimpl;               /* exact: 2, others: 1 */
    const kp_impl *impl[2];
    char role[2][64];        /* the role as the config names it ("candidate", "<family>.candidate"), or "" */
    /* the family's rule parameters (parse_params); exact takes them when declared, else the
       family's defaults (params_defaulted), recorded as such */
    bool has_params, params_defaulted;
    alignas(max_align_t) unsigned char params[KP_PARAMS_MAX];
    int runs;                                /* repeat */
    kp_tolerance tolerance[KP_MAX_TENSORS];  /* tolerance: per output tensor, in the family's order */
    kp_result expect_result;                 /* expect */
    char defect[32];                         /* expect: "" or one of the family's defects */
    char label[200];
} kp_check_spec;

typedef struct kp_case_spec {
    kp_case c;
    const struct kp_family *fam;
    char name[KP_CASE_NAME_MAX];
    kp_check_spec *checks;
    int nchecks;
    size_t host_bytes, device_bytes; /* estimates (kp_launch_estimate), checked against the budgets before anything
                                        is allocated; device_bytes counts the CUDA impls' buffers */
} kp_case_spec;

typedef struct kp_role {
    char role[64];       /* as written: "candidate", or "<family>.candidate" for one family's */
    const kp_impl *impl;
    char declared[128];  /* the name as written, e.g. "<family>.split_prob@auto" */
} kp_role;

typedef struct kp_config {
    char path[512];
    char sha256[KP_SHA256_HEX_LEN];
    char name[128];
    kp_role *roles;
    int nroles;
    kp_case_spec *cases;
    int ncases;
    int nimpls; /* distinct impls the cases name: the launch cache is sized for them at load */
    uint64_t host_budget;
    uint64_t device_budget; /* 0 when no GPU is used */
    double timeout_s;
    cJSON *doc;
} kp_config;

/* Load, validate and expand (grids, check sets, defaults, @auto impls) a gate config.
 * Any problem: exit class 2 with the JSON path of the field, e.g. "cases[3].checks[1].impl". */
int kp_config_load(const char *path, kp_config *cfg, kp_error *err);
void kp_config_free(kp_config *cfg);
/* The config's timeout_s, read as JSON alone (no plugin loaded, nothing validated): 0 when it has none or the file
 * is no config (kp_config_load, in the worker, then says why). For the supervisor, which loads nothing. */
double kp_config_timeout_peek(const char *path);

/* Where a check's parameters come from: the check, else the config's "defaults" (never from code).
 * A family's parse_params reads its fields through these; each field has one parser, and every
 * error names the field ("cases[3].checks[1].band: ..."). */
typedef struct kp_param_reader {
    const cJSON *check, *defaults;
    const char *where; /* the check's JSON path */
} kp_param_reader;
/* A JSON value as a non-empty string, or as a number; KP_EXIT_USAGE naming `where` otherwise. */
int kp_want_string(const cJSON *v, const char *where, const char **out, kp_error *err);
int kp_want_number(const cJSON *v, const char *where, double *out, kp_error *err);
/* The field's value, or NULL when neither the check nor the defaults give it. */
const cJSON *kp_param_get(const kp_param_reader *r, const char *key);
/* A required string, one of `allowed` (NULL-terminated; NULL allows any). */
int kp_param_string(const kp_param_reader *r, const char *key, const char *const *allowed, const char **out,
                    kp_error *err);
/* A required number in [lo, hi) (hi_inclusive: [lo, hi]). */
int kp_param_number(const kp_param_reader *r, const char *key, double lo, double hi, bool hi_inclusive, double *out,
                    kp_error *err);
/* A required integer in [lo, hi]: 2.5, "2" and 1e300 are refused, never truncated. */
int kp_param_int(const kp_param_reader *r, const char *key, int64_t lo, int64_t hi, int64_t *out, kp_error *err);

/* Where a check's evidence goes: index lists longer than inline_limit are stored whole as .npy
 * artifacts in the bundle and named (file, digest) in the receipt's "artifacts" (harness/evidence.c). */
typedef struct kp_evidence {
    kp_bundle *bundle;
    cJSON *artifacts; /* the receipt's "artifacts" array */
    int inline_limit;
} kp_evidence;
/* obj[key] = {"count", "first": [...], "artifact": {"file", "sha256"} when longer than inline_limit}. */
int kp_evidence_list(kp_evidence *ev, cJSON *obj, const char *key, const char *artifact_name, const int64_t *idx,
                     int64_t n, kp_error *err);

/* Where the gate's wall time goes (it is on a serving host's startup path): seconds per stage,
 * summed over the run, reported in bundle.json and on stderr (harness/stages.c). */
typedef enum kp_stage {
    KP_STAGE_GENERATION = 0, /* seeded inputs */
    KP_STAGE_REFERENCE,      /* the float64 reference */
    KP_STAGE_KERNELS,        /* impl runs: row gathers, launch, sync, guard checks, copies back */
    KP_STAGE_JUDGING,        /* comparisons, rule judging, evidence */
    KP_STAGE_RECEIPTS,       /* receipts, artifacts, reports, manifest */
    KP_STAGE_DIGESTS,        /* SHA-256 of inputs, reference and outputs recorded in receipts: the time the
                                run spent starting them and waiting for them (they are hashed on worker
                                threads beside the other stages: kp_digest_start) */
    KP_STAGE_CACHE,          /* inputs and references read from the cache and checked, and written to it
                                (harness/kp_cache.h) */
    KP_STAGE_UPLOADS,        /* a case's inputs copied to an impl's memory, once a case and memory kind */
    KP_STAGE_COUNT
} kp_stage;
void kp_stage_add(kp_stage stage, double seconds);
void kp_stages_reset(void); /* a run's stages are its own (judge prepares its case once before the run) */
double kp_stage_seconds(kp_stage stage);
double kp_stage_total(void); /* every stage's seconds, summed */
const char *kp_stage_name(kp_stage stage);

/* The digests receipts record, hashed on worker threads while the case goes on (kp_sha256_job).
 * kp_digest_start hashes prefix (copied) and spans (which must stay unchanged until the next
 * kp_digests_settle); at settle the hex lands in hex_out (if not NULL) and in obj[key] (if obj is
 * not NULL), added now with a placeholder so the receipt keeps its key order. kp_digest_record adds
 * obj[key] for the digest bound for hex_out, now if it has settled. kp_digests_settle waits for
 * every digest started and fills every place. Only the run's thread calls these; whoever frees a
 * buffer a digest may read settles first (the prepared case all, an output those reading it: harness/launch.c), and
 * the runner before it writes a case's receipt. */
void kp_digest_start(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans, char *hex_out,
                     cJSON *obj, const char *key);
/* The same, and the stream's checkpoints into *points at settle (the cache stores them: kp_sha256_points). */
void kp_digest_start_points(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans, char *hex_out,
                            kp_sha256_points *points, cJSON *obj, const char *key);
void kp_digest_record(cJSON *obj, const char *key, const char *hex_out);
void kp_digests_settle(void);
/* Wait only for the digests that read bytes in [data, data + bytes) (a buffer about to be freed or reused): the
 * others, the case's large inputs' above all, go on hashing while the case does. */
void kp_digests_settle_reading(const void *data, size_t bytes);

/* A prepared case: the family's data and the tensors its shapes declared, which the harness allocates (zeroed) before
 * prepare and frees after release. */
typedef struct kp_case_view {
    void *data;         /* the family's prepared case, handed to every hook */
    int64_t batch;      /* the case's rows */
    int64_t rows_total; /* batch + extra rows: how many dim-0 slices each batched input holds */
    kp_tensor inputs[KP_MAX_TENSORS];
    int ninputs;
    kp_tensor state[KP_MAX_TENSORS]; /* the family's own generated arrays (kp_shapes.state) */
    int nstate;
    bool cached; /* inputs and state hold a cache entry's checked bytes: prepare sets up its data, generates nothing */
    /* Seconds of generation prepare took from work an earlier case left (a family's memo of rows cases share): a run
     * without that case spends them on this one, so the cache's worth rule counts them beside prepare's own */
    double borrowed_s;
} kp_case_view;

/* A case's tensors and the family's own bytes, declared before anything is allocated (kp_family.shapes):
 * harness/launch.c, which owns the buffer layout, sizes the case's host and device memory from them
 * (kp_launch_estimate). Tensors carry no data. */
typedef struct kp_shapes {
    int64_t batch, rows_total;        /* as prepare sets them in the view for these extra rows */
    kp_tensor inputs[KP_MAX_TENSORS]; /* name, dtype, shape with shape[0] = batch for batched ones (which hold
                                         rows_total slices of dim 0, the others shape[0]), row_stride, batched */
    int ninputs;
    kp_tensor outputs[KP_MAX_TENSORS]; /* as outputs gives them for a run of `batch` rows */
    int noutputs;
    /* Arrays the family generates with the inputs for its own hooks, never handed to an impl (a page table, the values
     * before quantization): allocated, cached and freed with the inputs, dim 0 never batched (kp_shapes_state) */
    kp_tensor state[KP_MAX_TENSORS];
    int nstate;
    /* The most host bytes the family allocates beyond the view's inputs and state at once, judgements aside: its reference
     * arrays and the reference's scratch, generator scratch, arrays it keeps */
    double private_bytes;
    /* The most one judgement of an output of `batch` rows holds (its rule's judge, while judging too); the harness
     * keeps up to KP_MEMO_MAX of them. 0 without a rule. */
    double judgement_bytes;
    /* Its kp_*_args for a run of kp_shapes_largest_run rows, as fill_args would fill them with every pointer
     * NULL and sm_count the device's: what an impl's workspace_bytes is asked (it grows with the rows). */
    alignas(max_align_t) unsigned char args[KP_ARGS_MAX];
} kp_shapes;
/* The most rows one run of a case takes: its batch, or a batch probe's T + 1 (the extra rows hold those). */
static inline int64_t kp_shapes_largest_run(int64_t batch, int64_t rows_total) {
    return batch > rows_total - batch ? batch : rows_total - batch;
}

/* Declare an input in s (set s->batch first); nothing is allocated. */
void kp_shapes_input(kp_shapes *s, const char *name, kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride,
                     bool batched);
/* Declare a state array (dense, shape[0] slices); nothing is allocated. */
void kp_shapes_state(kp_shapes *s, const char *name, kp_dtype dtype, int ndim, const int64_t *shape);

/* An impl's output on some rows, on the host: the family's output tensors with shape[0] = nrows. */
typedef struct kp_output {
    int64_t nrows;
    kp_tensor t[KP_MAX_TENSORS];
    int ntensors;
    uint64_t serial; /* launch.c numbers the outputs it makes, from 1 (0: made elsewhere) */
} kp_output;

/* The device (or host) addresses fill_args puts into the family's kp_*_args. */
typedef struct kp_launch_bufs {
    const void *in[KP_MAX_TENSORS]; /* per input: batched ones hold just the rows of this run */
    void *out[KP_MAX_TENSORS];      /* per output tensor */
    int64_t nrows;
    void *stream;                   /* cudaStream_t for CUDA impls, NULL for host ones */
    int32_t sm_count;               /* 0 for host impls */
    void *workspace;                /* NULL when the impl asked for none (or before it was asked) */
    size_t workspace_bytes;
} kp_launch_bufs;

/* The float64 reference, as arrays the harness hashes (tag, then every array's bytes in order),
 * exports (reference_<name>.npy) and, for arrays named like an output tensor, holds outputs to in
 * a tolerance check. An array named "<output>@<what>" (out@unquantized: the same rule on other values)
 * is measured against too under the same bounds and reported beside the verdict, never in it. The
 * family owns the memory. */
typedef struct kp_reference {
    const char *digest_tag; /* hashed first, NUL included: "kparity.reference.<family>/v1" */
    kp_tensor arrays[KP_MAX_TENSORS];
    int narrays;
    /* What else of the reference the family's hooks read (per-row records, masks), dense: not hashed into the digest,
     * cached beside the arrays (harness/cache.c) so reference_adopt can take the whole reference back */
    kp_tensor state[KP_MAX_TENSORS];
    int nstate;
    /* optional: where the reference was computed ("cuda (host-identical; ...)"), a static string that the receipt's
     * reference description records as computed_on; NULL: nothing recorded */
    const char *computed_on;
} kp_reference;

/* Whether a reference read back (got) holds the arrays and state want describes (names, dtypes, shapes; data aside):
 * what a family's reference_adopt checks first. KP_EXIT_ENV naming the first difference. */
int kp_reference_matches(const kp_reference *got, const kp_reference *want, kp_error *err);

/* A rule check, judged by the family and reported by the harness (harness/rule.c): the family turns an output into a
 * judgement and answers small questions about it; the harness keeps one judgement per (output, rule parameters), times
 * the judging, and writes the findings (rows, rows_meeting_rule, the family's totals, one record per row), the summary
 * and, for an exact check that found differences, who of the two meets the rule on each differing row. A row's record is
 * {"row", "reference": reference_row, "impl": row_figures then "meets_rule" then every index list as evidence}. */
typedef struct kp_index_list {
    const int64_t *idx;
    int64_t n;
} kp_index_list;
/* Row r of lists packed one after another (idx, with row r's from off[r] to off[r + 1]), as the judges keep them. */
static inline kp_index_list kp_index_list_row(const int64_t *idx, const int64_t *off, int64_t r) {
    return (kp_index_list){idx + off[r], off[r + 1] - off[r]};
}
typedef struct kp_rule {
    /* A new judgement of out under params (the reference is computed first), or NULL with err set. */
    void *(*judge)(void *data, const void *params, const kp_output *out, kp_error *err);
    void (*free_judgement)(void *judgement); /* what it holds, and itself */
    bool (*row_ok)(const void *judgement, int64_t r);
    /* The row's figures (counts, masses, flags), first in its record. */
    void (*row_figures)(const void *judgement, int64_t r, cJSON *row);
    /* The row's index lists, in receipt order (lists: their names, NULL-terminated): stored whole as evidence. */
    const char *const *lists;
    kp_index_list (*row_list)(const void *judgement, int list, int64_t r);
    /* What the reference says of row r under params (its boundary, its tie group, ...). */
    void (*reference_row)(const void *data, const void *params, int64_t r, cJSON *row);
    /* The output's totals into findings (after "rows" and "rows_meeting_rule", before "per_row") and the summary's
     * words after "K/N rows meet the rule; " appended to summary (len bytes in all). */
    void (*totals)(const void *data, const void *params, const void *judgement, int64_t rows, cJSON *findings,
                   char *summary, size_t len);
    /* (optional) More findings after "per_row", and more summary words, the same way. */
    void (*notes)(const void *data, const void *params, const void *judgement, int64_t rows, cJSON *findings,
                  char *summary, size_t len);
} kp_rule;

/* The judgements of a prepared case's outputs (harness/rule.c): what has_defect asks for one through. */
typedef struct kp_judgements kp_judgements;
/* The family's judgement of out under params, judged once per (output, params); NULL with err set. */
const void *kp_judgement(kp_judgements *js, const void *params, const kp_output *out, kp_error *err);

/* A batch size at which some impl changes what it runs: batch probes straddle it (T rows, T + 1). */
typedef struct kp_threshold {
    int64_t rows;
    const char *why;
} kp_threshold;
#define KP_THRESHOLDS_MAX 16 /* of one case */

/* What `kparity export` says of one array in its case.json and in `kparity export --help`: a family declares one row
 * per input, output, reference array and export extra, as data (its array_docs, ended by a row with a NULL name).
 * Reference arrays go by their own names ("keep", "out@unquantized"); their files are reference_<name>.npy. */
typedef enum kp_array_kind { KP_ARRAY_INPUT = 0, KP_ARRAY_OUTPUT, KP_ARRAY_REFERENCE, KP_ARRAY_EXTRA } kp_array_kind;
typedef struct kp_array_doc {
    kp_array_kind kind;
    const char *name;
    const char *layout;  /* its dims in order and what indexes them: "[batch, vocab]: row r is the case's row r" */
    const char *meaning; /* one line: what it holds (and when it is there, where a field decides) */
} kp_array_doc;

/* One family: a declaration plus hooks. The harness reads the tables; hooks marked (optional) may be
 * NULL, and then a check that needs one is refused when the config loads, naming the family. */
typedef struct kp_family {
    const char *name;                      /* as in case names and impl names */
    const kp_case_family *cases;           /* its row of the case-family table */
    const char *reference_provider;        /* recorded in receipts, e.g. "reference.<family>@host-f64" */
    const char *reference_rule;            /* one line: what the reference computes */
    const char *const *bench_cases;        /* `kparity bench`'s default cases where a CUDA device is usable,
                                              NULL-terminated */
    const char *const *bench_cases_host;   /* its default cases without one (host ports only), NULL-terminated (or
                                              NULL: none, and a bench there names the family as having none);
                                              sized so every family's together take about a minute on 2 cores */
    const char *const *output_names;       /* every output tensor's name, in outputs' order, NULL-terminated: what an
                                              impl may declare absent (checked against outputs when a case is prepared) */
    const char *const *param_keys;         /* check fields parse_params reads, NULL-terminated (or NULL) */
    const char *const *defects;            /* `expect` defect names has_defect knows, NULL-terminated (or NULL) */
    const char *const *tolerance_outputs;  /* outputs the reference gives in float64 for a tolerance check, in
                                              output order from the first, NULL-terminated (or NULL: no check) */
    const char *const *order_outputs;      /* outputs that record the order an impl worked in rather than its answer
                                              (slots an impl handed out), NULL-terminated (or NULL): exact, batch and repeat's
                                              verdict leave them out; repeat reports where they changed */
    const kp_threshold *thresholds;        /* batch sizes where impls switch paths (or NULL) */
    int nthresholds;
    size_t args_bytes;                     /* sizeof its kp_*_args, at most KP_ARGS_MAX */

    /* --- required --- */
    /* Set up v->data and generate the inputs (rows [0, batch + extra_rows); extra rows only fill batch probes) and
     * state into the view's tensors, which the harness allocated from shapes; when v->cached they hold a cache entry's
     * bytes already and prepare only sets up its data. Set v->data first: on a failure the harness still calls
     * release on it and frees the tensors. */
    int (*prepare)(const kp_case *c, int64_t extra_rows, kp_case_view *v, kp_error *err);
    void (*release)(void *data);
    /* What prepare, outputs and fill_args will make of a case with extra_rows, declared from the case alone
     * (kp_shapes), so harness/launch.c sizes every buffer before anything is allocated and a case over a budget
     * is refused at load. kp_prepare asserts that prepare and outputs keep to it. */
    int (*shapes)(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err);
    /* The output tensors of a run of nrows (name, dtype, shape with shape[0] = nrows, row_stride, batched);
     * returns how many. Padding past the last dim must stay untouched by impls: the harness checks it. */
    int (*outputs)(const void *data, int64_t nrows, kp_tensor *t);
    /* Fill the family's kp_*_args from the buffers (called again once the workspace is known). */
    void (*fill_args)(const void *data, const kp_launch_bufs *b, void *args);
    /* Compute the reference once (params: the first check's rule parameters, or NULL) and describe
     * it as arrays (and state). */
    int (*reference)(void *data, const void *params, kp_reference *ref, kp_error *err);

    /* --- optional --- */
    /* Take back a reference that reference described before, from the cache (harness/cache.c): ref holds its arrays
     * and state, names, dtypes and shapes as reference gave them, bytes checked against the digests recorded then, in
     * the cache entry's private mapping, which the harness unmaps after release: the family reads them there and never
     * frees them; it checks they are what it expects (else KP_EXIT_ENV: the entry is not used) and keeps them, so that
     * reference describes them without computing. reference_version names what the reference computes: bump it
     * whenever its bytes change. NULL: the family's references are not cached. */
    const char *reference_version;
    int (*reference_adopt)(void *data, const void *params, kp_reference *ref, kp_error *err);
    /* Rule parameters (param_keys) into params (params_bytes); their receipt form; the defaults an
     * exact check explains differences with when the config declares none. */
    size_t params_bytes;
    int (*parse_params)(const kp_param_reader *r, void *params, kp_error *err);
    void (*describe_params)(const void *params, cJSON *out);
    void (*default_params)(void *params);
    /* The rule check (kp_rule above): also explains an exact check's differences with the rule parameters. */
    const kp_rule *rule;
    /* Whether a named defect shows on every row of this output; *rows_with counts the rows that show it (js: the
     * rule's judgements, where the defect is read from one). */
    int (*has_defect)(void *data, kp_judgements *js, const kp_output *out, const char *defect, int64_t *rows_with);
    /* The canonical form of one output tensor's row before exact and batch compare rows (a row that is a
     * set: sorted); `elems` elements of the tensor's dtype from row into canon. NULL: bits as they are.
     * repeat compares the bits as written: an order that changes run to run is a change. */
    void (*canonical_row)(const void *data, int tensor, const void *row, void *canon, int64_t elems);
    /* The batch sizes where impls switch paths for this case, when they depend on its fields (block sizes
     * that depend on the case's fields): at most KP_THRESHOLDS_MAX into t, their count returned.
     * NULL: the static thresholds above. */
    int (*case_thresholds)(const kp_case *c, kp_threshold *t);
    /* Whether a row ran in another situation in a probe of the case's own batch size than in the full batch
     * (row full_row of full, row probe_row of probe), judged from what the impls wrote (an order output says
     * where each row's work went). NULL: a row moved when its position did. A probe of another size always
     * moves its rows. */
    bool (*row_moved)(const void *data, const kp_output *full, int64_t full_row, const kp_output *probe, int64_t probe_row);
    /* What a batch probe ran, from its order outputs, into its receipt entry p (how many splits each of its rows
     * got): rows[i] is the case row at position i (rows past the case's batch are filler). NULL: nothing added. */
    void (*describe_probe)(const void *data, const kp_output *probe, const int64_t *rows, int64_t nrows,
                           const kp_output *full, cJSON *p);
    /* Bytes moved and FLOPs of one run of nrows, for GB/s and TFLOP/s in bench (NULL: not reported). */
    double (*bytes_moved)(const void *data, int64_t nrows);
    double (*flops)(const void *data, int64_t nrows);

    /* --- what an export says (harness/export.c) --- */
    /* Every array export writes, documented (kp_array_doc). Required to export: a family with an array it does not
     * document is refused by `kparity export`, naming the array. */
    const kp_array_doc *array_docs;
    /* (optional) Arrays past the inputs that a program reading the export without kparity needs (a page table, the
     * values before quantization), at most KP_MAX_TENSORS into t, each written as <name>.npy (dense, shape[0] slices)
     * and documented as KP_ARRAY_EXTRA; and facts about the inputs' layout into `layout` (case.json's "layout":
     * which cache pages are whose). Returns how many arrays. NULL: none. */
    int (*export_extras)(const void *data, kp_tensor *t, cJSON *layout);
} kp_family;

/* The family table (harness/families.c): the family of a name (or NULL), the i-th, every name for errors. */
extern kp_table kp_families;
static inline const kp_family *kp_family_find(const char *name) { return kp_table_find(&kp_families, name); }
static inline int kp_family_count(void) { return kp_table_count(&kp_families); }
static inline const kp_family *kp_family_at(int i) { return kp_table_at(&kp_families, i); }
static inline void kp_family_names(char *buf, size_t len) { kp_table_names(&kp_families, buf, len); }
/* A case's batch thresholds (the family's case_thresholds, else its static list) into t; their count. */
int kp_family_thresholds(const kp_family *fam, const kp_case *c, kp_threshold t[KP_THRESHOLDS_MAX]);
/* The filler rows a batch check's probes need beyond a case's own rows: probes fill up to the largest threshold
 * + 1 (0 without thresholds). The one place that rule is written; the checks (kp_case_extra_rows, which the
 * estimates at load use too) and a family that always holds filler rows use it (inline: the family files call it,
 * and families.c lists them, so an out-of-line copy there would be a call loop). */
static inline int64_t kp_threshold_probe_rows(const kp_threshold *t, int n) {
    int64_t most = 0;
    for (int i = 0; i < n; i++)
        if (t[i].rows + 1 > most) most = t[i].rows + 1;
    return most;
}
static inline int64_t kp_family_probe_rows(const kp_family *fam, const kp_case *c) {
    kp_threshold t[KP_THRESHOLDS_MAX];
    return kp_threshold_probe_rows(t, kp_family_thresholds(fam, c, t));
}
/* The index of output `name` in the family's output_names, or -1; every name, ", "-separated, into buf. */
int kp_family_output_index(const kp_family *fam, const char *name);
void kp_family_output_list(const kp_family *fam, char *buf, size_t len);
/* Declare that impl does not produce output `name` of its family (kp_impl_declare_absent, after checking it is one):
 * KP_EXIT_USAGE naming it and the family's outputs when it is not, or when impl's family is unknown. */
int kp_family_declare_absent(const kp_impl *impl, const char *name, kp_error *err);
/* Whether a record is complete and consistent (required hooks, sizes, hooks that come in pairs). */
int kp_family_check(const kp_family *fam, kp_error *err);
/* The family's row for array `name` of this kind (kp_array_doc), or NULL when it documents none. */
const kp_array_doc *kp_family_array_doc(const kp_family *fam, kp_array_kind kind, const char *name);
/* Add a family after the built-in rows (a test's own family), with its case family; KP_EXIT_USAGE for a
 * clash or an incomplete record. */
int kp_family_register(const kp_family *fam, kp_error *err);

#endif
