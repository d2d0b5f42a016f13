/* kp_json.c: exact numbers in cJSON documents: raw number text going in, each number's original
 * text kept on parse, and printing that never lets cJSON round a number (it prints 0.30000000000000004 as 0.3). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "kp_json.h"

#include <errno.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Numbers are printed and parsed under the C locale on this thread only: a program that called
 * setlocale() with a comma decimal point must still write JSON, and uselocale() leaves other threads alone. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void c_locale_init(void) { c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

static locale_t enter_c_locale(void) {
    pthread_once(&c_locale_once, c_locale_init);
    return c_locale ? uselocale(c_locale) : (locale_t)0;
}

static void leave_c_locale(locale_t old) {
    if (old) uselocale(old);
}

/* 2^53: from there on a double no longer tells integers apart ("9007199254740993" parses to 2^53),
 * so an int known only as a double is refused at or beyond it. */
#define EXACT_INT_LIMIT 9007199254740992.0

static const char *non_finite_text(double v) {
    if (isnan(v)) return "nan";
    return v > 0 ? "inf" : "-inf";
}

static cJSON *format_raw(const char *fmt, double v) {
    char buf[48];
    locale_t old = enter_c_locale();
    snprintf(buf, sizeof buf, fmt, v);
    leave_c_locale(old);
    return cJSON_CreateRaw(buf);
}

cJSON *kp_json_double(double v) {
    if (!isfinite(v)) return cJSON_CreateString(non_finite_text(v));
    return format_raw("%.17g", v);
}

cJSON *kp_json_float(float v) {
    if (!isfinite(v)) return cJSON_CreateString(non_finite_text(v));
    return format_raw("%.9g", (double)v);
}

cJSON *kp_json_int(int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_CreateRaw(buf);
}

static cJSON *add_member(cJSON *obj, const char *key, cJSON *item) {
    if (!item) return NULL;
    if (!obj || !cJSON_AddItemToObject(obj, key, item)) {
        cJSON_Delete(item);
        return NULL;
    }
    return item;
}

cJSON *kp_json_add_double(cJSON *obj, const char *key, double v) { return add_member(obj, key, kp_json_double(v)); }
cJSON *kp_json_add_float(cJSON *obj, const char *key, float v) { return add_member(obj, key, kp_json_float(v)); }
cJSON *kp_json_add_int(cJSON *obj, const char *key, int64_t v) { return add_member(obj, key, kp_json_int(v)); }

cJSON *kp_json_add_f32_bits(cJSON *obj, const char *key, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    char buf[16];
    snprintf(buf, sizeof buf, "0x%08" PRIx32, bits);
    return add_member(obj, key, cJSON_CreateString(buf));
}

cJSON *kp_json_int_array(const int64_t *v, int64_t n, int64_t limit) {
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return NULL;
    int64_t count = n < limit ? n : limit;
    for (int64_t i = 0; i < count; i++) {
        cJSON *item = kp_json_int(v[i]);
        if (!item || !cJSON_AddItemToArray(arr, item)) {
            cJSON_Delete(item);
            cJSON_Delete(arr);
            return NULL;
        }
    }
    return arr;
}

/* JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? . strtod alone would also
 * take "nan", "0x1p3" or "1." from a raw member, none of which is JSON. Sets *is_int when there is
 * no fraction or exponent. */
static int is_json_number(const char *s, int *is_int) {
    const char *p = s;
    *is_int = 1;
    if (*p == '-') p++;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (*p >= '0' && *p <= '9') p++;
    else return 0;
    if (*p == '.') {
        *is_int = 0;
        p++;
        if (!(*p >= '0' && *p <= '9')) return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p == 'e' || *p == 'E') {
        *is_int = 0;
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!(*p >= '0' && *p <= '9')) return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    return *p == '\0';
}

