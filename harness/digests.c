/* digests.c: the receipts' digests, hashed on worker threads while a case goes on (kp_harness.h).
 * Each pending digest knows where its hex goes: a buffer of the caller's, and the JSON string
 * items that name it, which hold a placeholder until kp_digests_settle. */
#include "kp_harness.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DIGEST_PLACES 4 /* JSON items one digest fills; a case records each digest once or twice */
#define DIGEST_RANGES 16 /* address ranges a digest reads, as kept for kp_digests_settle_reading */
#define DIGEST_GAP ((uintptr_t)64 << 10) /* spans this close in order share a range (a strided tensor's rows) */

typedef struct pending {
    kp_sha256_job *job;
    char *hex_out; /* the caller's buffer, or NULL: own */
    kp_sha256_points *points; /* the caller's, or NULL: not wanted */
    char own[KP_SHA256_HEX_LEN];
    /* the bytes its spans read lie in these ranges: one a tensor, not one from the lowest span to the highest, which
       across tensors in separate allocations took in memory allocated between them later (a run's fresh output
       block), and freeing that waited for a digest that never read it */
    uintptr_t lo[DIGEST_RANGES], hi[DIGEST_RANGES];
    int nranges;
    int nplaces;
    cJSON *place[DIGEST_PLACES];
} pending;

static pending *pend;
static int npend, cap;

static void add_place(pending *p, cJSON *obj, const char *key) {
    KP_ASSERT(p->nplaces < DIGEST_PLACES);
    cJSON *item = cJSON_AddStringToObject(obj, key, "(digest pending)");
    if (!item) KP_OUT_OF_MEMORY("recording a digest");
    p->place[p->nplaces++] = item;
}

void kp_digest_start(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans, char *hex_out,
                     cJSON *obj, const char *key) {
    kp_digest_start_points(prefix, prefix_len, spans, nspans, hex_out, NULL, obj, key);
}

void kp_digest_start_points(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans, char *hex_out,
                            kp_sha256_points *points, cJSON *obj, const char *key) {
    const double t0 = kp_now();
    if (npend == cap) {
        int grown_cap = cap ? 2 * cap : 16;
        pending *grown = realloc(pend, sizeof *pend * (size_t)grown_cap);
        if (!grown) KP_OUT_OF_MEMORY("for pending digests");
        pend = grown, cap = grown_cap;
    }
    pending *p = &pend[npend++];
    *p = (pending){.job = kp_sha256_job_start(prefix, prefix_len, spans, nspans), .hex_out = hex_out, .points = points};
    for (size_t i = 0; i < nspans; i++) { /* spans in order, merged while each starts within DIGEST_GAP of the last */
        const uintptr_t a = (uintptr_t)spans[i].data, b = a + spans[i].len;
        if (!spans[i].len) continue;
        int r = p->nranges - 1;
        if (r < 0 || a < p->lo[r] || a > p->hi[r] + DIGEST_GAP) {
            if (p->nranges < DIGEST_RANGES) r = p->nranges++, p->lo[r] = a, p->hi[r] = b;
            else p->lo[r] = a < p->lo[r] ? a : p->lo[r]; /* out of ranges: the last one widens (waits more, never less) */
        }
        if (b > p->hi[r]) p->hi[r] = b;
    }
    if (obj) add_place(p, obj, key);
    kp_stage_add(KP_STAGE_DIGESTS, kp_now() - t0);
}

void kp_digest_record(cJSON *obj, const char *key, const char *hex_out) {
    for (int i = 0; hex_out && i < npend; i++)
        if (pend[i].hex_out == hex_out) {
            add_place(&pend[i], obj, key);
            return;
        }
    cJSON_AddStringToObject(obj, key, hex_out); /* settled already */
}

/* Wait for pending digest i, fill its places. */
static void settle_one(int i) {
    char *hex = pend[i].hex_out ? pend[i].hex_out : pend[i].own;
    kp_sha256_job_join_points(pend[i].job, hex, pend[i].points);
    for (int k = 0; k < pend[i].nplaces; k++)
        if (!cJSON_SetValuestring(pend[i].place[k], hex))
            KP_OUT_OF_MEMORY("recording a digest");
}

void kp_digests_settle(void) {
    if (npend == 0) return;
    const double t0 = kp_now();
    for (int i = 0; i < npend; i++) settle_one(i);
    npend = 0;
    kp_stage_add(KP_STAGE_DIGESTS, kp_now() - t0);
}

void kp_digests_settle_reading(const void *data, size_t bytes) {
    if (npend == 0 || !bytes) return;
    const double t0 = kp_now();
    const uintptr_t lo = (uintptr_t)data, hi = lo + bytes;
    int kept = 0;
    for (int i = 0; i < npend; i++) {
        bool reads = false;
        for (int r = 0; r < pend[i].nranges && !reads; r++) reads = pend[i].lo[r] < hi && lo < pend[i].hi[r];
        if (reads) settle_one(i);
        else pend[kept++] = pend[i]; /* the others go on, in the order they started */
    }
    npend = kept;
    kp_stage_add(KP_STAGE_DIGESTS, kp_now() - t0);
}
