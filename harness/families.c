/* families.c: the family table, the one place the harness lists its families. Adding a family: one
 * row below (and its case family's row in cases/case_families.c); kp_harness.h says what else. */
#include <string.h>

#include "kp_harness.h"

extern const kp_family kp_topp_family; /* harness/topp_family.c */

static const kp_family *const builtin[] = {
    &kp_topp_family,
};
#define BUILTIN_COUNT ((int)(sizeof builtin / sizeof builtin[0]))

#define REGISTERED_MAX 8
static const kp_family *registered[REGISTERED_MAX];
static int registered_count;

int kp_family_count(void) { return BUILTIN_COUNT + registered_count; }

const kp_family *kp_family_at(int i) {
    if (i < 0 || i >= kp_family_count()) return NULL;
    return i < BUILTIN_COUNT ? builtin[i] : registered[i - BUILTIN_COUNT];
}

const kp_family *kp_family_find(const char *name) {
    for (int i = 0; name && i < kp_family_count(); i++)
        if (!strcmp(kp_family_at(i)->name, name)) return kp_family_at(i);
    return NULL;
}

int kp_family_register(const kp_family *fam, kp_error *err) {
    if (!fam->name || !fam->cases || strcmp(fam->name, fam->cases->name))
        return kp_fail(err, KP_EXIT_USAGE, "family %s: its case family must carry the same name", fam->name ? fam->name : "(null)");
    if (!fam->prepare || !fam->release || !fam->estimate_bytes || !fam->estimate_device_bytes || !fam->outputs ||
        !fam->fill_args || !fam->reference || !fam->reference_provider)
        return kp_fail(err, KP_EXIT_USAGE, "family %s: a required hook is missing (kp_harness.h lists them)", fam->name);
    if (fam->args_bytes == 0 || fam->args_bytes > KP_ARGS_MAX || fam->params_bytes > KP_PARAMS_MAX)
        return kp_fail(err, KP_EXIT_USAGE, "family %s: args_bytes must be in [1, %d] and params_bytes at most %d",
                       fam->name, KP_ARGS_MAX, KP_PARAMS_MAX);
    if (kp_family_find(fam->name)) return kp_fail(err, KP_EXIT_USAGE, "family '%s' is already known", fam->name);
    if (registered_count == REGISTERED_MAX)
        return kp_fail(err, KP_EXIT_USAGE, "family '%s': at most %d families can be added", fam->name, REGISTERED_MAX);
    if (!kp_case_family_find(fam->name)) {
        int rc = kp_case_family_register(fam->cases, err);
        if (rc) return rc;
    }
    registered[registered_count++] = fam;
    return 0;
}
