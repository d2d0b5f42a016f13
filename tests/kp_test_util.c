/* kp_test_util.c: process and file helpers for tests; nothing here judges a result. */
#define _GNU_SOURCE
#include "kp_test_util.h"

#include "../cases/kp_case.h"
#include "../kernels/kp_registry.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

/* The build's plugin paths; "" where this build has none (a CPU-only build's CUDA plugin). */
#ifndef KPT_CUDA_PLUGIN
#define KPT_CUDA_PLUGIN ""
#endif
#ifndef KPT_SCALE_PLUGIN
#define KPT_SCALE_PLUGIN ""
#endif

char *kpt_binary(void) { return (char *)env_or("KPARITY_BIN", KP_BINARY); }
const char *kpt_source_dir(void) { return env_or("KPARITY_SOURCE_DIR", KP_SOURCE_DIR); }
const char *kpt_cuda_plugin(void) { return env_or("KPT_CUDA_PLUGIN", KPT_CUDA_PLUGIN); }
const char *kpt_scale_plugin(void) { return env_or("KPT_SCALE_PLUGIN", KPT_SCALE_PLUGIN); }
#ifndef KPT_PYTHON
#define KPT_PYTHON "python3"
#endif
char *kpt_python(void) { return (char *)env_or("KPARITY_PYTHON", KPT_PYTHON[0] ? KPT_PYTHON : "python3"); }

uint64_t kpt_splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
double kpt_unit(uint64_t *s) { return (double)(kpt_splitmix(s) >> 11) * 0x1p-53; }

static char *slurp_fd(int fd) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    ssize_t n;
    while ((n = read(fd, buf + len, cap - len)) > 0) {
        len += (size_t)n;
        if (len == cap) { /* keep draining so the child never blocks, but keep only the head */
            char sink[4096];
            while (read(fd, sink, sizeof sink) > 0) {}
            break;
        }
    }
    buf[len] = '\0';
    return buf;
}

int kpt_run(char *const argv[], char **out, char **errout) {
    char outpath[] = "/tmp/kpt-out-XXXXXX", errpath[] = "/tmp/kpt-err-XXXXXX";
    int ofd = mkstemp(outpath), efd = mkstemp(errpath);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(ofd, 1);
        dup2(efd, 2);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    lseek(ofd, 0, SEEK_SET);
    lseek(efd, 0, SEEK_SET);
    char *o = slurp_fd(ofd), *e = slurp_fd(efd);
    close(ofd);
    close(efd);
    unlink(outpath);
    unlink(errpath);
    if (out) *out = o; else free(o);
    if (errout) *errout = e; else free(e);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}

char *kpt_tempdir(void) {
    const char *base = getenv("TMPDIR");
    char *path;
    if (asprintf(&path, "%s/kpt-XXXXXX", base && *base ? base : "/tmp") < 0) return NULL;
    if (!mkdtemp(path)) {
        free(path);
        return NULL;
    }
    return path;
}

char *kpt_read(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = '\0';
    if (len) *len = got;
    return buf;
}

int kpt_write(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t put = fwrite(data, 1, len, f);
    return fclose(f) == 0 && put == len ? 0 : -1;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

void kpt_rmtree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

#ifdef KP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

int kpt_gpu_available(void) {
#ifdef KP_HAVE_CUDA
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) return 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
#else
    return 0;
#endif
}

char *kpt_dir;
static void **scratch;
static size_t nscratch, scratch_cap;

void kpt_dir_setup(void) { kpt_dir = kpt_tempdir(); }
void kpt_dir_teardown(void) {
    kpt_rmtree(kpt_dir);
    free(kpt_dir);
    kpt_dir = NULL;
    for (size_t i = 0; i < nscratch; i++) free(scratch[i]);
    free(scratch);
    scratch = NULL;
    nscratch = scratch_cap = 0;
}

void *kpt_scratch(void *p) {
    if (!p) return p;
    if (nscratch == scratch_cap) {
        void **grown = realloc(scratch, sizeof *grown * (scratch_cap = scratch_cap ? 2 * scratch_cap : 16));
        cr_assert_not_null(grown, "out of memory");
        scratch = grown;
    }
    return scratch[nscratch++] = p;
}

