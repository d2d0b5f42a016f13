/* kp_report.c: the human and CI views of a bundle: junit.xml, summary.md and a self-contained
 * report.html with an inline SVG chart, all rendered from the receipt rows the bundle keeps. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_bundle.h"
#include "kp_json.h"

/* --- growing text buffer; out of memory is remembered and reported once at the end --- */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} text_buf;

static void put(text_buf *b, const char *s, size_t n) {
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

static void puts_(text_buf *b, const char *s) { put(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3))) static void printf_(text_buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        put(b, small, (size_t)n);
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
    put(b, big, (size_t)n);
    free(big);
}

static char *finish_buf(text_buf *b) {
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

/* Writes s as UTF-8, broken sequences replaced by U+FFFD; each single-byte character goes through
 * one_byte (which writes it, escaped as its format needs), longer sequences are copied. */
static void put_text(text_buf *b, const char *s, void (*one_byte)(text_buf *, unsigned char)) {
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    while (*p) {
        size_t n = utf8_seq(p);
        if (n == 0) {
            puts_(b, "\xEF\xBF\xBD");
            p++;
            continue;
        }
        if (n > 1) put(b, (const char *)p, n);
        else one_byte(b, *p);
        p += n;
    }
}

/* XML and HTML text and attributes. Receipt strings come from kernels' findings and plugin names,
 * so anything XML 1.0 cannot carry (control bytes, broken UTF-8) is replaced rather than trusted. */
static void xml_byte(text_buf *b, unsigned char c) {
    if (c == '&') puts_(b, "&amp;");
    else if (c == '<') puts_(b, "&lt;");
    else if (c == '>') puts_(b, "&gt;");
    else if (c == '"') puts_(b, "&quot;");
    else if (c == '\'') puts_(b, "&apos;");
    else if (c == '\n') puts_(b, "&#10;"); /* kept inside attributes, where a raw newline becomes a space */
    else if (c == '\t') puts_(b, "&#9;");
    else if (c < 0x20) puts_(b, "?");
    else put(b, (const char *)&c, 1);
}
static void put_xml(text_buf *b, const char *s) { put_text(b, s, xml_byte); }

/* A Markdown table cell: '|' would end the cell and a newline the row; emphasis and HTML
 * characters are escaped so a case name shows as written. */
static void md_byte(text_buf *b, unsigned char c) {
    if (strchr("\\|`*<>[]", c)) {
        put(b, "\\", 1);
        put(b, (const char *)&c, 1);
    } else if (c < 0x20) {
        put(b, " ", 1);
    } else {
        put(b, (const char *)&c, 1);
    }
}
static void put_md(text_buf *b, const char *s) { put_text(b, s, md_byte); }

/* --- one item per check (or per receipt without checks) --- */

/* The reports' order of the results (kp_common.h holds their one spelling): passes, then what broke,
 * then what did not run; colours in the same order. */
#define N_RESULTS 5
static const kp_result display_order[N_RESULTS] = {KP_PASSED, KP_INCORRECT, KP_FAILED, KP_NOT_RUN, KP_NOT_SUPPORTED};
static const char *const result_colors[] = {"#2e7d32", "#c62828", "#ef6c00", "#9e9e9e", "#78909c"};
#define RESULT_NAME(i) kp_result_name(display_order[i])

static int result_index(const char *r) {
    const int parsed = kp_result_parse(r);
    for (int i = 0; i < N_RESULTS; i++)
        if (parsed == (int)display_order[i]) return i;
    return 2; /* the bundle refuses other results; count a stray one as an error, never as a pass */
}

typedef struct {
    const char *case_name, *file, *impl, *label, *result;
    int row; /* which receipt */
    char *summary;
} item;

static const char *str_member(const cJSON *obj, const char *key, const char *fallback) {
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, key));
    return s ? s : fallback;
}

static char *join_reasons(const cJSON *reasons) {
    text_buf b = {0};
    const cJSON *r;
    cJSON_ArrayForEach(r, reasons) {
        if (!cJSON_IsString(r)) continue;
        if (b.len) puts_(&b, "; ");
        puts_(&b, r->valuestring);
    }
    if (!b.p) puts_(&b, "");
    return finish_buf(&b);
}

static void free_items(item *items, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(items[i].summary);
    }
    free(items);
}

