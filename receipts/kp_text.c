/* kp_text.c: the reports' growing text buffer and their escaping, so every writer of junit.xml,
 * summary.md and report.html escapes the same way. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "kp_text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kp_text_put(kp_text *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void kp_text_puts(kp_text *b, const char *s) { kp_text_put(b, s, strlen(s)); }

void kp_text_printf(kp_text *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        kp_text_put(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    kp_text_put(b, big, (size_t)n);
    free(big);
}

char *kp_text_finish(kp_text *b) {
    if (!b->p && !b->oom) kp_text_put(b, "", 0);
    if (b->oom || !b->p) {
        free(b->p);
        return NULL;
    }
    return b->p;
}

/* Length of the well-formed UTF-8 sequence at s, 0 if it is not one (overlong, surrogate, cut short). */
static size_t utf8_seq(const unsigned char *s) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t n = c >= 0xC2 && c <= 0xDF ? 2 : (c & 0xF0) == 0xE0 ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (n == 3) {
        unsigned cp = (c & 0x0F) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu);
        if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    } else if (n == 4) {
        unsigned cp = (c & 0x07) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu);
        if (cp < 0x10000 || cp > 0x10FFFF) return 0;
    }
    return n;
}

/* Writes at most `max` bytes of s as UTF-8, broken sequences replaced by U+FFFD; each single-byte
 * character goes through one_byte (which writes it, escaped as its format needs), longer sequences are
 * copied. Returns whether all of s was written. */
static int put_text(kp_text *b, const char *s, size_t max, void (*one_byte)(kp_text *, unsigned char)) {
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t used = 0;
    while (*p) {
        size_t n = utf8_seq(p);
        if (used + (n ? n : 1) > max) return 0;
        used += n ? n : 1;
        if (n == 0) {
            kp_text_puts(b, "\xEF\xBF\xBD");
            p++;
            continue;
        }
        if (n > 1) kp_text_put(b, (const char *)p, n);
        else one_byte(b, *p);
        p += n;
    }
    return 1;
}

static void xml_byte(kp_text *b, unsigned char c) {
    if (c == '&') kp_text_puts(b, "&amp;");
    else if (c == '<') kp_text_puts(b, "&lt;");
    else if (c == '>') kp_text_puts(b, "&gt;");
    else if (c == '"') kp_text_puts(b, "&quot;");
    else if (c == '\'') kp_text_puts(b, "&apos;");
    else if (c == '\n') kp_text_puts(b, "&#10;"); /* kept inside attributes, where a raw newline becomes a space */
    else if (c == '\t') kp_text_puts(b, "&#9;");
    else if (c < 0x20) kp_text_puts(b, "?");
    else kp_text_put(b, (const char *)&c, 1);
}

void kp_text_xml(kp_text *b, const char *s) { put_text(b, s, (size_t)-1, xml_byte); }

void kp_text_xml_head(kp_text *b, const char *s, size_t max_bytes) {
    if (!put_text(b, s, max_bytes, xml_byte)) kp_text_puts(b, "\xE2\x80\xA6");
}

static void md_byte(kp_text *b, unsigned char c) {
    if (strchr("\\|`*<>[]", c)) {
        kp_text_put(b, "\\", 1);
        kp_text_put(b, (const char *)&c, 1);
    } else if (c < 0x20) {
        kp_text_put(b, " ", 1);
    } else {
        kp_text_put(b, (const char *)&c, 1);
    }
}

void kp_text_md(kp_text *b, const char *s) { put_text(b, s, (size_t)-1, md_byte); }
