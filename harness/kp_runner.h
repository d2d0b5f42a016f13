/* kp_runner.h: runs a loaded gate config case by case, writes one receipt per case into a bundle,
 * prints progress and the summary table, and returns the gate's exit code. */
#ifndef KP_RUNNER_H
#define KP_RUNNER_H

#include "kp_harness.h"

typedef struct kp_run_options {
    const char *out_dir;   /* bundle folder (must not exist or be empty) */
    const char *filter;    /* substring of case names; NULL for all */
    double timeout_s;      /* 0: the config's, else none */
    int quiet;             /* no progress lines */
    int json;              /* progress and summary as JSON lines on stdout */
    const char *command;   /* "gate" or "run", recorded in bundle.json */
    int shard_index;       /* 1..shard_count: run the cases whose config index i has i % shard_count ==
                              shard_index - 1 (0: every case); `kparity merge` joins the parts */
    int shard_count;
    int isolate;           /* the CLI's gate and run: the cases run in a worker process (kp_run_supervise)
                              and a crash or a hang there is recorded as its case FAILED */
    int await_worker_end;  /* the supervisor returns once the worker's process has ended (its device memory given
                              back), not as soon as its result is in: a gate that starts a command after it */
} kp_run_options;

/* The CLI's gate and run (opt->isolate): whether this process is to supervise a worker process that runs the cases
 * (not when it is that worker, nor with KPARITY_IN_PROCESS=1, for a debugger). */
int kp_run_supervises(const kp_run_options *opt);
/* Supervise: start the worker (this command line, re-executed), and return the run's exit code and error as
 * kp_run_config would. Nothing of the config at `config_path` is loaded here (only its timeout_s is read): a worker
 * that dies in a case (a signal, an exit, killed past the timeout) leaves that case FAILED, saying how and in which
 * check, from the skeleton the worker published as the case began, and a fresh worker runs the rest. A worker that
 * stops before the run (a config error it has reported) gives its exit status with err empty; one that dies or hangs
 * before it made the bundle (a plugin's constructor) is exit 3 or 4 with err saying so. */
int kp_run_supervise(const char *config_path, const kp_run_options *opt, kp_error *err);

/* Returns the exit class: 0 passed, 1 incorrect, 2 usage, 3 environment/kernel failure, 4 timeout,
 * 77 nothing could run. `err` holds the message for 2 and 3 when the run itself could not proceed. */
int kp_run_config(const kp_config *cfg, const kp_run_options *opt, kp_error *err);

/* `kparity merge B1 B2 ... --out B` (harness/merge.c): argv after the command; the merged verdict's exit code, or 2
 * naming the part and the reason (a part that does not verify, another config or kparity version, a shard missing or
 * given twice), 3 when the bundle cannot be written. */
int kp_cmd_merge(int argc, char **argv);

/* `kparity judge CASE --impl NAME=FILE[,FILE...] ... --config FILE --out B` (harness/judge.c): outputs made outside
 * kparity judged by the config's checks for CASE; the gate's exit code, or 2 naming a file and what is wrong with it. */
int kp_cmd_judge(int argc, char **argv);

#endif
