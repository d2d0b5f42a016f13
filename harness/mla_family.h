/* mla_family.h: what the mla family's harness files share (mla_family.c, the record and its tensors;
 * mla_batch.c, its batch threshold and probes; mla_export.c, what an export says and writes beside the inputs): the
 * prepared case. */
#ifndef MLA_FAMILY_H
#define MLA_FAMILY_H

#include "../cases/mla_case.h"
#include "kp_harness.h"

typedef struct mla_data {
    kp_mla_case mc;
    kp_mla_sizes sz;       /* for every request the case holds, its extra ones too */
    int in_tl, in_sink;    /* input positions of topk_length and attn_sink, or -1 */
    int32_t *positions;    /* [rows, topk]: token positions in the request (the reference reads these) */
    int32_t *pages;        /* [requests, P] */
    uint16_t *kv;          /* [pages, page, 576] the values before quantization (fp8_ds_mla only) */
    const uint16_t *q;     /* the inputs (the harness holds them) */
    const void *cache;
    const int32_t *topk_length;
    const float *sink;
    double *ref[6];        /* out, lse, max_logits on the cache; the same on kv (fp8_ds_mla only) */
    bool ref_borrowed;     /* ref points into the cache's entry (reference_adopt): not ours to free */
} mla_data;

enum { IN_Q = 0, IN_INDICES, IN_CACHE };
enum { ST_POSITIONS = 0, ST_PAGES, ST_KV }; /* its state arrays (kp_shapes_state), bytes */

/* mla_batch.c: the batch size at which split_count stops splitting a full-length request (kp_family.case_thresholds),
 * the filler requests that makes a case hold, and a probe's split counts (kp_family.describe_probe). */
int kp_mla_case_thresholds(const kp_case *c, kp_threshold *t);
int64_t kp_mla_extra_requests(const kp_case *c);
void kp_mla_describe_probe(const void *data, const kp_output *probe, const int64_t *rows, int64_t nrows,
                           const kp_output *full, cJSON *p);
/* mla_export.c */
extern const kp_array_doc kp_mla_array_docs[];
int kp_mla_export_extras(const void *data, kp_tensor *t, cJSON *layout);

#endif