cJSON *kpt_receipt(const char *bundle, int index) {
    char *path;
    cr_assert(asprintf(&path, "%s/receipts/%04d.json", bundle, index) > 0);
    char *text = kpt_read(path, NULL);
    cr_assert_not_null(text, "no receipt %s", path);
    cJSON *doc = cJSON_Parse(text);
    cr_assert_not_null(doc, "%s does not parse", path);
    free(text), free(path);
    return doc;
}

char *kpt_build_plugin(const char *fixture, const char *flag, const char *name, int perturb_at) {
    char *so, *src, *inc, *def, *at;
    cr_assert(asprintf(&so, "%s/%s.so", kpt_dir, name) > 0);
    cr_assert(asprintf(&src, "%s/tests/fixtures/%s", kpt_source_dir(), fixture) > 0);
    cr_assert(asprintf(&inc, "-I%s/kernels", kpt_source_dir()) > 0);
    cr_assert(asprintf(&def, "-DKPT_NAME=\"%s\"", name) > 0);
    cr_assert(asprintf(&at, "-DKPT_PERTURB_AT=%d", perturb_at) > 0);
    char *argv[] = {"/usr/bin/cc", "-shared", "-fPIC", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", inc, def, at,
                    (char *)(flag ? flag : "-DKPT_CLEAN"), "-o", so, src, "-lm", NULL};
    char *out, *err;
    int rc = kpt_run(argv, &out, &err);
    cr_assert_eq(rc, 0, "building the plugin failed: %s", err);
    free(out), free(err), free(src), free(inc), free(def), free(at);
    return so;
}

int kpt_gate(const char *cfg, const char *out, char **out_text, char **err_text) {
    char *argv[] = {kpt_binary(), "gate", "--config", (char *)cfg, "--out", (char *)out, "--quiet", NULL};
    return kpt_run(argv, out_text, err_text);
}

const cJSON *kpt_at(const cJSON *obj, const char *path) {
    char buf[256], *save = NULL;
    cr_assert_lt(strlen(path), sizeof buf, "path %s is too long", path);
    snprintf(buf, sizeof buf, "%s", path);
    for (char *key = strtok_r(buf, ".", &save); key && obj; key = strtok_r(NULL, ".", &save))
        obj = (key[0] >= '0' && key[0] <= '9') ? cJSON_GetArrayItem(obj, atoi(key)) : cJSON_GetObjectItemCaseSensitive(obj, key);
    cr_assert_not_null(obj, "no %s", path);
    return obj;
}

const char *kpt_str(const cJSON *obj, const char *path) {
    const cJSON *v = kpt_at(obj, path);
    cr_assert(cJSON_IsString(v), "%s is not a string", path);
    return v->valuestring;
}

double kpt_num(const cJSON *obj, const char *path) {
    const cJSON *v = kpt_at(obj, path);
    cr_assert(cJSON_IsNumber(v), "%s is not a number", path);
    return v->valuedouble;
}

const cJSON *kpt_check(const cJSON *rec, int k) {
    const cJSON *c = cJSON_GetArrayItem(kpt_at(rec, "checks"), k);
    cr_assert_not_null(c, "no check %d", k);
    return c;
}

const kp_impl *impl_named(const char *name) {
    const kp_impl *impl = kp_impl_find(name);
    cr_assert_not_null(impl, "no impl named %s in this build", name);
    return impl;
}

void *alloc_or_die(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    cr_assert_not_null(p, "out of host memory for %zu bytes", bytes);
    return p;
}

void kpt_case_refused(const char *name, const char *needle) {
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err), 0, "%s: %s", name, err.msg);
    cr_assert_eq(kp_case_normalize(&c, &err), KP_EXIT_USAGE, "%s was accepted", name);
    cr_assert(strstr(err.msg, needle), "%s: %s", name, err.msg);
}

_Static_assert(KP_CASE_NAME_MAX == 512, "kp_test_util.h's kpt_gate_cases spells the name length out");
int kpt_gate_cases(const char *config, char names[][KP_CASE_NAME_MAX], int most) {
    char path[4096];
    snprintf(path, sizeof path, "%s/ci/gates/%s", kpt_source_dir(), config);
    char *text = kpt_read(path, NULL);
    cr_assert(text, "cannot read %s", path);
    cJSON *doc = cJSON_Parse(text);
    cr_assert(doc, "%s does not parse", path);
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "cases")) {
        cr_assert(n < most, "%s: more than %d cases", path, most);
        snprintf(names[n++], KP_CASE_NAME_MAX, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(c, "case")));
    }
    cJSON_Delete(doc);
    free(text);
    return n;
}
