/* stages.c: where the run's wall time goes, per stage (kp_harness.h, kp_stage). Every stage's code
 * adds its own seconds; the runner reports the sums in bundle.json and on stderr. */
#include "kp_harness.h"

static double g_stage[KP_STAGE_COUNT];
static const char *const stage_names[KP_STAGE_COUNT] = {"generation", "reference", "kernels", "judging", "receipts",
                                                        "digests", "cache", "uploads"};

void kp_stage_add(kp_stage stage, double seconds) { g_stage[stage] += seconds; }
void kp_stages_reset(void) {
    for (int s = 0; s < KP_STAGE_COUNT; s++) g_stage[s] = 0;
}
double kp_stage_seconds(kp_stage stage) { return g_stage[stage]; }
double kp_stage_total(void) {
    double sum = 0;
    for (int s = 0; s < KP_STAGE_COUNT; s++) sum += g_stage[s];
    return sum;
}
const char *kp_stage_name(kp_stage stage) { return stage_names[stage]; }
