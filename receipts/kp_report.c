/* kp_report.c: the human and CI views of a bundle: junit.xml, summary.md and a self-contained
 * report.html (inline SVG: results per case, a plot per finding, impl times), all rendered from the
 * receipt rows the bundle keeps. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "kp_report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_common.h"
#include "kp_plots.h"
#include "kp_svg.h"
#include "kp_text.h"

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
    int row;     /* which receipt */
    int check;   /* which of its checks; -1 for a receipt without checks */
    int finding; /* report.html draws it (kp_plot_is_finding) */
    char *summary;
} item;

static const char *str_member(const cJSON *obj, const char *key, const char *fallback) {
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, key));
    return s ? s : fallback;
}

static char *join_reasons(const cJSON *reasons) {
    kp_text b = {0};
    const cJSON *r;
    cJSON_ArrayForEach(r, reasons) {
        if (!cJSON_IsString(r)) continue;
        if (b.len) kp_text_puts(&b, "; ");
        kp_text_puts(&b, r->valuestring);
    }
    return kp_text_finish(&b);
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
            it->check = n_checks ? c : -1;
            if (n_checks) {
                const cJSON *check = cJSON_GetArrayItem(checks, c);
                it->finding = kp_plot_is_finding(check);
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
static void put_counts(kp_text *b, const size_t counts[N_RESULTS]) {
    int any = 0;
    for (int r = 0; r < N_RESULTS; r++) {
        if (!counts[r]) continue;
        kp_text_printf(b, "%s%zu %s", any ? ", " : "", counts[r], RESULT_NAME(r));
        any = 1;
    }
    if (!any) kp_text_puts(b, "nothing ran");
}

char *kp_report_junit(const cJSON *rows) {
    size_t n, counts[N_RESULTS];
    item *items = collect_items(rows, &n);
    if (!items) return NULL;
    count_results(items, n, counts);
    kp_text b = {0};
    size_t skipped = counts[3] + counts[4];
    kp_text_puts(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    kp_text_printf(&b, "<testsuites name=\"kparity\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"%zu\">\n", n,
            counts[1], counts[2], skipped);
    kp_text_printf(&b, "  <testsuite name=\"kparity\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"%zu\">\n", n,
            counts[1], counts[2], skipped);
    for (size_t i = 0; i < n; i++) {
        const item *it = &items[i];
        /* classname is the case: GitLab shows it as the suite and keys tests by classname + name. */
        kp_text_puts(&b, "    <testcase classname=\"");
        kp_text_xml(&b, it->case_name);
        kp_text_puts(&b, "\" name=\"");
        kp_text_xml(&b, it->label);
        kp_text_puts(&b, "\"");
        int r = result_index(it->result);
        if (r == 0) {
            kp_text_puts(&b, "/>\n");
            continue;
        }
        kp_text_puts(&b, ">\n      ");
        const char *tag = r == 1 ? "failure" : r == 2 ? "error" : "skipped";
        kp_text_printf(&b, "<%s message=\"", tag);
        kp_text_xml(&b, it->summary);
        kp_text_printf(&b, "\" type=\"%s\"", RESULT_NAME(r));
        if (r >= 3) {
            kp_text_puts(&b, "/>\n");
        } else {
            kp_text_puts(&b, ">");
            kp_text_xml(&b, it->result);
            kp_text_puts(&b, " in ");
            kp_text_xml(&b, it->file);
            if (*it->impl) {
                kp_text_puts(&b, ", impl ");
                kp_text_xml(&b, it->impl);
            }
            kp_text_printf(&b, "</%s>\n", tag);
        }
        kp_text_puts(&b, "    </testcase>\n");
    }
    kp_text_puts(&b, "  </testsuite>\n</testsuites>\n");
    free_items(items, n);
    return kp_text_finish(&b);
}

char *kp_report_summary_md(const cJSON *rows, const char *verdict, int exit_code) {
    size_t n, counts[N_RESULTS];
    item *items = collect_items(rows, &n);
    if (!items) return NULL;
    count_results(items, n, counts);
    kp_text b = {0};
    kp_text_puts(&b, "# kparity verdict: ");
    kp_text_md(&b, verdict);
    kp_text_printf(&b, " (exit code %d)\n\n%d case%s, %zu check%s: ", exit_code, cJSON_GetArraySize(rows),
            cJSON_GetArraySize(rows) == 1 ? "" : "s", n, n == 1 ? "" : "s");
    put_counts(&b, counts);
    kp_text_puts(&b, ".\n\n| case | impl | check | result | key figure |\n| --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < n; i++) {
        const char *cells[] = {items[i].case_name, items[i].impl, items[i].label, items[i].result, items[i].summary};
        for (int c = 0; c < 5; c++) {
            kp_text_puts(&b, "| ");
            kp_text_md(&b, cells[c]);
            kp_text_puts(&b, " ");
        }
        kp_text_puts(&b, "|\n");
    }
    free_items(items, n);
    return kp_text_finish(&b);
}

static void put_svg(kp_text *b, const cJSON *rows, const item *items, size_t n) {
    int n_rows = cJSON_GetArraySize(rows);
    const int width = 760, bar_max = 560, top = 30, block = 38;
    size_t max_per_row = 1;
    for (int r = 0; r < n_rows; r++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += items[i].row == r;
        if (k > max_per_row) max_per_row = k;
    }
    kp_svg_open(b, width, top + block * n_rows + 8, "check results per case");
    for (int r = 0; r < N_RESULTS; r++) /* legend */
        kp_svg_legend(b, 10 + r * 140, 16, result_colors[r], 1, RESULT_NAME(r));
    int row_no = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        size_t counts[N_RESULTS] = {0}, total = 0;
        for (size_t i = 0; i < n; i++)
            if (items[i].row == row_no) counts[result_index(items[i].result)]++, total++;
        int y = top + block * row_no;
        /* Case names run long (every parameter is in them): the label keeps the head. */
        kp_text_printf(b, "<text x=\"10\" y=\"%d\">", y + 12);
        kp_text_xml_head(b, str_member(row, "case", "?"), 110);
        kp_text_puts(b, "</text>\n");
        double x = 10;
        for (int r = 0; r < N_RESULTS; r++) {
            if (!counts[r]) continue;
            double w = (double)bar_max * (double)counts[r] / (double)max_per_row;
            char title[64];
            snprintf(title, sizeof title, "%zu %s", counts[r], RESULT_NAME(r));
            kp_svg_rect(b, x, y + 17, w, 14, result_colors[r], title);
            x += w;
        }
        kp_svg_textf(b, x + 6, y + 29, "start", NULL, 0, "%zu check%s", total, total == 1 ? "" : "s");
        row_no++;
    }
    kp_svg_close(b);
}

/* XHTML-compatible throughout (every element closed, attributes quoted, text escaped), so the page
 * parses as XML too; it must open offline from a CI artifact and print, so nothing is fetched or run. */
static const char *const page_style =
    "body { font-family: sans-serif; margin: 2em; color: #212121; }\n"
    "table { border-collapse: collapse; font-size: 0.9em; }\n"
    "th, td { border: 1px solid #bdbdbd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }\n"
    "td.case, h3.case { font-family: monospace; word-break: break-all; max-width: 40em; }\n"
    "h3.case { max-width: none; margin: 1.6em 0 0.4em; font-size: 1em; border-top: 1px solid #bdbdbd; padding-top: 0.6em; }\n"
    "figure.finding { margin: 0.6em 0 1.4em; break-inside: avoid; }\n"
    "figcaption { margin-bottom: 0.3em; max-width: 70em; }\n"
    "p.note { font-size: 0.85em; margin: 0.2em 0; max-width: 80em; }\n"
    "table.worst { margin: 0.4em 0; font-family: monospace; }\n"
    "table.worst tr.over td { color: #c62828; }\n"
    "svg text { font-family: monospace; font-size: 11px; fill: #212121; }\n"
    "svg text.ptitle { font-weight: bold; }\n"
    "svg text.small { font-size: 9px; }\n"
    "svg text.axis { fill: #757575; }\n"
    "svg text.ok { fill: #2e7d32; font-weight: bold; }\n"
    "svg text.bad { fill: #c62828; font-weight: bold; }\n"
    "@media print { body { margin: 0.5cm; } h2 { break-before: auto; } }\n";

char *kp_report_html(const cJSON *rows, const char *verdict, int exit_code) {
    size_t n, counts[N_RESULTS], findings = 0;
    item *items = collect_items(rows, &n);
    if (!items) return NULL;
    count_results(items, n, counts);
    for (size_t i = 0; i < n; i++) findings += items[i].finding;
    kp_text b = {0};
    kp_text_puts(&b, "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n"
                     "<meta charset=\"utf-8\"/>\n"
                     "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\"/>\n"
                     "<title>kparity: ");
    kp_text_xml(&b, verdict);
    kp_text_puts(&b, "</title>\n<style>\n");
    kp_text_puts(&b, page_style);
    for (int r = 0; r < N_RESULTS; r++)
        kp_text_printf(&b, ".r-%s { color: %s; font-weight: bold; }\n", RESULT_NAME(r), result_colors[r]);
    kp_text_puts(&b, "</style>\n</head>\n<body>\n<h1>kparity verdict: <span class=\"r-");
    kp_text_xml(&b, verdict);
    kp_text_puts(&b, "\">");
    kp_text_xml(&b, verdict);
    kp_text_printf(&b, "</span> (exit code %d)</h1>\n<p>%d case%s, %zu check%s: ", exit_code, cJSON_GetArraySize(rows),
                   cJSON_GetArraySize(rows) == 1 ? "" : "s", n, n == 1 ? "" : "s");
    put_counts(&b, counts);
    kp_text_printf(&b, "; %zu finding%s drawn below.</p>\n", findings, findings == 1 ? "" : "s");
    kp_plot_rule_overview(&b, rows);
    kp_text_puts(&b, "<h2>Check results per case</h2>\n");
    if (cJSON_GetArraySize(rows) > 0) put_svg(&b, rows, items, n);
    else kp_text_puts(&b, "<p>No receipts.</p>\n");
    if (findings) {
        kp_text_printf(&b, "<h2>Findings (%zu)</h2>\n<p class=\"note\">One plot for each check that broke, each expected "
                           "defect that reproduced (drawn from the check that showed it) and each check that recorded "
                           "differences it allows. Hover a mark for its numbers.</p>\n", findings);
        const size_t drawn = kp_plot_findings(&b, rows);
        KP_ASSERT(drawn == findings); /* the table's links and the figures come from one predicate */
    }
    kp_plot_timing(&b, rows);
    kp_text_puts(&b, "<h2>Checks</h2>\n<table>\n<thead><tr><th>case</th><th>impl</th><th>check</th><th>result</th>"
                     "<th>key figure</th><th>receipt</th></tr></thead>\n<tbody>\n");
    for (size_t i = 0; i < n; i++) {
        const item *it = &items[i];
        kp_text_puts(&b, "<tr><td class=\"case\">");
        kp_text_xml(&b, it->case_name);
        kp_text_puts(&b, "</td><td>");
        kp_text_xml(&b, it->impl);
        kp_text_puts(&b, "</td><td>");
        kp_text_xml(&b, it->label);
        kp_text_printf(&b, "</td><td class=\"r-%s\">", RESULT_NAME(result_index(it->result)));
        kp_text_xml(&b, it->result);
        if (it->finding) {
            char id[48];
            kp_plot_anchor(id, sizeof id, it->row, it->check);
            kp_text_printf(&b, " <a href=\"#%s\">plot</a>", id);
        }
        kp_text_puts(&b, "</td><td>");
        kp_text_xml(&b, it->summary);
        kp_text_puts(&b, "</td><td>");
        kp_text_xml(&b, it->file);
        kp_text_puts(&b, "</td></tr>\n");
    }
    kp_text_puts(&b, "</tbody>\n</table>\n</body>\n</html>\n");
    free_items(items, n);
    return kp_text_finish(&b);
}
