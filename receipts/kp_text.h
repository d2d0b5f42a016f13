/* kp_text.h: a growing text buffer and the escaping the bundle's reports need (XML for junit.xml and
 * report.html, Markdown table cells for summary.md). Internal to receipts/. */
#ifndef KP_TEXT_H
#define KP_TEXT_H

#include <stddef.h>

/* Out of memory is remembered (oom) and reported once, by kp_text_finish returning NULL. */
typedef struct kp_text {
    char *p;
    size_t len, cap;
    int oom;
} kp_text;

void kp_text_put(kp_text *b, const char *s, size_t n);
void kp_text_puts(kp_text *b, const char *s);
__attribute__((format(printf, 2, 3))) void kp_text_printf(kp_text *b, const char *fmt, ...);
/* The text, malloc'd and NUL-terminated (the caller frees it); NULL when out of memory. */
char *kp_text_finish(kp_text *b);

/* s as XML text or a quoted attribute value: & < > " ' escaped, newline and tab as character
 * references, other control bytes and broken UTF-8 replaced (receipt strings come from kernels'
 * findings and plugin names, so nothing XML 1.0 cannot carry is trusted). NULL writes nothing. */
void kp_text_xml(kp_text *b, const char *s);
/* At most max_bytes of s (cut on a UTF-8 boundary, an ellipsis added when cut), escaped as kp_text_xml. */
void kp_text_xml_head(kp_text *b, const char *s, size_t max_bytes);
/* s as one Markdown table cell: | and newlines cannot end it, emphasis and HTML characters are escaped. */
void kp_text_md(kp_text *b, const char *s);

#endif
