/* case_families.c: the case-family table, the one place the cases stage lists its families, and the
 * dispatch from a case name's family to that family's field table. Adding a family: one row below. */
#include <stddef.h>

#include "kp_case.h"
#include "mla_case.h"
#include "moe_case.h"
#include "topk_case.h"
#include "topp_case.h"

static const void *const builtin[] = {
    &kp_topp_case_family,
    &kp_topk_case_family,
    &kp_moe_case_family,
    &kp_mla_case_family, /* cases only so far: its reference, impls and harness family come with issue 18 */
};
_Static_assert(sizeof(kp_topp_case) <= KP_CASE_FIELDS_MAX && sizeof(kp_topk_case) <= KP_CASE_FIELDS_MAX &&
                   sizeof(kp_moe_case) <= KP_CASE_FIELDS_MAX && sizeof(kp_mla_case) <= KP_CASE_FIELDS_MAX,
               "a family's typed struct fits in kp_case.fields");
_Static_assert(offsetof(kp_case_family, name) == 0, "a table row begins with its name (kp_table)");
kp_table kp_case_families = {builtin, (int)(sizeof builtin / sizeof builtin[0]), {0}, 0};

static int rewrite(kp_case *c, bool drop_defaults, kp_error *err) {
    const kp_case_family *f = kp_case_family_find(c->family);
    if (f) return kp_case_rewrite(c, f, drop_defaults, err);
    char known[256];
    kp_case_family_names(known, sizeof known);
    return kp_fail(err, KP_EXIT_USAGE, "case family '%s' is unknown (known: %s)", c->family, known);
}

int kp_case_normalize(kp_case *c, kp_error *err) { return rewrite(c, true, err); }
int kp_case_fill_defaults(kp_case *c, kp_error *err) { return rewrite(c, false, err); }
