/* kp_cache.h: the content-addressed cache of generated inputs and references (harness/cache.c).
 *
 * Inputs are a pure function of a case's canonical name and its generator's version, and a reference of its inputs
 * and its family's reference version: a second run of the same case reads them back instead of recomputing them. An
 * entry is one file, <dir>/v1/<kind>/<key[0..1]>/<key>, key the SHA-256 of its key text (which the entry repeats, so
 * a file planted under another key is refused), written to a file of its own and renamed into place, so concurrent
 * runs sharing a folder never see a torn entry. Its layout: "KPCACHE2"; each tensor's bytes as they lie in memory
 * (every slice, row padding included) at a 64-byte aligned offset, zeros between; the metadata (JSON: key, tensors
 * with offsets, the caller's digests); then the metadata's offset and length (u64 LE each) and its SHA-256 hex. The
 * file is exactly that long. Nothing read is trusted: here the layout, the gaps and row padding (zeros) and the
 * metadata's digest are checked; harness/cached.c hashes every tensor byte again before it uses an entry, on every
 * thread from the SHA-256 checkpoints the entry records (kp_sha256_points), which proves the bytes hash to the digests a
 * receipt records, and recomputes (and rewrites) one that fails. Kinds: "inputs" and "reference" (bytes), "digests"
 * (the inputs' digests and checkpoints alone, no bytes). `verify --replay` never reads it. */
#ifndef KP_CACHE_H
#define KP_CACHE_H

#include <stdbool.h>

#include "../receipts/kp_json.h"
#include "kp_harness.h"

/* The process's cache folder: dir (--cache DIR) when given, none when off (--no-cache), else $KPARITY_CACHE ("off",
 * or a folder), else $XDG_CACHE_HOME/kparity, else $HOME/.cache/kparity. A folder named by --cache or KPARITY_CACHE
 * that cannot be made or written is KP_EXIT_USAGE naming it; the default one is left unused, with one line on stderr. */
int kp_cache_configure(const char *dir, bool off, kp_error *err);
/* The folder in use, or NULL: none (off, or the default could not be used). */
const char *kp_cache_dir(void);

/* Whether making `bytes` in `seconds` is worth an entry. A hit skips the making, but hashes every byte before it may
 * use them, on every thread (from the checkpoints its entry records, kp_sha256_check): so a hit is faster only when
 * making took longer than the run's threads hash the bytes (kp_cache_hash_rate each), and the entry pays for its
 * writing within KP_CACHE_PAYBACK_HITS hits only when making took longer than that many parts of writing it
 * (kp_cache_write_rate; while the folder's rate is unknown, the first large entry written measures it, so a fresh
 * folder's first run stores what its second would otherwise make again). Both must hold (measured on the H200: writing
 * the 27 GB of expert weights its GPU makes at 3-6 GB/s made a CUDA gate slower cold and warm, at one thread's writes).
 * Inputs not worth an entry leave a digests entry (their digests and checkpoints, no bytes): a run that makes them again
 * checks them against it on every thread instead of hashing each input on one (kp_cache_digests_read). */
#define KP_CACHE_PAYBACK_HITS 4
bool kp_cache_worth(double bytes, double seconds);
/* Bytes a second one core hashes with SHA-256 here, measured once a process (16 MiB, twice: the faster). */
double kp_cache_hash_rate(void);
/* Bytes a second the folder took the last large entry (over 64 MB) written at (file written on every thread, closed
 * and renamed), recorded in the folder for the next process (<dir>/write_rate); 0 while unknown (no such entry yet). */
double kp_cache_write_rate(void);

/* A tensor of an entry: t's `slices` slices of dim 0 as they lie in memory (a batched input's rows past its batch). */
typedef struct kp_cache_tensor {
    const kp_tensor *t;
    int64_t slices;
} kp_cache_tensor;

/* The most the folder holds ($KPARITY_CACHE_MAX_GB, default 20): past it, each entry written removes the least
 * recently used (written or read) that this run has not used, until it fits; an entry that would not fit beside this
 * run's own is not written (so a run whose entries pass the cap keeps a stable part of them, run after run, instead
 * of evicting its own as it goes). */
double kp_cache_cap_bytes(void);
/* Whether an entry of `bytes` fits under the cap beside the entries this run has used. */
bool kp_cache_fits(double bytes);

/* The key of `key_text` (its SHA-256 hex). */
void kp_cache_key(const char *key_text, char key[KP_SHA256_HEX_LEN]);

/* Store an entry: meta (the caller's fields: its digests; "key" and "tensors" are added here) and the tensors' bytes.
 * A failure to write (a full disk, a folder gone) leaves no entry and returns KP_EXIT_ENV with why; the run goes on. */
int kp_cache_put(const char *kind, const char *key_text, cJSON *meta, const kp_cache_tensor *tensors, int n, kp_error *err);

/* Marks entry (kind, key_text) used now, when it exists: one this run relies on without reading it stays past the cap
 * like those it read. */
void kp_cache_touch(const char *kind, const char *key_text);

/* An entry read back: its file mapped (private, so writes to it never reach the file), its metadata and tensors. */
typedef struct kp_cache_entry {
    void *map;
    size_t len;
    cJSON *meta;
    int ntensors;
    kp_tensor tensors[2 * KP_MAX_TENSORS]; /* as stored, data pointing into the map */
    int64_t slices[2 * KP_MAX_TENSORS];
} kp_cache_entry;
/* Open entry key_text of kind: 1 when it is there and well formed (the layout checks above), 0 when there is none,
 * -1 when one is there but refused; why says which (absent, truncated, another key's entry, ...). */
int kp_cache_open(const char *kind, const char *key_text, kp_cache_entry *e, char *why, size_t why_len);
/* Unmap it (unless its map was handed on: e->map NULL) and free its metadata. */
void kp_cache_close(kp_cache_entry *e);

#endif
