/* test_sha256_points.c: SHA-256 checkpoints (cases/kp_sha256.h). A job's digest is EVP's over the same bytes and its
 * points are the chain's states at every KP_SHA256_POINT_BYTES; kp_sha256_check accepts exactly the stream that
 * hashes to the digest: one flipped byte in any stretch, a wrong point, a stream one byte longer or shorter, another
 * digest, each refused; the points survive their hex form. Streams straddle the points (prefix, spans of odd lengths,
 * a stream of exactly a multiple of the point spacing). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_sha256.h"

#define P KP_SHA256_POINT_BYTES

static unsigned char *bytes_of(size_t n, unsigned seed) {
    unsigned char *b = malloc(n ? n : 1);
    cr_assert(b);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) x = x * 1664525u + 1013904223u, b[i] = (unsigned char)(x >> 24);
    return b;
}

/* A stream: a 13-byte prefix, then `len` bytes cut into spans of 1, 63, 4095, 1 MiB + 7, and the rest. */
typedef struct stream {
    unsigned char prefix[13];
    unsigned char *data;
    kp_span spans[8];
    size_t nspans, len;
} stream;

static void stream_make(stream *s, size_t len, unsigned seed) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 13; i++) s->prefix[i] = (unsigned char)(0xa0 + i);
    s->data = bytes_of(len, seed);
    s->len = len;
    const size_t cuts[] = {1, 63, 4095, (1u << 20) + 7};
    size_t at = 0;
    for (size_t c = 0; c < 4 && at < len; c++) {
        const size_t n = len - at < cuts[c] ? len - at : cuts[c];
        s->spans[s->nspans++] = (kp_span){s->data + at, n};
        at += n;
    }
    if (at < len) s->spans[s->nspans++] = (kp_span){s->data + at, len - at};
}

/* The job's digest and points, the digest checked against EVP's. */
static void hash_it(const stream *s, char hex[KP_SHA256_HEX_LEN], kp_sha256_points *pts) {
    kp_sha256_job_join_points(kp_sha256_job_start(s->prefix, sizeof s->prefix, s->spans, s->nspans), hex, pts);
    char evp[KP_SHA256_HEX_LEN];
    kp_sha256_spans_hex(s->prefix, sizeof s->prefix, s->spans, s->nspans, evp);
    cr_assert_str_eq(hex, evp);
    const uint64_t total = sizeof s->prefix + s->len;
    cr_assert_eq(pts->len, total);
    cr_assert_eq(pts->n, (int64_t)((total - 1) / P));
}

static bool check_one(const stream *s, const kp_sha256_points *pts, const char *hex) {
    kp_sha256_claim c = {s->prefix, sizeof s->prefix, s->spans, s->nspans, pts, hex, false};
    kp_sha256_check(&c, 1);
    return c.ok;
}

Test(sha256_points, a_jobs_points_check_its_stream_and_catch_any_flipped_byte) {
    const size_t lens[] = {0, 50, 2 * (size_t)P - 13, 2 * (size_t)P - 12, 3 * (size_t)P + 12345};
    for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
        stream s;
        stream_make(&s, lens[l], (unsigned)l + 1);
        char hex[KP_SHA256_HEX_LEN];
        kp_sha256_points pts;
        hash_it(&s, hex, &pts);
        cr_assert(check_one(&s, &pts, hex), "length %zu", lens[l]);
        /* a byte flipped in each stretch: that stretch misses its point, or the last its digest */
        for (uint64_t at = 0; s.len && at < s.len; at += P) {
            const size_t i = (size_t)(at + P / 2 < s.len ? at + P / 2 : s.len - 1);
            s.data[i] ^= 1;
            cr_assert(!check_one(&s, &pts, hex), "length %zu: byte %zu flipped passed", lens[l], i);
            s.data[i] ^= 1;
        }
        s.prefix[0] ^= 0x80;
        cr_assert(!check_one(&s, &pts, hex), "a flipped prefix byte passed");
        s.prefix[0] ^= 0x80;
        /* a wrong point: the stretches on both sides of it fail */
        if (pts.n) {
            pts.h[8 * (pts.n - 1) + 3] ^= 1;
            cr_assert(!check_one(&s, &pts, hex), "length %zu: a wrong point passed", lens[l]);
            pts.h[8 * (pts.n - 1) + 3] ^= 1;
        }
        char other[KP_SHA256_HEX_LEN];
        memcpy(other, hex, sizeof other);
        other[5] = other[5] == '0' ? '1' : '0';
        cr_assert(!check_one(&s, &pts, other), "another digest passed");
        /* the points' hex form, parsed back, checks the same */
        char *ph = kp_sha256_points_hex(&pts);
        kp_sha256_points back;
        cr_assert(kp_sha256_points_parse(ph, pts.len, &back));
        cr_assert(check_one(&s, &back, hex));
        kp_sha256_points_free(&back);
        cr_assert(!kp_sha256_points_parse(ph, pts.len + P, &back), "hex for fewer points than the length has");
        if (pts.n) {
            ph[7] = 'g';
            cr_assert(!kp_sha256_points_parse(ph, pts.len, &back), "a non-hex digit parsed");
        }
        free(ph);
        kp_sha256_points_free(&back);
        kp_sha256_points_free(&pts);
        free(s.data);
    }
}

