/* kp_test_util.h: helpers shared by the Criterion tests: run the kparity binary and capture
 * what it printed, make scratch folders, read and patch files. */
#ifndef KP_TEST_UTIL_H
#define KP_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Paths the tests need, overridable so a build can be carried to another machine and run there:
 * $KPARITY_BIN (else the build's kparity), $KPARITY_SOURCE_DIR (else the source tree it was
 * built from), $KPT_CUDA_PLUGIN (else the build's CUDA test plugin, "" in a CPU-only build). */
char *kpt_binary(void);
const char *kpt_source_dir(void);
const char *kpt_cuda_plugin(void);
/* $KPT_SCALE_PLUGIN, else the build's plugin of the test family `scale` (tests/fixtures/scale/). */
const char *kpt_scale_plugin(void);
/* $KPARITY_PYTHON, else the python3 with NumPy that CMake found when it configured the tests (a path). */
char *kpt_python(void);

/* A splitmix64 stream (independent of cases/'s cuRAND draws) and a uniform double in [0, 1) from it. */
uint64_t kpt_splitmix(uint64_t *state);
double kpt_unit(uint64_t *state);

/* A fresh scratch folder per test: TestSuite(name, .init = kpt_dir_setup, .fini = kpt_dir_teardown)
 * and use kpt_dir. */
extern char *kpt_dir;
void kpt_dir_setup(void);
void kpt_dir_teardown(void);
/* Keep a malloc'd buffer the test holds to its end (a path, a key file's name) and return it: kpt_dir_teardown
 * frees it, so a helper can hand out paths without every test freeing each (LeakSanitizer, KP_SANITIZE=ON). */
void *kpt_scratch(void *p);
/* Parse receipts/NNNN.json of a bundle (asserting it exists and parses); cJSON_Delete it. */
struct cJSON;
struct cJSON *kpt_receipt(const char *bundle, int index);

/* Run `argv` (NULL-terminated) with stdout and stderr captured (each truncated to 64 KiB).
 * Returns the exit status, or 128 + signal. The caller frees *out and *errout. */
int kpt_run(char *const argv[], char **out, char **errout);
/* `kparity gate --config cfg --out out --quiet`, through kpt_run (out_text, err_text as there; NULL: not kept). */
int kpt_gate(const char *cfg, const char *out, char **out_text, char **err_text);

/* A receipt's (or any document's) member by a dotted path, a number an array index: "checks.0.summary", or a
 * plain key. Each fails the test naming the path when there is none, or (str, num) it is not of that type. */
const struct cJSON *kpt_at(const struct cJSON *obj, const char *path);
const char *kpt_str(const struct cJSON *obj, const char *path);
double kpt_num(const struct cJSON *obj, const char *path);
/* A receipt's check k (its "checks" array), failing the test when there is none. */
const struct cJSON *kpt_check(const struct cJSON *rec, int k);
/* A case name that parses and that its family refuses when it is normalized: exit class 2, needle in the message. */
void kpt_case_refused(const char *name, const char *needle);
/* A fresh empty folder under $TMPDIR (or /tmp); the caller frees the path. */
char *kpt_tempdir(void);
/* Read a whole file (NUL-terminated); NULL if it cannot be read. */
char *kpt_read(const char *path, size_t *len);
int kpt_write(const char *path, const void *data, size_t len);
/* Build tests/fixtures/<fixture> into <kpt_dir>/<name>.so with -DKPT_NAME="name", -DKPT_PERTURB_AT=perturb_at and
 * one -D flag (NULL: -DKPT_CLEAN), warnings as errors; fails the test when it does not build. Returns the path. */
char *kpt_build_plugin(const char *fixture, const char *flag, const char *name, int perturb_at);
/* Whether this build has CUDA impls and a GPU answers, asked in a throwaway child so the calling
 * process never holds CUDA state (Criterion forks). */
int kpt_gpu_available(void);
/* Lookup and allocation that fail the test instead of returning NULL (alloc_or_die zeroes, and takes 0). */
struct kp_impl;
const struct kp_impl *impl_named(const char *name);
void *alloc_or_die(size_t bytes);
/* The case names of a shipped gate config, ci/gates/<config> (at most `most`, KP_CASE_NAME_MAX bytes each); their count. */
int kpt_gate_cases(const char *config, char names[][512], int most);
/* Remove a folder tree (best effort). */
void kpt_rmtree(const char *path);

#endif
