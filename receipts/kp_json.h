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
/* An array of int64 values, at most `limit` of them (the rest live in an artifact). */
cJSON *kp_json_int_array(const int64_t *v, int64_t n, int64_t limit);

/* Read a number member back exactly (raw or plain), 0 on success. */
int kp_json_get_double(const cJSON *obj, const char *key, double *out);
int kp_json_get_int(const cJSON *obj, const char *key, int64_t *out);

/* Print without whitespace changes to the text cJSON would give, indented for people;
 * the caller frees with cJSON_free. */
char *kp_json_print(const cJSON *doc);

#endif
