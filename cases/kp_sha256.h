/* kp_sha256.h: SHA-256 through OpenSSL EVP, and the lowercase hex form used in every receipt.
 * Input digests, receipt digests, the chain and the manifest all go through here. */
#ifndef KP_SHA256_H
#define KP_SHA256_H

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

#endif
