/* kp_worker.h: the process that runs a gate's cases, apart from the one that keeps the record. The CLI's
 * process re-executes itself (the same command line) as the worker and shares one block of memory with it;
 * when the worker dies (a plugin's SIGSEGV, an abort, a hang past the timeout) the first process is still
 * there to say so in the bundle and start a fresh worker for the cases left (harness/runner.c). */
#ifndef KP_WORKER_H
#define KP_WORKER_H

#include <stddef.h>
#include <sys/types.h>

#include "../cases/kp_common.h"

/* Whether this process was started as a worker (before kp_worker_attach, which forgets it). */
int kp_worker_is_one(void);

/* In a worker: map the block the supervisor shared (its size must be `bytes`), forget the environment variable
 * that named it (nothing the worker starts inherits it) and arrange that a fault injected with kill@N
 * (KPARITY_FAULT) kills the supervisor too. 1 in a worker, 0 in any other process, -1 (err filled) when
 * the variable is there but names no such block. */
int kp_worker_attach(void **shared, size_t bytes, kp_error *err);

/* In the supervisor: a zeroed block of `bytes` both processes see (a memfd, mapped shared). */
int kp_worker_share(void **shared, int *fd, size_t bytes, kp_error *err);
void kp_worker_unshare(void *shared, int fd, size_t bytes);

/* Start a worker: this executable (/proc/self/exe) with this process's command line, the block's
 * descriptor named in its environment; it is killed if the supervisor dies (PR_SET_PDEATHSIG). */
int kp_worker_start(int fd, pid_t *pid, kp_error *err);

/* In a worker, once its result is in the shared block: wake the supervisor (SIGCHLD, whose default action is to
 * ignore it), which may stop waiting before this process has ended (kp_worker_wait's `said_done`). */
void kp_worker_say_done(void);

/* How a worker ended, or that it has not. */
typedef struct kp_worker_end {
    int running;         /* still running at the deadline */
    int said_done;       /* its result is in (kp_worker_say_done): it is ending, not yet reaped (kp_worker_reap) */
    int exited, status;  /* it exited, with this status */
    int signal;          /* or was killed by this signal */
    int deadline;        /* killed by kp_worker_kill */
} kp_worker_end;

/* Wait for the worker to end, or until `until` (kp_now() seconds) has passed (then end->running), or, where `done` is
 * not NULL, until *done (a flag in the shared block the worker sets before kp_worker_say_done) is set (then
 * end->said_done: the worker's teardown, which for a CUDA process is its context's release, about 0.1 s, goes on). */
void kp_worker_wait(pid_t pid, const int *done, double until, kp_worker_end *end);
/* Wait, however long, for a worker that said it was done to end, and reap it. */
void kp_worker_reap(pid_t pid);
/* SIGKILL it and reap it: this ends a worker stopped by SIGSTOP, or one whose own watchdog cannot run. */
void kp_worker_kill(pid_t pid, kp_worker_end *end);

/* "killed by signal 11 (SIGSEGV, Segmentation fault)", "exited with status 0", "outlived ... and was killed". */
void kp_worker_describe(const kp_worker_end *end, char *text, size_t len);

#endif
