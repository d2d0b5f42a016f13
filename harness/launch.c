/* launch.c: running any family's impl on any rows of a prepared case: a per-impl cache of guarded
 * buffers, the launch, the guard and row-padding checks, the copy back into pooled host outputs,
 * CUDA-event timing and the bench loop. Family knowledge comes only through kp_family's hooks. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_json.h"
#include "kp_checks.h"
#include "kp_device.h"
#include "kp_launch.h"

/* One impl's buffers, kept across runs and cases: a batch check runs an impl ~140 times, and allocating,
 * filling and uploading tens of MB each time cost more than the kernels. Buffers only grow. */
typedef struct slot {
    const kp_impl *impl;
    kp_buf in[KP_MAX_TENSORS]; /* batched inputs: the rows of the run */
    kp_buf out[KP_MAX_TENSORS];
    kp_buf ws;
    kp_buf against[KP_MAX_TENSORS]; /* a device copy of the host output runs are compared with (kp_run_rows_against) */
    uint64_t against_serial;        /* which output it holds (0: none) */
} slot;

/* Per memory kind, every input of the current prepared case (batched ones with all their rows),
 * uploaded once per case: runs gather their rows from here, and shared inputs are read in place. */
static struct {
    kp_buf all[2][KP_MAX_TENSORS];
    uint64_t all_generation[2];
    slot *slots;
    int nslots, cap;
} g_cache;

int kp_launch_reserve(int nimpls, kp_error *err) {
    if (nimpls <= g_cache.cap) return 0;
    slot *grown = realloc(g_cache.slots, sizeof *grown * (size_t)nimpls);
    if (!grown) return kp_fail(err, KP_EXIT_ENV, "out of host memory for %d impl buffer slots", nimpls);
    g_cache.slots = grown, g_cache.cap = nimpls;
    return 0;
}

/* Host outputs of POOL_MIN_BYTES or more are recycled: a batch check makes ~140 outputs per impl, and
 * fresh 40 MB allocations cost page faults on every first touch. Those a device copies into are
 * page-locked once (cudaHostRegister), so device outputs copy straight into them at full speed.
 * The pool holds at most POOL_KEEP outputs of the case's largest run and is emptied when the case is
 * released (kp_launch_case_done), so what it holds is bounded by the case's own estimate. */
#define POOL_MAX 8
#define POOL_KEEP 2
#define POOL_MIN_BYTES ((size_t)1 << 20)
typedef struct block {
    unsigned char *p;
    size_t bytes;
    int pinned;
    int sparse; /* a run's rows that differ alone are written: never pooled, its untouched pages never faulted */
} block;
static block g_pool[POOL_MAX];
static int g_pool_count;
static size_t g_pool_bytes, g_pool_cap; /* held, and the most it may hold for the current case */

/* A new block's pages, faulted in on every thread before cudaHostRegister pins them: pinning fresh pages faults each
 * one on the calling thread first (a fresh page costs its fault and zeroing: the H200's copy benchmark moved 1 GB/s
 * into never-touched pageable memory, 10 GB/s into touched), and a case registers a new block for each output it
 * keeps. Its bytes are written by the copies back before anything reads them. */
enum { TOUCH_PIECE = 4 << 20 };
typedef struct touch_job {
    unsigned char *p;
    size_t bytes;
} touch_job;
static void touch_piece(void *ctx, int64_t i) {
    const touch_job *t = ctx;
    const size_t at = (size_t)i * TOUCH_PIECE, end = t->bytes - at < TOUCH_PIECE ? t->bytes : at + TOUCH_PIECE;
    for (size_t b = at; b < end; b += 4096) t->p[b] = 0;
}

/* The smallest pooled block that fits, or a new one (page-locked when `pin` and large). */
static block block_alloc(size_t bytes, int pin) {
    int best = -1;
    for (int i = 0; i < g_pool_count; i++)
        if (g_pool[i].bytes >= bytes && (best < 0 || g_pool[i].bytes < g_pool[best].bytes)) best = i;
    if (best >= 0) {
        block b = g_pool[best];
        g_pool[best] = g_pool[--g_pool_count];
        g_pool_bytes -= b.bytes;
        return b;
    }
    block b = {malloc(bytes ? bytes : 1), bytes, 0, 0};
    if (pin && b.p && bytes >= POOL_MIN_BYTES && kp_device_count() > 0) {
        touch_job t = {b.p, bytes};
        kp_parallel_for((int64_t)((bytes + TOUCH_PIECE - 1) / TOUCH_PIECE), touch_piece, &t);
        b.pinned = kp_host_register(b.p, bytes);
    }
    return b;
}

static void block_free(block b) {
    if (b.pinned) kp_host_unregister(b.p);
    free(b.p);
}

static void block_release(block b) {
    if (!b.p) return;
    if (b.sparse) {
        free(b.p);
        return;
    }
    if (b.bytes >= POOL_MIN_BYTES && g_pool_count < POOL_MAX && g_pool_bytes + b.bytes <= g_pool_cap) {
        g_pool[g_pool_count++] = b;
        g_pool_bytes += b.bytes;
        return;
    }
    block_free(b);
}

void kp_launch_case_done(void) {
    while (g_pool_count > 0) block_free(g_pool[--g_pool_count]);
    g_pool_bytes = 0;
}

/* A kp_output and the pooled block its tensors live in. */
typedef struct output {
    kp_output o;
    block mem;
} output;

void kp_output_free(kp_output *o) {
    if (!o) return;
    output *x = (output *)o;
    kp_digests_settle_reading(x->mem.p, x->mem.bytes); /* a digest may still be reading it */
    block_release(x->mem);
    free(x);
}