static int text_to_double(const char *s, double *out) {
    int is_int;
    if (!s || !is_json_number(s, &is_int)) return -1;
    locale_t old = enter_c_locale();
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    int bad = *end != '\0' || (errno == ERANGE && isinf(v));
    leave_c_locale(old);
    if (bad) return -1;
    *out = v;
    return 0;
}

/* The exact text of a number node, or NULL: a raw node's text, or the text kp_json_parse kept on
 * a number node, provided it still reads as the node's value. The check matters because
 * cJSON_SetNumberValue changes valuedouble and leaves valuestring stale. */
static const char *number_text(const cJSON *item) {
    if (!item || !item->valuestring) return NULL;
    if (cJSON_IsRaw(item)) return item->valuestring;
    if (!cJSON_IsNumber(item)) return NULL;
    double v;
    if (text_to_double(item->valuestring, &v) != 0) return NULL;
    return memcmp(&v, &item->valuedouble, sizeof v) == 0 ? item->valuestring : NULL;
}

int kp_json_value_double(const cJSON *item, double *out) {
    if (!item) return -1;
    if (cJSON_IsNumber(item)) {
        *out = item->valuedouble; /* cJSON parses with strtod, so a double's value is already exact */
        return 0;
    }
    if (cJSON_IsRaw(item)) return text_to_double(item->valuestring, out);
    if (cJSON_IsString(item)) {
        if (strcmp(item->valuestring, "nan") == 0) *out = NAN;
        else if (strcmp(item->valuestring, "inf") == 0) *out = INFINITY;
        else if (strcmp(item->valuestring, "-inf") == 0) *out = -INFINITY;
        else return -1;
        return 0;
    }
    return -1;
}

int kp_json_value_int(const cJSON *item, int64_t *out) {
    const char *text = number_text(item);
    int is_int = 0;
    if (text && is_json_number(text, &is_int) && is_int) {
        errno = 0;
        char *end;
        long long v = strtoll(text, &end, 10);
        if (errno == ERANGE || *end != '\0') return -1;
        *out = (int64_t)v;
        return 0;
    }
    double d;
    if (!cJSON_IsNumber(item) && !cJSON_IsRaw(item)) return -1;
    if (kp_json_value_double(item, &d) != 0) return -1;
    if (!isfinite(d) || d != trunc(d) || fabs(d) >= EXACT_INT_LIMIT) return -1;
    *out = (int64_t)d;
    return 0;
}

int kp_json_get_double(const cJSON *obj, const char *key, double *out) {
    return kp_json_value_double(cJSON_GetObjectItemCaseSensitive(obj, key), out);
}

int kp_json_get_float(const cJSON *obj, const char *key, float *out) {
    double d;
    if (kp_json_get_double(obj, key, &d) != 0) return -1;
    /* %.9g text is within half a float ulp by far more than a double ulp, so double then float
     * rounds the same way strtof would. */
    *out = (float)d;
    return 0;
}

int kp_json_get_int(const cJSON *obj, const char *key, int64_t *out) {
    return kp_json_value_int(cJSON_GetObjectItemCaseSensitive(obj, key), out);
}

/* --- parsing with number text kept --- */

typedef struct {
    size_t *start, *len;
    size_t count, cap;
} token_list;

/* Number tokens in document order. Outside strings only numbers contain digits or '-', and cJSON
 * keeps members and elements in document order, so the n-th token is the n-th number node of a
 * depth-first walk. */
static int collect_numbers(const char *text, size_t len, token_list *t) {
    int in_string = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = 0;
            continue;
        }
        if (c == '"') {
            in_string = 1;
            continue;
        }
        if (c != '-' && !(c >= '0' && c <= '9')) continue;
        size_t j = i;
        while (j < len && text[j] != '\0' && strchr("0123456789+-.eE", text[j])) j++;
        if (t->count == t->cap) {
            size_t cap = t->cap ? 2 * t->cap : 64;
            size_t *s = realloc(t->start, cap * sizeof *s), *l;
            if (!s) return -1;
            t->start = s;
            l = realloc(t->len, cap * sizeof *l);
            if (!l) return -1;
            t->len = l;
            t->cap = cap;
        }
        t->start[t->count] = i;
        t->len[t->count] = j - i;
        t->count++;
        i = j - 1;
    }
    return 0;
}

