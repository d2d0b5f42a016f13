/* case_families.c: the case-family table, the one place the cases stage lists its families, and the
 * dispatch from a case name's family to that family's rules. Adding a family: one row below. */
#include <stdio.h>
#include <string.h>

#include "kp_case.h"
#include "topp_case.h"

static const kp_case_family *const builtin[] = {
    &kp_topp_case_family,
};
#define BUILTIN_COUNT ((int)(sizeof builtin / sizeof builtin[0]))

#define REGISTERED_MAX 8
static const kp_case_family *registered[REGISTERED_MAX];
static int registered_count;

int kp_case_family_count(void) { return BUILTIN_COUNT + registered_count; }

const kp_case_family *kp_case_family_at(int i) {
    if (i < 0 || i >= kp_case_family_count()) return NULL;
    return i < BUILTIN_COUNT ? builtin[i] : registered[i - BUILTIN_COUNT];
}

const kp_case_family *kp_case_family_find(const char *name) {
    for (int i = 0; name && i < kp_case_family_count(); i++)
        if (!strcmp(kp_case_family_at(i)->name, name)) return kp_case_family_at(i);
    return NULL;
}

void kp_case_family_names(char *buf, size_t len) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < kp_case_family_count() && at < len; i++) {
        int n = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", kp_case_family_at(i)->name);
        if (n < 0) break;
        at += (size_t)n;
    }
}

int kp_case_family_register(const kp_case_family *f, kp_error *err) {
    if (kp_case_family_find(f->name)) return kp_fail(err, KP_EXIT_USAGE, "case family '%s' is already known", f->name);
    if (registered_count == REGISTERED_MAX)
        return kp_fail(err, KP_EXIT_USAGE, "case family '%s': at most %d families can be added", f->name, REGISTERED_MAX);
    registered[registered_count++] = f;
    return 0;
}

int kp_case_normalize(kp_case *c, kp_error *err) {
    const kp_case_family *f = kp_case_family_find(c->family);
    if (f) return f->normalize(c, err);
    char known[256];
    kp_case_family_names(known, sizeof known);
    return kp_fail(err, KP_EXIT_USAGE, "case family '%s' is unknown (known: %s)", c->family, known);
}
