/* kp_run_shared.h: what runner.c (the cases, in a worker) and supervise.c (the process that keeps the record)
 * share: the block of memory both processes map, and the pieces of a receipt both write. Internal to the harness. */
#ifndef KP_RUN_SHARED_H
#define KP_RUN_SHARED_H

#include <cjson/cJSON.h>

#include "kp_harness.h"
#include "kp_runner.h"

/* What the supervisor and its workers share (kp_worker_share): where the run is, and the verdict so far,
 * so a fresh worker carries on where a dead one stopped and the supervisor can say where it died. */
#define RUN_SHARED_MAGIC 0x6b707275u /* "kpru" */
typedef struct run_shared {
    unsigned magic;
    double t_start;            /* the run's start (kp_now: one monotonic clock for every process of it) */
    int opened;                /* a worker made the bundle folder: later ones resume it */
    int resume_at;             /* the config index the next worker starts at */
    int case_index;            /* the case in progress, -1 between cases */
    int check_index;           /* its check in progress, -1 while preparing or releasing it */
    int worst, any_ran, device_lost, timed_out;
    double stages[KP_STAGE_COUNT];
    int workers;               /* worker processes started so far */
    int finishing;             /* a worker is writing the bundle's last files */
    volatile double timeout;   /* the gate's, published by a worker once it has read the config (0: none) */
    char out_dir[4096];        /* the bundle folder the supervisor was given */
    int returned;              /* the worker's run returned `code` with `err`; it is exiting */
    int handed_off;            /* the worker ended itself after its device was lost to a sticky CUDA error in case
                                  resume_at - 1 (recorded): the next worker carries on with a fresh CUDA context */
    int code;
    kp_error err;
    int position;              /* receipts in the bundle before the case in progress */
    int selected;              /* the cases this run writes receipts for */
    char skeleton[1 << 20];    /* the case in progress's receipt skeleton (skeleton_json), as JSON text: the
                                  supervisor writes that case's receipt from it without loading the config */
} run_shared;

/* A receipt for a case that did not get to run its checks, or whose process died in check `at`, from its skeleton
 * (the case, the run, each check's head, the environment; runner.c's skeleton_json): that check gets `result` and
 * `reason`, those before it `result` and `earlier` (they ran, but what they found is gone), those after it NOT_RUN
 * and `later`. at < 0: every check gets `result` and `reason`. */
cJSON *kp_run_stub_receipt(const cJSON *skel, kp_result result, const char *reason, int at, const char *earlier,
                           const char *later);

/* One case's progress line (stderr, or a JSON event on stdout with --json; nothing with --quiet). */
void kp_run_progress(const kp_run_options *opt, int i, int n, const char *name, kp_result r, double case_s,
                     double elapsed);

#endif
