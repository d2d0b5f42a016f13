/* kp_plots.c: report.html's pictures of what the checks found: which checks are findings, one figure
 * each (the plot by check kind: kp_plot_rule.c, kp_plot_checks.c), every rule check's rows at a glance,
 * and the impls' times against each other. Everything comes from the receipt rows and the figure each family
 * plots for its rule (receipts/plot_families.c); nothing is fetched. */
#include "kp_plot_parts.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether x holds a difference list that is not empty (kp_plot_is_finding). */
static int has_differences(const cJSON *x) {
    if (cJSON_IsObject(x)) {
        if (is_list(x)) {
            int64_t n;
            return kp_json_value_int(get(x, "count"), &n) == 0 && n > 0;
        }
        for (const cJSON *c = x->child; c; c = c->next) {
            if (c->string && (!strcmp(c->string, "rows_varying") || !strcmp(c->string, "rows_differ")) &&
                cJSON_GetArraySize(c) > 0)
                return 1;
            if (has_differences(c)) return 1;
        }
    } else if (cJSON_IsArray(x)) {
        for (const cJSON *c = x->child; c; c = c->next)
            if (has_differences(c)) return 1;
    }
    return 0;
}

int kp_plot_is_finding(const cJSON *check) {
    const char *kind = str(check, "check", ""), *result = str(check, "result", "");
    if (!strcmp(result, "INCORRECT")) return 1;
    if (!strcmp(kind, "expect"))
        return !strcmp(result, "PASSED") || has_differences(get(get(check, "inner"), "findings"));
    return has_differences(get(check, "findings"));
}

void kp_plot_anchor(char *out, size_t size, int row, int check) { snprintf(out, size, "finding-%d-%d", row, check); }

const kp_plot_figure *kp_plot_figure_of(const cJSON *row) {
    const char *name = str(row, "case", ""), *paren = strchr(name, '(');
    char family[64];
    if (!paren || paren == name || (size_t)(paren - name) >= sizeof family) return NULL;
    memcpy(family, name, (size_t)(paren - name));
    family[paren - name] = 0;
    return kp_table_find(&kp_plot_figures, family);
}

/* --- one figure per finding --- */

static void plot_none(kp_text *b, const char *why) {
    kp_svg_open(b, KP_PLOT_WIDTH, 28, why);
    kp_svg_text(b, KP_PLOT_LEFT, 18, "start", NULL, 0, why);
    kp_svg_close(b);
}

/* The plot for one check (an expect's inner check, or the check itself) of a case whose family declares fig. */
static const char *plot_check(kp_text *b, const cJSON *chk, const kp_plot_figure *fig) {
    const char *kind = str(chk, "check", "");
    const cJSON *f = get(chk, "findings");
    if (!f) {
        plot_none(b, "the check recorded no findings to draw");
        return "none";
    }
    if (!strcmp(kind, "rule") || !strcmp(kind, "exact")) {
        const int exact = !strcmp(kind, "exact");
        const kp_plot_series s[2] = {{str(chk, "impl", "?"), exact ? str(chk, "impl", "?") : "impl"},
                                     {str(chk, "impl_b", "?"), str(chk, "impl_b", "?")}};
        const int ns = exact ? 2 : 1;
        const cJSON *first = cJSON_GetArrayItem(get(f, "per_row"), 0);
        if (cJSON_IsObject(get(first, s[0].key))) { /* rows judged against the rule */
            kp_plot_rule(b, f, s, ns, fig);
            return exact ? "rule-exact" : "rule";
        }
        if (exact) {
            kp_plot_differ(b, f);
            return "exact";
        }
        plot_none(b, "the rule check recorded no rows to draw");
        return "none";
    }
    if (!strcmp(kind, "tolerance")) return kp_plot_tolerance(b, f), "tolerance";
    if (!strcmp(kind, "repeat")) return kp_plot_repeat(b, chk, f), "repeat";
    if (!strcmp(kind, "batch")) return kp_plot_batch(b, f), "batch";
    plot_none(b, "no plot for this kind of check");
    return "none";
}

static void put_result(kp_text *b, const char *result) {
    kp_text_puts(b, "<span class=\"r-");
    kp_text_xml(b, result);
    kp_text_puts(b, "\">");
    kp_text_xml(b, result);
    kp_text_puts(b, "</span>");
}

