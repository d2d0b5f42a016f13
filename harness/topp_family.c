/* topp_family.c: the topp family's hooks for the runner: inputs, running an impl on any rows,
 * the reference, the rule check with classified mismatches, exact-parity evidence, export. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../cases/kp_tensor.h"
#include "../cases/topp_case.h"
#include "../receipts/kp_json.h"
#include "../receipts/kp_npy.h"
#include "kp_device.h"
#include "kp_harness.h"

#define MAX_JUDGED 8

typedef struct topp_out {
    int64_t nrows, stride, vocab;
    float *x;     /* [nrows, stride] */
    size_t bytes; /* x's size, at least nrows * stride floats (a pooled buffer may be larger) */
    int pinned;
} topp_out;

/* One impl's buffers, kept for the whole case: a batch probe runs an impl ~140 times, and
 * allocating, filling and uploading 40 MB each time cost more than the kernels. */
typedef struct topp_slot {
    const kp_impl *impl;
    kp_buf in, out, tp, ws;
} topp_slot;

typedef struct topp_data {
    kp_topp_case tc;
    int64_t rows_total;   /* batch + extra filler rows */
    float *logits;        /* [rows_total, stride] */
    float *top_p;         /* [rows_total] */
    int have_ref;
    kp_topp_ref ref;
    char ref_digest[KP_SHA256_HEX_LEN];
    double ref_seconds;
    struct {
        const void *out;
        kp_tie_policy policy;
        double band;
        kp_topp_judgement j;
    } judged[MAX_JUDGED];
    int njudged;
    uint64_t generation; /* which prepared case this is, for the buffer cache */
} topp_data;

/* Buffers outlive cases: a gate of twelve cases would otherwise allocate, pin and free ~100 device
 * and page-locked buffers, which on an H200 host cost more than the kernels. Buffers only grow;
 * `all` holds the current case's rows, uploaded once per case and memory kind. */
static struct {
    kp_buf all[2], all_tp[2];
    uint64_t all_generation[2];
    topp_slot slots[MAX_JUDGED];
    int nslots;
    uint64_t next_generation;
} g_cache;

/* Output buffers of POOL_MIN_BYTES or more are recycled: a batch check makes ~140 outputs per impl,
 * and fresh 40 MB allocations cost page faults on every first touch. Those a device copies into
 * are page-locked once (cudaHostRegister), so device outputs copy straight into them at full speed. */
#define POOL_MAX 8
#define POOL_MIN_BYTES ((size_t)1 << 20)
static topp_out g_pool[POOL_MAX]; /* x, bytes and pinned of each free buffer */
static int g_pool_count;

/* o->x: at least `bytes`, the smallest pooled buffer that fits or a new one (page-locked when `pin`
 * and large); o->bytes and o->pinned describe it. */
static void output_alloc(topp_out *o, size_t bytes, int pin) {
    int best = -1;
    for (int i = 0; i < g_pool_count; i++)
        if (g_pool[i].bytes >= bytes && (best < 0 || g_pool[i].bytes < g_pool[best].bytes)) best = i;
    if (best >= 0) {
        o->x = g_pool[best].x, o->bytes = g_pool[best].bytes, o->pinned = g_pool[best].pinned;
        g_pool[best] = g_pool[--g_pool_count];
        return;
    }
    o->x = malloc(bytes ? bytes : 1);
    o->bytes = bytes;
    o->pinned = pin && o->x && bytes >= POOL_MIN_BYTES && kp_host_register(o->x, bytes);
}

static void output_release(const topp_out *o) {
    if (!o->x) return;
    if (o->bytes >= POOL_MIN_BYTES && g_pool_count < POOL_MAX) {
        g_pool[g_pool_count++] = *o;
        return;
    }
    if (o->pinned) kp_host_unregister(o->x);
    free(o->x);
}

/* Grow a cached buffer to at least `bytes` (contents are not kept). */
static int cache_reserve(kp_buf *b, kp_memory mem, size_t bytes, const char *name, kp_error *err) {
    if (b->base && b->memory == mem && b->bytes >= bytes) return 0;
    kp_buf_free(b);
    return kp_buf_alloc(b, mem, bytes, name, err);
}

