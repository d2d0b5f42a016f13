/* kp_case.c: parsing and formatting of canonical case names, and the field-table code that validates, decodes,
 * normalizes and describes a family's fields. Family rules live in one file per family; case_families.c dispatches. */
#include "kp_case.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static int key_char(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_'; }
static int value_char(char ch) {
    return ch > ' ' && ch < 127 && ch != ',' && ch != '(' && ch != ')' && ch != '=';
}

static int param_index(const kp_case *c, const char *key) {
    for (int i = 0; i < c->nparams; i++)
        if (strcmp(c->params[i].key, key) == 0) return i;
    return -1;
}

const char *kp_case_get(const kp_case *c, const char *key) {
    int i = param_index(c, key);
    return i < 0 ? NULL : c->params[i].value;
}

void kp_case_unset(kp_case *c, const char *key) {
    int i = param_index(c, key);
    if (i < 0) return;
    memmove(&c->params[i], &c->params[i + 1], sizeof(kp_param) * (size_t)(c->nparams - i - 1));
    c->nparams--;
    c->typed_by = NULL;
}

int kp_case_set(kp_case *c, const char *key, const char *value, kp_error *err) {
    if (strlen(key) >= sizeof c->params[0].key || !*key)
        return kp_fail(err, KP_EXIT_USAGE, "case key '%s': empty or longer than %zu characters", key,
                       sizeof c->params[0].key - 1);
    for (const char *p = key; *p; p++)
        if (!key_char(*p)) return kp_fail(err, KP_EXIT_USAGE, "case key '%s': only a-z, 0-9 and _ are allowed", key);
    if (strlen(value) >= sizeof c->params[0].value || !*value)
        return kp_fail(err, KP_EXIT_USAGE, "case field '%s': value empty or longer than %zu characters", key,
                       sizeof c->params[0].value - 1);
    for (const char *p = value; *p; p++)
        if (!value_char(*p))
            return kp_fail(err, KP_EXIT_USAGE, "case field '%s': value '%s' has a character not allowed in a case name",
                           key, value);
    c->typed_by = NULL;
    int i = param_index(c, key);
    if (i >= 0) {
        snprintf(c->params[i].value, sizeof c->params[i].value, "%s", value);
        return 0;
    }
    if (c->nparams == KP_CASE_MAX_PARAMS)
        return kp_fail(err, KP_EXIT_USAGE, "case has more than %d fields", KP_CASE_MAX_PARAMS);
    int at = 0;
    while (at < c->nparams && strcmp(c->params[at].key, key) < 0) at++;
    memmove(&c->params[at + 1], &c->params[at], sizeof(kp_param) * (size_t)(c->nparams - at));
    snprintf(c->params[at].key, sizeof c->params[at].key, "%s", key);
    snprintf(c->params[at].value, sizeof c->params[at].value, "%s", value);
    c->nparams++;
    return 0;
}

int kp_case_parse(const char *name, kp_case *out, kp_error *err) {
    memset(out, 0, sizeof *out);
    const char *open = strchr(name, '(');
    size_t flen = open ? (size_t)(open - name) : 0;
    if (!open || flen == 0 || flen >= sizeof out->family)
        return kp_fail(err, KP_EXIT_USAGE, "case name '%s': expected family(key=value,...)", name);
    memcpy(out->family, name, flen);
    for (size_t i = 0; i < flen; i++)
        if (!key_char(out->family[i]))
            return kp_fail(err, KP_EXIT_USAGE, "case name '%s': bad character in the family", name);
    const char *p = open + 1, *end = strchr(p, ')');
    if (!end || end[1] != '\0')
        return kp_fail(err, KP_EXIT_USAGE, "case name '%s': must end with the one closing ')'", name);
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma ? comma : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        if (!eq) return kp_fail(err, KP_EXIT_USAGE, "case name '%s': field '%.*s' has no '='", name, (int)(stop - p), p);
        char key[64], value[128];
        if ((size_t)(eq - p) >= sizeof key || (size_t)(stop - eq - 1) >= sizeof value)
            return kp_fail(err, KP_EXIT_USAGE, "case name '%s': field '%.*s' is too long", name, (int)(stop - p), p);
        memcpy(key, p, (size_t)(eq - p));
        key[eq - p] = '\0';
        memcpy(value, eq + 1, (size_t)(stop - eq - 1));
        value[stop - eq - 1] = '\0';
        if (kp_case_get(out, key))
            return kp_fail(err, KP_EXIT_USAGE, "case name '%s': field '%s' given twice", name, key);
        if (kp_case_set(out, key, value, err)) {
            kp_error_prefix(err, "case name '%s': ", name);
            return err->code;
        }
        p = comma ? comma + 1 : end;
        if (comma && p == end) return kp_fail(err, KP_EXIT_USAGE, "case name '%s': trailing ','", name);
    }
    return 0;
}

