/* kp_case.h: canonical case names, `family(key=value,...)` with keys sorted. One name is the
 * case's id, its CLI filter and its receipt key; parse and format round-trip exactly. */
#ifndef KP_CASE_H
#define KP_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "kp_common.h"

#define KP_CASE_MAX_PARAMS 16
#define KP_CASE_NAME_MAX 512

typedef struct kp_param {
    char key[32];
    char value[64];
} kp_param;

typedef struct kp_case {
    char family[16];
    int nparams;
    kp_param params[KP_CASE_MAX_PARAMS]; /* sorted by key, unique */
} kp_case;

/* Syntax only: family and key=value pairs (keys [a-z0-9_], values without ',' '(' ')' '=' or spaces).
 * Keys are sorted; a repeated key is an error. The family's own rules come from kp_case_normalize. */
int kp_case_parse(const char *name, kp_case *out, kp_error *err);
/* The canonical name; returns its length, or -1 when it does not fit. */
int kp_case_format(const kp_case *c, char *buf, size_t len);
const char *kp_case_get(const kp_case *c, const char *key); /* NULL when absent */
int kp_case_set(kp_case *c, const char *key, const char *value, kp_error *err);
void kp_case_unset(kp_case *c, const char *key);

/* Typed reads that name the case and the field in their errors (exit class 2). */
int kp_case_int(const kp_case *c, const char *key, int64_t min, int64_t max, int64_t *out, kp_error *err);
int kp_case_uint(const kp_case *c, const char *key, uint64_t *out, kp_error *err);
int kp_case_num(const kp_case *c, const char *key, double *out, kp_error *err);

/* The shortest text that reads back as exactly v, exponent without '+' or leading zeros:
 * 1e9 -> "1e9", 0.95 -> "0.95", 1e-8 -> "1e-8", 1666666666.6666667 -> "1666666666.6666667". */
void kp_format_number(double v, char *buf, size_t len);

/* One row of the case-family table (cases/case_families.c): what the cases stage knows of a family.
 * A family's own file (cases/<family>_case.c) defines its row. */
typedef struct kp_case_family {
    const char *name;              /* the family in case names */
    const char *generator_version; /* recorded in every receipt; bumped whenever an input's bytes change */
    const char *fields_help;       /* one line for `kparity list`: the fields and profiles */
    /* Check a case against the family's rules, apply defaults and rewrite every value canonically. */
    int (*normalize)(kp_case *c, kp_error *err);
    /* (optional) Every field of a normalized case set, the defaults its name omits filled in canonical form: what an
     * outside program is told of the case (harness/exec.c). */
    int (*fill_defaults)(kp_case *c, kp_error *err);
} kp_case_family;

/* The case-family table (cases/case_families.c): the family of a name (or NULL), every family's name for
 * error messages, and a family added after the built-in rows (a test's own; KP_EXIT_USAGE for a name
 * already known). */
extern kp_table kp_case_families;
static inline const kp_case_family *kp_case_family_find(const char *name) { return kp_table_find(&kp_case_families, name); }
static inline void kp_case_family_names(char *buf, size_t len) { kp_table_names(&kp_case_families, buf, len); }
static inline int kp_case_family_register(const kp_case_family *f, kp_error *err) {
    return kp_table_add(&kp_case_families, f, "case family", err);
}

/* Check a case against its family's rules, fill defaults' effects, and rewrite every value in
 * canonical form, so two spellings of one case get one name. Unknown family or key, a missing
 * or mistyped field: exit class 2 naming the field. */
int kp_case_normalize(kp_case *c, kp_error *err);
/* A normalized case with every field set, defaults filled (the family's fill_defaults; as it is without one). */
int kp_case_fill_defaults(kp_case *c, kp_error *err);

#endif