static int topp_prepare(const kp_case *c, int64_t extra_rows, void **data, kp_error *err) {
    topp_data *d = kp_calloc(1, sizeof *d, "topp case", err);
    if (!d) return err->code;
    int rc = kp_topp_case_read(c, &d->tc, err);
    if (rc) return free(d), rc;
    d->rows_total = d->tc.batch + extra_rows;
    d->generation = ++g_cache.next_generation;
    d->logits = kp_calloc((size_t)(d->rows_total * d->tc.stride), sizeof(float), "logits", err);
    d->top_p = kp_calloc((size_t)d->rows_total, sizeof(float), "top_p", err);
    if (!d->logits || !d->top_p || (rc = kp_topp_case_rows(&d->tc, 0, d->rows_total, d->logits, d->top_p, err))) {
        free(d->logits), free(d->top_p), free(d);
        return err->code;
    }
    *data = d;
    return 0;
}

static void topp_release(void *data) {
    topp_data *d = data;
    if (!d) return;
    kp_digests_settle(); /* digests may still be reading the inputs or the reference */
    for (int i = 0; i < d->njudged; i++) kp_topp_judgement_free(&d->judged[i].j);
    if (d->have_ref) kp_topp_ref_free(&d->ref);
    free(d->logits);
    free(d->top_p);
    free(d);
}

static int64_t topp_batch(const void *data) { return ((const topp_data *)data)->tc.batch; }

static size_t topp_estimate(const kp_case *c, int nimpls, kp_error *err) {
    kp_topp_case tc;
    if (kp_topp_case_read(c, &tc, err)) return 0;
    /* inputs (+65 filler rows), one output per impl run kept at once (+ repeat/probe scratch),
     * the reference (keep, in_group: 1 byte; prob, mass_before: 8 bytes) and judgements */
    double rows = (double)tc.batch + 65.0, elems = (double)tc.batch * (double)tc.vocab;
    double bytes = rows * (double)tc.stride * 4.0 * (double)(nimpls + 3) + elems * (2.0 + 16.0 + 3.0 * 8.0);
    return bytes > 1.8e19 ? 0 : (size_t)bytes;
}

static size_t topp_estimate_device(const kp_case *c, const kp_impl *impl, kp_error *err) {
    kp_topp_case tc;
    if (kp_topp_case_read(c, &tc, err)) return 0;
    int64_t rows = tc.batch > 65 ? tc.batch : 65; /* the 65-row probe */
    kp_topp_args args = {.batch = rows, .vocab = tc.vocab, .row_stride = tc.stride, .sm_count = kp_device_sm_count()};
    size_t ws = impl->workspace_bytes ? impl->workspace_bytes(&args) : 0;
    double bytes = 2.0 * (double)rows * (double)tc.stride * 4.0 + (double)rows * 4.0 + (double)ws + 4.0 * KP_GUARD_BYTES * 2;
    return bytes > 1.8e19 ? 0 : (size_t)bytes;
}

static void add_tensor(cJSON *inputs, const char *name, kp_dtype dtype, int ndim, const int64_t *shape, int64_t stride,
                       const void *data) {
    cJSON *t = cJSON_AddObjectToObject(inputs, name);
    cJSON_AddStringToObject(t, "dtype", kp_dtype_name(dtype));
    cJSON *s = cJSON_AddArrayToObject(t, "shape");
    for (int i = 0; i < ndim; i++) cJSON_AddItemToArray(s, kp_json_int(shape[i]));
    if (stride) kp_json_add_int(t, "row_stride", stride);
    unsigned char prefix[KP_TENSOR_PREFIX_MAX];
    kp_span *rows;
    size_t nrows;
    const size_t n = kp_buffer_digest_parts(dtype, ndim, shape, stride, data, prefix, &rows, &nrows);
    kp_digest_start(prefix, n, rows, nrows, NULL, t, "sha256"); /* kp_buffer_digest's hex, at settle */
    free(rows);
}

static void topp_describe_inputs(const void *data, cJSON *inputs) {
    const topp_data *d = data;
    int64_t shape[2] = {d->tc.batch, d->tc.vocab};
    add_tensor(inputs, "logits", KP_F32, 2, shape, d->tc.stride, d->logits);
    add_tensor(inputs, "top_p", KP_F32, 1, shape, 0, d->top_p);
}

/* One launch on chosen rows, in the impl's cached slot. The rows in use of `out` start filled with
 * guard bytes (so a write into row padding [vocab, stride) shows) and so do the KP_GUARD_BYTES
 * right after them (so a write one row past the batch shows even in a larger buffer). */
typedef struct topp_launch {
    const kp_impl *impl;
    int64_t nrows;
    topp_slot *slot;
    kp_topp_args args;
} topp_launch;

/* The guard bytes right after the `used` bytes of a cached output (up to KP_GUARD_BYTES, within the
 * buffer; its own guard region follows). */