int kp_case_format(const kp_case *c, char *buf, size_t len) {
    size_t at = 0;
    int n = snprintf(buf, len, "%s(", c->family);
    if (n < 0 || (size_t)n >= len) return -1;
    at = (size_t)n;
    for (int i = 0; i < c->nparams; i++) {
        n = snprintf(buf + at, len - at, "%s%s=%s", i ? "," : "", c->params[i].key, c->params[i].value);
        if (n < 0 || (size_t)n >= len - at) return -1;
        at += (size_t)n;
    }
    if (at + 2 > len) return -1;
    buf[at++] = ')';
    buf[at] = '\0';
    return (int)at;
}

static void shortest_exponent_text(double v, char *out, size_t len) {
    char text[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(text, sizeof text, "%.*g", p, v);
        if (strtod(text, NULL) == v) break;
    }
    /* strip '+' and leading zeros from the exponent: 1e+09 -> 1e9, 1e-08 -> 1e-8 */
    size_t o = 0;
    for (const char *s = text; *s && o + 1 < len; s++) {
        out[o++] = *s;
        if (*s != 'e') continue;
        s++;
        if (*s == '-') out[o++] = *s++;
        else if (*s == '+') s++;
        while (*s == '0' && s[1]) s++;
        while (*s && o + 1 < len) out[o++] = *s++;
        break;
    }
    out[o] = '\0';
}

void kp_format_number(double v, char *buf, size_t len) {
    char shortest[64];
    shortest_exponent_text(v, shortest, sizeof shortest);
    if (v == floor(v) && fabs(v) < 1e17) { /* an integer: plain digits unless the exponent form is shorter */
        char plain[64];
        snprintf(plain, sizeof plain, "%.0f", v);
        if (strlen(plain) <= strlen(shortest)) {
            snprintf(buf, len, "%s", plain);
            return;
        }
    }
    snprintf(buf, len, "%s", shortest);
}

/* ---- field tables ---------------------------------------------------------------------------- */

static const kp_case_field *earlier(const kp_case_family *f, const kp_case_field *field, const char *name) {
    for (const kp_case_field *g = f->fields; g < field; g++)
        if (!strcmp(g->name, name)) return g;
    kp_abort(__FILE__, __LINE__, "case %s: field '%s' refers to '%s', which is not an earlier field", f->name, field->name,
             name);
}

static void store_int(void *fields, const kp_case_field *field, int64_t v) {
    unsigned char *at = (unsigned char *)fields + field->offset;
    if (field->size == sizeof(int32_t)) {
        int32_t x = (int32_t)v;
        memcpy(at, &x, sizeof x);
    } else {
        KP_ASSERT(field->size == sizeof(int64_t));
        memcpy(at, &v, sizeof v);
    }
}

static int64_t load_int(const void *fields, const kp_case_field *field) {
    const unsigned char *at = (const unsigned char *)fields + field->offset;
    if (field->size == sizeof(int32_t)) {
        int32_t x;
        memcpy(&x, at, sizeof x);
        return x;
    }
    int64_t v;
    memcpy(&v, at, sizeof v);
    return v;
}

