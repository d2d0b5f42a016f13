/* kp_bundle.h: a bundle folder of hash-chained receipts, artifacts, bundle.json, manifest.sha256,
 * junit.xml, summary.md and report.html, and `verify`, which rechecks every byte and the chain.
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
#include <sys/types.h>

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

/* A run's verdict and its exit code (DESIGN.md "The gate"), in precedence: TIMEOUT (4) when the gate's time ran
 * out; FAILED (3) when a case failed or the device was lost; INCORRECT (1); NOT_RUN (77) when no check ran; PASSED
 * (0); else the worst result's name (77: some checks could not run). In kp_verdict.c. */
const char *kp_bundle_verdict(kp_result worst, int any_ran, int timed_out, int device_lost, int *exit_code);
/* The same from receipt rows: the worst receipt result (one outside the vocabulary counts as FAILED) and whether
 * any check's result is other than NOT_RUN. */
const char *kp_bundle_rows_verdict(const cJSON *rows, int timed_out, int device_lost, int *exit_code);
/* Whether a bundle of these rows may record `verdict` with `exit_code`: the exit code is the verdict's, and the
 * verdict is what the rows give, or TIMEOUT or FAILED, which the receipts cannot always show (a timeout, a lost
 * device). 0 with `why` filled when not. finish refuses what this refuses, verify checks bundle.json with it. */
int kp_bundle_verdict_fits(const cJSON *rows, const char *verdict, int64_t exit_code, char *why, size_t why_size);

/* Store an array as artifacts/<sha256>.npy (content addressed; the same bytes are stored once).
 * `digest` receives the file's SHA-256, `relpath` its path inside the bundle. */
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

/* Recheck a bundle: every manifest line, no file added or removed, bundle.json's receipt digests,
 * the chain, every artifact a receipt names, and what the receipts give: bundle.json's verdict and exit
 * code (kp_bundle_verdict_fits), junit.xml, summary.md and report.html byte for byte. 0 when intact;
 * KP_EXIT_INCORRECT with a message naming the first bad file otherwise; KP_EXIT_USAGE when `dir` is not
 * a bundle. A bundle whose run stopped before its manifest (killed, disk full) is KP_EXIT_INCORRECT with
 * a message that begins "incomplete:", names the last receipt and what is missing, after checking that
 * every file there is whole and chained; damage to what is there is reported as for a finished bundle
 * (its reports and verdict are not rendered again: an unfinished run may not have written them). */
int kp_bundle_verify(const char *dir, kp_error *err);

/* Read a receipt file of a bundle (for replay), numbers kept exact (kp_json_parse).
 * KP_EXIT_USAGE naming the path and the line of a syntax error. Caller frees with cJSON_Delete. */
int kp_bundle_read_json(const char *path, cJSON **out, kp_error *err);

/* Every file under `dir` as sorted relative paths ('/'-separated, strcmp order = LC_ALL=C sort),
 * folders walked recursively. KP_EXIT_USAGE naming an entry that is neither a regular file nor a
 * folder (a symlink, a socket), or whose name a manifest line cannot hold (control character, backslash). */
int kp_bundle_list_files(const char *dir, char ***paths, size_t *count, kp_error *err);
void kp_bundle_free_list(char **paths, size_t count);
/* Whether a name (no folder) is a temporary file of kp_write_file_atomic: ".<name>.tmp-XXXXXX". */
int kp_bundle_is_temp_name(const char *name);
/* Remove the temporary files writes that never finished left in one folder (kp_bundle_is_temp_name); nothing else is
 * touched. KP_EXIT_ENV naming the file when one cannot be removed. */
int kp_bundle_drop_temp_files(const char *folder, kp_error *err);
/* (Re)write DIR/manifest.sha256 over every other file: "<64 hex>  <path>\n", sorted by path. */
int kp_bundle_write_manifest(const char *dir, kp_error *err);

/* The reports, rendered from receipt rows: an array of {"file", "case", "result", "reasons": [str],
 * "checks": [as in the receipt], "impls": [as in the receipt, when it has them]}, which the bundle keeps one per receipt. Each check gives one JUnit
 * testcase and one table row; a receipt without checks gives one, labelled "case", carrying the
 * receipt's own result. Malloc'd text; NULL only when out of memory. */
char *kp_report_junit(const cJSON *rows);
char *kp_report_summary_md(const cJSON *rows, const char *verdict, int exit_code);
char *kp_report_html(const cJSON *rows, const char *verdict, int exit_code);

/* Fault injection for the crash-consistency tests (tests/test_crash.c), in kp_fileio.c. KPARITY_FAULT=kill@N,
 * enospc@N or eacces@N acts at this process's Nth file operation that writes (a bundle folder made; a file
 * created, written, synced, closed, renamed into place, its folder synced; counted from 1):
 *   kill@N    SIGKILL there, after writing half when it is a write (the torn temporary file a crash leaves),
 *             and the pid given to kp_fault_also_kill first (a run's supervisor: the whole gate dies at once);
 *   enospc@N  that operation and every later one fails with ENOSPC (a full disk stays full);
 *   eacces@N  every operation from the Nth on that adds or renames a folder entry fails with EACCES.
 * Unset, it costs one predicted branch per operation. kp_fault_point counts one operation and returns 0 (go
 * ahead) or the errno to fail it with (kill does not return); in_folder: the operation adds or renames an
 * entry (mkdir, create, rename). */
int kp_fault_point(int in_folder);
void kp_fault_also_kill(pid_t pid);

#endif