static item *collect_items(const cJSON *rows, size_t *count) {
    size_t n = 0, cap = 0;
    item *items = NULL;
    int row_no = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        const cJSON *checks = cJSON_GetObjectItemCaseSensitive(row, "checks");
        int n_checks = cJSON_IsArray(checks) ? cJSON_GetArraySize(checks) : 0;
        for (int c = 0; c < (n_checks ? n_checks : 1); c++) {
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                item *grown = realloc(items, cap * sizeof *items);
                if (!grown) goto oom;
                items = grown;
            }
            item *it = &items[n];
            memset(it, 0, sizeof *it);
            n++;
            it->case_name = str_member(row, "case", "?");
            it->file = str_member(row, "file", "?");
            it->row = row_no;
            if (n_checks) {
                const cJSON *check = cJSON_GetArrayItem(checks, c);
                it->impl = str_member(check, "impl", "");
                it->label = str_member(check, "label", str_member(check, "check", "check"));
                it->result = str_member(check, "result", "FAILED");
                it->summary = strdup(str_member(check, "summary", ""));
            } else {
                it->impl = "";
                it->label = "case";
                it->result = str_member(row, "result", "FAILED");
                it->summary = join_reasons(cJSON_GetObjectItemCaseSensitive(row, "reasons"));
            }
            if (!it->summary) goto oom;
        }
        row_no++;
    }
    *count = n;
    if (!items) items = calloc(1, sizeof *items);
    return items;
oom:
    free_items(items, n);
    return NULL;
}

static void count_results(const item *items, size_t n, size_t counts[N_RESULTS]) {
    memset(counts, 0, N_RESULTS * sizeof counts[0]);
    for (size_t i = 0; i < n; i++) counts[result_index(items[i].result)]++;
}

/* "4 PASSED, 1 INCORRECT": only the results that occur. */
static void put_counts(text_buf *b, const size_t counts[N_RESULTS]) {
    int any = 0;
    for (int r = 0; r < N_RESULTS; r++) {
        if (!counts[r]) continue;
        printf_(b, "%s%zu %s", any ? ", " : "", counts[r], RESULT_NAME(r));
        any = 1;
    }
    if (!any) puts_(b, "nothing ran");
}

char *kp_report_junit(const cJSON *rows) {
    size_t n, counts[N_RESULTS];
    item *items = collect_items(rows, &n);
    if (!items) return NULL;
    count_results(items, n, counts);
    text_buf b = {0};
    size_t skipped = counts[3] + counts[4];
    puts_(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    printf_(&b, "<testsuites name=\"kparity\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"%zu\">\n", n,
            counts[1], counts[2], skipped);
    printf_(&b, "  <testsuite name=\"kparity\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"%zu\">\n", n,
            counts[1], counts[2], skipped);
    for (size_t i = 0; i < n; i++) {
        const item *it = &items[i];
        /* classname is the case: GitLab shows it as the suite and keys tests by classname + name. */
        puts_(&b, "    <testcase classname=\"");
        put_xml(&b, it->case_name);
        puts_(&b, "\" name=\"");
        put_xml(&b, it->label);
        puts_(&b, "\"");
        int r = result_index(it->result);
        if (r == 0) {
            puts_(&b, "/>\n");
            continue;
        }
        puts_(&b, ">\n      ");
        const char *tag = r == 1 ? "failure" : r == 2 ? "error" : "skipped";
        printf_(&b, "<%s message=\"", tag);
        put_xml(&b, it->summary);
        printf_(&b, "\" type=\"%s\"", RESULT_NAME(r));
        if (r >= 3) {
            puts_(&b, "/>\n");
        } else {
            puts_(&b, ">");
            put_xml(&b, it->result);
            puts_(&b, " in ");
            put_xml(&b, it->file);
            if (*it->impl) {
                puts_(&b, ", impl ");
                put_xml(&b, it->impl);
            }
            printf_(&b, "</%s>\n", tag);
        }
        puts_(&b, "    </testcase>\n");
    }
    puts_(&b, "  </testsuite>\n</testsuites>\n");
    free_items(items, n);
    return finish_buf(&b);
}

char *kp_report_summary_md(const cJSON *rows, const char *verdict, int exit_code) {
    size_t n, counts[N_RESULTS];
    item *items = collect_items(rows, &n);
    if (!items) return NULL;
    count_results(items, n, counts);
    text_buf b = {0};
    puts_(&b, "# kparity verdict: ");
    put_md(&b, verdict);
    printf_(&b, " (exit code %d)\n\n%d case%s, %zu check%s: ", exit_code, cJSON_GetArraySize(rows),
            cJSON_GetArraySize(rows) == 1 ? "" : "s", n, n == 1 ? "" : "s");
    put_counts(&b, counts);
    puts_(&b, ".\n\n| case | impl | check | result | key figure |\n| --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < n; i++) {
        const char *cells[] = {items[i].case_name, items[i].impl, items[i].label, items[i].result, items[i].summary};
        for (int c = 0; c < 5; c++) {
            puts_(&b, "| ");
            put_md(&b, cells[c]);
            puts_(&b, " ");
        }
        puts_(&b, "|\n");
    }
    free_items(items, n);
    return finish_buf(&b);
}

/* Case names run long (every parameter is in them); the SVG label keeps the head, cut on a
 * UTF-8 boundary. */
static void put_svg_label(text_buf *b, const char *s) {
    size_t max = 110, len = strlen(s);
    if (len <= max) {
        put_xml(b, s);
        return;
    }
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80) max--;
    char *head = strndup(s, max);
    if (!head) {
        b->oom = 1;
        return;
    }
    put_xml(b, head);
    puts_(b, "\xE2\x80\xA6");
    free(head);
}

