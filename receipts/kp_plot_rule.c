/* kp_plot_rule.c: report.html's plots of rule findings, for a rule check (one impl) or an exact check the rule explains
 * (two): per row, each index list's count the judge recorded and the family's figure (kp_plot_figure) against the
 * reference's; and of exact findings no rule explains: the elements that differ, per row. Nothing here knows a family:
 * the lists are what the rows hold, the figure is what the family declares. */
#include "kp_plot_parts.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- exact without a rule to explain it: differing elements per row --- */

static int64_t differ_count(const cJSON *d) {
    if (get(d, "count")) return inum(d, "count", 0);
    int64_t n = 0; /* several output tensors: {tensor: {count, first}} */
    for (const cJSON *t = d ? d->child : NULL; t; t = t->next) n += inum(t, "count", 0);
    return n;
}

void kp_plot_differ(kp_text *b, const cJSON *f) {
    const cJSON *per_row = get(f, "per_row"), *e;
    const int64_t nrows = rows_spanned(f, per_row);
    double cmax = 1;
    cJSON_ArrayForEach(e, per_row) cmax = fmax(cmax, (double)differ_count(get(e, "differ")));
    const kp_box p = {KP_PLOT_LEFT, 30, KP_PLOT_W, 140};
    kp_svg_open(b, KP_PLOT_WIDTH, p.y + p.h + 34, "elements that differ per row");
    kp_svg_panel(b, p, "elements that differ per row (every output tensor)");
    kp_svg_textf(b, KP_PLOT_LEFT - 6, p.y + 10, "end", NULL, 0, "%.0f", cmax);
    kp_svg_text(b, KP_PLOT_LEFT - 6, p.y + p.h, "end", NULL, 0, "0");
    const double bw = fmax(1, fmin(14, kp_svg_row_w(p, nrows) * 0.8));
    cJSON_ArrayForEach(e, per_row) {
        const int64_t r = inum(e, "row", 0), n = differ_count(get(e, "differ"));
        char title[120];
        snprintf(title, sizeof title, "row %lld: %lld elements differ", (long long)r, (long long)n);
        kp_svg_rect(b, kp_svg_row_x(p, nrows, r) - bw / 2, p.y + p.h, bw, -p.h * (double)n / cmax, KP_RED, title);
    }
    kp_svg_row_axis(b, p, nrows);
    kp_svg_close(b);
}


/* --- rule findings: index lists and the family's figure, per row --- */

#define MAX_LISTS 6
static const char *const list_fill[MAX_LISTS] = {"#c62828", "#ef6c00", "#f9a825", "#8e24aa", "#1565c0", "#6d4c41"};

/* The index lists a judgement record holds, in its order (at most MAX_LISTS). */
static int list_names(const cJSON *j, const char *names[MAX_LISTS]) {
    int n = 0;
    for (const cJSON *m = j ? j->child : NULL; m && n < MAX_LISTS; m = m->next)
        if (m->string && is_list(m)) names[n++] = m->string;
    return n;
}

double kp_plot_symlog(double d, double lin) { return d >= 0 ? log10(1 + d / lin) : -log10(1 - d / lin); }

int kp_plot_figure_is_number(const kp_plot_figure *fig, const cJSON *j) {
    double v; /* a receipt read back holds numbers; one being written holds some as raw text (kp_json) */
    return fig && fig->key && !is_list(get(j, fig->key)) && j && kp_json_get_double(j, fig->key, &v) == 0;
}

double kp_plot_figure_reference(const kp_plot_figure *fig, const cJSON *ref) {
    return get(ref, fig->key) ? kp_plot_figure_value(fig, ref, ref) : 0; /* none given: the figure's own zero */
}

double kp_plot_figure_value(const kp_plot_figure *fig, const cJSON *j, const cJSON *ref) {
    const cJSON *v = get(j, fig->key);
    if (is_list(v)) return (double)list_count(j, fig->key);
    return num(j, fig->key, NAN) - (fig->baseline ? num(ref, fig->baseline, NAN) : 0);
}

