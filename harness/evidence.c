/* evidence.c: index lists in receipts: the first few inline, the whole list as a content-addressed
 * .npy artifact of the bundle, named in the receipt's "artifacts" (kp_harness.h, kp_evidence). */
#include "kp_harness.h"

#include "../receipts/kp_json.h"

int kp_evidence_list(kp_evidence *ev, cJSON *obj, const char *key, const char *artifact_name, const int64_t *idx,
                     int64_t n, kp_error *err) {
    cJSON *o = cJSON_AddObjectToObject(obj, key);
    kp_json_add_int(o, "count", n);
    cJSON_AddItemToObject(o, "first", kp_json_int_array(idx, n, ev->inline_limit));
    if (n > ev->inline_limit && ev->bundle) {
        char digest[KP_SHA256_HEX_LEN], rel[128];
        if (kp_bundle_add_artifact(ev->bundle, "<i8", 1, &n, idx, (size_t)n * sizeof(int64_t), digest, rel, err))
            return err->code;
        cJSON *a = cJSON_AddObjectToObject(o, "artifact");
        cJSON_AddStringToObject(a, "file", rel);
        cJSON_AddStringToObject(a, "sha256", digest);
        cJSON *entry = cJSON_CreateObject();
        cJSON_AddStringToObject(entry, "name", artifact_name);
        cJSON_AddStringToObject(entry, "file", rel);
        cJSON_AddStringToObject(entry, "sha256", digest);
        cJSON_AddItemToArray(ev->artifacts, entry);
    }
    return 0;
}
