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

#endif
