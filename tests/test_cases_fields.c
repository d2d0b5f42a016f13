/* test_cases_fields.c: the case field tables (kp_case.h): one test family's table drives validation, decoding,
 * canonical names, filled defaults and the help line; the built-in tables drive the fuzz dictionary. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_case.h"

typedef struct demo_case {
    int64_t n, width, stride, extra;
    uint64_t seed;
    int mode, ratio_auto;
    int32_t sign;
    double ratio;
} demo_case;

static const char *const modes[] = {"a", "b", NULL}, *const ratio_words[] = {"auto", NULL}, *const signs[] = {"minus", "plus", NULL};
static const int64_t sign_codes[] = {-1, 1};

#define AT(member) KP_FIELD_AT(demo_case, member)
static const kp_case_field demo_fields[] = {
    {"n", KP_FIELD_INT, AT(n), .min = 1, .max = 100, .help = "items"},
    {"width", KP_FIELD_INT, AT(width), .min = 1, .max = 1000, .help = "items a row"},
    {"seed", KP_FIELD_UINT, AT(seed), .help = "the seed"},
    {"stride", KP_FIELD_INT, AT(stride), .min = 1, .max = 2000, .same_as = "width", .help = "row stride, at least width"},
    {"mode", KP_FIELD_NAME, AT(mode), .names = modes, .fallback = "a", .help = "the mode"},
    {"extra", KP_FIELD_INT, AT(extra), .min = 0, .max = 100, .fallback = "7", .when = "mode", .when_is = "b",
     .help = "mode b's extra items"},
    {"ratio", KP_FIELD_NUMBER, AT(ratio), .nmin = 0, .nmax = 1, .nmin_open = true, .names = ratio_words,
     .word_offset = offsetof(demo_case, ratio_auto), .fallback = "0.5", .help = "a share"},
    {"sign", KP_FIELD_NAME, AT(sign), .names = signs, .codes = sign_codes, .fallback = "plus", .help = "the sign"},
};
#undef AT

static const kp_case_family demo_family;

/* Cross-field: a stride below the width. */
static int demo_check(void *fields, kp_error *err) {
    const demo_case *d = fields;
    return kp_case_field_range(&demo_family, "stride", d->stride, d->width, 2000, err);
}

static const kp_case_family demo_family = {
    .name = "demo",
    .generator_version = "demo/v1",
    KP_CASE_FIELDS(demo_fields, demo_case),
    .check = demo_check,
};

static void add_demo(void) {
    kp_error err = {0};
    cr_assert_eq(kp_case_family_register(&demo_family, &err), 0, "%s", err.msg);
}

static int normalize(const char *name, kp_case *c, kp_error *err) {
    memset(err, 0, sizeof *err);
    int rc = kp_case_parse(name, c, err);
    cr_assert_eq(rc, 0, "%s: %s", name, err->msg);
    return kp_case_normalize(c, err);
}

static void refused(const char *name, const char *needle) {
    kp_case c;
    kp_error err;
    cr_assert_eq(normalize(name, &c, &err), KP_EXIT_USAGE, "%s was accepted", name);
    cr_assert(strstr(err.msg, needle), "%s: '%s' not in: %s", name, needle, err.msg);
    cr_assert_null(c.typed_by, "%s: a refused case holds no decoded fields", name);
}

static void canon(const char *name, const char *want) {
    kp_case c;
    kp_error err;
    char got[KP_CASE_NAME_MAX];
    cr_assert_eq(normalize(name, &c, &err), 0, "%s: %s", name, err.msg);
    cr_assert_gt(kp_case_format(&c, got, sizeof got), 0);
    cr_assert_str_eq(got, want, "%s", name);
}

Test(cases_fields, an_unknown_field_is_named_with_the_known_ones_from_the_table, .init = add_demo) {
    refused("demo(colour=1,n=1,seed=1,width=4)",
            "case demo: field 'colour' is unknown (known: n, width, seed, stride, mode, extra, ratio, sign)");
}

Test(cases_fields, values_outside_their_type_or_range_are_refused_naming_family_and_field, .init = add_demo) {
    canon("demo(n=100,seed=1,width=4)", "demo(n=100,seed=1,width=4)"); /* the bounds themselves are inside */
    canon("demo(n=1,seed=1,width=4)", "demo(n=1,seed=1,width=4)");
    refused("demo(n=101,seed=1,width=4)", "case demo: field 'n': 101 is outside [1, 100]");
    refused("demo(n=0,seed=1,width=4)", "case demo: field 'n': 0 is outside [1, 100]");
    refused("demo(n=1.5,seed=1,width=4)", "case demo: field 'n': '1.5' is not an integer");
    refused("demo(n=1,seed=-1,width=4)", "case demo: field 'seed': '-1' is not an unsigned 64-bit integer");
    refused("demo(n=1,ratio=0,seed=1,width=4)", "case demo: field 'ratio': 0 is outside (0, 1]");
    refused("demo(n=1,ratio=1.5,seed=1,width=4)", "case demo: field 'ratio': 1.5 is outside (0, 1]");
    refused("demo(n=1,ratio=nan,seed=1,width=4)", "case demo: field 'ratio': NaN is not allowed");
    refused("demo(n=1,ratio=most,seed=1,width=4)", "case demo: field 'ratio': 'most' is not a number or auto");
    refused("demo(n=1,width=4)", "case demo: field 'seed' is required");
}