static void join_names(const char *const *names, const char *sep, char *buf, size_t len) {
    buf[0] = '\0';
    for (int i = 0, at = 0; names && names[i] && (size_t)at < len; i++)
        at += snprintf(buf + at, len - (size_t)at, "%s%s", i ? sep : "", names[i]);
}

/* The canonical text of a decoded field. */
static void format_field(const kp_case_field *field, const void *fields, char *buf, size_t len) {
    const unsigned char *at = (const unsigned char *)fields + field->offset;
    switch (field->type) {
    case KP_FIELD_INT: snprintf(buf, len, "%lld", (long long)load_int(fields, field)); break;
    case KP_FIELD_UINT: {
        uint64_t v;
        memcpy(&v, at, sizeof v);
        snprintf(buf, len, "%llu", (unsigned long long)v);
        break;
    }
    case KP_FIELD_NUMBER: {
        int word = 0;
        if (field->names) memcpy(&word, (const unsigned char *)fields + field->word_offset, sizeof word);
        double v;
        memcpy(&v, at, sizeof v);
        if (word) snprintf(buf, len, "%s", field->names[word - 1]);
        else kp_format_number(v, buf, len);
        break;
    }
    case KP_FIELD_NAME: {
        const int64_t v = load_int(fields, field);
        for (int i = 0; field->names[i]; i++)
            if ((field->codes ? field->codes[i] : i) == v) {
                snprintf(buf, len, "%s", field->names[i]);
                return;
            }
        kp_abort(__FILE__, __LINE__, "field '%s' holds %lld, none of its names", field->name, (long long)v);
    }
    }
}

/* The default's canonical text; 0 for a required field. */
static int default_text(const kp_case_family *f, const kp_case_field *field, const void *fields, char *buf, size_t len) {
    if (field->fallback) snprintf(buf, len, "%s", field->fallback);
    else if (field->same_as) format_field(earlier(f, field, field->same_as), fields, buf, len);
    else if (field->preset && field->type == KP_FIELD_NAME) { /* a code: its name */
        const int64_t v = field->preset(fields);
        for (int i = 0; field->names[i]; i++)
            if ((field->codes ? field->codes[i] : i) == v) return snprintf(buf, len, "%s", field->names[i]), 1;
        kp_abort(__FILE__, __LINE__, "field '%s': preset %lld is none of its names", field->name, (long long)v);
    } else if (field->preset) snprintf(buf, len, "%lld", (long long)field->preset(fields));
    else return 0;
    return 1;
}

static bool applies(const kp_case_family *f, const kp_case_field *field, const void *fields) {
    if (!field->when) return true;
    char value[64];
    format_field(earlier(f, field, field->when), fields, value, sizeof value);
    return !strcmp(value, field->when_is);
}

