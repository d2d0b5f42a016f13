/* mla_export.c: the mla family's export stage (harness/export.c writes it out): what case.json says of each array, and
 * the arrays a program reading the export without kparity needs beside the inputs (the page table, the values before
 * quantization) with the cache's layout. */
#include <stdint.h>

#include "../receipts/kp_json.h"
#include "mla_family.h"

/* What an export says of each array (kparity export, case.json); the page table and the values before quantization
 * go with the inputs, and case.json's layout says which cache pages are the case's requests' and which fillers'. */
const kp_array_doc kp_mla_array_docs[] = {
    {KP_ARRAY_INPUT, "q", "[batch, s_q, h_q, 576]: request, its query row, head, column", "queries: 512 NoPE then 64 "
     "RoPE columns a head"},
    {KP_ARRAY_INPUT, "indices", "[batch, s_q, topk]: request, query row, slot", "each query row's top-k as slots of the "
     "whole cache (physical page * page + offset, FlashMLA's indices_in_kvcache), -1 for none: token = "
     "cache.reshape(-1, cache.shape[-1])[slot]"},
    {KP_ARRAY_INPUT, "cache", "[pages, page, 656] bytes (cache=fp8_ds_mla) or [pages, page, 576] (cache=bf16): physical "
     "page, token in it, byte or column; every request's pages, filler requests' too (layout.requests)",
     "the paged KV cache; an fp8_ds_mla token is 512 e4m3 codes, 4 f32 tile scales (one per 128 values), 64 bf16 RoPE "
     "values; tokens no counted slot names hold NaN"},
    {KP_ARRAY_INPUT, "topk_length", "[batch, s_q] (topk_length=on or request only)", "slot j of a query row counts only "
     "when j < its topk_length"},
    {KP_ARRAY_INPUT, "attn_sink", "[h_q] (sink=on or inf only)", "each head's attention sink: exp(sink) joins the "
     "softmax's denominator"},
    {KP_ARRAY_OUTPUT, "out", "[batch, s_q, h_q, 512]", "softmax(sm_scale q . k) . v over the row's counted slots (V: the "
     "first 512 columns); 0 for a row with none"},
    {KP_ARRAY_OUTPUT, "lse", "[batch, s_q, h_q]", "the natural log of the softmax's sum; +inf for a row with no counted "
     "slot"},
    {KP_ARRAY_OUTPUT, "max_logits", "[batch, s_q, h_q]", "the largest sm_scale q . k over the counted slots; -inf for a "
     "row with none"},
    {KP_ARRAY_OUTPUT, "splits", "[batch]", "how many splits the impl cut each request's slots into (the order it worked "
     "in, not part of the answer)"},
    {KP_ARRAY_REFERENCE, "out", "[batch, s_q, h_q, 512]", "out in float64 on the cache dequantized exactly (f32 scales)"},
    {KP_ARRAY_REFERENCE, "lse", "[batch, s_q, h_q]", "lse in float64 on the dequantized cache"},
    {KP_ARRAY_REFERENCE, "max_logits", "[batch, s_q, h_q]", "max_logits in float64 on the dequantized cache"},
    {KP_ARRAY_REFERENCE, "out@unquantized", "[batch, s_q, h_q, 512] (cache=fp8_ds_mla only)", "out in float64 on kv, the "
     "values before quantization: the quantization error, reported beside the verdict"},
    {KP_ARRAY_REFERENCE, "lse@unquantized", "[batch, s_q, h_q] (cache=fp8_ds_mla only)", "lse in float64 on kv"},
    {KP_ARRAY_REFERENCE, "max_logits@unquantized", "[batch, s_q, h_q] (cache=fp8_ds_mla only)", "max_logits in float64 "
     "on kv"},
    {KP_ARRAY_EXTRA, "page_table", "[requests, P], P = ceil(s_kv / page): request r (the case's first, then fillers: "
     "layout.requests), its logical page p", "the physical cache page holding tokens [p * page, (p + 1) * page) of "
     "request r"},
    {KP_ARRAY_EXTRA, "kv", "[pages, page, 576]: laid out as cache (cache=fp8_ds_mla only)", "the values before "
     "quantization, what the reference's @unquantized arrays are computed on (a bf16 cache holds exactly these)"},
    {0, NULL, NULL, NULL},
};

/* The page table of every request the cache holds and, for fp8_ds_mla, the values before quantization; which requests
 * are the case's (its inputs' dim 0) and which are fillers (a batch probe's extra requests, whose pages the cache holds
 * so that its bytes do not depend on the checks asked for). */
int kp_mla_export_extras(const void *data, kp_tensor *t, cJSON *layout) {
    const mla_data *d = data;
    const kp_mla_case *mc = &d->mc;
    const int64_t P = d->sz.pages_per_request, requests = d->sz.pages / P;
    int n = 0;
    t[n++] = (kp_tensor){.name = "page_table", .dtype = KP_I32, .ndim = 2, .shape = {requests, P}, .data = d->pages};
    if (d->kv)
        t[n++] = (kp_tensor){.name = "kv", .dtype = KP_BF16, .ndim = 3, .shape = {d->sz.pages, mc->page, KP_MLA_D_QK},
                             .data = d->kv};
    cJSON *r = cJSON_AddObjectToObject(layout, "requests");
    kp_json_add_int(r, "case", mc->batch);
    kp_json_add_int(r, "filler", requests - mc->batch);
    cJSON_AddStringToObject(r, "note", "the cache holds every request's pages: the case's requests are 0 .. case - 1 (the "
                            "inputs' dim 0) and own physical pages [0, case * P); the fillers (batch probes' extra "
                            "requests) own the rest. A request's token t is at cache page page_table[r, t / page], slot "
                            "t % page");
    kp_json_add_int(r, "pages_per_request", P);
    cJSON *per = cJSON_AddArrayToObject(r, "per_request");
    for (int64_t q = 0; q < requests; q++) {
        cJSON *one = cJSON_CreateObject();
        cJSON_AddItemToArray(per, one);
        kp_json_add_int(one, "request", q);
        cJSON_AddStringToObject(one, "role", q < mc->batch ? "case" : "filler");
        cJSON *pages = cJSON_AddArrayToObject(one, "pages");
        for (int64_t p = 0; p < P; p++) cJSON_AddItemToArray(pages, kp_json_int(d->pages[q * P + p]));
    }
    return n;
}