static size_t guard_after(const kp_buf *out, size_t used) {
    return out->bytes - used < KP_GUARD_BYTES ? out->bytes - used : KP_GUARD_BYTES;
}

static topp_slot *slot_for(topp_data *d, const kp_impl *impl, kp_error *err) {
    kp_memory mem = impl->memory;
    const size_t rows_bytes = (size_t)(d->rows_total * d->tc.stride) * sizeof(float);
    const size_t tp_bytes = (size_t)d->rows_total * sizeof(float);
    if (g_cache.all_generation[mem] != d->generation) {
        g_cache.all_generation[mem] = 0;
        if (cache_reserve(&g_cache.all[mem], mem, rows_bytes, "logits (all rows)", err) ||
            kp_buf_upload(&g_cache.all[mem], d->logits, rows_bytes, "logits (all rows)", err) ||
            cache_reserve(&g_cache.all_tp[mem], mem, tp_bytes, "top_p (all rows)", err) ||
            kp_buf_upload(&g_cache.all_tp[mem], d->top_p, tp_bytes, "top_p (all rows)", err))
            return NULL;
        g_cache.all_generation[mem] = d->generation;
    }
    topp_slot *sl = NULL;
    for (int i = 0; i < g_cache.nslots && !sl; i++)
        if (g_cache.slots[i].impl == impl) sl = &g_cache.slots[i];
    if (!sl) {
        if (g_cache.nslots == MAX_JUDGED) {
            kp_fail(err, KP_EXIT_USAGE, "more than %d impls in one run", MAX_JUDGED);
            return NULL;
        }
        sl = &g_cache.slots[g_cache.nslots++];
        memset(sl, 0, sizeof *sl);
        sl->impl = impl;
    }
    if (cache_reserve(&sl->in, mem, rows_bytes, "logits", err) || cache_reserve(&sl->out, mem, rows_bytes, "out", err) ||
        cache_reserve(&sl->tp, mem, tp_bytes, "top_p", err))
        return NULL;
    return sl;
}

static kp_result launch_setup(topp_data *d, const kp_impl *impl, const int64_t *rows, int64_t nrows, topp_launch *L,
                              kp_error *err) {
    const int64_t S = d->tc.stride, V = d->tc.vocab;
    const size_t row_bytes = (size_t)S * sizeof(float), used = row_bytes * (size_t)nrows;
    memset(L, 0, sizeof *L);
    L->impl = impl, L->nrows = nrows;
    kp_memory mem = impl->memory;
    if (mem == KP_MEMORY_CUDA && kp_device_init(err)) return KP_NOT_RUN;
    for (int64_t i = 0; i < nrows; i++) KP_ASSERT(rows[i] >= 0 && rows[i] < d->rows_total);
    KP_ASSERT(nrows <= d->rows_total);
    topp_slot *sl = slot_for(d, impl, err);
    if (!sl) return KP_FAILED;
    L->slot = sl;
    const size_t after = guard_after(&sl->out, used);
    if (kp_buf_gather_rows(&sl->in, &g_cache.all[mem], rows, nrows, row_bytes, "logits", err) ||
        kp_buf_gather_rows(&sl->tp, &g_cache.all_tp[mem], rows, nrows, sizeof(float), "top_p", err) ||
        kp_buf_fill_guard(&sl->out, 0, used + after, "out", err))
        return KP_FAILED;
    kp_topp_args args = {.logits = kp_buf_ptr(&sl->in), .out = kp_buf_ptr(&sl->out), .top_p = kp_buf_ptr(&sl->tp),
                         .batch = nrows, .vocab = V, .row_stride = S,
                         .stream = mem == KP_MEMORY_CUDA ? kp_device_stream() : NULL,
                         .sm_count = mem == KP_MEMORY_CUDA ? kp_device_sm_count() : 0};
    L->args = args;
    char message[512] = "";
    if (impl->supports && impl->supports(&L->args, message, sizeof message) != KP_RUN_OK) {
        kp_fail(err, KP_EXIT_OK, "%s refuses this shape: %s", impl->name, message);
        return KP_NOT_SUPPORTED;
    }
    size_t ws = impl->workspace_bytes ? impl->workspace_bytes(&L->args) : 0;
    if (ws > sl->ws.bytes) {
        kp_buf_free(&sl->ws);
        if (kp_buf_alloc(&sl->ws, mem, ws, "workspace", err)) return KP_FAILED;
    }
    if (ws) L->args.workspace = kp_buf_ptr(&sl->ws), L->args.workspace_bytes = ws;
    return KP_PASSED;
}