Test(cases_fields, a_name_not_in_its_list_is_refused_with_the_list, .init = add_demo) {
    refused("demo(mode=c,n=1,seed=1,width=4)", "case demo: field 'mode': 'c' is unknown (a, b)");
    refused("demo(n=1,seed=1,sign=zero,width=4)", "case demo: field 'sign': 'zero' is unknown (minus, plus)");
}

Test(cases_fields, the_canonical_name_drops_defaults_and_rewrites_values, .init = add_demo) {
    /* constant, same-as and conditional defaults dropped; numbers and integers in canonical form */
    canon("demo(extra=7,mode=b,n=+3,ratio=0.50,seed=01,sign=plus,stride=10,width=10)", "demo(mode=b,n=3,seed=1,width=10)");
    canon("demo(mode=a,n=3,ratio=5e-1,seed=1,stride=11,width=10)", "demo(n=3,seed=1,stride=11,width=10)");
    canon("demo(extra=8,mode=b,n=3,ratio=auto,seed=1,sign=minus,width=10)",
          "demo(extra=8,mode=b,n=3,ratio=auto,seed=1,sign=minus,width=10)");
}

Test(cases_fields, the_case_is_decoded_once_and_every_default_can_be_filled, .init = add_demo) {
    kp_case c;
    kp_error err;
    cr_assert_eq(normalize("demo(mode=b,n=3,ratio=auto,seed=9,sign=minus,width=10)", &c, &err), 0, "%s", err.msg);
    const demo_case *d = kp_case_fields(&c, &demo_family);
    cr_assert(d->n == 3 && d->width == 10 && d->stride == 10 && d->seed == 9 && d->mode == 1 && d->extra == 7 &&
              d->ratio_auto == 1 && d->sign == -1, "the typed struct holds the fields and their defaults");
    kp_case all = c;
    cr_assert_eq(kp_case_fill_defaults(&all, &err), 0, "%s", err.msg);
    char name[KP_CASE_NAME_MAX];
    cr_assert_gt(kp_case_format(&all, name, sizeof name), 0);
    cr_assert_str_eq(name, "demo(extra=7,mode=b,n=3,ratio=auto,seed=9,sign=minus,stride=10,width=10)");
    cr_assert_eq(memcmp(kp_case_fields(&all, &demo_family), d, sizeof *d), 0, "filling changes the spelling only");
    cr_assert_eq(normalize("demo(n=3,seed=9,width=10)", &c, &err), 0, "%s", err.msg);
    all = c;
    cr_assert_eq(kp_case_fill_defaults(&all, &err), 0, "%s", err.msg);
    cr_assert_gt(kp_case_format(&all, name, sizeof name), 0);
    cr_assert_str_eq(name, "demo(mode=a,n=3,ratio=0.5,seed=9,sign=plus,stride=10,width=10)", "extra only with mode=b");
    cr_assert_eq(kp_case_set(&c, "n", "4", &err), 0);
    cr_assert_null(c.typed_by, "a changed case is not read from its old decode");
}

Test(cases_fields, cross_field_rules_come_from_the_check_hook_and_the_when_conditions, .init = add_demo) {
    refused("demo(n=1,seed=1,stride=9,width=10)", "case demo: field 'stride': 9 is outside [10, 2000]");
    refused("demo(extra=3,n=1,seed=1,width=10)", "case demo: field 'extra' only applies to mode=b");
    refused("demo(extra=3,mode=a,n=1,seed=1,width=10)", "case demo: field 'extra' only applies to mode=b");
}

Test(cases_fields, fields_help_is_generated_from_the_table, .init = add_demo) {
    char line[512];
    kp_case_family_help(&demo_family, line, sizeof line);
    cr_assert_str_eq(line, "n width seed [stride mode extra ratio sign]; mode: a b; ratio: a number or auto; sign: minus plus");
    kp_case_field_describe(&demo_fields[5], line, sizeof line);
    cr_assert_str_eq(line, "integer in [0, 100], default 7, only with mode=b: mode b's extra items");
    kp_case_field_describe(&demo_fields[3], line, sizeof line);
    cr_assert_str_eq(line, "integer in [1, 2000], default: width's value: row stride, at least width");
    kp_case_field_describe(&demo_fields[6], line, sizeof line);
    cr_assert_str_eq(line, "number in (0, 1] or auto, default 0.5: a share");
}

