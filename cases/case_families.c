/* case_families.c: the case-family table, the one place the cases stage lists its families, and the
 * families' typed structs' bound. Adding a family: one row below. */
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
