/* kp_sha256.c: SHA-256 over OpenSSL 3's EVP interface (the SHA256_* calls are deprecated).
 * A digest failure inside OpenSSL is a broken environment, so it aborts with file and line. */
#include "kp_sha256.h"

#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kp_sha256_init(kp_sha256 *h, kp_error *err) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        return kp_fail(err, KP_EXIT_ENV, "OpenSSL could not start a SHA-256 digest");
    }
    h->md_ctx = ctx;
    return 0;
}

void kp_sha256_update(kp_sha256 *h, const void *data, size_t len) {
    KP_ASSERT(h->md_ctx);
    if (len && EVP_DigestUpdate(h->md_ctx, data, len) != 1) KP_ASSERT(!"EVP_DigestUpdate failed");
}

void kp_sha256_final_hex(kp_sha256 *h, char hex[KP_SHA256_HEX_LEN]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    KP_ASSERT(h->md_ctx);
    if (EVP_DigestFinal_ex(h->md_ctx, md, &n) != 1 || n != 32) KP_ASSERT(!"EVP_DigestFinal_ex failed");
    EVP_MD_CTX_free(h->md_ctx);
    h->md_ctx = NULL;
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = '\0';
}

void kp_sha256_hex(const void *data, size_t len, char hex[KP_SHA256_HEX_LEN]) {
    kp_sha256 h = {0};
    kp_error err;
    if (kp_sha256_init(&h, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
    kp_sha256_update(&h, data, len);
    kp_sha256_final_hex(&h, hex);
}

int kp_sha256_file_hex(const char *path, char hex[KP_SHA256_HEX_LEN], kp_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kp_fail(err, KP_EXIT_USAGE, "%s: cannot read: %s", path, strerror(errno));
    kp_sha256 h = {0};
    if (kp_sha256_init(&h, err)) {
        fclose(f);
        return err->code;
    }
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) kp_sha256_update(&h, buf, n);
    int bad = ferror(f);
    fclose(f);
    kp_sha256_final_hex(&h, hex);
    if (bad) return kp_fail(err, KP_EXIT_USAGE, "%s: read error", path);
    return 0;
}

struct kp_sha256_job {
    pthread_t thread;
    int threaded;
    unsigned char *prefix;
    size_t prefix_len, nspans;
    kp_span *spans;
    char hex[KP_SHA256_HEX_LEN];
};

void kp_sha256_spans_hex(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans,
                         char hex[KP_SHA256_HEX_LEN]) {
    kp_sha256 h = {0};
    kp_error err;
    if (kp_sha256_init(&h, &err)) kp_abort(__FILE__, __LINE__, "%s", err.msg);
    kp_sha256_update(&h, prefix, prefix_len);
    for (size_t i = 0; i < nspans; i++) kp_sha256_update(&h, spans[i].data, spans[i].len);
    kp_sha256_final_hex(&h, hex);
}

static void *job_main(void *arg) {
    kp_sha256_job *job = arg;
    kp_sha256_spans_hex(job->prefix, job->prefix_len, job->spans, job->nspans, job->hex);
    return NULL;
}

kp_sha256_job *kp_sha256_job_start(const void *prefix, size_t prefix_len, const kp_span *spans, size_t nspans) {
    kp_sha256_job *job = calloc(1, sizeof *job);
    if (!job) KP_OUT_OF_MEMORY("for a digest job");
    job->prefix = malloc(prefix_len ? prefix_len : 1);
    job->spans = malloc(sizeof *spans * (nspans ? nspans : 1));
    if (!job->prefix || !job->spans) KP_OUT_OF_MEMORY("for a digest job");
    if (prefix_len) memcpy(job->prefix, prefix, prefix_len);
    if (nspans) memcpy(job->spans, spans, sizeof *spans * nspans);
    job->prefix_len = prefix_len;
    job->nspans = nspans;
    size_t bytes = prefix_len;
    for (size_t i = 0; i < nspans; i++) bytes += spans[i].len;
    /* a small digest costs less than a thread; where no thread can be made, the same digest, now */
    job->threaded = bytes >= KP_SHA256_JOB_THREAD_BYTES && pthread_create(&job->thread, NULL, job_main, job) == 0;
    if (!job->threaded) job_main(job);
    return job;
}

void kp_sha256_job_join(kp_sha256_job *job, char hex[KP_SHA256_HEX_LEN]) {
    if (job->threaded && pthread_join(job->thread, NULL) != 0) kp_abort(__FILE__, __LINE__, "joining a digest thread");
    memcpy(hex, job->hex, KP_SHA256_HEX_LEN);
    free(job->prefix);
    free(job->spans);
    free(job);
}