/* Grow a cached buffer to at least `bytes` (contents are not kept). */
static int cache_reserve(kp_buf *b, kp_memory mem, size_t bytes, const char *name, kp_error *err) {
    if (b->base && b->memory == mem && b->bytes >= bytes) return 0;
    kp_buf_free(b);
    return kp_buf_alloc(b, mem, bytes, name, err);
}

/* Bytes a tensor's `slices` slices of dim 0 take (padding included). */
static size_t slices_bytes(const kp_tensor *t, int64_t slices) { return kp_tensor_slice_bytes(t) * (size_t)slices; }

/* The bytes of one host output of nrows rows: output_new's block, each tensor 64-byte aligned in it. */
static size_t output_bytes(const kp_tensor *outs, int nout, int64_t nrows, size_t offset[KP_MAX_TENSORS]) {
    size_t total = 0;
    for (int k = 0; k < nout; k++) {
        if (offset) offset[k] = total;
        total += (slices_bytes(&outs[k], nrows) + 63) & ~(size_t)63;
    }
    return total;
}

static double g_uploads_s; /* the uploads' seconds in the kp_run_rows in progress, a stage of their own */

static double g_part[KP_RUN_PARTS];
static int64_t g_runs;
static const char *const part_names[KP_RUN_PARTS] = {"setup",           "output_blocks", "launch",
                                                     "wait_and_guards", "compare",       "copies_back"};
void kp_run_parts_reset(void) {
    memset(g_part, 0, sizeof g_part);
    g_runs = 0;
}
const char *kp_run_part_name(kp_run_part part) { return part_names[part]; }
double kp_run_part_seconds(kp_run_part part) { return g_part[part]; }
int64_t kp_run_count(void) { return g_runs; }

/* The seconds since t added to a part; now. */
static double part_add(kp_run_part part, double t) {
    const double now = kp_now();
    g_part[part] += now - t;
    return now;
}

static slot *slot_for(kp_prepared *p, const kp_impl *impl, const kp_tensor *outs, int nout, kp_error *err) {
    const kp_memory mem = impl->memory;
    const kp_case_view *v = &p->v;
    if (g_cache.all_generation[mem] != p->generation) {
        const double t0 = kp_now();
        g_cache.all_generation[mem] = 0;
        for (int k = 0; k < v->ninputs; k++) {
            const kp_tensor *t = &v->inputs[k];
            const size_t bytes = slices_bytes(t, t->batched ? v->rows_total : t->shape[0]);
            char name[64];
            snprintf(name, sizeof name, "%s (all rows)", t->name);
            if (cache_reserve(&g_cache.all[mem][k], mem, bytes, name, err) ||
                kp_buf_upload(&g_cache.all[mem][k], t->data, bytes, name, err))
                return NULL;
        }
        g_cache.all_generation[mem] = p->generation;
        g_uploads_s += kp_now() - t0;
    }
    slot *sl = NULL;
    for (int i = 0; i < g_cache.nslots && !sl; i++)
        if (g_cache.slots[i].impl == impl) sl = &g_cache.slots[i];
    if (!sl) {
        if (g_cache.nslots == g_cache.cap && kp_launch_reserve(g_cache.cap ? 2 * g_cache.cap : 4, err)) return NULL;
        sl = &g_cache.slots[g_cache.nslots++];
        memset(sl, 0, sizeof *sl);
        sl->impl = impl;
    }
    for (int k = 0; k < v->ninputs; k++)
        if (v->inputs[k].batched &&
            cache_reserve(&sl->in[k], mem, slices_bytes(&v->inputs[k], v->rows_total), v->inputs[k].name, err))
            return NULL;
    for (int k = 0; k < nout; k++)
        if (cache_reserve(&sl->out[k], mem, slices_bytes(&outs[k], v->rows_total), outs[k].name, err)) return NULL;
    return sl;
}

/* One launch on chosen rows, in the impl's cached slot. */
typedef struct launch {
    const kp_impl *impl;
    const kp_prepared *p; /* for kp_launch_current */
    int64_t nrows;
    const int64_t *rows; /* the case rows of the run, for kp_launch_current */
    slot *slot;
    kp_tensor outs[KP_MAX_TENSORS];
    int nout;
    kp_launch_bufs bufs;
    alignas(max_align_t) unsigned char args[KP_ARGS_MAX];
} launch;

/* The guard bytes right after the `used` bytes of a cached output (up to KP_GUARD_BYTES, within the
 * buffer; its own guard region follows). */
static size_t guard_after(const kp_buf *out, size_t used) {
    return out->bytes - used < KP_GUARD_BYTES ? out->bytes - used : KP_GUARD_BYTES;
}

/* Inputs gathered, outputs filled with guard bytes (so a write into row padding shows) and so are the
 * KP_GUARD_BYTES right after them (so a write one row past the batch shows even in a larger buffer);
 * args filled, the impl asked whether it runs the shape, its workspace allocated. */
