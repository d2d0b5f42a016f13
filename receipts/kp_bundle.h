/* kp_bundle.h: a bundle folder of hash-chained receipts, artifacts, bundle.json, manifest.sha256,
 * junit.xml, summary.md and report.html, and `verify`, which rechecks every byte and the chain.
 *
 * Receipt shape (schema "kparity.receipt/v1") as the bundle reads it; the harness fills the rest:
 *   { "schema", "index", "case": {"name", "family", ...}, "result": "PASSED|INCORRECT|FAILED|NOT_RUN|NOT_SUPPORTED",
 *     "reasons": [str], "duration_s",
 *     "checks": [ {"check", "label", "impl", "result", "summary", ...} ],
 *     "artifacts": [ {"name", "file": "artifacts/<sha256>.npy", "sha256"} ],
 *     "chain": {"prev": "<sha256 of the previous receipt file, 64 zeros for the first>"} }
 * The bundle sets "index" and "chain" itself. */
#ifndef KP_BUNDLE_H
#define KP_BUNDLE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "../cases/kp_common.h"
#include "../cases/kp_sha256.h"

typedef struct kp_bundle kp_bundle;

/* Create `dir` (it must not exist, or be an empty folder) with receipts/ and artifacts/.
 * KP_EXIT_USAGE naming the path when it cannot be created or written. */
int kp_bundle_open(kp_bundle **out, const char *dir, kp_error *err);
const char *kp_bundle_dir(const kp_bundle *b);

/* Store an array as artifacts/<sha256>.npy (content addressed; the same bytes are stored once).
 * `digest` receives the file's SHA-256, `relpath` its path inside the bundle. */
int kp_bundle_add_artifact(kp_bundle *b, const char *descr, int ndim, const int64_t *shape, const void *data,
                           size_t data_bytes, char digest[KP_SHA256_HEX_LEN], char relpath[128], kp_error *err);

/* Append a receipt: the bundle sets "index" and "chain.prev", prints it, writes
 * receipts/NNNN.json atomically and takes ownership of `receipt`. */
int kp_bundle_add_receipt(kp_bundle *b, cJSON *receipt, kp_error *err);

/* Finish: junit.xml, summary.md, report.html, bundle.json (with `meta` merged in: config digest,
 * verdict, exit code, environment...; ownership taken), then manifest.sha256 over every other file. */
int kp_bundle_finish(kp_bundle *b, const char *verdict, int exit_code, cJSON *meta, kp_error *err);
void kp_bundle_free(kp_bundle *b);

/* Recheck a bundle: every manifest line, no file added or removed, bundle.json's receipt digests,
 * the chain, every artifact a receipt names. 0 when intact; KP_EXIT_INCORRECT with a message
 * naming the first bad file otherwise; KP_EXIT_USAGE when `dir` is not a bundle. */
int kp_bundle_verify(const char *dir, kp_error *err);

/* Read a receipt file of a bundle (for replay). Caller frees with cJSON_Delete. */
int kp_bundle_read_json(const char *path, cJSON **out, kp_error *err);

#endif
