/* replay.c: regenerate each receipt's case from its name alone and compare input and reference
 * digests, proving the receipt's evidence can be rebuilt on another machine. */
#define _GNU_SOURCE
#include "kp_replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_bundle.h"
#include "kp_launch.h"

/* Whether a result recorded in a receipt says a check compared outputs, which needs the case's inputs: PASSED,
 * INCORRECT and NOT_SUPPORTED (an impl refuses a shape only once the inputs exist), or a result that is none of
 * the vocabulary. FAILED and NOT_RUN are what the runner's stubs record for a case that never got its inputs. */
static int says_checked(const cJSON *result) {
    const int r = kp_result_parse(cJSON_GetStringValue(result));
    return r != KP_FAILED && r != KP_NOT_RUN;
}

/* A receipt without inputs: NULL when the runner writes such a receipt (nothing ran that needed them), else what
 * in it says a check ran (written into why). */
static const char *claims_checks(const cJSON *rec, char *why, size_t len) {
    const cJSON *result = cJSON_GetObjectItemCaseSensitive(rec, "result");
    if (says_checked(result)) {
        snprintf(why, len, "its result is %s", cJSON_IsString(result) ? result->valuestring : "missing");
        return why;
    }
    const cJSON *chk;
    cJSON_ArrayForEach(chk, cJSON_GetObjectItemCaseSensitive(rec, "checks")) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(chk, "result");
        if (!says_checked(r)) continue;
        const char *label = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(chk, "label"));
        snprintf(why, len, "its check '%s' is %s", label ? label : "?", cJSON_IsString(r) ? r->valuestring : "missing");
        return why;
    }
    return NULL;
}

static void list_not_replayed(kp_replay_report *report, const char *file, const char *name, const cJSON *rec) {
    report->not_replayed++;
    const char *result = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "result"));
    char *line = NULL, *grown = NULL;
    if (asprintf(&line, "%s (%s): %s\n", file, name, result ? result : "?") < 0) return;
    if (asprintf(&grown, "%s%s", report->not_replayed_list ? report->not_replayed_list : "", line) >= 0) {
        free(report->not_replayed_list);
        report->not_replayed_list = grown;
    }
    free(line);
}

static int replay_receipt(const char *dir, const char *file, kp_replay_report *report, kp_error *err) {
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
        kp_error_prefix(err, "%s (%s): ", file, name->valuestring);
        rc = err->code;
    }
    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(rec, "inputs");
    if (!rc && !inputs) {
        char why[300];
        if (claims_checks(rec, why, sizeof why))
            rc = kp_fail(err, KP_EXIT_INCORRECT, "%s (%s): the receipt records no inputs, yet %s: its checks cannot be "
                         "replayed (a receipt is written without inputs only for a case that FAILED or was NOT_RUN "
                         "before they were made)", file, name->valuestring, why);
        else
            list_not_replayed(report, file, name->valuestring, rec);
        cJSON_Delete(rec);
        return rc;
    }
    const kp_family *fam = rc ? NULL : kp_family_find(kc.family);
    if (!rc && !fam)
        rc = kp_fail(err, KP_EXIT_INCORRECT, "%s (%s): family %s has no harness family here", file, name->valuestring,
                     kc.family);
    kp_prepared p = {0};
    if (!rc && kp_prepare_uncached(fam, &kc, 0, &p, err)) rc = err->code; /* regenerated, never read back */
    if (!rc) {
        cJSON *now = cJSON_CreateObject();
        kp_describe_inputs(&p, now);
        kp_digests_settle();
        for (const cJSON *t = now->child; t && !rc; t = t->next) {
            const cJSON *was = cJSON_GetObjectItemCaseSensitive(inputs, t->string);
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(t, "sha256");
            const cJSON *b = was ? cJSON_GetObjectItemCaseSensitive(was, "sha256") : NULL;
            if (!cJSON_IsString(b) || strcmp(a->valuestring, b->valuestring))
                rc = kp_fail(err, KP_EXIT_INCORRECT, "%s (%s): input '%s' regenerates to %s, the receipt records %s", file,
                             name->valuestring, t->string, a->valuestring, cJSON_IsString(b) ? b->valuestring : "nothing");
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
            rc = kp_fail(err, KP_EXIT_INCORRECT, "%s (%s): the reference regenerates to %s, the receipt records %s", file,
                         name->valuestring, cJSON_IsString(now) ? now->valuestring : "nothing", ref_sha->valuestring);
        cJSON_Delete(desc);
        report->with_reference += !rc;
    }
    report->replayed += !rc;
    kp_prepared_release(&p);
    cJSON_Delete(rec);
    return rc;
}

int kp_replay_bundle(const char *dir, kp_replay_report *report, kp_error *err) {
    kp_replay_report mine = {0};
    if (!report) report = &mine;
    memset(report, 0, sizeof *report);
    char path[1024];
    snprintf(path, sizeof path, "%s/bundle.json", dir);
    cJSON *bundle = NULL;
    if (kp_bundle_read_json(path, &bundle, err)) return err->code;
    const cJSON *receipts = cJSON_GetObjectItemCaseSensitive(bundle, "receipts");
    int rc = 0;
    for (const cJSON *r = receipts ? receipts->child : NULL; r && !rc; r = r->next) {
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(r, "file");
        if (!cJSON_IsString(file)) rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle.json: a receipt entry has no file");
        else rc = replay_receipt(dir, file->valuestring, report, err);
    }
    cJSON_Delete(bundle);
    kp_replay_report_free(&mine);
    return rc;
}

void kp_replay_report_free(kp_replay_report *report) {
    free(report->not_replayed_list);
    report->not_replayed_list = NULL;
}
