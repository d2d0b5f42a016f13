/* exec.c: outside programs as impls (kp_exec.h has the protocol): each is a host impl whose run() sends the launch
 * in progress (kp_launch_current) to the program through a shared memory file and reads its outputs back. */
#define _GNU_SOURCE
#include "kp_exec.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../receipts/kp_json.h"
#include "../receipts/kp_npy.h"
#include "kp_judge.h"
#include "kp_launch.h"

extern char **environ;

#define MAX_EXEC 16
#define MAX_FILES 16
#define LINE_MAX_BYTES (1 << 20)
#define STDERR_TAIL 2000

typedef struct exec_impl {
    kp_impl impl;
    char name[128];
    char family[16], program_impl[64];
    char **argv;
    char command[1024];      /* argv joined, for receipts and messages */
    char files[MAX_FILES][1024];
    char file_sha[MAX_FILES][KP_SHA256_HEX_LEN];
    int nfiles;
    char identity[KP_SHA256_HEX_LEN];
    double timeout_s;
    /* the running program (pid 0: none) */
    pid_t pid;
    int to_prog, from_prog, err_fd, shm_fd;
    unsigned char *map;
    size_t map_bytes;
    uint64_t shared_generation; /* the case whose shared inputs are in the file */
    size_t shared_end;
    char *line;
    size_t line_len;
    cJSON *versions; /* from the handshake */
    long requests, starts;
} exec_impl;

static exec_impl g_exec[MAX_EXEC];
static int g_nexec;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The file argv[0] runs (found on PATH when it has no '/'), or "" when none is found. */
static void program_path(const char *arg0, char *out, size_t len) {
    out[0] = '\0';
    if (strchr(arg0, '/')) {
        snprintf(out, len, "%s", arg0);
        return;
    }
    const char *path = getenv("PATH");
    char *copy = strdup(path ? path : "/usr/bin:/bin"), *save = NULL;
    for (char *dir = copy ? strtok_r(copy, ":", &save) : NULL; dir; dir = strtok_r(NULL, ":", &save)) {
        char cand[1024];
        snprintf(cand, sizeof cand, "%s/%s", dir, arg0);
        if (access(cand, X_OK) == 0) {
            snprintf(out, len, "%s", cand);
            break;
        }
    }
    free(copy);
}