/* Launch once; for CUDA impls the launch is asynchronous (kp_sync waits). */
static kp_result launch_run(topp_launch *L, kp_error *err) {
    char message[512] = "";
    int rc = L->impl->run(&L->args, message, sizeof message);
    if (rc == KP_RUN_NOT_SUPPORTED) {
        kp_fail(err, KP_EXIT_OK, "%s refuses this shape: %s", L->impl->name, message);
        return KP_NOT_SUPPORTED;
    }
    if (rc != KP_RUN_OK) {
        kp_fail(err, KP_EXIT_ENV, "%s failed: %s", L->impl->name, message[0] ? message : "no message");
        return KP_FAILED;
    }
    return KP_PASSED;
}

/* Wait, check every guard and the row padding, and copy the output back. */
static kp_result launch_collect(topp_data *d, topp_launch *L, float *x, kp_error *err) {
    const int64_t S = d->tc.stride, V = d->tc.vocab;
    topp_slot *sl = L->slot;
    size_t bytes = (size_t)S * sizeof(float) * (size_t)L->nrows;
    const size_t after = guard_after(&sl->out, bytes);
    if (kp_sync(L->impl->memory, err) || kp_buf_check_guards(&sl->out, "out", err) ||
        kp_buf_check_range(&sl->out, bytes, after, "out", err) || kp_buf_check_guards(&sl->in, "logits", err) ||
        kp_buf_check_guards(&sl->tp, "top_p", err) ||
        (L->args.workspace_bytes && kp_buf_check_guards(&sl->ws, "workspace", err)) ||
        kp_buf_download(&sl->out, x, bytes, "out", err))
        return KP_FAILED;
    for (int64_t r = 0; r < L->nrows; r++) {
        const unsigned char *pad = (const unsigned char *)(x + r * S + V);
        for (size_t k = 0; k < (size_t)(S - V) * sizeof(float); k++)
            if (pad[k] != KP_GUARD_BYTE) {
                kp_fail(err, KP_EXIT_ENV, "%s wrote into row padding of buffer 'out' (row %lld, element %lld)",
                        L->impl->name, (long long)r, (long long)(V + (int64_t)k / 4));
                return KP_FAILED;
            }
    }
    return KP_PASSED;
}

static kp_result topp_run_rows_timed(void *data, const kp_impl *impl, const int64_t *rows, int64_t nrows, void **outp,
                                     cJSON *info, kp_error *err);
static void topp_free_output(void *out);

static kp_result topp_run_rows(void *data, const kp_impl *impl, const int64_t *rows, int64_t nrows, void **outp,
                               cJSON *info, kp_error *err) {
    double t0 = kp_now();
    kp_result r = topp_run_rows_timed(data, impl, rows, nrows, outp, info, err);
    kp_stage_add(KP_STAGE_KERNELS, kp_now() - t0);
    return r;
}

static kp_result topp_run_rows_timed(void *data, const kp_impl *impl, const int64_t *rows, int64_t nrows, void **outp,
                                     cJSON *info, kp_error *err) {
    topp_data *d = data;
    *outp = NULL;
    topp_out *o = calloc(1, sizeof *o);
    if (o) output_alloc(o, (size_t)d->tc.stride * sizeof(float) * (size_t)nrows, impl->memory == KP_MEMORY_CUDA);
    if (!o || !o->x) {
        if (o) free(o);
        kp_fail(err, KP_EXIT_ENV, "out of host memory for a batch of %lld rows", (long long)nrows);
        return KP_FAILED;
    }
    o->nrows = nrows, o->stride = d->tc.stride, o->vocab = d->tc.vocab;
    topp_launch L;
    kp_result r = launch_setup(d, impl, rows, nrows, &L, err);
    kp_timer *timer = NULL; /* CUDA events around the launch alone, for the receipt (bench flushes L2 too) */
    double t0 = kp_now(), kernel_us = -1;
    if (r == KP_PASSED && info && impl->memory == KP_MEMORY_CUDA &&
        (kp_timer_create(&timer, impl->memory, 0, err) || kp_timer_start(timer, err)))
        r = KP_FAILED;
    if (r == KP_PASSED) r = launch_run(&L, err);
    if (r == KP_PASSED && timer && kp_timer_stop(timer, &kernel_us, err)) r = KP_FAILED;
    if (r == KP_PASSED) r = launch_collect(d, &L, o->x, err);
    double seconds = kp_now() - t0;
    kp_timer_free(timer);
    if (info && r == KP_PASSED) {
        kp_json_add_double(info, "wall_us", seconds * 1e6);
        cJSON_AddStringToObject(info, "wall_note", "one launch, sync, guard checks and copy back; kparity bench times kernels");
        if (kernel_us >= 0) {
            kp_json_add_double(info, "kernel_us", kernel_us);
            cJSON_AddStringToObject(info, "kernel_note", "CUDA events around the first launch (cold: no warm-up)");
        }
        kp_json_add_int(info, "workspace_bytes", (int64_t)L.args.workspace_bytes);
    }
    if (r != KP_PASSED) {
        topp_free_output(o);
        return r;
    }
    *outp = o;
    return KP_PASSED;
}

