/* kp_replay.h: `kparity verify --replay`: regenerate every receipt's inputs and reference on the
 * CPU and compare their digests with the ones recorded. */
#ifndef KP_REPLAY_H
#define KP_REPLAY_H

#include "../cases/kp_common.h"

/* 0 when every digest matches; KP_EXIT_INCORRECT naming the receipt and the digest otherwise. */
int kp_replay_bundle(const char *dir, kp_error *err);

#endif
