/* kp_json.h: exact numbers in cJSON documents. cJSON's own number printing rounds
 * (0.30000000000000004 prints as 0.3), so every number goes in as raw text written here. */
#ifndef KP_JSON_H
#define KP_JSON_H

#include <cjson/cJSON.h>
#include <stdint.h>

/* Doubles as %.17g; NaN and infinities (not JSON numbers) as the strings "nan", "inf", "-inf". */
cJSON *kp_json_add_double(cJSON *obj, const char *key, double v);
/* Floats as %.9g (round-trips a float), same non-finite strings. */
cJSON *kp_json_add_float(cJSON *obj, const char *key, float v);
/* IEEE bits as a hex string, "0x3f800000", where bits matter. */
cJSON *kp_json_add_f32_bits(cJSON *obj, const char *key, float v);
/* 64-bit integers exactly (cJSON stores numbers as double). */
cJSON *kp_json_add_int(cJSON *obj, const char *key, int64_t v);
cJSON *kp_json_int(int64_t v);
cJSON *kp_json_double(double v);
cJSON *kp_json_float(float v);
/* An array of int64 values, at most `limit` of them (the rest live in an artifact). */
cJSON *kp_json_int_array(const int64_t *v, int64_t n, int64_t limit);

/* Read a number member back exactly (raw or plain), 0 on success, -1 when missing or not a number.
 * The strings "nan", "inf", "-inf" read as doubles. An int member of a document parsed with plain
 * cJSON_Parse is exact only below 2^53 (cJSON keeps a double, and "2^53 + 1" parses to 2^53); from
 * 2^53 on it is refused, not rounded: parse with kp_json_parse, which keeps each number's text. */
int kp_json_get_double(const cJSON *obj, const char *key, double *out);
int kp_json_get_float(const cJSON *obj, const char *key, float *out);
int kp_json_get_int(const cJSON *obj, const char *key, int64_t *out);
/* The same for a value itself (an array element). */
int kp_json_value_double(const cJSON *item, double *out);
int kp_json_value_int(const cJSON *item, int64_t *out);

/* Parse `len` bytes of JSON (one value, only whitespace after it, no NUL inside), keeping each
 * number's original text in its node's valuestring (the node stays a cJSON_Number), so ints read
 * back exactly and kp_json_print writes numbers back as they were read. NULL on a syntax error,
 * with *error_offset (if given) at the byte where parsing ended. Free with cJSON_Delete. */
cJSON *kp_json_parse(const char *text, size_t len, size_t *error_offset);

/* cJSON_Print's indented layout with every number exact: raw numbers and parsed number text as they
 * are, other numbers as integers (below 2^53) or %.17g, NaN and infinities as strings.
 * The caller frees with cJSON_free. */
char *kp_json_print(const cJSON *doc);

#endif