void kp_plot_rule(kp_text *b, const cJSON *f, const kp_plot_series *s, int ns, const kp_plot_figure *fig) {
    const cJSON *per_row = get(f, "per_row"), *e;
    const int64_t nrows = rows_spanned(f, per_row);
    const char *names[MAX_LISTS];
    const int nl = list_names(get(cJSON_GetArrayItem(per_row, 0), s[0].key), names);
    /* the figure gets its own panel when it is a number (a list's count is in the counts panel already) */
    const int number = kp_plot_figure_is_number(fig, get(cJSON_GetArrayItem(per_row, 0), s[0].key));
    const double lin = number && fig->floor > 0 ? fig->floor : 1e-9;
    double cmax = 1, top = 3, bottom = 0; /* counts; the figure's axis spans at least 1e3 floors up */
    cJSON_ArrayForEach(e, per_row) {
        const cJSON *ref = get(e, "reference");
        if (number && get(ref, fig->key)) top = fmax(top, kp_plot_symlog(kp_plot_figure_value(fig, ref, ref), lin));
        for (int k = 0; k < ns; k++) {
            const cJSON *j = get(e, s[k].key);
            if (!j) continue;
            double total = 0;
            for (int l = 0; l < nl; l++) total += (double)list_count(j, names[l]);
            cmax = fmax(cmax, total);
            if (!number) continue;
            const double v = kp_plot_symlog(kp_plot_figure_value(fig, j, ref), lin);
            if (v > top) top = v;
            if (v < bottom) bottom = v;
        }
    }
    top = fmin(2 * ceil((top + 1) / 2) - 1, 9); /* up to the next labelled decade */
    if (bottom < 0) bottom = fmax(-(2 * ceil((-bottom + 1) / 2) - 1), -9);
    const kp_box counts = {KP_PLOT_LEFT, 60, KP_PLOT_W, 90};
    const kp_box fp = {KP_PLOT_LEFT, 182, KP_PLOT_W, number ? (bottom < 0 ? 230 : 160) : 0};
    const double height = (number ? fp.y + fp.h : counts.y + counts.h) + 34;
    kp_svg_open(b, KP_PLOT_WIDTH, height, "index lists against the rule per row, and the family's figure");

    double x = KP_PLOT_LEFT; /* legend */
    for (int l = 0; l < nl; l++) x = kp_svg_legend(b, x, 16, list_fill[l], 1, names[l]);
    kp_svg_legend(b, x, 16, KP_SHADE, 1, "row breaks the rule");
    x = KP_PLOT_LEFT;
    for (int k = 0; k < ns; k++) { /* the impls by marker shape */
        kp_svg_dot(b, x + 6, 28, 4.5, "#ffffff", k, NULL);
        kp_svg_text(b, x + 16, 32, "start", NULL, 0, s[k].name);
        x += 16 + 7.0 * (double)strlen(s[k].name) + 18;
    }
    if (number) {
        x = kp_svg_legend(b, x, 32, KP_GREEN, 1, "meets the rule");
        x = kp_svg_legend(b, x, 32, KP_RED, 1, "breaks it");
        kp_svg_legend(b, x, 32, KP_GREY, -1, "reference");
    }
    cJSON_ArrayForEach(e, per_row) { /* shading under everything */
        int broken = 0;
        for (int k = 0; k < ns; k++) broken |= get(e, s[k].key) && !flag(get(e, s[k].key), "meets_rule");
        if (!broken) continue;
        shade_row(b, counts, nrows, inum(e, "row", 0), counts.y, counts.y + counts.h);
        if (number) shade_row(b, fp, nrows, inum(e, "row", 0), fp.y, fp.y + fp.h);
    }
    kp_svg_panel(b, counts, "index lists against the rule per row (entries)");
    kp_svg_textf(b, KP_PLOT_LEFT - 6, counts.y + 10, "end", NULL, 0, "%.0f", cmax);
    kp_svg_text(b, KP_PLOT_LEFT - 6, counts.y + counts.h, "end", NULL, 0, "0");
    const double unit = number ? fp.h / (top - bottom) : 0, zero = fp.y + top * unit;
    const char *base = number && fig->baseline ? fig->baseline : "0";
    if (number) {
        char title[200];
        snprintf(title, sizeof title, "%s%s%s per row (symmetric log scale)", fig->label, fig->baseline ? " \xE2\x88\x92 " : "",
                 fig->baseline ? fig->baseline : "");
        kp_svg_panel(b, fp, title);
        const int floor_dec = (int)floor(log10(lin));
        for (int sign = -1; sign <= 1; sign += 2) /* every other decade from 10 floors up, either side of the baseline */
            for (int dec = floor_dec + 1; dec <= floor_dec + 9; dec += 2) {
                const double v = sign * kp_plot_symlog(pow(10, dec), lin);
                if (v > top + 1e-3 || v < bottom - 1e-3) continue;
                const double y = zero - v * unit;
                kp_svg_line(b, fp.x, y, fp.x + fp.w, y, "#eeeeee", 1, 0);
                kp_svg_textf(b, KP_PLOT_LEFT - 6, y + 4, "end", NULL, 0, "%s1e%d", sign > 0 ? "+" : "\xE2\x88\x92", dec);
            }
        kp_svg_line(b, fp.x, zero, fp.x + fp.w, zero, "#212121", 1, 0);
        kp_svg_text(b, KP_PLOT_LEFT - 6, zero + 4, "end", NULL, 0, base);
    }
    const double roww = kp_svg_row_w(counts, nrows);
    const double bw = fmin(14, roww * 0.8 / ns), r_dot = fmax(2.5, fmin(5, roww * 0.35));
    cJSON_ArrayForEach(e, per_row) {
        const int64_t r = inum(e, "row", 0);
        const cJSON *ref = get(e, "reference");
        const double cx = kp_svg_row_x(counts, nrows, r);
        const double ref_d = number && get(ref, fig->key) ? kp_plot_figure_value(fig, ref, ref) : NAN;
        char title[600];
        if (isfinite(ref_d)) {
            snprintf(title, sizeof title, "row %lld, reference: %s%s%s = %+.3g", (long long)r, fig->label,
                     fig->baseline ? " - " : "", fig->baseline ? fig->baseline : "", ref_d);
            kp_text_puts(b, "<g>");
            const double y = zero - kp_plot_symlog(ref_d, lin) * unit;
            kp_svg_line(b, cx - fmax(3, roww * 0.45), y, cx + fmax(3, roww * 0.45), y, KP_GREY, 2, 0);
            kp_text_puts(b, "<title>");
            kp_text_xml(b, title);
            kp_text_puts(b, "</title></g>\n");
        }
        for (int k = 0; k < ns; k++) {
            const cJSON *j = get(e, s[k].key);
            if (!j) continue;
            int used = snprintf(title, sizeof title, "row %lld, %s:", (long long)r, s[k].name);
            for (int l = 0; l < nl && used > 0 && (size_t)used < sizeof title; l++)
                used += snprintf(title + used, sizeof title - (size_t)used, "%s %lld %s", l ? "," : "",
                                 (long long)list_count(j, names[l]), names[l]);
            const double d = number ? kp_plot_figure_value(fig, j, ref) : NAN;
            if (number && used > 0 && (size_t)used < sizeof title)
                used += snprintf(title + used, sizeof title - (size_t)used, "; %s%s%s = %+.3g (reference %+.3g)",
                                 fig->label, fig->baseline ? " - " : "", fig->baseline ? fig->baseline : "", d, ref_d);
            if (used > 0 && (size_t)used < sizeof title)
                snprintf(title + used, sizeof title - (size_t)used, "; %s",
                         flag(j, "meets_rule") ? "meets the rule" : "breaks the rule");
            const double bx = cx + (k - (ns - 1) / 2.0) * bw - bw / 2;
            double y = counts.y + counts.h;
            for (int l = 0; l < nl; l++) {
                const double h = counts.h * (double)list_count(j, names[l]) / cmax;
                if (h > 0) kp_svg_rect(b, bx, y - h, bw, h, list_fill[l], title);
                y -= h;
            }
            if (isfinite(d)) /* a record without the figure draws its bars only */
                kp_svg_dot(b, cx + (k - (ns - 1) / 2.0) * bw, zero - kp_plot_symlog(d, lin) * unit, r_dot,
                           flag(j, "meets_rule") ? KP_GREEN : KP_RED, k, title);
        }
    }
    kp_svg_row_axis(b, number ? fp : counts, nrows);
    kp_svg_close(b);
    for (int k = 0; k < ns; k++) { /* the same in words: which rows, and the figure's extremes against the reference */
        row_list l = {b, 0};
        double hi = -INFINITY, lo = INFINITY;
        int64_t at_hi = -1, at_lo = -1;
        kp_text_puts(b, "<p class=\"note\">");
        kp_text_xml(b, s[k].name);
        kp_text_puts(b, ": rows breaking the rule: ");
        cJSON_ArrayForEach(e, per_row) {
            const cJSON *j = get(e, s[k].key), *ref = get(e, "reference");
            if (!j) continue;
            const int64_t r = inum(e, "row", 0);
            if (!flag(j, "meets_rule")) row_list_add(&l, r);
            if (!fig || !fig->key) continue;
            const double v = kp_plot_figure_value(fig, j, ref) - (number ? kp_plot_figure_reference(fig, ref) : 0);
            if (v > hi) hi = v, at_hi = r;
            if (v < lo) lo = v, at_lo = r;
        }
        if (!l.n) kp_text_puts(b, "none");
        else kp_text_printf(b, " (%lld of %lld)", (long long)l.n, (long long)nrows);
        if (at_hi >= 0 && hi > 0 && number) {
            kp_text_puts(b, "; most ");
            kp_text_xml(b, fig->label);
            kp_text_printf(b, " beyond the reference's: %+.3g (row %lld)", hi, (long long)at_hi);
        } else if (at_hi >= 0 && hi > 0) {
            kp_text_puts(b, "; most ");
            kp_text_xml(b, fig->label);
            kp_text_printf(b, ": %.0f (row %lld)", hi, (long long)at_hi);
        }
        if (at_lo >= 0 && lo < 0 && number) {
            kp_text_puts(b, "; most ");
            kp_text_xml(b, fig->label);
            kp_text_printf(b, " short of the reference's: %+.3g (row %lld)", lo, (long long)at_lo);
        }
        kp_text_puts(b, ".</p>\n");
    }
}