static int is_regular(const char *path) {
    struct stat st;
    return path[0] && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int serve(const void *args, char *message, size_t len, int slot); /* the run */
#define RUNNER(i) static int run_##i(const void *a, char *m, size_t n) { return serve(a, m, n, i); }
RUNNER(0) RUNNER(1) RUNNER(2) RUNNER(3) RUNNER(4) RUNNER(5) RUNNER(6) RUNNER(7)
RUNNER(8) RUNNER(9) RUNNER(10) RUNNER(11) RUNNER(12) RUNNER(13) RUNNER(14) RUNNER(15)
static int (*const runners[MAX_EXEC])(const void *, char *, size_t) = {
    run_0, run_1, run_2, run_3, run_4, run_5, run_6, run_7, run_8, run_9, run_10, run_11, run_12, run_13, run_14, run_15};

/* Every file the command names (the program found on PATH first) hashed, the pins checked against them, then the
 * impl's identity: SHA-256 over the command and those digests. */
static int hash_files(exec_impl *x, int argc, const cJSON *pins, const char *where, kp_error *err) {
    for (int a = 0; a < argc && x->nfiles < MAX_FILES; a++) {
        char path[1024];
        if (a == 0) program_path(x->argv[0], path, sizeof path);
        else snprintf(path, sizeof path, "%s", x->argv[a]);
        if (!is_regular(path)) continue;
        snprintf(x->files[x->nfiles], sizeof x->files[0], "%s", path);
        if (kp_sha256_file_hex(path, x->file_sha[x->nfiles], err)) return kp_error_prefix(err, "%s: ", where), err->code;
        x->nfiles++;
    }
    for (const cJSON *pin = pins ? pins->child : NULL; pin; pin = pin->next) {
        int found = 0;
        for (int f = 0; f < x->nfiles; f++)
            if (!strcmp(x->files[f], pin->string) || !strcmp(x->argv[0], pin->string)) {
                found = 1;
                if (!cJSON_IsString(pin) || strcmp(pin->valuestring, x->file_sha[f]))
                    return kp_fail(err, KP_EXIT_USAGE, "%s.sha256: %s has SHA-256 %s, not the pinned %s: refused before it runs", where,
                                   pin->string, x->file_sha[f], cJSON_IsString(pin) ? pin->valuestring : "(not a string)");
            }
        if (!found)
            return kp_fail(err, KP_EXIT_USAGE, "%s.sha256: %s is pinned but the command names no such file", where, pin->string);
    }
    kp_sha256 h; /* begun only now: a refusal above leaves no hash context behind */
    if (kp_sha256_init(&h, err)) return err->code;
    kp_sha256_update(&h, x->command, strlen(x->command) + 1);
    for (int f = 0; f < x->nfiles; f++) kp_sha256_update(&h, x->file_sha[f], KP_SHA256_HEX_LEN);
    kp_sha256_final_hex(&h, x->identity);
    return 0;
}

static void drop_argv(exec_impl *x) {
    for (int a = 0; x->argv && x->argv[a]; a++) free(x->argv[a]);
    free(x->argv);
    x->argv = NULL;
}

int kp_exec_register(const kp_exec_decl *decl, const char *where, const kp_impl **out, kp_error *err) {
    char name[128];
    int n = snprintf(name, sizeof name, "%s.%s@exec", decl->family, decl->program_impl[0] ? decl->program_impl : decl->role);
    if (n < 0 || (size_t)n >= sizeof name) return kp_fail(err, KP_EXIT_USAGE, "%s: the impl's name is too long", where);
    for (char *c = name + strlen(decl->family) + 1; *c && *c != '@'; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) *c = '_';
    for (int i = 0; i < g_nexec; i++) /* the same program declared again (another role, --exec): one impl */
        if (!strcmp(g_exec[i].name, name)) {
            int same = 1;
            for (int a = 0; same && (decl->argv[a] || g_exec[i].argv[a]); a++)
                same = decl->argv[a] && g_exec[i].argv[a] && !strcmp(decl->argv[a], g_exec[i].argv[a]);
            if (!same) return kp_fail(err, KP_EXIT_USAGE, "%s: %s is declared twice with different commands", where, name);
            *out = &g_exec[i].impl;
            return 0;
        }
    if (g_nexec == MAX_EXEC) return kp_fail(err, KP_EXIT_USAGE, "%s: at most %d outside programs", where, MAX_EXEC);
    exec_impl *x = &g_exec[g_nexec];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    snprintf(x->family, sizeof x->family, "%s", decl->family);
    snprintf(x->program_impl, sizeof x->program_impl, "%s", decl->program_impl);
    x->timeout_s = decl->timeout_s > 0 ? decl->timeout_s : 300;
    int argc = 0;
    while (decl->argv[argc]) argc++;
    x->argv = calloc((size_t)argc + 1, sizeof *x->argv); /* the slot is not taken until the end: a refusal frees it */
    if (!x->argv) return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    size_t used = 0;
    for (int a = 0; a < argc; a++) {
        x->argv[a] = strdup(decl->argv[a]);
        used += (size_t)snprintf(x->command + used, used < sizeof x->command ? sizeof x->command - used : 0, "%s%s", a ? " " : "",
                                 decl->argv[a]);
        if (used >= sizeof x->command) used = sizeof x->command - 1;
    }
    if (hash_files(x, argc, decl->pins, where, err)) return drop_argv(x), err->code;
    x->impl = (kp_impl){KP_ABI_VERSION, x->family, x->name, KP_MEMORY_HOST, NULL, NULL, runners[g_nexec]};
    char origin[1200];
    snprintf(origin, sizeof origin, "exec: %s", x->command);
    if (kp_impl_register_outside(&x->impl, origin, x->identity, 0, err)) return drop_argv(x), err->code;
    g_nexec++;
    int i = 0;
    for (const cJSON *a = decl->absent ? decl->absent->child : NULL; a; a = a->next, i++) {
        if (!cJSON_IsString(a)) return kp_fail(err, KP_EXIT_USAGE, "%s.absent[%d]: expected an output's name", where, i);
        if (kp_family_declare_absent(&x->impl, a->valuestring, err)) return kp_error_prefix(err, "%s.absent[%d]: ", where, i), err->code;
    }
    *out = &x->impl;
    return 0;
}

static exec_impl *find(const kp_impl *impl) {
    for (int i = 0; impl && i < g_nexec; i++)
        if (&g_exec[i].impl == impl) return &g_exec[i];
    return NULL;
}

int kp_impl_is_exec(const kp_impl *impl) { return find(impl) != NULL; }

void kp_exec_describe(const kp_impl *impl, cJSON *entry) {
    const exec_impl *x = find(impl);
    if (!x) return;
    cJSON *e = cJSON_AddObjectToObject(entry, "exec");
    cJSON *argv = cJSON_AddArrayToObject(e, "command");
    for (int a = 0; x->argv[a]; a++) cJSON_AddItemToArray(argv, cJSON_CreateString(x->argv[a]));
    cJSON_AddStringToObject(e, "impl", x->program_impl);
    cJSON_AddStringToObject(e, "protocol", KP_EXEC_PROTOCOL);
    cJSON *files = cJSON_AddArrayToObject(e, "files");
    for (int f = 0; f < x->nfiles; f++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", x->files[f]);
        cJSON_AddStringToObject(o, "sha256", x->file_sha[f]);
        cJSON_AddItemToArray(files, o);
    }
    if (x->versions) cJSON_AddItemToObject(e, "versions", cJSON_Duplicate(x->versions, 1));
    kp_json_add_int(e, "requests", x->requests);
    kp_json_add_int(e, "starts", x->starts);
}

/* ---- the running program ---- */

static void stderr_tail(const exec_impl *x, char *out, size_t len) {
    out[0] = '\0';
    if (x->err_fd < 0) return;
    const off_t end = lseek(x->err_fd, 0, SEEK_END);
    if (end <= 0) return;
    const off_t from = end > STDERR_TAIL ? end - STDERR_TAIL : 0;
    char buf[STDERR_TAIL + 1];
    const ssize_t got = pread(x->err_fd, buf, (size_t)(end - from), from);
    if (got <= 0) return;
    buf[got] = '\0';
    for (ssize_t i = 0; i < got; i++)
        if (buf[i] == '\n' && i + 1 < got) buf[i] = '|'; /* one line in a message */
    snprintf(out, len, "%s%s", from ? "..." : "", buf);
}

/* End the program (its stdin closed first; killed if it lingers); how it ended into how (when not NULL). */
static void stop(exec_impl *x, char *how, size_t how_len) {
    if (how) how[0] = '\0';
    if (x->to_prog >= 0) close(x->to_prog);
    x->to_prog = -1;
    if (x->pid > 0) {
        int status = 0;
        pid_t got = 0;
        for (int i = 0; i < 50 && (got = waitpid(x->pid, &status, WNOHANG)) == 0; i++) usleep(10000);
        if (got == 0) {
            kill(x->pid, SIGKILL);
            got = waitpid(x->pid, &status, 0);
        }
        if (how && got == x->pid) {
            if (WIFSIGNALED(status)) snprintf(how, how_len, "killed by signal %d", WTERMSIG(status));
            else if (WIFEXITED(status)) snprintf(how, how_len, "exit status %d", WEXITSTATUS(status));
        }
    }
    x->pid = 0;
    if (x->from_prog >= 0) close(x->from_prog);
    if (x->err_fd >= 0) close(x->err_fd);
    if (x->shm_fd >= 0) close(x->shm_fd);
    if (x->map) munmap(x->map, x->map_bytes);
    x->from_prog = x->err_fd = x->shm_fd = -1;
    x->map = NULL, x->map_bytes = 0, x->shared_generation = 0, x->shared_end = 0;
    free(x->line);
    x->line = NULL, x->line_len = 0;
}

void kp_exec_stop_all(void) {
    for (int i = 0; i < g_nexec; i++)
        if (g_exec[i].pid > 0) stop(&g_exec[i], NULL, 0);
}

/* A failure of the program: the message with its stderr tail and how it ended; the program is ended. */
static int program_failed(exec_impl *x, char *message, size_t len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int program_failed(exec_impl *x, char *message, size_t len, const char *fmt, ...) {
    char what[1024], tail[STDERR_TAIL + 8], how[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    stderr_tail(x, tail, sizeof tail);
    if (x->pid > 0) kill(x->pid, SIGKILL);
    stop(x, how, sizeof how);
    snprintf(message, len, "%s: %s%s%s; its stderr: %s", x->command, what, how[0] ? "; the program: " : "", how,
             tail[0] ? tail : "(nothing)");
    return KP_RUN_FAILED;
}

/* One line from the program within the deadline (NUL-terminated in x->line); 0, or -1 with why. */
static int read_line(exec_impl *x, double deadline, char *why, size_t why_len) {
    size_t cap = 0;
    char *buf = NULL;
    size_t n = 0;
    for (;;) {
        const double left = deadline - now_s();
        if (left <= 0) {
            free(buf);
            snprintf(why, why_len, "no reply within %g s", x->timeout_s);
            return -1;
        }
        struct pollfd pfd = {x->from_prog, POLLIN, 0};
        const int pr = poll(&pfd, 1, left > 1e6 ? 1000000000 : (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) continue;
        if (n + 65536 + 1 > cap) {
            if (cap >= LINE_MAX_BYTES) {
                free(buf);
                snprintf(why, why_len, "a reply line longer than %d bytes", LINE_MAX_BYTES);
                return -1;
            }
            cap = cap ? cap * 2 : 65536 * 2;
            char *grown = realloc(buf, cap);
            if (!grown) return free(buf), snprintf(why, why_len, "out of host memory"), -1;
            buf = grown;
        }
        /* read byte-wise up to a newline: the program writes one line per request */
        const ssize_t got = read(x->from_prog, buf + n, 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            free(buf);
            snprintf(why, why_len, "it closed its replies (ended?) before a whole line");
            return -1;
        }
        if (buf[n] == '\n') {
            buf[n] = '\0';
            free(x->line);
            x->line = buf, x->line_len = n;
            return 0;
        }
        n++;
    }
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        const ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) return -1;
        p += put, n -= (size_t)put;
    }
    return 0;
}

static int start(exec_impl *x, char *message, size_t len) {
    int in[2] = {-1, -1}, outp[2] = {-1, -1};
    x->to_prog = x->from_prog = x->err_fd = x->shm_fd = -1;
    x->err_fd = memfd_create("kparity-exec-stderr", MFD_CLOEXEC);
    x->shm_fd = memfd_create("kparity-exec-arrays", MFD_CLOEXEC);
    if (x->err_fd < 0 || x->shm_fd < 0 || pipe2(in, O_CLOEXEC) || pipe2(outp, O_CLOEXEC)) {
        snprintf(message, len, "%s: cannot make its pipes and shared memory: %s", x->command, strerror(errno));
        stop(x, NULL, 0);
        return KP_RUN_FAILED;
    }
    /* the environment before fork: the child may only dup and exec */
    int nenv = 0;
    while (environ[nenv]) nenv++;
    char **envp = calloc((size_t)nenv + 3, sizeof *envp);
    if (!envp) return snprintf(message, len, "out of host memory"), KP_RUN_FAILED;
    int k = 0;
    for (int i = 0; i < nenv; i++)
        if (strncmp(environ[i], "KPARITY_EXEC_", 13)) envp[k++] = environ[i];
    envp[k++] = "KPARITY_EXEC_PROTOCOL=" KP_EXEC_PROTOCOL;
    envp[k++] = "KPARITY_EXEC_SHM_FD=3";
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* it ends with the worker that started it */
        if (getppid() != parent) _exit(126);
        dup2(in[0], 0), dup2(outp[1], 1), dup2(x->err_fd, 2), dup2(x->shm_fd, 3);
        execvpe(x->argv[0], x->argv, envp);
        static const char msg[] = "kparity: exec failed: the program could not be started\n";
        if (write(2, msg, sizeof msg - 1) < 0) _exit(127);
        _exit(127);
    }
    free(envp);
    close(in[0]), close(outp[1]);
    x->to_prog = in[1], x->from_prog = outp[0];
    if (pid < 0) {
        close(in[1]), close(outp[0]);
        x->to_prog = x->from_prog = -1;
        snprintf(message, len, "%s: fork: %s", x->command, strerror(errno));
        stop(x, NULL, 0);
        return KP_RUN_FAILED;
    }
    x->pid = pid;
    x->starts++;
    signal(SIGPIPE, SIG_IGN); /* a program that ended shows as a failed write, not a dead worker */
    /* the handshake */
    char why[256];
    if (read_line(x, now_s() + x->timeout_s, why, sizeof why))
        return program_failed(x, message, len, "no handshake: %s", why);
    cJSON *hello = cJSON_Parse(x->line);
    const cJSON *proto = cJSON_GetObjectItemCaseSensitive(hello, "protocol");
    const cJSON *impls = cJSON_GetObjectItemCaseSensitive(hello, "impls");
    if (!x->program_impl[0] && cJSON_IsObject(impls) && cJSON_GetArraySize(impls) == 1) /* the one impl it serves */
        snprintf(x->program_impl, sizeof x->program_impl, "%s", impls->child->string);
    const cJSON *mine = cJSON_GetObjectItemCaseSensitive(impls, x->program_impl);
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(mine, "family");
    int rc = 0;
    char first[120];
    snprintf(first, sizeof first, "%.100s%s", x->line, x->line_len > 100 ? "..." : "");
    if (!cJSON_IsObject(hello)) rc = program_failed(x, message, len, "its first line is not a JSON handshake: '%s'", first);
    else if (!cJSON_IsString(proto) || strcmp(proto->valuestring, KP_EXEC_PROTOCOL))
        rc = program_failed(x, message, len, "handshake: protocol %s, not %s", cJSON_IsString(proto) ? proto->valuestring : "(none)",
                            KP_EXEC_PROTOCOL);
    else if (!x->program_impl[0])
        rc = program_failed(x, message, len, "handshake: it serves %d impls; name the one to run (the config's impls object form, "
                            "\"impl\": NAME)", cJSON_GetArraySize(impls));
    else if (!cJSON_IsObject(mine))
        rc = program_failed(x, message, len, "handshake: it does not serve the impl '%s'", x->program_impl);
    else if (!cJSON_IsString(fam) || strcmp(fam->valuestring, x->family))
        rc = program_failed(x, message, len, "handshake: it serves '%s' for family %s, not %s", x->program_impl,
                            cJSON_IsString(fam) ? fam->valuestring : "(none)", x->family);
    if (!rc) {
        cJSON_Delete(x->versions);
        x->versions = cJSON_DetachItemFromObjectCaseSensitive(hello, "versions");
    }
    cJSON_Delete(hello);
    return rc;
}

/* ---- one launch ---- */

/* The shared file at least `bytes` long, mapped. */
static int shm_reserve(exec_impl *x, size_t bytes, char *message, size_t len) {
    if (bytes <= x->map_bytes) return 0;
    size_t want = x->map_bytes ? x->map_bytes : (size_t)1 << 20;
    while (want < bytes) want *= 2;
    if (x->map) munmap(x->map, x->map_bytes);
    x->map = NULL, x->map_bytes = 0;
    if (ftruncate(x->shm_fd, (off_t)want)) {
        snprintf(message, len, "%s: cannot size its shared memory to %zu bytes: %s", x->name, want, strerror(errno));
        return -1;
    }
    void *m = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, x->shm_fd, 0);
    if (m == MAP_FAILED) {
        snprintf(message, len, "%s: cannot map %zu bytes of shared memory: %s", x->name, want, strerror(errno));
        return -1;
    }
    x->map = m, x->map_bytes = want; /* a file that grows keeps its bytes: shared inputs written before stay */
    return 0;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Tensor t as the run sees it (a batched one holds nrows slices) written as a whole .npy at offset; returns the bytes
 * written (0 with message on failure). */
static size_t put_array(exec_impl *x, const kp_tensor *t, const void *data, int64_t slices, size_t offset, char *message,
                        size_t len) {
    kp_tensor view = *t;
    view.data = (void *)data;
    int64_t shape[KP_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = slices;
    unsigned char header[KP_NPY_HEADER_MAX];
    size_t hb, db;
    kp_error e = {0};
    if (kp_npy_header(kp_dtype_npy(t->dtype), t->ndim, shape, header, &hb, &db, &e)) {
        snprintf(message, len, "%s: input '%s': %s", x->name, t->name, e.msg);
        return 0;
    }
    if (shm_reserve(x, offset + hb + db, message, len)) return 0;
    memcpy(x->map + offset, header, hb);
    kp_tensor_copy_dense(&view, 0, slices, x->map + offset + hb);
    return hb + db;
}

/* The case for the program: its canonical name and every field, defaults filled (as strings, in canonical form). */
static cJSON *case_json(const kp_case *c) {
    cJSON *o = cJSON_CreateObject();
    char name[KP_CASE_NAME_MAX];
    if (kp_case_format(c, name, sizeof name) > 0) cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "family", c->family);
    kp_case all = *c;
    kp_error ignored = {0};
    if (kp_case_fill_defaults(&all, &ignored)) all = *c; /* a prepared case was read once already: not expected */
    cJSON *f = cJSON_AddObjectToObject(o, "fields");
    for (int i = 0; i < all.nparams; i++) cJSON_AddStringToObject(f, all.params[i].key, all.params[i].value);
    return o;
}

static int serve(const void *args, char *message, size_t len, int slot) {
    (void)args;
    exec_impl *x = &g_exec[slot];
    const kp_launch_view *v = kp_launch_current();
    if (!v) return snprintf(message, len, "%s: called outside a run", x->name), KP_RUN_FAILED;
    if (x->pid <= 0) {
        const int rc = start(x, message, len);
        if (rc) return rc;
    }
    /* the layout: shared inputs first (written once per case), then the run's batched inputs and its outputs */
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "op", "run");
    kp_json_add_int(req, "id", ++x->requests);
    cJSON_AddStringToObject(req, "impl", x->program_impl);
    cJSON_AddItemToObject(req, "case", case_json(v->c));
    cJSON *rows = cJSON_AddArrayToObject(req, "rows");
    for (int64_t i = 0; i < v->nrows; i++) cJSON_AddItemToArray(rows, cJSON_CreateNumber((double)v->rows[i]));
    kp_json_add_int(req, "nrows", v->nrows);
    cJSON_AddBoolToObject(req, "time", kp_launch_timing_wanted());
    cJSON *ins = cJSON_AddArrayToObject(req, "inputs"), *outs = cJSON_AddArrayToObject(req, "outputs");
    const int reuse = x->shared_generation == v->generation && x->map;
    size_t at = 0;
    int rc = 0;
    for (int pass = 0; pass < 2 && !rc; pass++) /* pass 0: shared inputs, pass 1: batched */
        for (int k = 0; k < v->nin && !rc; k++) {
            const kp_tensor *t = &v->ins[k];
            if (!!t->batched != pass) continue;
            size_t bytes = 0;
            if (!t->batched && reuse) { /* the same case's shared input is already there: only its size is needed */
                unsigned char header[KP_NPY_HEADER_MAX];
                size_t hb, db;
                kp_error e = {0};
                if (!kp_npy_header(kp_dtype_npy(t->dtype), t->ndim, t->shape, header, &hb, &db, &e)) bytes = hb + db;
            } else {
                bytes = put_array(x, t, v->in[k], t->batched ? v->nrows : t->shape[0], at, message, len);
            }
            if (!bytes) {
                rc = KP_RUN_FAILED;
                break;
            }
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", t->name);
            kp_json_add_int(e, "offset", (int64_t)at);
            kp_json_add_int(e, "bytes", (int64_t)bytes);
            /* the program may keep what it made of an unchanged shared input (weights, a cache) */
            if (!t->batched && reuse) cJSON_AddBoolToObject(e, "reused", 1);
            cJSON_AddItemToArray(ins, e);
            at = align64(at + bytes);
        }
    if (!rc) x->shared_generation = v->generation;
    size_t out_at[KP_MAX_TENSORS], out_cap[KP_MAX_TENSORS];
    for (int k = 0; k < v->nout && !rc; k++) {
        const kp_tensor *t = &v->outs[k];
        if (kp_impl_output_absent(&x->impl, t->name)) continue; /* declared: not asked for */
        unsigned char header[KP_NPY_HEADER_MAX];
        size_t hb, db;
        kp_error e = {0};
        if (kp_npy_header(kp_dtype_npy(t->dtype), t->ndim, t->shape, header, &hb, &db, &e)) {
            snprintf(message, len, "%s: output '%s': %s", x->name, t->name, e.msg);
            rc = KP_RUN_FAILED;
            break;
        }
        out_at[k] = at, out_cap[k] = KP_NPY_HEADER_MAX + db;
        if (shm_reserve(x, at + out_cap[k], message, len)) {
            rc = KP_RUN_FAILED;
            break;
        }
        memset(x->map + at, 0, 16); /* no .npy magic: an output the program leaves unwritten shows */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t->name);
        kp_json_add_int(o, "offset", (int64_t)at);
        kp_json_add_int(o, "capacity", (int64_t)out_cap[k]);
        cJSON_AddStringToObject(o, "dtype", kp_dtype_npy(t->dtype));
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToArray(outs, o);
        at = align64(at + out_cap[k]);
    }
    cJSON *absent = cJSON_AddArrayToObject(req, "absent"); /* declared: the program is not asked for them */
    for (int k = 0; k < v->nout; k++)
        if (kp_impl_output_absent(&x->impl, v->outs[k].name)) cJSON_AddItemToArray(absent, cJSON_CreateString(v->outs[k].name));
    kp_json_add_int(req, "shm_bytes", (int64_t)x->map_bytes);
    char *text = rc ? NULL : cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    if (rc) return rc;
    const size_t tl = strlen(text);
    text[tl] = '\n'; /* the NUL becomes the line's end; written with its length */
    const int wrote = write_all(x->to_prog, text, tl + 1);
    free(text);
    if (wrote) return program_failed(x, message, len, "it stopped reading requests");
    char why[256];
    if (read_line(x, now_s() + x->timeout_s, why, sizeof why)) return program_failed(x, message, len, "%s", why);
    cJSON *reply = cJSON_Parse(x->line);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(reply, "id"), *status = cJSON_GetObjectItemCaseSensitive(reply, "status");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(reply, "message");
    char first[120];
    snprintf(first, sizeof first, "%.100s%s", x->line, x->line_len > 100 ? "..." : "");
    if (!cJSON_IsObject(reply) || !cJSON_IsString(status)) {
        cJSON_Delete(reply);
        return program_failed(x, message, len, "a reply that is not the protocol: '%s'", first);
    }
    if (!cJSON_IsNumber(id) || id->valuedouble != (double)x->requests) {
        cJSON_Delete(reply);
        return program_failed(x, message, len, "a reply to request %g, not %ld", cJSON_IsNumber(id) ? id->valuedouble : -1.0, x->requests);
    }
    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(reply, "device_us");
    if (cJSON_IsNumber(dev) && dev->valuedouble >= 0) kp_launch_report_time(dev->valuedouble);
    if (!strcmp(status->valuestring, "not_supported")) {
        snprintf(message, len, "%s: %s", x->program_impl, cJSON_IsString(msg) ? msg->valuestring : "(no message)");
        cJSON_Delete(reply);
        return KP_RUN_NOT_SUPPORTED;
    }
    if (strcmp(status->valuestring, "ok")) {
        char tail[STDERR_TAIL + 8];
        stderr_tail(x, tail, sizeof tail);
        const int lost = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply, "context_lost"));
        snprintf(message, len, "%s: %s %s: %s; its stderr: %s%s", x->command, x->program_impl, status->valuestring,
                 cJSON_IsString(msg) ? msg->valuestring : "(no message)", tail[0] ? tail : "(nothing)",
                 lost ? "; its CUDA context is lost: the next launch starts the program afresh" : "");
        cJSON_Delete(reply);
        if (lost) stop(x, NULL, 0); /* a sticky error in its own process: a fresh one serves the next launch */
        return KP_RUN_FAILED;       /* otherwise the program answered: it stays up for the next launch */
    }
    /* every output read back through its own header */
    const cJSON *written = cJSON_GetObjectItemCaseSensitive(reply, "outputs");
    for (int k = 0; k < v->nout && !rc; k++) {
        const kp_tensor *t = &v->outs[k];
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(written, t->name);
        const size_t es = kp_dtype_size(t->dtype);
        const int64_t cols = kp_tensor_cols(t), stride = kp_tensor_stride(t), sub = kp_tensor_rows(t);
        unsigned char *dst = v->out[k];
        if (kp_impl_output_absent(&x->impl, t->name)) { /* declared absent: a stand-in no check reads, -1 bytes */
            for (int64_t r = 0; r < sub; r++) memset(dst + (size_t)(r * stride) * es, 0xff, (size_t)cols * es);
            continue;
        }
        if (!cJSON_IsNumber(w) || w->valuedouble < 10 || w->valuedouble > (double)out_cap[k]) {
            snprintf(message, len, "%s: output '%s' was not written (the reply gives %s bytes of it; at most %zu fit)%s", x->name,
                     t->name, cJSON_IsNumber(w) ? "a count out of range of" : "no", out_cap[k],
                     w ? "" : "; an output the program does not produce is declared in the config: \"absent\": [NAME]");
            rc = KP_RUN_FAILED;
            break;
        }
        kp_npy_info info;
        kp_error e = {0};
        char label[160];
        snprintf(label, sizeof label, "%s output '%s'", x->program_impl, t->name);
        if (kp_judge_check_output(label, x->map + out_at[k], (size_t)w->valuedouble, t, v->nrows, &info, &e)) {
            snprintf(message, len, "%s", e.msg);
            rc = KP_RUN_FAILED;
            break;
        }
        const unsigned char *src = x->map + out_at[k] + info.data_offset;
        for (int64_t r = 0; r < sub; r++) memcpy(dst + (size_t)(r * stride) * es, src + (size_t)(r * cols) * es, (size_t)cols * es);
    }
    cJSON_Delete(reply);
    return rc;
}