Test(sha256_points, a_stream_one_byte_longer_or_shorter_is_refused) {
    stream s;
    stream_make(&s, 2 * (size_t)P + 100, 7);
    char hex[KP_SHA256_HEX_LEN];
    kp_sha256_points pts;
    hash_it(&s, hex, &pts);
    s.spans[s.nspans - 1].len -= 1;
    cr_assert(!check_one(&s, &pts, hex), "a stream one byte short passed");
    s.spans[s.nspans - 1].len += 2;
    unsigned char *grown = realloc(s.data, s.len + 1);
    cr_assert(grown);
    grown[s.len] = 0;
    const ptrdiff_t moved = grown - s.data;
    for (size_t i = 0; i < s.nspans; i++) s.spans[i].data = (const unsigned char *)s.spans[i].data + moved;
    s.data = grown;
    cr_assert(!check_one(&s, &pts, hex), "a stream one byte long passed");
    cr_assert(!check_one(&s, NULL, hex), "a claim without points passed");
    kp_sha256_points_free(&pts);
    free(s.data);
}

Test(sha256_points, many_claims_at_once_are_judged_each_on_its_own) {
    enum { N = 5 };
    stream s[N];
    char hex[N][KP_SHA256_HEX_LEN];
    kp_sha256_points pts[N];
    kp_sha256_claim c[N];
    for (int i = 0; i < N; i++) {
        stream_make(&s[i], (size_t)(i + 1) * (P / 2) + (size_t)i, 100 + (unsigned)i);
        hash_it(&s[i], hex[i], &pts[i]);
    }
    s[2].data[s[2].len / 2] ^= 4; /* only the third is wrong */
    for (int i = 0; i < N; i++) c[i] = (kp_sha256_claim){s[i].prefix, sizeof s[i].prefix, s[i].spans, s[i].nspans, &pts[i], hex[i], false};
    kp_sha256_check(c, N);
    for (int i = 0; i < N; i++) cr_assert_eq(c[i].ok, i != 2, "claim %d", i);
    for (int i = 0; i < N; i++) kp_sha256_points_free(&pts[i]), free(s[i].data);
}

/* Past 512 MiB a stream's bit count needs SHA-256's high length word: the points past it carry it. */
Test(sha256_points, a_stream_past_two_to_the_32_bits_checks) {
    const size_t len = ((size_t)513 << 20) + 5;
    unsigned char *z = calloc(len, 1), prefix[1] = {7};
    cr_assert(z);
    z[len - 1] = 1;
    kp_span span = {z, len};
    char hex[KP_SHA256_HEX_LEN];
    kp_sha256_points pts;
    kp_sha256_job_join_points(kp_sha256_job_start(prefix, 1, &span, 1), hex, &pts);
    kp_sha256_claim c = {prefix, 1, &span, 1, &pts, hex, false};
    kp_sha256_check(&c, 1);
    cr_assert(c.ok);
    z[len - 1] = 0;
    kp_sha256_check(&c, 1);
    cr_assert(!c.ok, "a flipped last byte passed");
    kp_sha256_points_free(&pts);
    free(z);
}

/* A stream of a few MB (a top-p case's logits, a small case's reference) must be more than one stretch, or one core
 * checks it while the others wait: at 16 MiB apart every entry under 16 MiB was one. */
Test(sha256_points, a_stream_of_a_few_megabytes_is_checked_in_several_stretches) {
    stream s;
    stream_make(&s, ((size_t)4 << 20) + 1, 9);
    char hex[KP_SHA256_HEX_LEN];
    kp_sha256_points pts;
    hash_it(&s, hex, &pts);
    cr_assert_geq(pts.n, 4, "a 4 MiB stream has %lld points: fewer than 5 stretches", (long long)pts.n);
    cr_assert(check_one(&s, &pts, hex));
    kp_sha256_points_free(&pts);
    free(s.data);
}