/* Read text into the field's member, or an error naming the family and the field. */
static int parse_field(const kp_case_family *f, const kp_case_field *field, const char *text, void *fields, kp_error *err) {
    unsigned char *at = (unsigned char *)fields + field->offset;
    char *end;
    errno = 0;
    switch (field->type) {
    case KP_FIELD_INT: {
        const long long x = strtoll(text, &end, 10);
        if (*end || end == text || errno == ERANGE)
            return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': '%s' is not an integer", f->name, field->name, text);
        if (kp_case_field_range(f, field->name, x, field->min, field->max, err)) return err->code;
        store_int(fields, field, x);
        return 0;
    }
    case KP_FIELD_UINT: {
        const unsigned long long x = strtoull(text, &end, 10);
        if (*end || end == text || errno == ERANGE || *text == '-')
            return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': '%s' is not an unsigned 64-bit integer", f->name,
                           field->name, text);
        const uint64_t v = x;
        memcpy(at, &v, sizeof v);
        return 0;
    }
    case KP_FIELD_NUMBER: {
        for (int i = 0; field->names && field->names[i]; i++)
            if (!strcmp(text, field->names[i])) {
                const int word = i + 1;
                memcpy((unsigned char *)fields + field->word_offset, &word, sizeof word);
                return 0;
            }
        char words[160] = "";
        if (field->names) join_names(field->names, ", ", words + 4, sizeof words - 4), memcpy(words, " or ", 4);
        const double x = strtod(text, &end);
        if (*end || end == text)
            return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': '%s' is not a number%s", f->name, field->name, text, words);
        if (isnan(x)) return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': NaN is not allowed", f->name, field->name);
        if (x < field->nmin || x > field->nmax || (field->nmin_open && x == field->nmin))
            return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': %g is outside %c%g, %g]%s", f->name, field->name, x,
                           field->nmin_open ? '(' : '[', field->nmin, field->nmax, words);
        memcpy(at, &x, sizeof x);
        return 0;
    }
    case KP_FIELD_NAME:
        for (int i = 0; field->names[i]; i++)
            if (!strcmp(text, field->names[i])) return store_int(fields, field, field->codes ? field->codes[i] : i), 0;
        char known[160];
        join_names(field->names, ", ", known, sizeof known);
        return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': '%s' is unknown (%s)", f->name, field->name, text, known);
    }
    return 0;
}

int kp_case_field_range(const kp_case_family *f, const char *field, int64_t v, int64_t min, int64_t max, kp_error *err) {
    if (v >= min && v <= max) return 0;
    return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': %lld is outside [%lld, %lld]", f->name, field, (long long)v,
                   (long long)min, (long long)max);
}

int kp_case_decode(const kp_case *c, const kp_case_family *f, void *out, kp_error *err) {
    KP_ASSERT(f->fields_size <= KP_CASE_FIELDS_MAX);
    memset(out, 0, f->fields_size);
    for (int i = 0; i < c->nparams; i++) {
        int known = 0;
        for (int k = 0; k < f->nfields; k++) known |= !strcmp(c->params[i].key, f->fields[k].name);
        if (known) continue;
        char names[320] = "";
        for (int k = 0, at = 0; k < f->nfields && (size_t)at < sizeof names; k++)
            at += snprintf(names + at, sizeof names - (size_t)at, "%s%s", k ? ", " : "", f->fields[k].name);
        return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s' is unknown (known: %s)", f->name, c->params[i].key, names);
    }
    for (const kp_case_field *field = f->fields; field < f->fields + f->nfields; field++) {
        const char *text = kp_case_get(c, field->name);
        const bool apply = applies(f, field, out);
        if (text && !apply)
            return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s' only applies to %s=%s", f->name, field->name, field->when,
                           field->when_is);
        if (!text && field->fallback) text = field->fallback;
        int rc = 0;
        if (text) rc = parse_field(f, field, text, out, err);
        else if (field->same_as) store_int(out, field, load_int(out, earlier(f, field, field->same_as)));
        else if (field->preset) store_int(out, field, field->preset(out));
        else if (apply) rc = kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s' is required", f->name, field->name);
        if (rc) return rc;
    }
    return f->check ? f->check(out, err) : 0;
}

const void *kp_case_fields(const kp_case *c, const kp_case_family *f) {
    if (c->typed_by != f)
        kp_abort(__FILE__, __LINE__, "case %s: read as a %s case but %s", c->family, f->name,
                 c->typed_by ? "decoded as another family's" : "not normalized since its last change");
    return c->fields;
}

/* A decoded case's every field that applies: set in canonical form, or (drop_defaults) dropped when it equals
 * its default, or (!drop_defaults) set only where absent. */