/* Every built-in table is well formed: members of the type's size inside the struct, each default reading back as
 * itself (same_as and when name earlier fields: the generic code aborts on a later one). */
Test(cases_fields, every_builtin_table_is_well_formed) {
    for (int i = 0; i < kp_table_count(&kp_case_families); i++) {
        const kp_case_family *f = kp_table_at(&kp_case_families, i);
        cr_assert_leq(f->fields_size, KP_CASE_FIELDS_MAX, "%s", f->name);
        for (int k = 0; k < f->nfields; k++) {
            const kp_case_field *field = &f->fields[k];
            cr_assert(field->help && *field->help, "%s.%s has no help", f->name, field->name);
            const size_t want = field->type == KP_FIELD_UINT || field->type == KP_FIELD_NUMBER ? 8 : field->size;
            cr_assert((field->size == 4 || field->size == 8) && field->size == want && field->offset + field->size <= f->fields_size,
                      "%s.%s: its member's size or place", f->name, field->name);
            cr_assert_eq(!!field->names, field->type == KP_FIELD_NAME || field->word_offset, "%s.%s: names", f->name, field->name);
            cr_assert_leq(!!field->fallback + !!field->same_as + !!field->preset, 1, "%s.%s: one default", f->name, field->name);
            if (!field->fallback) continue;
            char text[64];
            if (field->type == KP_FIELD_NUMBER && !(field->names && !strcmp(field->names[0], field->fallback))) {
                kp_format_number(strtod(field->fallback, NULL), text, sizeof text);
                cr_assert_str_eq(text, field->fallback, "%s.%s: the default is not canonical", f->name, field->name);
            }
            if (field->type == KP_FIELD_INT) {
                snprintf(text, sizeof text, "%lld", strtoll(field->fallback, NULL, 10));
                cr_assert_str_eq(text, field->fallback, "%s.%s: the default is not canonical", f->name, field->name);
            }
        }
    }
}

/* fuzz/case_name.dict is written by hand and checked here against the tables: every family, field and name
 * in it, and no field it lists that no table has. */
typedef struct dict {
    char *text;
    int missing;
    char first_missing[80];
} dict;

static void want_entry(const char *entry, void *ctx) {
    dict *d = ctx;
    char quoted[96];
    snprintf(quoted, sizeof quoted, "\n\"%s\"\n", entry);
    if (strstr(d->text, quoted)) return;
    if (!d->missing++) snprintf(d->first_missing, sizeof d->first_missing, "%s", entry);
}

static void find_entry(const char *entry, void *ctx) {
    if (!strcmp(entry, ((const char **)ctx)[0])) ((const char **)ctx)[1] = entry;
}

static char *read_dict(void) {
    char *path;
    cr_assert(asprintf(&path, "%s/fuzz/case_name.dict", KP_SOURCE_DIR) > 0);
    FILE *fp = fopen(path, "r");
    cr_assert(fp, "%s", path);
    char *text = calloc(1, 1 << 16);
    text[0] = '\n';
    size_t n = fread(text + 1, 1, (1 << 16) - 2, fp);
    cr_assert_lt(n, (size_t)(1 << 16) - 2, "the dictionary grew past the test's buffer");
    fclose(fp);
    free(path);
    return text;
}

Test(cases_fields, the_fuzz_dictionary_matches_the_tables) {
    dict d = {.text = read_dict()};
    int families = kp_table_count(&kp_case_families);
    for (int i = 0; i < families; i++) kp_case_family_dict(kp_table_at(&kp_case_families, i), want_entry, &d);
    cr_assert_eq(d.missing, 0, "fuzz/case_name.dict lacks %d of the tables' entries, the first \"%s\"", d.missing,
                 d.first_missing);
    /* and every "field=" or "family(" it lists is one a table has */
    for (char *line = strtok(d.text, "\n"); line; line = strtok(NULL, "\n")) {
        size_t len = strlen(line);
        if (line[0] != '"' || len < 4 || (line[len - 2] != '=' && line[len - 2] != '(')) continue;
        char entry[80];
        snprintf(entry, sizeof entry, "%.*s", (int)(len - 2), line + 1);
        const char *probe[2] = {entry, NULL};
        for (int i = 0; i < families && !probe[1]; i++) kp_case_family_dict(kp_table_at(&kp_case_families, i), find_entry, probe);
        cr_assert(probe[1], "fuzz/case_name.dict lists \"%s\", which no case table has", entry);
    }
    free(d.text);
}
