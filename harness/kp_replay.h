/* kp_replay.h: `kparity verify --replay`: regenerate every receipt's inputs and reference on the
 * CPU and compare their digests with the ones recorded. */
#ifndef KP_REPLAY_H
#define KP_REPLAY_H

#include "../cases/kp_common.h"

/* What a replay covered: every receipt is either replayed or listed as not replayed, never passed over. */
typedef struct kp_replay_report {
    int replayed;         /* receipts whose recorded inputs regenerated to the same digests */
    int with_reference;   /* of those, the ones that recorded a reference digest (it regenerated too) */
    int not_replayed;     /* receipts with no inputs that say no check ran (see kp_replay_bundle) */
    char *not_replayed_list; /* one line each, "<file> (<case>): <result>\n"; malloc'd, NULL when none */
} kp_replay_report;

/* 0 when every digest matches; KP_EXIT_INCORRECT naming the receipt (its file and case), the tensor and both
 * digests otherwise. A receipt without inputs is replayed from nothing, so it is allowed only where the runner
 * writes one: a case that FAILED before its inputs were made (preparing failed, a process that died in it, the
 * watchdog) or that was NOT_RUN (the gate's timeout, a lost device). One whose result or any check's result says
 * a check ran (PASSED, INCORRECT, NOT_SUPPORTED) is KP_EXIT_INCORRECT naming it. `report` (may be NULL) says what
 * was replayed and lists what was not; free it with kp_replay_report_free, also after a failure. */
int kp_replay_bundle(const char *dir, kp_replay_report *report, kp_error *err);
void kp_replay_report_free(kp_replay_report *report);

#endif