static int write_fields(kp_case *c, const kp_case_family *f, const void *fields, bool drop_defaults, kp_error *err) {
    for (const kp_case_field *field = f->fields; field < f->fields + f->nfields; field++) {
        if (!applies(f, field, fields)) continue;
        char value[64], fallback[64];
        format_field(field, fields, value, sizeof value);
        int rc = 0;
        if (!drop_defaults) rc = kp_case_get(c, field->name) ? 0 : kp_case_set(c, field->name, value, err);
        else if (default_text(f, field, fields, fallback, sizeof fallback) && !strcmp(value, fallback))
            kp_case_unset(c, field->name);
        else rc = kp_case_set(c, field->name, value, err);
        if (rc) return rc;
    }
    memcpy(c->fields, fields, f->fields_size);
    c->typed_by = f;
    return 0;
}

int kp_case_rewrite(kp_case *c, const kp_case_family *f, bool drop_defaults, kp_error *err) {
    alignas(max_align_t) unsigned char fields[KP_CASE_FIELDS_MAX];
    int rc = kp_case_decode(c, f, fields, err);
    return rc ? rc : write_fields(c, f, fields, drop_defaults, err);
}

void kp_case_field_describe(const kp_case_field *field, char *buf, size_t len) {
    char type[192], names[160], def[96], when[96] = "";
    join_names(field->names, " ", names, sizeof names);
    switch (field->type) {
    case KP_FIELD_INT: snprintf(type, sizeof type, "integer in [%lld, %lld]", (long long)field->min, (long long)field->max); break;
    case KP_FIELD_UINT: snprintf(type, sizeof type, "unsigned 64-bit integer"); break;
    case KP_FIELD_NUMBER:
        if (isinf(field->nmin) && isinf(field->nmax)) snprintf(type, sizeof type, "number");
        else snprintf(type, sizeof type, "number in %c%g, %g]", field->nmin_open ? '(' : '[', field->nmin, field->nmax);
        if (field->names) snprintf(type + strlen(type), sizeof type - strlen(type), " or %s", names);
        break;
    case KP_FIELD_NAME: snprintf(type, sizeof type, "one of %s", names); break;
    }
    if (field->fallback) snprintf(def, sizeof def, "default %s", field->fallback);
    else if (field->same_as) snprintf(def, sizeof def, "default: %s's value", field->same_as);
    else if (field->preset) snprintf(def, sizeof def, "default: preset by the fields before it");
    else snprintf(def, sizeof def, "required");
    if (field->when) snprintf(when, sizeof when, ", only with %s=%s", field->when, field->when_is);
    snprintf(buf, len, "%s, %s%s: %s", type, def, when, field->help);
}

static bool required(const kp_case_field *field) {
    return !field->fallback && !field->same_as && !field->preset && !field->when;
}

void kp_case_family_help(const kp_case_family *f, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = '\0';
#define PUT(...) (at < len ? (void)(at += (size_t)snprintf(buf + at, len - at, __VA_ARGS__)) : (void)0)
    int optional = 0;
    for (int k = 0; k < f->nfields; k++)
        if (required(&f->fields[k])) PUT("%s%s", at ? " " : "", f->fields[k].name);
    for (int k = 0; k < f->nfields; k++)
        if (!required(&f->fields[k])) PUT("%s%s", optional++ ? " " : " [", f->fields[k].name);
    if (optional) PUT("]");
    for (int k = 0; k < f->nfields; k++) {
        const kp_case_field *field = &f->fields[k];
        if (!field->names) continue;
        char names[160];
        join_names(field->names, " ", names, sizeof names);
        PUT("; %s: %s%s", field->name, field->type == KP_FIELD_NUMBER ? "a number or " : "", names);
    }
#undef PUT
}

void kp_case_family_dict(const kp_case_family *f, void (*entry)(const char *text, void *ctx), void *ctx) {
    char text[80];
    snprintf(text, sizeof text, "%s(", f->name);
    entry(text, ctx);
    for (int k = 0; k < f->nfields; k++) {
        snprintf(text, sizeof text, "%s=", f->fields[k].name);
        entry(text, ctx);
        for (int i = 0; f->fields[k].names && f->fields[k].names[i]; i++) entry(f->fields[k].names[i], ctx);
    }
}