static kp_result launch_setup(kp_prepared *p, const kp_impl *impl, const int64_t *rows, int64_t nrows, launch *L,
                              kp_error *err) {
    const kp_family *fam = p->fam;
    const kp_case_view *v = &p->v;
    memset(L, 0, sizeof *L);
    L->impl = impl, L->p = p, L->nrows = nrows, L->rows = rows;
    const kp_memory mem = impl->memory;
    if (mem == KP_MEMORY_CUDA && kp_device_init(err)) return KP_NOT_RUN;
    KP_ASSERT(nrows >= 1 && nrows <= v->rows_total);
    for (int64_t i = 0; i < nrows; i++) KP_ASSERT(rows[i] >= 0 && rows[i] < v->rows_total);
    L->nout = fam->outputs(v->data, nrows, L->outs);
    KP_ASSERT(L->nout >= 1 && L->nout <= KP_MAX_TENSORS);
    g_pool_cap = POOL_KEEP * output_bytes(L->outs, L->nout, kp_shapes_largest_run(v->batch, v->rows_total), NULL);
    slot *sl = slot_for(p, impl, L->outs, L->nout, err);
    if (!sl) return KP_FAILED;
    L->slot = sl;
    for (int k = 0; k < v->ninputs; k++) {
        const kp_tensor *t = &v->inputs[k];
        if (!t->batched) {
            L->bufs.in[k] = kp_buf_ptr(&g_cache.all[mem][k]);
            continue;
        }
        if (kp_buf_gather_rows(&sl->in[k], &g_cache.all[mem][k], rows, nrows, kp_tensor_slice_bytes(t), t->name, err))
            return KP_FAILED;
        L->bufs.in[k] = kp_buf_ptr(&sl->in[k]);
    }
    for (int k = 0; k < L->nout; k++) {
        const size_t used = slices_bytes(&L->outs[k], nrows);
        if (kp_buf_fill_guard(&sl->out[k], 0, used + guard_after(&sl->out[k], used), L->outs[k].name, err))
            return KP_FAILED;
        L->bufs.out[k] = kp_buf_ptr(&sl->out[k]);
    }
    L->bufs.nrows = nrows;
    L->bufs.stream = mem == KP_MEMORY_CUDA ? kp_device_stream() : NULL;
    L->bufs.sm_count = mem == KP_MEMORY_CUDA ? kp_device_sm_count() : 0;
    KP_ASSERT(fam->args_bytes <= KP_ARGS_MAX);
    fam->fill_args(v->data, &L->bufs, L->args);
    char message[512] = "";
    if (impl->supports && impl->supports(L->args, message, sizeof message) != KP_RUN_OK) {
        kp_fail(err, KP_EXIT_OK, "%s refuses this shape: %s", impl->name, message);
        return KP_NOT_SUPPORTED;
    }
    const size_t ws = impl->workspace_bytes ? impl->workspace_bytes(L->args) : 0;
    if (ws > sl->ws.bytes) {
        kp_buf_free(&sl->ws);
        if (kp_buf_alloc(&sl->ws, mem, ws, "workspace", err)) return KP_FAILED;
    }
    if (ws) {
        L->bufs.workspace = kp_buf_ptr(&sl->ws), L->bufs.workspace_bytes = ws;
        fam->fill_args(v->data, &L->bufs, L->args);
    }
    /* the fills and gathers done before the impl starts, whatever stream it launches on */
    if (mem == KP_MEMORY_CUDA && kp_stream_wait("filling the run's buffers", err)) return KP_FAILED;
    return KP_PASSED;
}

static _Thread_local kp_launch_view g_current; /* the run in progress on this thread (nrows 0: none) */

const kp_launch_view *kp_launch_current(void) { return g_current.nrows > 0 ? &g_current : NULL; }

static _Thread_local int g_want_self_time; /* the bench loop's reps */
static _Thread_local double g_self_us;     /* what the impl in progress reported of itself, -1: nothing */
int kp_launch_timing_wanted(void) { return g_want_self_time; }
void kp_launch_report_time(double us) { g_self_us = us; }