static void put_svg(text_buf *b, const cJSON *rows, const item *items, size_t n) {
    int n_rows = cJSON_GetArraySize(rows);
    const int width = 760, bar_max = 560, top = 30, block = 38;
    size_t max_per_row = 1;
    for (int r = 0; r < n_rows; r++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += items[i].row == r;
        if (k > max_per_row) max_per_row = k;
    }
    printf_(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" role=\"img\" "
               "aria-label=\"check results per case\">\n", width, top + block * n_rows + 8);
    for (int r = 0; r < N_RESULTS; r++) /* legend */
        printf_(b, "<rect x=\"%d\" y=\"6\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"16\">%s</text>\n",
                10 + r * 140, result_colors[r], 26 + r * 140, RESULT_NAME(r));
    int row_no = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        size_t counts[N_RESULTS] = {0}, total = 0;
        for (size_t i = 0; i < n; i++)
            if (items[i].row == row_no) counts[result_index(items[i].result)]++, total++;
        int y = top + block * row_no;
        printf_(b, "<text x=\"10\" y=\"%d\">", y + 12);
        put_svg_label(b, str_member(row, "case", "?"));
        puts_(b, "</text>\n");
        double x = 10;
        for (int r = 0; r < N_RESULTS; r++) {
            if (!counts[r]) continue;
            double w = (double)bar_max * (double)counts[r] / (double)max_per_row;
            printf_(b, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"14\" fill=\"%s\"><title>%zu %s</title></rect>\n",
                    x, y + 17, w, result_colors[r], counts[r], RESULT_NAME(r));
            x += w;
        }
        printf_(b, "<text x=\"%.1f\" y=\"%d\">%zu check%s</text>\n", x + 6, y + 29, total, total == 1 ? "" : "s");
        row_no++;
    }
    puts_(b, "</svg>\n");
}

char *kp_report_html(const cJSON *rows, const char *verdict, int exit_code) {
    size_t n, counts[N_RESULTS];
    item *items = collect_items(rows, &n);
    if (!items) return NULL;
    count_results(items, n, counts);
    text_buf b = {0};
    puts_(&b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
              /* The report must open offline from a CI artifact: nothing may be fetched. */
              "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
              "<title>kparity: ");
    put_xml(&b, verdict);
    puts_(&b, "</title>\n<style>\n"
              "body { font-family: sans-serif; margin: 2em; color: #212121; }\n"
              "table { border-collapse: collapse; font-size: 0.9em; }\n"
              "th, td { border: 1px solid #bdbdbd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }\n"
              "td.case { font-family: monospace; word-break: break-all; max-width: 40em; }\n"
              "svg text { font-family: monospace; font-size: 11px; }\n");
    for (int r = 0; r < N_RESULTS; r++) printf_(&b, ".r-%s { color: %s; font-weight: bold; }\n", RESULT_NAME(r), result_colors[r]);
    puts_(&b, "</style>\n</head>\n<body>\n<h1>kparity verdict: <span class=\"r-");
    put_xml(&b, verdict);
    puts_(&b, "\">");
    put_xml(&b, verdict);
    printf_(&b, "</span> (exit code %d)</h1>\n<p>%d case%s, %zu check%s: ", exit_code, cJSON_GetArraySize(rows),
            cJSON_GetArraySize(rows) == 1 ? "" : "s", n, n == 1 ? "" : "s");
    put_counts(&b, counts);
    puts_(&b, ".</p>\n<h2>Check results per case</h2>\n");
    if (cJSON_GetArraySize(rows) > 0) put_svg(&b, rows, items, n);
    else puts_(&b, "<p>No receipts.</p>\n");
    puts_(&b, "<h2>Checks</h2>\n<table>\n<thead><tr><th>case</th><th>impl</th><th>check</th><th>result</th>"
              "<th>key figure</th><th>receipt</th></tr></thead>\n<tbody>\n");
    for (size_t i = 0; i < n; i++) {
        const item *it = &items[i];
        puts_(&b, "<tr><td class=\"case\">");
        put_xml(&b, it->case_name);
        puts_(&b, "</td><td>");
        put_xml(&b, it->impl);
        puts_(&b, "</td><td>");
        put_xml(&b, it->label);
        printf_(&b, "</td><td class=\"r-%s\">", RESULT_NAME(result_index(it->result)));
        put_xml(&b, it->result);
        puts_(&b, "</td><td>");
        put_xml(&b, it->summary);
        puts_(&b, "</td><td>");
        put_xml(&b, it->file);
        puts_(&b, "</td></tr>\n");
    }
    puts_(&b, "</tbody>\n</table>\n</body>\n</html>\n");
    free_items(items, n);
    return finish_buf(&b);
}
