/* params.c: one parser per kind of check field (kp_param_reader in kp_harness.h): a field comes from
 * the check or from the config's "defaults", never from code, and every error names its path. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kp_harness.h"

int kp_want_string(const cJSON *v, const char *where, const char **out, kp_error *err) {
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return kp_fail(err, KP_EXIT_USAGE, "%s: expected a non-empty string", where);
    *out = v->valuestring;
    return 0;
}

int kp_want_number(const cJSON *v, const char *where, double *out, kp_error *err) {
    if (!cJSON_IsNumber(v)) return kp_fail(err, KP_EXIT_USAGE, "%s: expected a number", where);
    *out = v->valuedouble;
    return 0;
}

const cJSON *kp_param_get(const kp_param_reader *r, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->check, key);
    return v ? v : (r->defaults ? cJSON_GetObjectItemCaseSensitive(r->defaults, key) : NULL);
}

static const cJSON *required(const kp_param_reader *r, const char *key, char *at, size_t len, kp_error *err) {
    snprintf(at, len, "%.400s.%.60s", r->where, key);
    const cJSON *v = kp_param_get(r, key);
    if (!v) kp_fail(err, KP_EXIT_USAGE, "%s: required (in the check or in \"defaults\")", at);
    return v;
}

int kp_param_string(const kp_param_reader *r, const char *key, const char *const *allowed, const char **out,
                    kp_error *err) {
    char at[480];
    const cJSON *v = required(r, key, at, sizeof at, err);
    if (!v) return err->code;
    if (!cJSON_IsString(v) || !v->valuestring[0]) return kp_fail(err, KP_EXIT_USAGE, "%s: expected a non-empty string", at);
    if (allowed) {
        char known[256] = "";
        for (int i = 0; allowed[i]; i++) {
            if (!strcmp(v->valuestring, allowed[i])) return *out = allowed[i], 0;
            size_t n = strlen(known);
            snprintf(known + n, sizeof known - n, "%s%s", i ? ", " : "", allowed[i]);
        }
        return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is unknown (%s)", at, v->valuestring, known);
    }
    *out = v->valuestring;
    return 0;
}

int kp_param_number(const kp_param_reader *r, const char *key, double lo, double hi, bool hi_inclusive, double *out,
                    kp_error *err) {
    char at[480];
    const cJSON *v = required(r, key, at, sizeof at, err);
    if (!v) return err->code;
    if (!cJSON_IsNumber(v)) return kp_fail(err, KP_EXIT_USAGE, "%s: expected a number", at);
    const double x = v->valuedouble;
    if (!(x >= lo && (hi_inclusive ? x <= hi : x < hi)))
        return kp_fail(err, KP_EXIT_USAGE, "%s: %g is outside [%g, %g%c", at, x, lo, hi, hi_inclusive ? ']' : ')');
    *out = x;
    return 0;
}

int kp_param_int(const kp_param_reader *r, const char *key, int64_t lo, int64_t hi, int64_t *out, kp_error *err) {
    char at[480];
    const cJSON *v = required(r, key, at, sizeof at, err);
    if (!v) return err->code;
    if (!cJSON_IsNumber(v)) return kp_fail(err, KP_EXIT_USAGE, "%s: expected an integer", at);
    const double x = v->valuedouble;
    if (x != floor(x) || x < (double)lo || x > (double)hi)
        return kp_fail(err, KP_EXIT_USAGE, "%s: %g must be an integer in [%lld, %lld]", at, x, (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return 0;
}
