/* kp_harness.h: the harness's shared vocabulary: results, check specs, the gate config, and the
 * per-family hooks the runner drives. One family = one kp_family (harness/topp_family.c). */
#ifndef KP_HARNESS_H
#define KP_HARNESS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "../cases/kp_case.h"
#include "../cases/kp_common.h"
#include "../cases/kp_sha256.h"
#include "../kernels/kp_registry.h"
#include "../receipts/kp_bundle.h"
#include "../reference/topp_ref.h"

/* Result vocabulary, everywhere (CLI, receipts, JUnit, report). Ordered by severity. */
typedef enum kp_result {
    KP_PASSED = 0,
    KP_NOT_SUPPORTED,
    KP_NOT_RUN,
    KP_INCORRECT,
    KP_FAILED
} kp_result;
const char *kp_result_name(kp_result r);

typedef enum kp_check_kind { KP_CHECK_EXACT = 0, KP_CHECK_RULE, KP_CHECK_REPEAT, KP_CHECK_BATCH, KP_CHECK_EXPECT } kp_check_kind;
const char *kp_check_name(kp_check_kind k);

/* One declared check with its effective parameters (defaults from the config already applied). */
typedef struct kp_check_spec {
    kp_check_kind kind;
    kp_check_kind of;        /* expect: the check whose result is expected */
    int nimpl;               /* exact: 2, others: 1 */
    const kp_impl *impl[2];
    char role[2][32];        /* "incumbent", "candidate", or "" when named directly */
    kp_tie_policy tie_policy;
    double band;
    int runs;                /* repeat */
    kp_result expect_result; /* expect */
    char defect[32];         /* expect: "" or "all_neginf" (every row masked entirely) */
    char label[200];
} kp_check_spec;

typedef struct kp_case_spec {
    kp_case c;
    char name[KP_CASE_NAME_MAX];
    kp_check_spec *checks;
    int nchecks;
    size_t host_bytes; /* estimate, checked against the budget before anything is allocated */
} kp_case_spec;

typedef struct kp_config {
    char path[512];
    char sha256[KP_SHA256_HEX_LEN];
    char name[128];
    struct {
        char role[32];
        const kp_impl *impl;
        char declared[96]; /* the name as written, e.g. topp.split_prob@auto */
    } roles[8];
    int nroles;
    kp_case_spec *cases;
    int ncases;
    uint64_t host_budget;
    uint64_t device_budget; /* 0 when no GPU is used */
    double timeout_s;
    cJSON *doc;
} kp_config;

/* Load, validate and expand (grids, check sets, defaults, @auto impls) a gate config.
 * Any problem: exit class 2 with the JSON path of the field, e.g. "cases[3].checks[1].impl". */
int kp_config_load(const char *path, kp_config *cfg, kp_error *err);
void kp_config_free(kp_config *cfg);

/* Where a check's evidence goes: index lists longer than inline_limit are stored whole as .npy
 * artifacts in the bundle and named (file, digest) in the receipt's "artifacts". */
typedef struct kp_evidence {
    kp_bundle *bundle;
    cJSON *artifacts; /* the receipt's "artifacts" array */
    int inline_limit;
} kp_evidence;
/* obj[key] = {"count", "first": [...], "artifact": {"file", "sha256"} when longer than inline_limit}. */
int kp_evidence_list(kp_evidence *ev, cJSON *obj, const char *key, const char *artifact_name, const int64_t *idx,
                     int64_t n, kp_error *err);

/* Where the gate's wall time goes (it is on a serving host's startup path): seconds per stage,
 * summed over the run, reported in bundle.json and on stderr. */
typedef enum kp_stage {
    KP_STAGE_GENERATION = 0, /* seeded inputs */
    KP_STAGE_REFERENCE,      /* the float64 reference */
    KP_STAGE_KERNELS,        /* impl runs: copies, launch, sync, guard checks */
    KP_STAGE_JUDGING,        /* comparisons, rule judging, evidence */
    KP_STAGE_RECEIPTS,       /* receipts, artifacts, reports, manifest */
    KP_STAGE_DIGESTS,        /* SHA-256 of inputs, reference and outputs recorded in receipts: the time the
                                run spent starting them and waiting for them (they are hashed on worker
                                threads beside the other stages: kp_digest_start) */
    KP_STAGE_COUNT
} kp_stage;
void kp_stage_add(kp_stage stage, double seconds);
double kp_stage_seconds(kp_stage stage);
double kp_stage_total(void); /* every stage's seconds, summed */
const char *kp_stage_name(kp_stage stage);