size_t kp_plot_findings(kp_text *b, const cJSON *rows) {
    size_t n = 0;
    int r = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        int c = 0, header = 0;
        const cJSON *chk;
        cJSON_ArrayForEach(chk, get(row, "checks")) {
            if (!kp_plot_is_finding(chk)) {
                c++;
                continue;
            }
            if (!header) {
                kp_text_puts(b, "<h3 class=\"case\">");
                kp_text_xml(b, str(row, "case", "?"));
                kp_text_puts(b, "</h3>\n");
                header = 1;
            }
            const int expect = !strcmp(str(chk, "check", ""), "expect");
            const cJSON *shown = expect && get(chk, "inner") ? get(chk, "inner") : chk;
            char id[48];
            kp_plot_anchor(id, sizeof id, r, c);
            /* the plot's kind is known once drawn; the figure opens around a plot drawn into its own buffer */
            kp_text plot = {0};
            const char *kind = plot_check(&plot, shown, kp_plot_figure_of(row));
            kp_text_printf(b, "<figure class=\"finding\" id=\"%s\" data-plot=\"%s\">\n<figcaption><b>", id, kind);
            kp_text_xml(b, str(chk, "label", str(chk, "check", "check")));
            kp_text_puts(b, "</b> ");
            put_result(b, str(chk, "result", "?"));
            if (expect) {
                kp_text_puts(b, " (the expected check ");
                put_result(b, str(shown, "result", "?"));
                kp_text_puts(b, ")");
            }
            kp_text_puts(b, ": ");
            kp_text_xml(b, str(chk, "summary", ""));
            kp_text_puts(b, "</figcaption>\n");
            if (plot.oom) b->oom = 1;
            else if (plot.p) kp_text_put(b, plot.p, plot.len);
            free(plot.p);
            kp_text_puts(b, "</figure>\n");
            n++;
            c++;
        }
        r++;
    }
    return n;
}

/* --- the rule checks' rows at a glance --- */

/* Shades for a row that broke the rule, lightest to darkest: by how far its figure is beyond the reference's (red) or
 * short of it (purple) for a number, by the count for an index list. */
static const char *const excess_shades[5] = {"#ffcdd2", "#ef9a9a", "#e53935", "#b71c1c", "#5d0000"};
static const char *const shortfall_shades[5] = {"#e1bee7", "#ce93d8", "#ab47bc", "#6a1b9a", "#311b92"};
/* Parenthesized: the literals are split only to end a \x escape (clang -Wstring-concatenation). */
static const char *const count_buckets[5] = {"1", ("\xE2\x89\xA4" "4"), ("\xE2\x89\xA4" "16"), ("\xE2\x89\xA4" "64"), ">64"};
#define MEETS_SHADE "#c8e6c9"
#define MAX_FIGURES 4

/* A number's buckets: past 1e3, 1e5, 1e7 and 1e8 floors (for masses, floor 1e-9: 1e-6, 1e-4, 1e-2, 0.1). */
static const int bucket_decades[4] = {3, 5, 7, 8};
static int number_bucket(double d, double floor) {
    int i = 0;
    while (i < 4 && !(fabs(d) < floor * pow(10, bucket_decades[i]))) i++;
    return i;
}
static int count_bucket(int64_t n) { return n <= 1 ? 0 : n <= 4 ? 1 : n <= 16 ? 2 : n <= 64 ? 3 : 4; }

/* The rule check a check shows per row (itself, or an expect's inner rule) when it judged rows, else NULL. */
static const cJSON *rule_shown(const cJSON *chk) {
    const cJSON *shown = !strcmp(str(chk, "check", ""), "expect") ? get(chk, "inner") : chk;
    if (strcmp(str(shown, "check", ""), "rule")) return NULL;
    return cJSON_IsObject(get(cJSON_GetArrayItem(get(get(shown, "findings"), "per_row"), 0), "impl")) ? shown : NULL;
}

/* Whether a figure is a number in these findings (else an index list's count, or none: every list's entries). */
static int figure_is_number(const kp_plot_figure *fig, const cJSON *shown) {
    return kp_plot_figure_is_number(fig, get(cJSON_GetArrayItem(get(get(shown, "findings"), "per_row"), 0), "impl"));
}

/* How far row e's judgement j broke the rule: a number's excess over the reference's, else a count. */
static double row_excess(const kp_plot_figure *fig, int number, const cJSON *e, const cJSON *j) {
    const cJSON *ref = get(e, "reference");
    if (number) return kp_plot_figure_value(fig, j, ref) - kp_plot_figure_reference(fig, ref);
    if (fig && fig->key) return (double)list_count(j, fig->key);
    double n = 0;
    for (const cJSON *m = j ? j->child : NULL; m; m = m->next)
        if (m->string && is_list(m)) n += (double)list_count(j, m->string);
    return n;
}

static void swatches(kp_text *b, double y, const char *what, const char *const shades[5], const char *const labels[5]) {
    kp_svg_text(b, 10, y, "start", NULL, 0, what);
    double x = 10 + 7.0 * (double)strlen(what) + 8;
    for (int i = 0; i < 5; i++) x = kp_svg_legend(b, x, y, shades[i], 1, labels[i]) - 8;
}