/* Launch once; for CUDA impls the launch is asynchronous (kp_sync waits). */
static kp_result launch_run(launch *L, kp_error *err) {
    char message[512] = "";
    g_current = (kp_launch_view){.c = &L->p->c, .generation = L->p->generation, .rows = L->rows, .nrows = L->nrows,
                                 .ins = L->p->v.inputs, .nin = L->p->v.ninputs, .in = L->bufs.in, .outs = L->outs,
                                 .nout = L->nout, .out = L->bufs.out};
    g_self_us = -1;
    int rc = L->impl->run(L->args, message, sizeof message);
    g_current = (kp_launch_view){0};
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

/* Every guard of the run: checks[] gets them, in the order kp_bufs_check_queue reads them; their count. */
static int run_guards(const kp_prepared *p, const launch *L, kp_guard_check *checks) {
    const kp_case_view *v = &p->v;
    slot *sl = L->slot;
    int n = 0;
    for (int k = 0; k < L->nout; k++) {
        const size_t used = slices_bytes(&L->outs[k], L->nrows);
        checks[n++] = (kp_guard_check){&sl->out[k], L->outs[k].name, 0, 0, 0};
        checks[n++] = (kp_guard_check){&sl->out[k], L->outs[k].name, 1, used, guard_after(&sl->out[k], used)};
    }
    for (int k = 0; k < v->ninputs; k++)
        checks[n++] = (kp_guard_check){v->inputs[k].batched ? &sl->in[k] : &g_cache.all[L->impl->memory][k],
                                       v->inputs[k].name, 0, 0, 0};
    if (L->bufs.workspace_bytes) checks[n++] = (kp_guard_check){&sl->ws, "workspace", 0, 0, 0};
    return n;
}

/* A run compared with another output (kp_run_rows_against): NULL for a run copied back whole. */
typedef struct against_spec {
    const kp_output *o;
    const int64_t *rows;
    uint8_t *bits;
} against_spec;

/* The comparison of a CUDA impl's run with vs's output, queued on the device (its slot holds that output). */
static int compare_queue(const launch *L, const against_spec *vs, kp_error *err) {
    kp_rows_pair pairs[KP_MAX_TENSORS];
    for (int k = 0; k < L->nout; k++) {
        const size_t slice = kp_tensor_slice_bytes(&L->outs[k]);
        KP_ASSERT(kp_tensor_slice_bytes(&vs->o->t[k]) == slice);
        pairs[k] = (kp_rows_pair){&L->slot->out[k], &L->slot->against[k], slice};
    }
    return kp_bufs_rows_differ_queue(pairs, L->nout, vs->rows, L->nrows, vs->o->nrows, err);
}

/* Wait and check every guard: the device's checked behind the impl on its stream, and where vs is not NULL the
 * comparison queued after them, so that one wait covers the impl, the checks and the comparison. */
static kp_result collect_guards(const kp_prepared *p, launch *L, const against_spec *vs, kp_error *err) {
    const double t = kp_now();
    kp_guard_check checks[3 * KP_MAX_TENSORS + 1];
    const int n = run_guards(p, L, checks);
    const kp_memory mem = L->impl->memory;
    if ((mem == KP_MEMORY_CUDA && kp_bufs_check_queue(checks, n, err)) || (vs && compare_queue(L, vs, err)) ||
        kp_sync(mem, err) || kp_bufs_check_result(checks, n, err))
        return KP_FAILED;
    part_add(KP_RUN_WAIT_AND_GUARDS, t);
    return KP_PASSED;
}

/* Rows [r0, r1) of every output copied back into o's tensors, their row padding checked. */
static kp_result copy_rows_back(launch *L, kp_output *o, int64_t r0, int64_t r1, kp_error *err) {
    for (int k = 0; k < L->nout; k++) {
        const kp_tensor *t = &o->t[k];
        const size_t slice = kp_tensor_slice_bytes(t);
        unsigned char *data = (unsigned char *)t->data;
        if (kp_buf_download_range(&L->slot->out[k], slice * (size_t)r0, data + slice * (size_t)r0,
                                  slice * (size_t)(r1 - r0), t->name, err))
            return KP_FAILED;
        const int64_t cols = kp_tensor_cols(t), stride = kp_tensor_stride(t), per = kp_tensor_rows(t) / L->nrows;
        if (stride == cols) continue;
        const size_t esize = kp_dtype_size(t->dtype), pad = (size_t)(stride - cols) * esize;
        for (int64_t r = r0 * per; r < r1 * per; r++) {
            const unsigned char *at = data + ((size_t)(r * stride) + (size_t)cols) * esize;
            for (size_t b = 0; b < pad; b++)
                if (at[b] != KP_GUARD_BYTE) {
                    kp_fail(err, KP_EXIT_ENV, "%s wrote into row padding of buffer '%s' (row %lld, element %lld)",
                            L->impl->name, t->name, (long long)(r / per), (long long)(cols + (int64_t)(b / esize)));
                    return KP_FAILED;
                }
        }
    }
    return KP_PASSED;
}

static kp_result collect_rows(launch *L, kp_output *o, int64_t r0, int64_t r1, kp_error *err) {
    const double t = kp_now();
    const kp_result r = copy_rows_back(L, o, r0, r1, err);
    part_add(KP_RUN_COPIES_BACK, t);
    return r;
}

/* Wait, check every guard, copy the outputs back into o's tensors and check their row padding. */
static kp_result launch_collect(const kp_prepared *p, launch *L, kp_output *o, kp_error *err) {
    kp_result r = collect_guards(p, L, NULL, err);
    return r == KP_PASSED ? collect_rows(L, o, 0, L->nrows, err) : r;
}

/* Whether row i of a run compared with an output of against_nrows rows comes back: it differs, or was not compared. */
static bool row_comes_back(const uint8_t *bits, const int64_t *against_rows, int64_t against_nrows, int64_t i) {
    const int64_t at = against_rows ? against_rows[i] : i;
    return bits[i] || at < 0 || at >= against_nrows;
}

/* The host output a run is compared with, on the device in the impl's slot (once an output): before the run, so
 * that its wait is not the impl's. */
static kp_result against_upload(launch *L, const kp_output *against, kp_error *err) {
    slot *sl = L->slot;
    KP_ASSERT(against->ntensors == L->nout);
    if (against->serial && sl->against_serial == against->serial) return KP_PASSED;
    sl->against_serial = 0;
    for (int k = 0; k < L->nout; k++) {
        char name[96];
        snprintf(name, sizeof name, "%s (compared with)", against->t[k].name);
        const size_t bytes = slices_bytes(&against->t[k], against->nrows);
        if (cache_reserve(&sl->against[k], KP_MEMORY_CUDA, bytes, name, err) ||
            kp_buf_upload(&sl->against[k], against->t[k].data, bytes, name, err))
            return KP_FAILED;
    }
    sl->against_serial = against->serial;
    return KP_PASSED;
}

/* As launch_collect, for a CUDA impl's run compared with vs's output (kp_run_rows_against): the rows compared on the
 * device in the guards' wait, and those that differ copied back (with those not compared: their padding is checked
 * nowhere else). */
static kp_result launch_collect_against(const kp_prepared *p, launch *L, kp_output *o, const against_spec *vs,
                                        kp_error *err) {
    kp_result r = collect_guards(p, L, vs, err);
    if (r != KP_PASSED) return r;
    const double t = kp_now();
    kp_bufs_rows_differ_result(L->nrows, vs->bits);
    part_add(KP_RUN_COMPARE, t);
    for (int64_t i = 0; i < L->nrows; i++) { /* runs of rows that come back, each run one copy */
        if (!row_comes_back(vs->bits, vs->rows, vs->o->nrows, i)) continue;
        int64_t end = i + 1;
        while (end < L->nrows && row_comes_back(vs->bits, vs->rows, vs->o->nrows, end)) end++;
        if ((r = collect_rows(L, o, i, end, err)) != KP_PASSED) return r;
        i = end; /* row end stays on the device */
    }
    return KP_PASSED;
}

/* A host output for the launch's tensors: one pooled block, each tensor 64-byte aligned in it; `sparse`: a block of
 * its own, neither touched nor page-locked, for a run whose equal rows are not copied back. */
static kp_output *output_new(const launch *L, bool sparse, kp_error *err) {
    static uint64_t serial;
    size_t offset[KP_MAX_TENSORS];
    const size_t total = output_bytes(L->outs, L->nout, L->nrows, offset);
    output *x = calloc(1, sizeof *x);
    if (x && sparse) x->mem = (block){malloc(total ? total : 1), total, 0, 1};
    else if (x) x->mem = block_alloc(total, L->impl->memory == KP_MEMORY_CUDA);
    if (!x || !x->mem.p) {
        free(x);
        kp_fail(err, KP_EXIT_ENV, "out of host memory for the outputs of a batch of %lld rows", (long long)L->nrows);
        return NULL;
    }
    x->o.nrows = L->nrows, x->o.ntensors = L->nout, x->o.serial = ++serial;
    for (int k = 0; k < L->nout; k++) {
        x->o.t[k] = L->outs[k];
        x->o.t[k].data = x->mem.p + offset[k];
    }
    return &x->o;
}

/* The family's FLOP count for nrows (where it has one) and TFLOP/s over us into t; whether it has one. */
static int add_flops(cJSON *t, const kp_prepared *p, int64_t nrows, double us) {
    const double flops = p->fam->flops ? p->fam->flops(p->v.data, nrows) : 0;
    if (!(flops > 0)) return 0;
    kp_json_add_double(t, "flops", flops);
    kp_json_add_double(t, "tflop_per_s", flops / (us * 1e-6) / 1e12);
    return 1;
}

static kp_result run_rows_timed(kp_prepared *p, const kp_impl *impl, const int64_t *rows, int64_t nrows,
                                kp_output **outp, cJSON *info, const against_spec *vs, kp_error *err) {
    *outp = NULL;
    launch L;
    double t = kp_now();
    kp_result r = launch_setup(p, impl, rows, nrows, &L, err);
    if (r == KP_PASSED && vs) r = against_upload(&L, vs->o, err);
    t = part_add(KP_RUN_SETUP, t + g_uploads_s); /* the uploads are their own stage */
    kp_output *o = r == KP_PASSED ? output_new(&L, vs != NULL, err) : NULL;
    t = part_add(KP_RUN_OUTPUT_BLOCKS, t);
    if (r == KP_PASSED && !o) r = KP_FAILED;
    kp_timer *timer = NULL; /* CUDA events around the launch alone, for the receipt (bench flushes L2 too) */
    double t0 = kp_now(), kernel_us = -1;
    if (r == KP_PASSED && info && impl->memory == KP_MEMORY_CUDA &&
        (kp_timer_create(&timer, impl->memory, 0, err) || kp_timer_start(timer, err)))
        r = KP_FAILED;
    if (r == KP_PASSED) r = launch_run(&L, err);
    if (r == KP_PASSED && timer && kp_timer_stop(timer, &kernel_us, err)) r = KP_FAILED;
    part_add(KP_RUN_LAUNCH, t);
    if (r == KP_PASSED) r = vs ? launch_collect_against(p, &L, o, vs, err) : launch_collect(p, &L, o, err);
    const double seconds = kp_now() - t0;
    kp_timer_free(timer);
    if (info && r == KP_PASSED) {
        kp_json_add_double(info, "wall_us", seconds * 1e6);
        cJSON_AddStringToObject(info, "wall_note", "one launch, sync, guard checks and copy back; kparity bench times kernels");
        if (kernel_us >= 0) {
            kp_json_add_double(info, "kernel_us", kernel_us);
            cJSON_AddStringToObject(info, "kernel_note", "CUDA events around the first launch (cold: no warm-up)");
        }
        kp_json_add_int(info, "workspace_bytes", (int64_t)L.bufs.workspace_bytes);
        if (add_flops(info, p, nrows, kernel_us >= 0 ? kernel_us : seconds * 1e6)) /* over the kernel's time if any */
            cJSON_AddStringToObject(info, "tflop_note", kernel_us >= 0 ? "flops over kernel_us" : "flops over wall_us");
    }
    if (r != KP_PASSED) {
        kp_output_free(o);
        return r;
    }
    *outp = o;
    return KP_PASSED;
}

static kp_result run_rows(kp_prepared *p, const kp_impl *impl, const int64_t *rows, int64_t nrows, kp_output **out,
                          cJSON *info, const against_spec *vs, kp_error *err) {
    const double t0 = kp_now();
    g_uploads_s = 0;
    g_runs++;
    kp_result r = run_rows_timed(p, impl, rows, nrows, out, info, vs, err);
    kp_stage_add(KP_STAGE_UPLOADS, g_uploads_s);
    kp_stage_add(KP_STAGE_KERNELS, kp_now() - t0 - g_uploads_s);
    return r;
}

kp_result kp_run_rows(kp_prepared *p, const kp_impl *impl, const int64_t *rows, int64_t nrows, kp_output **out,
                      cJSON *info, kp_error *err) {
    return run_rows(p, impl, rows, nrows, out, info, NULL, err);
}

kp_result kp_run_rows_against(kp_prepared *p, const kp_impl *impl, const int64_t *rows, int64_t nrows,
                              const kp_output *against, const int64_t *against_rows, uint8_t *bits, kp_output **out,
                              kp_error *err) {
    if (impl->memory != KP_MEMORY_CUDA) { /* every row copied back: compared on the host */
        memset(bits, 0xff, (size_t)nrows);
        return run_rows(p, impl, rows, nrows, out, NULL, NULL, err);
    }
    const against_spec vs = {against, against_rows, bits};
    return run_rows(p, impl, rows, nrows, out, NULL, &vs, err);
}

int kp_bench_impl(kp_prepared *p, const kp_impl *impl, int reps, cJSON *timing, kp_error *err) {
    const int64_t B = p->v.batch;
    int64_t *rows = malloc(sizeof *rows * (size_t)B);
    double *us = malloc(sizeof *us * (size_t)reps);
    if (!rows || !us) {
        free(rows), free(us);
        return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    }
    for (int64_t r = 0; r < B; r++) rows[r] = r;
    launch L;
    kp_timer *timer = NULL;
    kp_output *o = NULL;
    int rc = 0;
    if (launch_setup(p, impl, rows, B, &L, err) != KP_PASSED) rc = err->code ? err->code : KP_EXIT_ENV;
    if (!rc) rc = kp_timer_create(&timer, impl->memory, 1, err);
    for (int w = 0; !rc && w < 3; w++) /* warm-up: first-launch costs stay out of the figures */
        if (launch_run(&L, err) != KP_PASSED || kp_sync(impl->memory, err)) rc = err->code ? err->code : KP_EXIT_ENV;
    double *self_us = malloc(sizeof *self_us * (size_t)reps);
    int nself = 0;
    g_want_self_time = 1;
    for (int i = 0; !rc && i < reps; i++) {
        if (!self_us || kp_timer_start(timer, err) || launch_run(&L, err) != KP_PASSED || kp_timer_stop(timer, &us[i], err))
            rc = err->code ? err->code : KP_EXIT_ENV;
        if (!rc && g_self_us >= 0) self_us[nself++] = g_self_us;
    }
    g_want_self_time = 0;
    if (!rc && nself == reps) { /* the impl's own figures, every rep: reported beside the wall clock */
        qsort(self_us, (size_t)reps, sizeof *self_us, kp_cmp_double);
        kp_json_add_double(timing, "self_median_us", self_us[reps / 2]);
        kp_json_add_double(timing, "self_p10_us", self_us[reps / 10]);
        kp_json_add_double(timing, "self_p90_us", self_us[reps - 1 - reps / 10]);
    }
    free(self_us);
    if (!rc && (!(o = output_new(&L, false, err)) || launch_collect(p, &L, o, err) != KP_PASSED))
        rc = err->code ? err->code : KP_EXIT_ENV;
    if (!rc) {
        qsort(us, (size_t)reps, sizeof *us, kp_cmp_double);
        const double median = us[reps / 2];
        kp_json_add_int(timing, "reps", reps);
        kp_json_add_double(timing, "median_us", median);
        kp_json_add_double(timing, "min_us", us[0]);
        kp_json_add_double(timing, "p10_us", us[reps / 10]);
        kp_json_add_double(timing, "p90_us", us[reps - 1 - reps / 10]);
        kp_json_add_double(timing, "max_us", us[reps - 1]);
        const double bytes = p->fam->bytes_moved ? p->fam->bytes_moved(p->v.data, B) : 0;
        if (bytes > 0) {
            kp_json_add_double(timing, "bytes", bytes);
            kp_json_add_double(timing, "gb_per_s", bytes / (median * 1e-6) / 1e9);
        }
        add_flops(timing, p, B, median);
        cJSON_AddStringToObject(timing, "method", impl->memory == KP_MEMORY_CUDA
                                                      ? "CUDA events around one launch, L2 flushed before each rep, 3 warm-ups"
                                                      : "wall clock around one call, 3 warm-ups");
    }
    kp_output_free(o);
    kp_timer_free(timer);
    free(rows), free(us);
    return rc;
}

/* ---- what a case holds at once ----------------------------------------------------------------- */

/* Bytes of one dim-0 slice, padding included, in floating point so that a shape past the address space
 * shows as a large number rather than kp_tensor_slice_bytes' 0. */
static double slice_bytes_f(const kp_tensor *t) {
    if (t->ndim == 1) return (double)kp_dtype_size(t->dtype);
    double elems = (double)kp_tensor_stride(t);
    for (int d = 1; d + 1 < t->ndim; d++) elems *= (double)t->shape[d];
    return elems * (double)kp_dtype_size(t->dtype);
}

/* Bytes of `slices` dim-0 slices of every tensor (a shared input keeps its shape[0]), plus a kp_buf's two
 * guard regions each where `guarded`; batched tensors only where `batched_only`. */
static double tensors_bytes(const kp_tensor *t, int n, int64_t slices, bool batched_only, bool guarded) {
    double bytes = 0;
    for (int k = 0; k < n; k++)
        if (!batched_only || t[k].batched)
            bytes += slice_bytes_f(&t[k]) * (double)(t[k].batched ? slices : t[k].shape[0]) +
                     (guarded ? 2.0 * KP_GUARD_BYTES : 0.0);
    return bytes;
}

/* Host bytes the checks allocate beside the outputs, the most of any one check (they run one at a time and free
 * their scratch): tolerance.c's two index lists (8 bytes each per element compared) and worst element per row, for
 * one output against its reference and, beside it, against a "<output>@<what>" array; repeat's row digests per run
 * and row; every check's row list. */
static double check_scratch(const kp_case_spec *cs, const kp_shapes *s) {
    double most = 0;
    for (int i = 0; i < cs->nchecks; i++) {
        const kp_check_spec *k = &cs->checks[i];
        const kp_check_kind kind = k->kind == KP_CHECK_EXPECT ? k->of : k->kind;
        double bytes = 8.0 * (double)(s->rows_total + 1);
        for (int t = 0; kind == KP_CHECK_TOLERANCE && t < s->noutputs; t++) {
            const double row_elems = slice_bytes_f(&s->outputs[t]) / (double)kp_dtype_size(s->outputs[t].dtype);
            const double elems = row_elems * (double)s->batch;
            bytes = fmax(bytes, 8.0 * (double)(s->rows_total + 1) + 2.0 * (16.0 * elems + 32.0 * (double)s->batch) +
                                    16.0 * fmax((double)KP_TOLERANCE_WAVE_ELEMENTS, row_elems));
        }
        if (kind == KP_CHECK_REPEAT)
            bytes += ((double)s->batch + 1.0) * ((double)k->runs * KP_SHA256_HEX_LEN + 1.0 + s->noutputs);
        most = fmax(most, bytes);
    }
    return most;
}

/* The spans a pending digest keeps (kp_digest_start): one per last-dim row of each tensor's `slices` slices. */
static double digest_spans(const kp_tensor *t, int n, int64_t slices) {
    double spans = 0;
    for (int k = 0; k < n; k++) {
        double rows = (double)(t[k].batched ? slices : t[k].shape[0]);
        for (int d = 1; d + 1 < t[k].ndim; d++) rows *= (double)t[k].shape[d];
        spans += rows;
    }
    return spans * (double)sizeof(kp_span);
}

/* Whether a check of the case runs impl through kp_run_rows_against (checks.c: repeat's runs, and batch probes where
 * the family reads no probe's every row), so that a CUDA impl's slot holds a device copy of its output of the batch. */
static bool compared_against(const kp_case_spec *cs, const kp_impl *impl) {
    for (int i = 0; i < cs->nchecks; i++) {
        const kp_check_spec *k = &cs->checks[i];
        const kp_check_kind kind = k->kind == KP_CHECK_EXPECT ? k->of : k->kind;
        const bool against = kind == KP_CHECK_REPEAT ||
                             (kind == KP_CHECK_BATCH && !cs->fam->row_moved && !cs->fam->describe_probe);
        for (int j = 0; against && j < k->nimpl; j++)
            if (k->impl[j] == impl) return true;
    }
    return false;
}

int kp_launch_estimate(const kp_case_spec *cs, int64_t extra_rows, kp_case_bytes *est, kp_error *err) {
    memset(est, 0, sizeof *est);
    kp_shapes s;
    memset(&s, 0, sizeof s);
    int rc = cs->fam->shapes(&cs->c, extra_rows, &s, err);
    if (rc) return rc;
    KP_ASSERT(s.ninputs >= 1 && s.ninputs <= KP_MAX_TENSORS && s.noutputs >= 1 && s.noutputs <= KP_MAX_TENSORS);
    const int64_t R = s.rows_total, largest = kp_shapes_largest_run(s.batch, R);
    double most = -1;
    for (int k = 0; k < s.ninputs + s.nstate + s.noutputs; k++) { /* named in a budget's error */
        const bool in = k < s.ninputs, st = !in && k < s.ninputs + s.nstate;
        const kp_tensor *t = in ? &s.inputs[k] : st ? &s.state[k - s.ninputs] : &s.outputs[k - s.ninputs - s.nstate];
        const double bytes = tensors_bytes(t, 1, R, false, false);
        if (bytes <= most) continue;
        most = bytes;
        int at = snprintf(est->largest, sizeof est->largest, "%s '%s' [", in ? "input" : st ? "state array" : "output", t->name);
        for (int d = 0; d < t->ndim && at < (int)sizeof est->largest; d++)
            at += snprintf(est->largest + at, sizeof est->largest - (size_t)at, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        if (at < (int)sizeof est->largest)
            snprintf(est->largest + at, sizeof est->largest - (size_t)at, "] %s, %.3g GiB", kp_dtype_name(t->dtype),
                     bytes / 1073741824.0);
    }
    /* one host output of the largest run (output_new's block, each tensor 64-byte aligned); the comparisons'
       row buffers (kp_output_row's and row_diff's, kept per thread) hold a few rows */
    double out_run = 0, row_bytes = 0;
    for (int k = 0; k < s.noutputs; k++) {
        const double row = slice_bytes_f(&s.outputs[k]);
        out_run += row * (double)largest + 64.0;
        row_bytes = row > row_bytes ? row : row_bytes;
    }
    /* per impl, its slot (slot_for): the batched inputs gathered and the outputs, R rows each, guarded */
    const double slot = tensors_bytes(s.inputs, s.ninputs, R, true, true) + tensors_bytes(s.outputs, s.noutputs, R, false, true);
    int nimpls = 0;
    bool host_impl = false;
    double host = tensors_bytes(s.inputs, s.ninputs, R, false, false) + tensors_bytes(s.state, s.nstate, R, false, false) +
                  s.private_bytes + check_scratch(cs, &s) +
                  8.0 * row_bytes + digest_spans(s.inputs, s.ninputs, R), device = 0;
    for (int i = 0; i < cs->nchecks; i++)
        for (int j = 0; j < cs->checks[i].nimpl; j++) {
            const kp_impl *impl = cs->checks[i].impl[j];
            bool named_before = false; /* an impl's buffers and output are one however many checks name it */
            for (int q = 0; q <= i; q++)
                for (int r = 0; r < (q < i ? cs->checks[q].nimpl : j); r++) named_before |= cs->checks[q].impl[r] == impl;
            if (named_before) continue;
            nimpls++;
            const double ws = impl->workspace_bytes ? (double)impl->workspace_bytes(s.args) : 0.0;
            const double against = compared_against(cs, impl) ? tensors_bytes(s.outputs, s.noutputs, s.batch, false, true) : 0;
            const double bufs = slot + ws + 2.0 * KP_GUARD_BYTES + (impl->memory == KP_MEMORY_CUDA ? against : 0.0);
            if (impl->memory == KP_MEMORY_CUDA) device += bufs, est->ncuda++;
            else host += bufs, host_impl = true;
        }
    /* the judgements rule.c keeps (one per output and rule parameters, KP_MEMO_MAX at most): a rule check judges its
       impl's output, an exact check explains with both, an expect with the check it expects */
    int judged = 0;
    for (int i = 0; cs->fam->rule && i < cs->nchecks; i++) {
        const kp_check_spec *k = &cs->checks[i];
        const kp_check_kind kind = k->kind == KP_CHECK_EXPECT ? k->of : k->kind;
        if (kind == KP_CHECK_RULE || kind == KP_CHECK_EXACT || k->defect[0]) judged += k->nimpl;
    }
    host += (double)(judged < KP_MEMO_MAX ? judged : KP_MEMO_MAX) * s.judgement_bytes;
    /* each impl's full output, kept for the case; one repeat run or probe out at a time; the pool's POOL_KEEP */
    host += (double)(nimpls + 1 + POOL_KEEP) * (out_run + digest_spans(s.outputs, s.noutputs, largest));
    /* every input, all rows, once per memory kind an impl runs in (g_cache.all, guarded) */
    const double inputs_copy = tensors_bytes(s.inputs, s.ninputs, R, false, true);
    host += host_impl ? inputs_copy : 0.0;
    device += est->ncuda ? inputs_copy : 0.0;
    if (!(host < 0x1p63) || !(device < 0x1p63)) return kp_fail(err, KP_EXIT_USAGE, "its buffers overflow the address space");
    est->host = (uint64_t)host, est->device = (uint64_t)device;
    return 0;
}

/* ---- output rows ----------------------------------------------------------------------------- */

static unsigned char *rowbuf_reserve(kp_rowbuf *b, size_t bytes) {
    if (b->cap < bytes) {
        unsigned char *grown = realloc(b->p, bytes);
        if (!grown) KP_OUT_OF_MEMORY("for a %zu-byte output row", bytes);
        b->p = grown, b->cap = bytes;
    }
    return b->p;
}

void kp_rowbuf_free(kp_rowbuf *b) {
    free(b->p);
    b->p = NULL, b->cap = 0;
}

const void *kp_output_row(const kp_prepared *p, const kp_output *o, int k, int64_t i, bool canonical, int64_t *elems,
                          kp_rowbuf *buf) {
    const kp_tensor *t = &o->t[k];
    const size_t esize = kp_dtype_size(t->dtype);
    const int64_t cols = kp_tensor_cols(t), stride = kp_tensor_stride(t);
    const int64_t nsub = t->ndim == 1 ? 1 : kp_tensor_rows(t) / o->nrows; /* last-dim rows per batch row */
    const int64_t per_row = t->ndim == 1 ? 1 : nsub * cols;
    const unsigned char *row = (const unsigned char *)t->data + kp_tensor_slice_bytes(t) * (size_t)i;
    const bool canon = canonical && p->fam->canonical_row;
    *elems = per_row;
    if (stride == cols && !canon) return row;
    unsigned char *dense = rowbuf_reserve(buf, 2 * (size_t)per_row * esize);
    if (stride == cols) memcpy(dense, row, (size_t)per_row * esize);
    else
        for (int64_t s = 0; s < nsub; s++)
            memcpy(dense + (size_t)(s * cols) * esize, row + (size_t)(s * stride) * esize, (size_t)cols * esize);
    if (!canon) return dense;
    unsigned char *out = dense + (size_t)per_row * esize;
    p->fam->canonical_row(p->v.data, k, dense, out, per_row);
    return out;
}

kp_span *kp_output_spans(const kp_output *o, size_t *nspans) {
    size_t n = 0;
    for (int k = 0; k < o->ntensors; k++) n += (size_t)(o->t[k].ndim == 1 ? o->nrows : kp_tensor_rows(&o->t[k]));
    kp_span *spans = malloc(sizeof *spans * (n ? n : 1));
    if (!spans) KP_OUT_OF_MEMORY("for an output digest");
    size_t at = 0;
    for (int64_t i = 0; i < o->nrows; i++)
        for (int k = 0; k < o->ntensors; k++) {
            const kp_tensor *t = &o->t[k];
            const size_t esize = kp_dtype_size(t->dtype);
            const unsigned char *row = (const unsigned char *)t->data + kp_tensor_slice_bytes(t) * (size_t)i;
            if (t->ndim == 1) {
                spans[at++] = (kp_span){row, esize};
                continue;
            }
            const int64_t nsub = kp_tensor_rows(t) / o->nrows, cols = kp_tensor_cols(t), stride = kp_tensor_stride(t);
            for (int64_t s = 0; s < nsub; s++) spans[at++] = (kp_span){row + (size_t)(s * stride) * esize, (size_t)cols * esize};
        }
    *nspans = at;
    return spans;
}
