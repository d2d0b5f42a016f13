/* kp_config.h: what config.c and config_checks.c share while a gate config loads: impl names and the
 * checks of a case. Internal to the harness; kp_config_load (kp_harness.h) is the entry point. */
#ifndef KP_CONFIG_H
#define KP_CONFIG_H

#include "kp_harness.h"

/* An impl named in the config: a registered name, or "<family>.<algorithm>@auto" (@cuda when a GPU and
 * the CUDA impl exist, else @host). */
int kp_resolve_impl(const char *declared, const char *where, const kp_impl **out, kp_error *err);
/* A case's checks (an array, or the name of a check set) into cs->checks, against cs->fam. */
int kp_parse_checks(const kp_config *cfg, const cJSON *checks, const char *where, kp_case_spec *cs, kp_error *err);

#endif
