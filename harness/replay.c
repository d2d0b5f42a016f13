/* replay.c: regenerate each receipt's case from its name alone and compare input and reference
 * digests, proving the receipt's evidence can be rebuilt on another machine. */
#define _GNU_SOURCE
#include "kp_replay.h"

#include <stdio.h>
#include <string.h>

#include "../receipts/kp_bundle.h"
#include "kp_launch.h"

static int replay_receipt(const char *dir, const char *file, kp_error *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    cJSON *rec = NULL;
    if (kp_bundle_read_json(path, &rec, err)) return err->code;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(rec, "case");
    const cJSON *name = c ? cJSON_GetObjectItemCaseSensitive(c, "name") : NULL;
    int rc = 0;
    kp_case kc;
    if (!cJSON_IsString(name)) {
        rc = kp_fail(err, KP_EXIT_INCORRECT, "%s: no case.name", file);
    } else if (kp_case_parse(name->valuestring, &kc, err) || kp_case_normalize(&kc, err)) {
        kp_error_prefix(err, "%s: ", file);
        rc = err->code;
    }
    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(rec, "inputs");
    if (!rc && !inputs) { /* a case that never got inputs (it failed to prepare): nothing to replay */
        cJSON_Delete(rec);
        return 0;
    }
    const kp_family *fam = rc ? NULL : kp_family_find(kc.family);
    if (!rc && !fam) rc = kp_fail(err, KP_EXIT_INCORRECT, "%s: family %s has no harness family here", file, kc.family);
    kp_prepared p = {0};
    if (!rc && kp_prepare(fam, &kc, 0, &p, err)) rc = err->code;
    if (!rc) {
        cJSON *now = cJSON_CreateObject();
        kp_describe_inputs(&p, now);
        kp_digests_settle();
        for (const cJSON *t = now->child; t && !rc; t = t->next) {
            const cJSON *was = cJSON_GetObjectItemCaseSensitive(inputs, t->string);
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(t, "sha256");
            const cJSON *b = was ? cJSON_GetObjectItemCaseSensitive(was, "sha256") : NULL;
            if (!cJSON_IsString(b) || strcmp(a->valuestring, b->valuestring))
                rc = kp_fail(err, KP_EXIT_INCORRECT, "%s: input '%s' regenerates to %s, the receipt records %s", file,
                             t->string, a->valuestring, cJSON_IsString(b) ? b->valuestring : "nothing");
        }
        cJSON_Delete(now);
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(rec, "reference");
    const cJSON *ref_sha = ref ? cJSON_GetObjectItemCaseSensitive(ref, "sha256") : NULL;
    if (!rc && cJSON_IsString(ref_sha)) {
        cJSON *desc = cJSON_CreateObject();
        if (kp_reference_run(&p, NULL, desc, err)) rc = err->code;
        kp_digests_settle();
        const cJSON *now = cJSON_GetObjectItemCaseSensitive(desc, "sha256");
        if (!rc && (!cJSON_IsString(now) || strcmp(now->valuestring, ref_sha->valuestring)))
            rc = kp_fail(err, KP_EXIT_INCORRECT, "%s: the reference regenerates to %s, the receipt records %s", file,
                         cJSON_IsString(now) ? now->valuestring : "nothing", ref_sha->valuestring);
        cJSON_Delete(desc);
    }
    kp_prepared_release(&p);
    cJSON_Delete(rec);
    return rc;
}

int kp_replay_bundle(const char *dir, kp_error *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/bundle.json", dir);
    cJSON *bundle = NULL;
    if (kp_bundle_read_json(path, &bundle, err)) return err->code;
    const cJSON *receipts = cJSON_GetObjectItemCaseSensitive(bundle, "receipts");
    int rc = 0;
    for (const cJSON *r = receipts ? receipts->child : NULL; r && !rc; r = r->next) {
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(r, "file");
        if (!cJSON_IsString(file)) rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle.json: a receipt entry has no file");
        else rc = replay_receipt(dir, file->valuestring, err);
    }
    cJSON_Delete(bundle);
    return rc;
}
