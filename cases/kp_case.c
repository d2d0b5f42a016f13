/* kp_case.c: parsing, formatting and typed reads of canonical case names.
 * Family rules live in one file per family; case_families.c dispatches to them. */
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

static int missing(const kp_case *c, const char *key, kp_error *err) {
    return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s' is required", c->family, key);
}

int kp_case_int(const kp_case *c, const char *key, int64_t min, int64_t max, int64_t *out, kp_error *err) {
    const char *v = kp_case_get(c, key);
    if (!v) return missing(c, key, err);
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end || errno == ERANGE)
        return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': '%s' is not an integer", c->family, key, v);
    if (x < min || x > max)
        return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': %lld is outside [%lld, %lld]", c->family, key, x,
                       (long long)min, (long long)max);
    *out = x;
    return 0;
}

int kp_case_uint(const kp_case *c, const char *key, uint64_t *out, kp_error *err) {
    const char *v = kp_case_get(c, key);
    if (!v) return missing(c, key, err);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || errno == ERANGE || *v == '-')
        return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': '%s' is not an unsigned 64-bit integer", c->family, key, v);
    *out = x;
    return 0;
}

int kp_case_num(const kp_case *c, const char *key, double *out, kp_error *err) {
    const char *v = kp_case_get(c, key);
    if (!v) return missing(c, key, err);
    char *end;
    double x = strtod(v, &end);
    if (*end || end == v)
        return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': '%s' is not a number", c->family, key, v);
    if (isnan(x)) return kp_fail(err, KP_EXIT_USAGE, "case %s: field '%s': NaN is not allowed", c->family, key);
    *out = x;
    return 0;
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
