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
} kp_run_options;

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
