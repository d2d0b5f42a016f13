/* kp_bundle.h: a bundle folder of hash-chained receipts, artifacts, bundle.json, manifest.sha256,
 * junit.xml, summary.md and report.html (kp_bundle.c). Beside it: kp_verify.h (`verify`, which rechecks every byte
 * and the chain), kp_verdict.h, kp_report.h and kp_fileio.h, one header per source file.
 *
 * Receipt shape (schema "kparity.receipt/v1") as the bundle reads it; the harness fills the rest:
 *   { "schema", "index", "case": {"name", "family", ...}, "result": "PASSED|INCORRECT|FAILED|NOT_RUN|NOT_SUPPORTED",
 *     "reasons": [str], "duration_s",
 *     "checks": [ {"check", "label", "impl", "result", "summary", ...} ],
 *     "artifacts": [ {"name", "file": "artifacts/<sha256>.npy", "sha256"} ],
 *     "chain": {"prev": "<sha256 of the previous receipt file, 64 zeros for the first>"} }
 * The bundle sets "index" and "chain" itself. Results are the DESIGN.md vocabulary (kp_result in
 * cases/kp_common.h); the reports show each check's "summary". */
#ifndef KP_BUNDLE_H
#define KP_BUNDLE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "../cases/kp_common.h"
#include "../cases/kp_sha256.h"

typedef struct kp_bundle kp_bundle;

/* The chain's start: the "previous receipt" digest of a bundle's first receipt. */
#define KP_ZERO_DIGEST "0000000000000000000000000000000000000000000000000000000000000000"

/* Create `dir` (it must not exist, or be an empty folder; its parent must exist) with receipts/ and
 * artifacts/. KP_EXIT_USAGE naming the path and the reason when it cannot be created or written.
 * Past this point every write that fails is KP_EXIT_ENV naming the file and why, and leaves the bundle
 * unfinished: no bundle.json or manifest is written after a failed write, so verify calls it incomplete. */
int kp_bundle_open(kp_bundle **out, const char *dir, kp_error *err);

/* Reopen a bundle a run left unfinished (its process died: no bundle.json, no manifest) to append to it:
 * receipts/0001.json.. are read back in order, each checked against its index and the chain, and the
 * temporary files of writes that never finished are removed. KP_EXIT_ENV naming the file when what is
 * there does not read back as this bundle wrote it. */
int kp_bundle_resume(kp_bundle **out, const char *dir, kp_error *err);
/* Receipts written (or read back by kp_bundle_resume), and one row per receipt (kp_bundle_add_row), owned by the
 * bundle. */
int64_t kp_bundle_count(const kp_bundle *b);
const cJSON *kp_bundle_rows(const kp_bundle *b);
/* Append to `rows` the row of `receipt`, stored as `file` with SHA-256 `digest`: {"file", "sha256", "case", "result",
 * "reasons", "checks", and "impls" when the receipt has them}, what the reports are rendered from. The bundle keeps
 * one per receipt it writes or reads back, and verify builds the same from the files, so the reports it renders
 * again are the bytes finish wrote. -1 without case.name or result strings (nothing appended then), or out of
 * memory. */
int kp_bundle_add_row(cJSON *rows, const char *file, const char *digest, const cJSON *receipt);

/* Store an array as artifacts/<sha256>.npy (content addressed; the same bytes are stored once).
 * `digest` receives the file's SHA-256, `relpath` its path inside the bundle. The file is written (and synced) by the
 * time the next receipt or the bundle's end is, with the others pending then, on several threads at once: one sync
 * each is what an artifact costs, and concurrent syncs share the file system's commits. A write that fails fails
 * that receipt, naming the artifact. */
int kp_bundle_add_artifact(kp_bundle *b, const char *descr, int ndim, const int64_t *shape, const void *data,
                           size_t data_bytes, char digest[KP_SHA256_HEX_LEN], char relpath[128], kp_error *err);

/* Append a receipt: the bundle sets "index" and "chain.prev", prints it, writes
 * receipts/NNNN.json atomically and takes ownership of `receipt` (also when it fails).
 * KP_EXIT_USAGE for a receipt without case.name, with a result outside the vocabulary, or naming
 * an artifact this bundle does not hold. */
int kp_bundle_add_receipt(kp_bundle *b, cJSON *receipt, kp_error *err);

/* Finish: junit.xml, summary.md, report.html, bundle.json (with `meta` merged in: config digest,
 * verdict, exit code, environment...; ownership taken), then manifest.sha256 over every other file.
 * KP_EXIT_USAGE, writing nothing, for a verdict its receipts do not allow (kp_bundle_verdict_fits). */
int kp_bundle_finish(kp_bundle *b, const char *verdict, int exit_code, cJSON *meta, kp_error *err);
void kp_bundle_free(kp_bundle *b);

/* Read a receipt file of a bundle (for replay), numbers kept exact (kp_json_parse).
 * KP_EXIT_USAGE naming the path and the line of a syntax error. Caller frees with cJSON_Delete. */
int kp_bundle_read_json(const char *path, cJSON **out, kp_error *err);

/* Remove the temporary files writes that never finished left in one folder (kp_bundle_is_temp_name); nothing else is
 * touched. KP_EXIT_ENV naming the file when one cannot be removed. */
int kp_bundle_drop_temp_files(const char *folder, kp_error *err);
/* (Re)write DIR/manifest.sha256 over every other file: "<64 hex>  <path>\n", sorted by path. */
int kp_bundle_write_manifest(const char *dir, kp_error *err);

#endif
