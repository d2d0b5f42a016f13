/* kp_case.h: canonical case names, `family(key=value,...)` with keys sorted. One name is the
 * case's id, its CLI filter and its receipt key; parse and format round-trip exactly. */
#ifndef KP_CASE_H
#define KP_CASE_H

#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kp_common.h"

#define KP_CASE_MAX_PARAMS 16
#define KP_CASE_NAME_MAX 512
#define KP_CASE_FIELDS_MAX 256 /* the largest family's typed struct; each family asserts it fits */

typedef struct kp_param {
    char key[32];
    char value[64];
} kp_param;

struct kp_case_family;

typedef struct kp_case {
    char family[16];
    int nparams;
    kp_param params[KP_CASE_MAX_PARAMS]; /* sorted by key, unique */
    /* The family's typed struct, decoded once by kp_case_normalize so the hooks never re-read the text;
     * typed_by is that family, NULL until then and again after any kp_case_set or kp_case_unset. */
    const struct kp_case_family *typed_by;
    alignas(max_align_t) unsigned char fields[KP_CASE_FIELDS_MAX];
} kp_case;

/* Syntax only: family and key=value pairs (keys [a-z0-9_], values without ',' '(' ')' '=' or spaces).
 * Keys are sorted; a repeated key is an error. The family's own rules come from kp_case_normalize. */
int kp_case_parse(const char *name, kp_case *out, kp_error *err);
/* The canonical name; returns its length, or -1 when it does not fit. */
int kp_case_format(const kp_case *c, char *buf, size_t len);
const char *kp_case_get(const kp_case *c, const char *key); /* NULL when absent */
int kp_case_set(kp_case *c, const char *key, const char *value, kp_error *err);
void kp_case_unset(kp_case *c, const char *key);

/* The shortest text that reads back as exactly v, exponent without '+' or leading zeros:
 * 1e9 -> "1e9", 0.95 -> "0.95", 1e-8 -> "1e-8", 1666666666.6666667 -> "1666666666.6666667". */
void kp_format_number(double v, char *buf, size_t len);

/* A case field, one row of a family's field table (git's parse-options style): the generic code below
 * validates, decodes, normalizes and fills a case from the table, and writes its help and fuzz dictionary. */
typedef enum kp_field_type {
    KP_FIELD_INT,    /* int32_t or int64_t member, [min, max] */
    KP_FIELD_UINT,   /* uint64_t member, any unsigned 64-bit integer */
    KP_FIELD_NUMBER, /* double member, [min, max] or (min, max]; no NaN; `names`: words accepted in its place */
    KP_FIELD_NAME,   /* int-sized member: the index of its value in `names`, or codes[index] */
} kp_field_type;

typedef struct kp_case_field {
    const char *name;
    kp_field_type type;
    size_t offset, size; /* the member of the family's typed struct (KP_FIELD_AT) */
    int64_t min, max;    /* KP_FIELD_INT: the range; bounds set by other fields are the check hook's */
    double nmin, nmax;   /* KP_FIELD_NUMBER: the range, ±INFINITY for none */
    bool nmin_open;      /* KP_FIELD_NUMBER: (nmin, nmax] */
    const char *const *names; /* NULL-ended: KP_FIELD_NAME's values, a KP_FIELD_NUMBER's words */
    const int64_t *codes;     /* KP_FIELD_NAME: what each name stores (NULL: its index) */
    size_t word_offset;       /* KP_FIELD_NUMBER with names: an int member, 1 + the word's index, 0 for a number */
    /* The default, at most one of: canonical text; an earlier field's value (a row stride defaults to the row's
     * width); a function of earlier fields (a model's preset). None: the field is required. */
    const char *fallback;
    const char *same_as;
    int64_t (*preset)(const void *fields);
    /* The field applies only when the earlier KP_FIELD_NAME field `when` is `when_is`: given otherwise, it is an
     * error; absent, it holds its default. */
    const char *when, *when_is;
    const char *help; /* one line: what the field means */
} kp_case_field;

#define KP_FIELD_AT(type, member) .offset = offsetof(type, member), .size = sizeof(((type *)0)->member)
/* A family row's table and typed struct: .fields, .nfields and .fields_size. */
#define KP_CASE_FIELDS(table, type) .fields = (table), .nfields = (int)(sizeof(table) / sizeof *(table)), .fields_size = sizeof(type)

/* One row of the case-family table (cases/case_families.c): what the cases stage knows of a family.
 * A family's own file (cases/<family>_case.c) defines its row. */
typedef struct kp_case_family {
    const char *name;              /* the family in case names */
    const char *generator_version; /* recorded in every receipt; bumped whenever an input's bytes change */
    const kp_case_field *fields;   /* decoding order: a field's same_as, preset and when name earlier ones */
    int nfields;
    size_t fields_size; /* sizeof the typed struct, <= KP_CASE_FIELDS_MAX */
    /* (optional) The rules across fields, on the decoded struct: bounds set by other fields, presets' effects.
     * Errors through kp_case_field_range or kp_fail(err, KP_EXIT_USAGE, "case <family>: field '<f>': ..."). */
    int (*check)(void *fields, kp_error *err);
} kp_case_family;

/* Decode c (normalized or not) into f's typed struct (fields_size bytes at out): unknown fields, type, range
 * and list errors name the family and the field (KP_EXIT_USAGE), then f's check. */
int kp_case_decode(const kp_case *c, const kp_case_family *f, void *out, kp_error *err);
/* Decode c as f's case, rewrite each field that applies in canonical form, dropping those equal to their default
 * (drop_defaults: kp_case_normalize) or filling those absent (kp_case_fill_defaults), and keep the decode in c. */
int kp_case_rewrite(kp_case *c, const kp_case_family *f, bool drop_defaults, kp_error *err);
/* c's typed struct as kp_case_normalize decoded it; a case not normalized as f's is a programmer error. */
const void *kp_case_fields(const kp_case *c, const kp_case_family *f);
/* KP_EXIT_USAGE "case <family>: field '<field>': <v> is outside [min, max]" unless v is inside: for check hooks. */
int kp_case_field_range(const kp_case_family *f, const char *field, int64_t v, int64_t min, int64_t max, kp_error *err);
/* `kparity list`'s line for f: its fields (optional ones in brackets) and each name field's values. */
void kp_case_family_help(const kp_case_family *f, char *buf, size_t len);
/* One field's line: type and range, default, when it applies, and its help. */
void kp_case_field_describe(const kp_case_field *field, char *buf, size_t len);
/* The fuzz dictionary's entries for f (fuzz/case_name.dict): "family(", every "field=", every name and word. */
void kp_case_family_dict(const kp_case_family *f, void (*entry)(const char *text, void *ctx), void *ctx);

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
/* Every field that applies set, the defaults a normalized name omits filled in canonical form: what an outside
 * program is told of the case (harness/exec.c). */
int kp_case_fill_defaults(kp_case *c, kp_error *err);

#endif