static size_t count_numbers(const cJSON *node) {
    size_t n = cJSON_IsNumber(node) ? 1 : 0;
    for (const cJSON *c = node->child; c; c = c->next) n += count_numbers(c);
    return n;
}

static int attach_texts(cJSON *node, const char *text, const token_list *t, size_t *next) {
    if (cJSON_IsNumber(node)) {
        size_t k = (*next)++, n = t->len[k];
        char *s = cJSON_malloc(n + 1);
        if (!s) return -1;
        memcpy(s, text + t->start[k], n);
        s[n] = '\0';
        node->valuestring = s;
    }
    for (cJSON *c = node->child; c; c = c->next)
        if (attach_texts(c, text, t, next) != 0) return -1;
    return 0;
}

cJSON *kp_json_parse(const char *text, size_t len, size_t *error_offset) {
    const char *nul = memchr(text, '\0', len);
    if (nul) { /* cJSON would stop there and take the text before it as the whole document */
        if (error_offset) *error_offset = (size_t)(nul - text);
        return NULL;
    }
    const char *end = NULL;
    /* require_null_terminated wants the NUL inside `len`; trailing text is checked here instead. */
    cJSON *doc = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t at = end ? (size_t)(end - text) : 0;
    if (doc) {
        while (at < len && strchr(" \t\r\n", text[at])) at++;
        if (at < len) {
            cJSON_Delete(doc);
            doc = NULL;
        }
    }
    if (!doc) {
        if (error_offset) *error_offset = at;
        return NULL;
    }
    token_list t = {0};
    size_t next = 0;
    int ok = collect_numbers(text, len, &t) == 0 && t.count == count_numbers(doc) &&
             attach_texts(doc, text, &t, &next) == 0;
    free(t.start);
    free(t.len);
    if (!ok) { /* out of memory (the token count always matches a document cJSON accepted) */
        if (error_offset) *error_offset = len;
        cJSON_Delete(doc);
        return NULL;
    }
    return doc;
}

/* --- exact printing --- */

/* Turn every number node of a private copy into raw text, so cJSON_Print never formats a number. */
static int exactify(cJSON *node) {
    if (cJSON_IsNumber(node)) {
        const char *kept = number_text(node);
        char buf[48];
        const char *text = kept;
        double v = node->valuedouble;
        int as_string = !isfinite(v);
        if (as_string) {
            text = non_finite_text(v);
        } else if (!kept) {
            locale_t old = enter_c_locale();
            if (v == trunc(v) && fabs(v) < EXACT_INT_LIMIT) snprintf(buf, sizeof buf, "%.0f", v);
            else snprintf(buf, sizeof buf, "%.17g", v);
            leave_c_locale(old);
            text = buf;
        }
        if (text != node->valuestring) {
            size_t n = strlen(text);
            char *s = cJSON_malloc(n + 1);
            if (!s) return -1;
            memcpy(s, text, n + 1);
            cJSON_free(node->valuestring);
            node->valuestring = s;
        }
        node->type = (node->type & ~0xFF) | (as_string ? cJSON_String : cJSON_Raw);
    }
    for (cJSON *c = node->child; c; c = c->next)
        if (exactify(c) != 0) return -1;
    return 0;
}

char *kp_json_print(const cJSON *doc) {
    if (!doc) return NULL;
    cJSON *copy = cJSON_Duplicate(doc, 1);
    if (!copy) return NULL;
    char *text = exactify(copy) == 0 ? cJSON_Print(copy) : NULL;
    cJSON_Delete(copy);
    return text;
}