/* The digests receipts record, hashed on worker threads while the case goes on (kp_sha256_job).
 * kp_digest_start hashes prefix (copied) and spans (which must stay unchanged until the next
 * kp_digests_settle); at settle the hex lands in hex_out (if not NULL) and in obj[key] (if obj is
 * not NULL), added now with a placeholder so the receipt keeps its key order. kp_digest_record adds
 * obj[key] for the digest bound for hex_out, now if it has settled. kp_digests_settle waits for
 * every digest started and fills every place. Only the run's thread calls these; a family settles
 * before it frees a buffer a digest may read (its release and free_output, whoever calls them), and
 * the runner before it writes a case's receipt. */
void kp_digest_start(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans, char *hex_out,
                     cJSON *obj, const char *key);
void kp_digest_record(cJSON *obj, const char *key, const char *hex_out);
void kp_digests_settle(void);

/* Per-family hooks. `data` is the family's prepared case (inputs, lazily the reference). */
typedef struct kp_family {
    const char *name;
    /* Inputs for rows [0, batch + extra_rows); extra rows feed batch probes. */
    int (*prepare)(const kp_case *c, int64_t extra_rows, void **data, kp_error *err);
    void (*release)(void *data);
    int64_t (*batch)(const void *data);
    size_t (*estimate_bytes)(const kp_case *c, int nimpls, kp_error *err);
    /* Device bytes one launch of a CUDA impl needs at most (inputs, outputs and workspace of the
     * largest batch the checks build), so a case over the device budget is refused up front. */
    size_t (*estimate_device_bytes)(const kp_case *c, const kp_impl *impl, kp_error *err);
    /* Input tensors' digests and shapes into `inputs`. */
    void (*describe_inputs)(const void *data, cJSON *inputs);
    /* Run an impl on the given rows (indices into the prepared rows) as one batch; output rows
     * land in a family-owned buffer returned through *out (freed with free_output). */
    kp_result (*run_rows)(void *data, const kp_impl *impl, const int64_t *rows, int64_t nrows, void **out,
                          cJSON *info, kp_error *err);
    void (*free_output)(void *out);
    /* Logical bytes of output row i (for bitwise comparisons and per-row digests). */
    const void *(*out_row)(const void *data, const void *out, int64_t i, size_t *bytes);
    /* Compute the reference (once) and describe it. */
    int (*reference)(void *data, const kp_check_spec *spec, cJSON *desc, kp_error *err);
    /* The rule check of one impl's full-batch output. */
    kp_result (*rule)(void *data, const kp_check_spec *spec, const void *out, const kp_impl *impl, cJSON *check,
                      kp_evidence *ev, kp_error *err);
    /* Extra evidence for an exact check that found differences: per row, who meets the rule. */
    int (*explain_exact)(void *data, const kp_check_spec *spec, const void *out_a, const void *out_b,
                         const int64_t *rows, int64_t nrows, cJSON *rows_json, kp_evidence *ev, kp_error *err);
    /* Whether a named defect shows on every row of this output ("all_neginf"). */
    int (*has_defect)(void *data, const void *out, const char *defect, int64_t *rows_with);
    /* Time an impl on the whole case: inputs uploaded once, warm-up, then `reps` timed runs (CUDA
     * events with L2 flushed between reps on a GPU; wall clock on the host). Fills `timing` with
     * median/min/max microseconds and bytes moved. */
    int (*bench)(void *data, const kp_impl *impl, int reps, cJSON *timing, kp_error *err);
    /* Write inputs, reference and outputs as .npy (kparity export). */
    int (*export_npy)(void *data, const char *dir, const kp_impl *const *impls, const void *const *outs, int nimpls,
                      kp_error *err);
} kp_family;

const kp_family *kp_family_find(const char *name);
extern const kp_family kp_topp_family;

#endif