void kp_plot_rule_overview(kp_text *b, const cJSON *rows) {
    const cJSON *row, *chk;
    const kp_plot_figure *figs[MAX_FIGURES];
    int strips = 0, nfigs = 0, numbers[MAX_FIGURES], legend_lines = 0;
    cJSON_ArrayForEach(row, rows) cJSON_ArrayForEach(chk, get(row, "checks")) {
        const cJSON *shown = rule_shown(chk);
        if (!shown) continue;
        strips++;
        const kp_plot_figure *fig = kp_plot_figure_of(row);
        int known = 0;
        for (int i = 0; i < nfigs; i++) known |= figs[i] == fig;
        if (!known && nfigs < MAX_FIGURES) {
            numbers[nfigs] = figure_is_number(fig, shown);
            legend_lines += 1 + numbers[nfigs];
            figs[nfigs++] = fig;
        }
    }
    if (!strips) return;
    kp_text_puts(b, "<h2>Rows against the rule</h2>\n<p class=\"note\">One strip for each rule check, one cell a row: green "
                    "meets the rule; otherwise the shade says by how much it broke it. A strip links to its plot.</p>\n");
    const double strip = 36, cells_w = 600;
    double y = 8;
    const double legend_h = 12 + 18.0 * legend_lines + 10;
    kp_svg_open(b, KP_PLOT_WIDTH, y + legend_h + strip * strips, "rows against the rule, per rule check");
    kp_svg_legend(b, 10, y += 12, MEETS_SHADE, 1, "row meets the rule");
    for (int i = 0; i < nfigs; i++) {
        char what[200];
        const char *label = figs[i] && figs[i]->key ? figs[i]->label : "index list entries";
        if (numbers[i]) {
            char buckets[5][24];
            const char *labels[5];
            const int dec0 = (int)floor(log10(figs[i]->floor > 0 ? figs[i]->floor : 1e-9));
            for (int k = 0; k < 5; k++) {
                if (k < 4) snprintf(buckets[k], sizeof buckets[k], "<1e%d", dec0 + bucket_decades[k]);
                else snprintf(buckets[k], sizeof buckets[k], "\xE2\x89\xA5" "1e%d", dec0 + bucket_decades[3]);
                labels[k] = buckets[k];
            }
            snprintf(what, sizeof what, "%s beyond the reference's:", label);
            swatches(b, y += 18, what, excess_shades, labels);
            swatches(b, y += 18, "              or short of it:", shortfall_shades, labels);
        } else {
            snprintf(what, sizeof what, "%s:", label);
            swatches(b, y += 18, what, excess_shades, count_buckets);
        }
    }
    y += 10;
    int r = 0;
    cJSON_ArrayForEach(row, rows) {
        int c = 0;
        const kp_plot_figure *fig = kp_plot_figure_of(row);
        cJSON_ArrayForEach(chk, get(row, "checks")) {
            const cJSON *shown = rule_shown(chk);
            if (!shown) {
                c++;
                continue;
            }
            const int number = figure_is_number(fig, shown);
            const char *label = fig && fig->key ? fig->label : "index list entries";
            const cJSON *f = get(shown, "findings"), *per_row = get(f, "per_row"), *e;
            const int64_t nrows = rows_spanned(f, per_row);
            const int link = kp_plot_is_finding(chk);
            if (link) {
                char id[48];
                kp_plot_anchor(id, sizeof id, r, c);
                kp_text_printf(b, "<a href=\"#%s\">\n", id);
            }
            kp_text_printf(b, "<text x=\"10\" y=\"%.1f\" text-anchor=\"start\">", y + 11);
            kp_text_xml_head(b, str(row, "case", "?"), 96);
            kp_text_puts(b, "  \xC2\xB7  ");
            kp_text_xml(b, str(shown, "impl", "?"));
            kp_text_puts(b, "</text>\n");
            const kp_box cells = {10, y + 15, fmin(cells_w, 14.0 * (double)nrows), 13};
            const double w = kp_svg_row_w(cells, nrows);
            int64_t meet = 0, worst_at = -1;
            double worst = 0;
            cJSON_ArrayForEach(e, per_row) {
                const cJSON *j = get(e, "impl");
                const int64_t rr = inum(e, "row", 0);
                const int ok = flag(j, "meets_rule");
                const double d = row_excess(fig, number, e, j);
                const char *fill = MEETS_SHADE;
                char title[300];
                if (!ok && number) fill = (d < 0 ? shortfall_shades : excess_shades)[number_bucket(d, fig->floor > 0 ? fig->floor : 1e-9)];
                else if (!ok) fill = excess_shades[count_bucket((int64_t)d)];
                if (!ok && (worst_at < 0 || fabs(d) > fabs(worst))) worst = d, worst_at = rr;
                if (number)
                    snprintf(title, sizeof title, "row %lld: %s; %s %+.3g against the reference's", (long long)rr,
                             ok ? "meets the rule" : "breaks the rule", label, d);
                else
                    snprintf(title, sizeof title, "row %lld: %s; %.0f %s", (long long)rr, ok ? "meets the rule" : "breaks the rule",
                             d, label);
                meet += ok;
                kp_svg_rect(b, kp_svg_row_x(cells, nrows, rr) - w / 2, cells.y, w > 3 ? w - 1 : w, cells.h, fill, title);
            }
            char what[200] = "";
            if (worst_at >= 0 && number)
                snprintf(what, sizeof what, "; worst row %lld: %s %+.3g", (long long)worst_at, label, worst);
            else if (worst_at >= 0)
                snprintf(what, sizeof what, "; worst row %lld: %.0f %s", (long long)worst_at, worst, label);
            kp_svg_textf(b, cells.x + cells.w + 8, cells.y + 11, "start", meet == nrows ? "ok" : "bad", 0,
                         "%lld/%lld rows meet%s", (long long)meet, (long long)nrows, what);
            if (link) kp_text_puts(b, "</a>\n");
            y += strip;
            c++;
        }
        r++;
    }
    kp_svg_close(b);
}

