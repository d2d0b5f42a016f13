/* kp_sha256.h: SHA-256 through OpenSSL EVP, and the lowercase hex form used in every receipt.
 * Input digests, receipt digests, the chain and the manifest all go through here. */
#ifndef KP_SHA256_H
#define KP_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kp_common.h"

#define KP_SHA256_HEX_LEN 65 /* 64 hex digits and a NUL */

typedef struct kp_sha256 {
    void *md_ctx; /* EVP_MD_CTX */
} kp_sha256;

int kp_sha256_init(kp_sha256 *h, kp_error *err);
void kp_sha256_update(kp_sha256 *h, const void *data, size_t len);
/* Finish, free the context, write 64 hex digits and a NUL. */
void kp_sha256_final_hex(kp_sha256 *h, char hex[KP_SHA256_HEX_LEN]);

/* One-shot forms. */
void kp_sha256_hex(const void *data, size_t len, char hex[KP_SHA256_HEX_LEN]);
/* Digest of a whole file; KP_EXIT_USAGE naming the path when it cannot be read. */
int kp_sha256_file_hex(const char *path, char hex[KP_SHA256_HEX_LEN], kp_error *err);

/* A digest of prefix (copied) followed by spans, computed on a thread of its own while the caller
 * goes on (or before kp_sha256_job_start returns: under KP_SHA256_JOB_THREAD_BYTES, or where no
 * thread can be made): the spans' bytes must stay valid and unchanged until kp_sha256_job_join, which
 * waits, writes the hex and frees the job. The same hex as kp_sha256_update over the same bytes in
 * the same order. */
typedef struct kp_span {
    const void *data;
    size_t len;
} kp_span;
/* The same digest, now. */
void kp_sha256_spans_hex(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans,
                         char hex[KP_SHA256_HEX_LEN]);
typedef struct kp_sha256_job kp_sha256_job;
#define KP_SHA256_JOB_THREAD_BYTES (1u << 20) /* smaller digests are computed in kp_sha256_job_start */
kp_sha256_job *kp_sha256_job_start(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans);
void kp_sha256_job_join(kp_sha256_job *job, char hex[KP_SHA256_HEX_LEN]);

/* A stream's checkpoints: SHA-256's chaining state after every KP_SHA256_POINT_BYTES of the stream (a multiple of
 * its 64-byte block), which hashing the stream passes through anyway. SHA-256 is a chain: the state after a stretch
 * is a function of the state before it and the stretch's bytes alone, and the digest of the state after the last
 * full block and the tail. So a stream hashes to a digest exactly when each stretch, hashed from the state recorded
 * before it (the standard start for the first), reaches the state recorded after it, and the last stretch finishes
 * at the digest: a check that every stretch can make at once, on its own thread. One core hashes a stream alone.
 * 1 MiB apart: at 16 MiB every tensor of a few MB was one stretch, checked on one core while the others waited; a
 * point costs 64 hex digits a MiB of an entry's metadata. The cache's key texts carry the spacing's version
 * (harness/cached.c). */
#define KP_SHA256_POINT_BYTES ((uint64_t)1 << 20)
typedef struct kp_sha256_points {
    uint64_t len; /* the stream's bytes */
    int64_t n;    /* one point at each multiple of KP_SHA256_POINT_BYTES below len */
    uint32_t *h;  /* n x 8 state words */
} kp_sha256_points;
void kp_sha256_points_free(kp_sha256_points *p);
/* As stored: n * 64 hex digits, malloc'd ("" for none). */
char *kp_sha256_points_hex(const kp_sha256_points *p);
/* The points of a stream of len bytes from their hex; false when it is not that many points' hex. */
bool kp_sha256_points_parse(const char *hex, uint64_t len, kp_sha256_points *p);
/* kp_sha256_job_join, and the stream's points into *points (NULL: not wanted). */
void kp_sha256_job_join_points(kp_sha256_job *job, char hex[KP_SHA256_HEX_LEN], kp_sha256_points *points);

/* A claim that prefix || spans hashes to hex, with the stream's points; ok is set by kp_sha256_check. */
typedef struct kp_sha256_claim {
    const void *prefix;
    size_t prefix_len;
    const kp_span *spans;
    size_t nspans;
    const kp_sha256_points *points;
    const char *hex;
    bool ok;
} kp_sha256_claim;
/* Check every claim, their stretches spread over kp_thread_count() threads: ok when the stream's length is the
 * points' and the stream hashes to hex (exactly SHA-256's answer, above); false for any other stream or points. */
void kp_sha256_check(kp_sha256_claim *claims, int n);

#endif
