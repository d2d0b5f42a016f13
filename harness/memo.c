/* memo.c: a family's judgements of outputs, one per (output, rule parameters), the oldest freed past
 * KP_MEMO_MAX (kp_harness.h, kp_memo). */
#include <string.h>

#include "kp_harness.h"

void *kp_memo_find(const kp_memo *m, const kp_output *out, const void *params) {
    for (int i = 0; i < m->n; i++)
        if (m->e[i].out == out && !memcmp(m->e[i].params, params, m->params_bytes)) return m->e[i].value;
    return NULL;
}

void *kp_memo_add(kp_memo *m, const kp_output *out, const void *params, void *value) {
    KP_ASSERT(m->params_bytes <= KP_PARAMS_MAX);
    if (m->n == KP_MEMO_MAX) { /* evict the oldest */
        m->free_value(m->e[0].value);
        memmove(&m->e[0], &m->e[1], sizeof m->e[0] * (KP_MEMO_MAX - 1));
        m->n--;
    }
    m->e[m->n].out = out;
    memset(m->e[m->n].params, 0, sizeof m->e[m->n].params);
    memcpy(m->e[m->n].params, params, m->params_bytes);
    m->e[m->n].value = value;
    return m->e[m->n++].value;
}

void kp_memo_clear(kp_memo *m) {
    for (int i = 0; i < m->n; i++) m->free_value(m->e[i].value);
    m->n = 0;
}
