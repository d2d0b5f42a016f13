/* worker.c: starting, watching and ending the gate's worker process (kp_worker.h): a re-executed copy of
 * this program that shares one memfd block with the process that started it. Linux only (/proc, memfd). */
#define _GNU_SOURCE
#include "kp_worker.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_fileio.h"

#define WORKER_ENV "KPARITY_WORKER"

extern char **environ;

static pid_t g_supervisor; /* in a worker: the process that started it */

int kp_worker_is_one(void) { return getenv(WORKER_ENV) != NULL; }

int kp_worker_attach(void **shared, size_t bytes, kp_error *err) {
    *shared = NULL;
    const char *v = getenv(WORKER_ENV);
    if (!v) return 0;
    char *end;
    long fd = strtol(v, &end, 10);
    struct stat st;
    if (end == v || *end || fd < 0 || fd > 1 << 20 || fstat((int)fd, &st) != 0 || (size_t)st.st_size != bytes) {
        kp_fail(err, KP_EXIT_USAGE, "%s=%s names no block this kparity shares with its worker (it is set by kparity "
                "itself; unset it)", WORKER_ENV, v);
        return -1;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
    if (p == MAP_FAILED) {
        kp_fail(err, KP_EXIT_ENV, "%s: cannot map the block shared with the supervisor: %s", WORKER_ENV, strerror(errno));
        return -1;
    }
    fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* nothing the worker starts gets it */
    unsetenv(WORKER_ENV);
    g_supervisor = getppid();
    kp_fault_also_kill(g_supervisor);
    *shared = p;
    return 1;
}

int kp_worker_share(void **shared, int *fd, size_t bytes, kp_error *err) {
    *shared = NULL;
    *fd = memfd_create("kparity-run", 0); /* inherited across exec on purpose: the worker maps it */
    if (*fd < 0) return kp_fail(err, KP_EXIT_ENV, "cannot make the block shared with the worker (memfd_create): %s", strerror(errno));
    void *p = MAP_FAILED;
    if (ftruncate(*fd, (off_t)bytes) == 0) p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(*fd);
        *fd = -1;
        return kp_fail(err, KP_EXIT_ENV, "cannot map the block shared with the worker: %s", strerror(e));
    }
    memset(p, 0, bytes);
    *shared = p;
    return 0;
}

void kp_worker_unshare(void *shared, int fd, size_t bytes) {
    if (shared) munmap(shared, bytes);
    if (fd >= 0) close(fd);
}

/* This process's command line, as argv (NUL-separated in /proc/self/cmdline). */
static char **own_argv(char **text) {
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap + 1);
    ssize_t n;
    while (buf && (n = read(fd, buf + len, cap - len)) > 0) {
        len += (size_t)n;
        if (len == cap) {
            char *grown = realloc(buf, 2 * cap + 1);
            if (!grown) free(buf);
            buf = grown;
            cap *= 2;
        }
    }
    close(fd);
    if (!buf || len == 0) {
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    size_t argc = 0;
    for (size_t i = 0; i < len; i++) argc += buf[i] == '\0';
    char **argv = calloc(argc + 1, sizeof *argv);
    if (!argv) {
        free(buf);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < len && k < argc; i += strlen(buf + i) + 1) argv[k++] = buf + i;
    *text = buf;
    return argv;
}

int kp_worker_start(int fd, pid_t *pid, kp_error *err) {
    char *text = NULL, **argv = own_argv(&text);
    if (!argv) return kp_fail(err, KP_EXIT_ENV, "cannot read this process's command line (/proc/self/cmdline) to start its worker");
    /* Everything the child needs is made before fork: after it, only async-signal-safe calls. */
    size_t nenv = 0;
    while (environ[nenv]) nenv++;
    char **envp = calloc(nenv + 2, sizeof *envp), named[64];
    snprintf(named, sizeof named, "%s=%d", WORKER_ENV, fd);
    size_t k = 0;
    for (size_t i = 0; envp && i < nenv; i++)
        if (strncmp(environ[i], WORKER_ENV "=", sizeof WORKER_ENV) != 0) envp[k++] = environ[i];
    if (envp) envp[k] = named;
    const pid_t parent = getpid();
    fflush(NULL);
    pid_t child = envp ? fork() : -1;
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* the supervisor gone (killed, its alarm), the worker goes too */
        if (getppid() != parent) _exit(127);
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    int e = errno;
    free(envp);
    free(argv);
    free(text);
    if (child < 0) return kp_fail(err, KP_EXIT_ENV, "cannot start the worker process: %s", strerror(e));
    *pid = child;
    return 0;
}

void kp_worker_say_done(void) {
    if (g_supervisor > 1 && getppid() == g_supervisor) kill(g_supervisor, SIGCHLD);
}

void kp_worker_reap(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
}

void kp_worker_wait(pid_t pid, const int *done, double until, kp_worker_end *end) {
    memset(end, 0, sizeof *end);
    /* SIGCHLD blocked and waited for: the worker's end is seen at once, with no polling interval */
    sigset_t chld, old;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    pthread_sigmask(SIG_BLOCK, &chld, &old);
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r == 0 && done && __atomic_load_n(done, __ATOMIC_SEQ_CST)) {
            end->said_done = 1;
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            return;
        }
        if (r < 0 && errno != EINTR) { /* not our child any more: nothing to wait for */
            end->exited = 1, end->status = 127;
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            return;
        }
        const double left = until - kp_now();
        if (left <= 0) {
            end->running = 1;
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            return;
        }
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        sigtimedwait(&chld, NULL, &ts);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (WIFEXITED(status)) end->exited = 1, end->status = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) end->signal = WTERMSIG(status);
}

void kp_worker_kill(pid_t pid, kp_worker_end *end) {
    kill(pid, SIGKILL); /* ends a stopped process too */
    kp_worker_reap(pid);
    memset(end, 0, sizeof *end);
    end->deadline = 1;
}

void kp_worker_describe(const kp_worker_end *end, char *text, size_t len) {
    if (end->deadline) snprintf(text, len, "was still running past the gate's timeout and was killed (SIGKILL)");
    else if (end->signal) {
        const char *abbrev = sigabbrev_np(end->signal), *descr = sigdescr_np(end->signal);
        snprintf(text, len, "was killed by signal %d (SIG%s, %s)", end->signal, abbrev ? abbrev : "?", descr ? descr : "?");
    } else snprintf(text, len, "exited with status %d before it had finished", end->status);
}