/* --- the impls' times against each other --- */

void kp_plot_timing(kp_text *b, const cJSON *rows) {
    static const char *const palette[] = {"#1565c0", "#00897b", "#8e24aa", "#f4511e", "#6d4c41", "#546e7a"};
    const char *names[6] = {0};
    int nnames = 0, lines = 0, cases = 0;
    const cJSON *row, *impl;
    cJSON_ArrayForEach(row, rows) {
        int here = 0;
        cJSON_ArrayForEach(impl, get(row, "impls")) {
            if (!(num(get(impl, "timing"), "wall_us", -1) >= 0)) continue;
            here++;
            const char *name = str(impl, "name", "?");
            int known = 0;
            for (int i = 0; i < nnames; i++) known |= !strcmp(names[i], name);
            if (!known && nnames < 6) names[nnames++] = name;
        }
        lines += here, cases += here > 0;
    }
    if (!lines) return;
    kp_text_puts(b, "<h2>Impl times</h2>\n<p class=\"note\">Each impl's wall time for the case's full batch (one launch, "
                    "sync, guard checks and copy back: impls[].timing.wall_us), bars scaled to the slowest impl of each case. "
                    "<code>kparity bench</code> times kernels alone.</p>\n");
    const double bar_h = 11, gap = 20;
    kp_svg_open(b, KP_PLOT_WIDTH, 30 + lines * (bar_h + 2) + cases * gap, "impl wall times per case");
    double x = 10;
    for (int i = 0; i < nnames; i++) x = kp_svg_legend(b, x, 16, palette[i], 1, names[i]);
    double y = 30;
    cJSON_ArrayForEach(row, rows) {
        double slowest = 0, first = -1;
        cJSON_ArrayForEach(impl, get(row, "impls")) slowest = fmax(slowest, num(get(impl, "timing"), "wall_us", 0));
        if (!(slowest > 0)) continue;
        kp_text_puts(b, "<text x=\"10\" y=\"");
        kp_text_printf(b, "%.1f\" text-anchor=\"start\">", y + 10);
        kp_text_xml_head(b, str(row, "case", "?"), 130);
        kp_text_puts(b, "</text>\n");
        y += 14;
        cJSON_ArrayForEach(impl, get(row, "impls")) {
            const double us = num(get(impl, "timing"), "wall_us", -1);
            if (!(us >= 0)) continue;
            const char *name = str(impl, "name", "?");
            int c = 5;
            for (int i = 0; i < nnames; i++)
                if (!strcmp(names[i], name)) c = i;
            char title[300];
            snprintf(title, sizeof title, "%s: %.0f us", name, us);
            const double w = (KP_PLOT_WIDTH - 260) * us / slowest;
            kp_svg_rect(b, 30, y, fmax(w, 1), bar_h, palette[c], title);
            if (first < 0) first = us;
            if (first > 0 && us != first)
                kp_svg_textf(b, 36 + w, y + 9, "start", NULL, 0, "%.4g ms (%.2fx the first)", us / 1000, us / first);
            else kp_svg_textf(b, 36 + w, y + 9, "start", NULL, 0, "%.4g ms", us / 1000);
            y += bar_h + 2;
        }
        y += gap - 14;
    }
    kp_svg_close(b);
}