static int cmp_us(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int topp_bench(void *data, const kp_impl *impl, int reps, cJSON *timing, kp_error *err) {
    topp_data *d = data;
    int64_t B = d->tc.batch, *rows = malloc(sizeof *rows * (size_t)B);
    double *us = malloc(sizeof *us * (size_t)reps);
    if (!rows || !us) {
        free(rows), free(us);
        return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    }
    for (int64_t r = 0; r < B; r++) rows[r] = r;
    topp_launch L;
    kp_timer *timer = NULL;
    int rc = 0;
    kp_result st = launch_setup(d, impl, rows, B, &L, err);
    if (st != KP_PASSED) rc = err->code ? err->code : KP_EXIT_ENV;
    if (!rc) rc = kp_timer_create(&timer, impl->memory, 1, err);
    for (int w = 0; !rc && w < 3; w++) /* warm-up: first-launch costs stay out of the figures */
        if (launch_run(&L, err) != KP_PASSED || kp_sync(impl->memory, err)) rc = err->code ? err->code : KP_EXIT_ENV;
    for (int i = 0; !rc && i < reps; i++) {
        if (kp_timer_start(timer, err) || launch_run(&L, err) != KP_PASSED || kp_timer_stop(timer, &us[i], err))
            rc = err->code ? err->code : KP_EXIT_ENV;
    }
    if (!rc) {
        float *x = malloc((size_t)d->tc.stride * sizeof(float) * (size_t)B);
        if (!x || launch_collect(d, &L, x, err) != KP_PASSED) rc = x ? err->code : kp_fail(err, KP_EXIT_ENV, "out of memory");
        free(x);
    }
    if (!rc) {
        qsort(us, (size_t)reps, sizeof *us, cmp_us);
        double bytes = (double)B * (double)d->tc.vocab * 8.0 + (double)B * 4.0; /* read logits, write out, top_p */
        kp_json_add_int(timing, "reps", reps);
        kp_json_add_double(timing, "median_us", us[reps / 2]);
        kp_json_add_double(timing, "min_us", us[0]);
        kp_json_add_double(timing, "p10_us", us[reps / 10]);
        kp_json_add_double(timing, "p90_us", us[reps - 1 - reps / 10]);
        kp_json_add_double(timing, "max_us", us[reps - 1]);
        kp_json_add_double(timing, "bytes", bytes);
        kp_json_add_double(timing, "gb_per_s", bytes / (us[reps / 2] * 1e-6) / 1e9);
        cJSON_AddStringToObject(timing, "method", impl->memory == KP_MEMORY_CUDA
                                                      ? "CUDA events around one launch, L2 flushed before each rep, 3 warm-ups"
                                                      : "wall clock around one call, 3 warm-ups");
    }
    kp_timer_free(timer);
    free(rows), free(us);
    return rc;
}

static void topp_free_output(void *out) {
    topp_out *o = out;
    if (!o) return;
    kp_digests_settle(); /* a digest may still be reading it */
    output_release(o);
    free(o);
}

static const void *topp_out_row(const void *data, const void *out, int64_t i, size_t *bytes) {
    (void)data;
    const topp_out *o = out;
    *bytes = (size_t)o->vocab * sizeof(float);
    return o->x + i * o->stride;
}

static int topp_reference(void *data, const kp_check_spec *spec, cJSON *desc, kp_error *err) {
    topp_data *d = data;
    if (!d->have_ref) {
        double t0 = kp_now();
        int rc = kp_topp_reference(d->logits, d->tc.batch, d->tc.vocab, d->tc.stride, d->top_p, spec ? spec->band : 0.0,
                                   &d->ref, err);
        if (rc) return rc;
        d->ref_seconds = kp_now() - t0;
        kp_stage_add(KP_STAGE_REFERENCE, d->ref_seconds);
        d->have_ref = 1;
        /* digest of what the rule decided: keep mask, probabilities and C_t, all machine-independent
         * (hashed on a worker thread into ref_digest: kp_digest_start) */
        size_t n = (size_t)(d->tc.batch * d->tc.vocab);
        const kp_span parts[3] = {{d->ref.keep, n}, {d->ref.prob, n * sizeof(double)},
                                  {d->ref.mass_before, n * sizeof(double)}};
        kp_digest_start("kparity.reference.topp/v1", 26, parts, 3, d->ref_digest, NULL, NULL);
    }
    if (desc && !cJSON_GetObjectItemCaseSensitive(desc, "sha256")) {
        cJSON_AddStringToObject(desc, "provider", "reference.topp@host-f64");
        kp_digest_record(desc, "sha256", d->ref_digest);
        cJSON_AddStringToObject(desc, "rule", "keep t iff mass strictly before t in (p desc, index asc) order < top_p; "
                                              "at least one; top_p >= 1 keeps every finite token; NaN never kept");
        kp_json_add_double(desc, "seconds", d->ref_seconds);
        kp_json_add_int(desc, "threads", kp_thread_count());
    }
    return 0;
}

static const kp_topp_judgement *judge(topp_data *d, const kp_check_spec *spec, const topp_out *o, kp_error *err) {
    for (int i = 0; i < d->njudged; i++)
        if (d->judged[i].out == o && d->judged[i].policy == spec->tie_policy && d->judged[i].band == spec->band)
            return &d->judged[i].j;
    if (topp_reference(d, spec, NULL, err)) return NULL;
    if (d->njudged == MAX_JUDGED) { /* evict the oldest */
        kp_topp_judgement_free(&d->judged[0].j);
        memmove(&d->judged[0], &d->judged[1], sizeof d->judged[0] * (MAX_JUDGED - 1));
        d->njudged--;
    }
    int slot = d->njudged;
    double t0 = kp_now();
    int rc = kp_topp_judge(&d->ref, d->logits, o->x, o->stride, spec->tie_policy, spec->band, &d->judged[slot].j, err);
    kp_stage_add(KP_STAGE_JUDGING, kp_now() - t0);
    if (rc) return NULL;
    d->judged[slot].out = o, d->judged[slot].policy = spec->tie_policy, d->judged[slot].band = spec->band;
    d->njudged++;
    return &d->judged[slot].j;
}

static void add_bits(cJSON *obj, const char *key, float v) {
    char text[64];
    uint32_t bits;
    memcpy(&bits, &v, 4);
    snprintf(text, sizeof text, "%.9g (0x%08x)", (double)v, bits);
    cJSON_AddStringToObject(obj, key, text);
}

/* One row of a judgement, with its index lists as evidence. */
static int row_json(topp_data *d, const kp_topp_judgement *j, int64_t r, cJSON *row, kp_evidence *ev, const char *tag,
                    kp_error *err) {
    const kp_topp_row_judgement *rj = &j->rows[r];
    kp_json_add_int(row, "kept", rj->kept_count);
    kp_json_add_double(row, "kept_mass", rj->kept_mass);
    kp_json_add_int(row, "group_kept", rj->group_kept);
    cJSON_AddBoolToObject(row, "group_lowest_first", rj->group_lowest_first);
    cJSON_AddBoolToObject(row, "all_neginf", rj->all_neginf);
    kp_json_add_int(row, "altered", rj->altered_count);
    kp_json_add_int(row, "nan_out", rj->nan_out_count);
    cJSON *flags = cJSON_AddObjectToObject(row, "conformance");
    cJSON_AddBoolToObject(flags, "mass", rj->mass_ok);
    cJSON_AddBoolToObject(flags, "minimal", rj->minimal_ok);
    cJSON_AddBoolToObject(flags, "monotone", rj->monotone_ok);
    cJSON_AddBoolToObject(flags, "no_nan", rj->no_nan_ok);
    cJSON_AddBoolToObject(flags, "nonempty", rj->nonempty_ok);
    cJSON_AddBoolToObject(row, "meets_rule", rj->rule_ok);
    char name[96];
    snprintf(name, sizeof name, "%s.row%lld.strict", tag, (long long)r);
    if (kp_evidence_list(ev, row, "strict", name, j->strict_idx + j->strict_off[r], j->strict_off[r + 1] - j->strict_off[r], err))
        return err->code;
    snprintf(name, sizeof name, "%s.row%lld.tie", tag, (long long)r);
    if (kp_evidence_list(ev, row, "tie", name, j->tie_idx + j->tie_off[r], j->tie_off[r + 1] - j->tie_off[r], err))
        return err->code;
    snprintf(name, sizeof name, "%s.row%lld.band", tag, (long long)r);
    if (kp_evidence_list(ev, row, "band", name, j->band_idx + j->band_off[r], j->band_off[r + 1] - j->band_off[r], err))
        return err->code;
    (void)d;
    return 0;
}

static void ref_row_json(const topp_data *d, int64_t r, cJSON *row) {
    const kp_topp_ref_row *rr = &d->ref.rows[r];
    kp_json_add_float(row, "top_p", (float)rr->top_p);
    kp_json_add_int(row, "finite", rr->finite_count);
    if (rr->nan_count) kp_json_add_int(row, "nan_inputs", rr->nan_count);
    kp_json_add_int(row, "kept", rr->kept_count);
    kp_json_add_double(row, "kept_mass", rr->kept_mass);
    kp_json_add_int(row, "boundary_token", rr->boundary_token);
    if (rr->boundary_token >= 0) add_bits(row, "boundary_logit", rr->boundary_logit);
    kp_json_add_int(row, "tie_group_size", rr->tie_group_size);
    kp_json_add_int(row, "tie_needed", rr->tie_needed);
    kp_json_add_int(row, "band_tokens", rr->band_count);
}

static kp_result topp_rule(void *data, const kp_check_spec *spec, const void *out, const kp_impl *impl, cJSON *check,
                           kp_evidence *ev, kp_error *err) {
    topp_data *d = data;
    const kp_topp_judgement *j = judge(d, spec, out, err);
    if (!j) return KP_FAILED;
    int64_t strict = 0, tie = 0, band = 0, neginf_rows = 0, B = d->tc.batch;
    for (int64_t r = 0; r < B; r++) {
        strict += j->rows[r].strict_count, tie += j->rows[r].tie_count, band += j->rows[r].band_count;
        neginf_rows += j->rows[r].all_neginf;
    }
    cJSON *f = cJSON_AddObjectToObject(check, "findings");
    kp_json_add_int(f, "rows", B);
    kp_json_add_int(f, "rows_meeting_rule", j->rows_rule_ok);
    kp_json_add_int(f, "strict", strict);
    kp_json_add_int(f, "tie", tie);
    kp_json_add_int(f, "band", band);
    kp_json_add_int(f, "all_neginf_rows", neginf_rows);
    cJSON *rows = cJSON_AddArrayToObject(f, "per_row");
    for (int64_t r = 0; r < B; r++) {
        cJSON *row = cJSON_CreateObject();
        cJSON_AddItemToArray(rows, row);
        kp_json_add_int(row, "row", r);
        cJSON *ref = cJSON_AddObjectToObject(row, "reference");
        ref_row_json(d, r, ref);
        cJSON *mine = cJSON_AddObjectToObject(row, "impl");
        if (row_json(d, j, r, mine, ev, impl->name, err)) return KP_FAILED;
    }
    char summary[256];
    snprintf(summary, sizeof summary, "%lld/%lld rows meet the rule; %lld strict, %lld tie, %lld band%s",
             (long long)j->rows_rule_ok, (long long)B, (long long)strict, (long long)tie, (long long)band,
             neginf_rows ? "; ALL -inf rows present" : "");
    if (neginf_rows) {
        size_t n = strlen(summary);
        snprintf(summary + n, sizeof summary - n, " (%lld)", (long long)neginf_rows);
    }
    cJSON_AddStringToObject(check, "summary", summary);
    return j->rows_rule_ok == B ? KP_PASSED : KP_INCORRECT;
}

static int topp_explain_exact(void *data, const kp_check_spec *spec, const void *out_a, const void *out_b,
                              const int64_t *rows, int64_t nrows, cJSON *rows_json, kp_evidence *ev, kp_error *err) {
    topp_data *d = data;
    const kp_topp_judgement *ja = judge(d, spec, out_a, err);
    if (!ja) return err->code;
    const kp_topp_judgement *jb = judge(d, spec, out_b, err);
    if (!jb) return err->code;
    for (int64_t k = 0; k < nrows; k++) {
        int64_t r = rows[k];
        cJSON *row = cJSON_GetArrayItem(rows_json, (int)k);
        cJSON *ref = cJSON_AddObjectToObject(row, "reference");
        ref_row_json(d, r, ref);
        cJSON *a = cJSON_AddObjectToObject(row, spec->impl[0]->name);
        cJSON *b = cJSON_AddObjectToObject(row, spec->impl[1]->name);
        if (row_json(d, ja, r, a, ev, spec->impl[0]->name, err) || row_json(d, jb, r, b, ev, spec->impl[1]->name, err))
            return err->code;
        int ok_a = ja->rows[r].rule_ok, ok_b = jb->rows[r].rule_ok;
        char who[200];
        if (ok_a && ok_b) snprintf(who, sizeof who, "both");
        else if (ok_a) snprintf(who, sizeof who, "%s", spec->impl[0]->name);
        else if (ok_b) snprintf(who, sizeof who, "%s", spec->impl[1]->name);
        else snprintf(who, sizeof who, "neither");
        cJSON_AddStringToObject(row, "meets_rule", who);
    }
    return 0;
}

static int topp_has_defect(void *data, const void *out, const char *defect, int64_t *rows_with) {
    topp_data *d = data;
    const topp_out *o = out;
    *rows_with = 0;
    if (strcmp(defect, "all_neginf")) return 0;
    for (int64_t r = 0; r < d->tc.batch; r++) {
        const float *x = o->x + r * o->stride, *in = d->logits + r * d->tc.stride;
        int finite_in = 0, all = 1;
        for (int64_t i = 0; i < d->tc.vocab; i++) {
            finite_in |= isfinite(in[i]);
            all &= isinf(x[i]) && x[i] < 0;
        }
        *rows_with += finite_in && all;
    }
    return *rows_with == d->tc.batch;
}

static int topp_export(void *data, const char *dir, const kp_impl *const *impls, const void *const *outs, int nimpls,
                       kp_error *err) {
    topp_data *d = data;
    const int64_t B = d->tc.batch, V = d->tc.vocab;
    int64_t shape[2] = {B, V};
    float *dense = kp_calloc((size_t)(B * V), sizeof(float), "export", err);
    if (!dense) return err->code;
    char path[1024];
    int rc = 0;
    for (int64_t r = 0; r < B; r++) memcpy(dense + r * V, d->logits + r * d->tc.stride, (size_t)V * sizeof(float));
    snprintf(path, sizeof path, "%s/logits.npy", dir);
    rc = kp_npy_write(path, "<f4", 2, shape, dense, (size_t)(B * V) * 4, err);
    snprintf(path, sizeof path, "%s/top_p.npy", dir);
    if (!rc) rc = kp_npy_write(path, "<f4", 1, shape, d->top_p, (size_t)B * 4, err);
    if (!rc) rc = topp_reference(d, NULL, NULL, err);
    snprintf(path, sizeof path, "%s/reference_keep.npy", dir);
    if (!rc) rc = kp_npy_write(path, "|u1", 2, shape, d->ref.keep, (size_t)(B * V), err);
    snprintf(path, sizeof path, "%s/reference_prob.npy", dir);
    if (!rc) rc = kp_npy_write(path, "<f8", 2, shape, d->ref.prob, (size_t)(B * V) * 8, err);
    snprintf(path, sizeof path, "%s/reference_mass_before.npy", dir);
    if (!rc) rc = kp_npy_write(path, "<f8", 2, shape, d->ref.mass_before, (size_t)(B * V) * 8, err);
    for (int i = 0; !rc && i < nimpls; i++) {
        const topp_out *o = outs[i];
        for (int64_t r = 0; r < B; r++) memcpy(dense + r * V, o->x + r * o->stride, (size_t)V * sizeof(float));
        snprintf(path, sizeof path, "%s/%s.npy", dir, impls[i]->name);
        rc = kp_npy_write(path, "<f4", 2, shape, dense, (size_t)(B * V) * 4, err);
    }
    free(dense);
    return rc;
}

const kp_family kp_topp_family = {
    .name = "topp",
    .prepare = topp_prepare,
    .release = topp_release,
    .batch = topp_batch,
    .estimate_bytes = topp_estimate,
    .estimate_device_bytes = topp_estimate_device,
    .describe_inputs = topp_describe_inputs,
    .run_rows = topp_run_rows,
    .free_output = topp_free_output,
    .out_row = topp_out_row,
    .reference = topp_reference,
    .rule = topp_rule,
    .explain_exact = topp_explain_exact,
    .has_defect = topp_has_defect,
    .bench = topp_bench,
    .export_npy = topp_export,
};

const kp_family *kp_family_find(const char *name) { return !strcmp(name, "topp") ? &kp_topp_family : NULL; }
