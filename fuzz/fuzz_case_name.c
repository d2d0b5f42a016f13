/* fuzz_case_name.c: libFuzzer target for case names: kp_case_parse, kp_case_format, kp_case_normalize, the
 * family's field-table decode and its size estimate. Beyond "no crash": parse and format round-trip, and the canonical
 * form is a fixed point (two spellings of one case get one name, and both read as the same case). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_case.h"
#include "../harness/kp_harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *name = malloc(size + 1);
    KP_ASSERT(name);
    memcpy(name, data, size);
    name[size] = '\0';
    kp_case c, raw, again;
    kp_error err = {0};
    char canon[KP_CASE_NAME_MAX], canon2[KP_CASE_NAME_MAX];
    if (kp_case_parse(name, &c, &err)) {
        KP_ASSERT(err.code == KP_EXIT_USAGE && err.msg[0]);
        goto out;
    }
    /* syntax: the formatted name parses back to the very same fields */
    if (kp_case_format(&c, canon, sizeof canon) >= 0) {
        KP_ASSERT(kp_case_parse(canon, &again, &err) == 0);
        KP_ASSERT(kp_case_format(&again, canon2, sizeof canon2) >= 0 && !strcmp(canon, canon2));
    }
    raw = c;
    if (kp_case_normalize(&c, &err)) {
        KP_ASSERT(err.code == KP_EXIT_USAGE && err.msg[0]);
        goto out;
    }
    if (kp_case_format(&c, canon, sizeof canon) < 0) goto out; /* the config refuses it as too long */
    /* the canonical name is a fixed point of parse + normalize */
    KP_ASSERT(kp_case_parse(canon, &again, &err) == 0);
    KP_ASSERT(kp_case_normalize(&again, &err) == 0);
    KP_ASSERT(kp_case_format(&again, canon2, sizeof canon2) >= 0);
    if (strcmp(canon, canon2)) kp_abort(__FILE__, __LINE__, "'%s' normalizes to '%s', which normalizes to '%s'", name, canon, canon2);
    /* the name as given and its canonical form decode as one case (the fields the hooks read) */
    const kp_case_family *cf = kp_case_family_find(c.family);
    alignas(max_align_t) unsigned char given[KP_CASE_FIELDS_MAX];
    KP_ASSERT(cf && kp_case_decode(&raw, cf, given, &err) == 0);
    if (memcmp(given, kp_case_fields(&again, cf), cf->fields_size))
        kp_abort(__FILE__, __LINE__, "'%s' and its canonical '%s' decode differently", name, canon);
    const kp_family *fam = kp_family_find(c.family);
    if (fam) {
        kp_shapes s;
        memset(&s, 0, sizeof s);
        if (!fam->shapes(&c, kp_family_probe_rows(fam, &c), &s, &err))
            KP_ASSERT(s.ninputs >= 1 && s.noutputs >= 1 && s.rows_total >= s.batch);
        kp_threshold t[KP_THRESHOLDS_MAX];
        int n = kp_family_thresholds(fam, &c, t);
        KP_ASSERT(n >= 0 && n <= KP_THRESHOLDS_MAX);
    }
out:
    free(name);
    return 0;
}
