/* kp_plot_checks.c: report.html's plots of tolerance, repeat and batch findings: the bf16 ulp histogram
 * and each row's worst element against its bound, distinct outputs and flip rates with Wilson intervals
 * per row, rows moved and differing per batch probe. */
#include "kp_plot_parts.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- tolerance: the bf16 ulp histogram and each row's worst element against its bound --- */

typedef struct {
    const char *tensor;
    int tensor_no;  /* its place in findings.tensors */
    const cJSON *w; /* a worst_per_row entry */
    double ratio;   /* |x - r| over the bound it had: past 1 fails */
} worst_elem;

static double bound_ratio(const cJSON *w) {
    const double abs_err = num(w, "abs", NAN), excess = num(w, "excess", NAN), allowed = abs_err - excess;
    if (isinf(excess) && excess > 0) return INFINITY; /* NaN or inf where the reference has none, or the reverse */
    return allowed > 0 ? abs_err / allowed : (abs_err > 0 ? INFINITY : 0);
}

static int by_tensor_then_ratio_desc(const void *a, const void *b) {
    const worst_elem *p = a, *q = b;
    if (p->tensor_no != q->tensor_no) return p->tensor_no - q->tensor_no;
    return (p->ratio < q->ratio) - (p->ratio > q->ratio);
}

void kp_plot_tolerance(kp_text *b, const cJSON *f) {
    const cJSON *tensors = get(f, "tensors"), *t;
    const int nt = cJSON_GetArraySize(tensors);
    const double block = 190;
    kp_svg_open(b, KP_PLOT_WIDTH, 24 + block * nt, "tolerance: bf16 ulp histogram and each row's worst element");
    double x = KP_PLOT_LEFT;
    x = kp_svg_legend(b, x, 14, KP_GREEN, 0, "worst element within its bound");
    kp_svg_legend(b, x, 14, KP_RED, 0, "past it");
    size_t nworst = 0;
    int k = 0;
    cJSON_ArrayForEach(t, tensors) {
        const double y0 = 24 + block * k++;
        const cJSON *m = get(t, "metrics"), *hist = get(m, "bf16_ulp_histogram"), *bin;
        kp_svg_textf(b, 10, y0 + 36, "start", "ptitle", 0, "%s (%s)", str(t, "tensor", "?"), str(t, "dtype", "?"));
        kp_svg_text(b, 10, y0 + 52, "start", !strcmp(str(t, "result", ""), "PASSED") ? "ok" : "bad", 0, str(t, "result", "?"));
        kp_svg_textf(b, 10, y0 + 68, "start", NULL, 0, "%lld over bound", (long long)list_count(t, "over_tolerance"));
        kp_svg_textf(b, 10, y0 + 84, "start", NULL, 0, "%lld NaN/inf misplaced", (long long)list_count(t, "nonfinite_mismatch"));
        kp_svg_textf(b, 10, y0 + 100, "start", NULL, 0, "of %lld", (long long)inum(t, "elements", 0));
        /* the histogram, log counts: its tail is what matters */
        const kp_box h = {KP_PLOT_LEFT + 10, y0 + 22, 270, block - 70};
        kp_svg_panel(b, h, "elements per bf16 ulp distance (log)");
        const int nbins = cJSON_GetArraySize(hist);
        double cmax = 1;
        cJSON_ArrayForEach(bin, hist) {
            double c;
            if (!kp_json_value_double(bin, &c)) cmax = fmax(cmax, c);
        }
        int i = 0;
        cJSON_ArrayForEach(bin, hist) {
            double c = 0;
            kp_json_value_double(bin, &c);
            const double bw = h.w / (nbins ? nbins : 1), hh = c > 0 ? 0.85 * h.h * log10(1 + c) / log10(1 + cmax) : 0;
            char title[120], label[24];
            snprintf(title, sizeof title, "%s ulp: %.0f elements", bin->string ? bin->string : "?", c);
            const char *fill = i == 0 ? KP_GREEN : i < nbins - 1 ? KP_SLATE : KP_ORANGE; /* exact, near, the tail */
            kp_svg_rect(b, h.x + i * bw + 2, h.y + h.h - hh, bw - 4, hh, fill, title);
            kp_svg_num(label, sizeof label, c);
            if (c > 0) kp_svg_text(b, h.x + (i + 0.5) * bw, h.y + h.h - hh - 3, "middle", "small", 0, label);
            kp_svg_text(b, h.x + (i + 0.5) * bw, h.y + h.h + 13, "middle", "small", 0, bin->string ? bin->string : "?");
            i++;
        }
        /* each row's worst element: |x - r| over its bound, log scale, 1 = the bound */
        const kp_box p = {KP_PLOT_LEFT + 340, y0 + 22, KP_PLOT_WIDTH - KP_PLOT_LEFT - 360, block - 70};
        const cJSON *rows = get(t, "worst_per_row"), *w;
        const int64_t nrows = rows_spanned(NULL, rows);
        kp_svg_panel(b, p, "each row's worst element: |x \xE2\x88\x92 r| / bound (log)");
        const double lo = -3, hi = 2, unit = p.h / (hi - lo);
        for (int d = (int)lo; d <= (int)hi; d++) {
            const double y = p.y + (hi - d) * unit;
            kp_svg_line(b, p.x, y, p.x + p.w, y, d == 0 ? KP_RED : "#eeeeee", d == 0 ? 1.5 : 1, d == 0);
            kp_svg_textf(b, p.x - 4, y + 4, "end", "small", 0, d == 0 ? "bound" : "1e%d", d);
        }
        const double r_dot = fmax(2, fmin(4, kp_svg_row_w(p, nrows) * 0.35));
        cJSON_ArrayForEach(w, rows) {
            if (inum(w, "index", -1) < 0) continue; /* a row with no finite pair */
            nworst++;
            const double ratio = bound_ratio(w);
            const double v = isinf(ratio) ? hi : fmax(lo, fmin(hi, ratio > 0 ? log10(ratio) : lo));
            char title[300];
            snprintf(title, sizeof title, "row %lld, index %lld: value %.6g, reference %.6g, |x - r| %.3g, excess %.3g",
                     (long long)inum(w, "row", 0), (long long)inum(w, "index", 0), num(w, "value", NAN),
                     num(w, "reference", NAN), num(w, "abs", NAN), num(w, "excess", NAN));
            kp_svg_dot(b, kp_svg_row_x(p, nrows, inum(w, "row", 0)), p.y + (hi - v) * unit, r_dot, ratio > 1 ? KP_RED : KP_GREEN,
                       0, title);
        }
        kp_svg_row_axis(b, p, nrows);
    }
    kp_svg_close(b);

    /* each tensor's worst elements, by how far past their bound */
    worst_elem *all = nworst ? calloc(nworst, sizeof *all) : NULL;
    size_t n = 0;
    k = 0;
    cJSON_ArrayForEach(t, tensors) {
        const cJSON *w;
        cJSON_ArrayForEach(w, get(t, "worst_per_row")) {
            if (inum(w, "index", -1) < 0 || !all || n == nworst) continue;
            all[n++] = (worst_elem){str(t, "tensor", "?"), k, w, bound_ratio(w)};
        }
        k++;
    }
    if (nworst && !all) b->oom = 1;
    if (n) {
        qsort(all, n, sizeof *all, by_tensor_then_ratio_desc);
        kp_text_puts(b, "<table class=\"worst\">\n<thead><tr><th>tensor</th><th>row</th><th>index</th><th>value</th>"
                        "<th>reference</th><th>|x \xE2\x88\x92 r|</th><th>excess</th><th>|x \xE2\x88\x92 r| / bound</th>"
                        "</tr></thead>\n<tbody>\n");
        for (size_t i = 0, shown = 0; i < n; i++) {
            shown = i > 0 && all[i].tensor_no == all[i - 1].tensor_no ? shown + 1 : 0;
            if (shown >= 3) continue; /* three a tensor */
            const cJSON *w = all[i].w;
            kp_text_printf(b, "<tr%s><td>", all[i].ratio > 1 ? " class=\"over\"" : "");
            kp_text_xml(b, all[i].tensor);
            kp_text_printf(b, "</td><td>%lld</td><td>%lld</td><td>%.9g</td><td>%.9g</td><td>%.3g</td><td>%.3g</td>"
                              "<td>%.3g</td></tr>\n",
                           (long long)inum(w, "row", 0), (long long)inum(w, "index", 0), num(w, "value", NAN),
                           num(w, "reference", NAN), num(w, "abs", NAN), num(w, "excess", NAN), all[i].ratio);
        }
        kp_text_puts(b, "</tbody>\n</table>\n");
    }
    free(all);
    cJSON_ArrayForEach(t, tensors) { /* reference arrays measured beside the verdict */
        const cJSON *a;
        cJSON_ArrayForEach(a, get(t, "against")) {
            kp_text_puts(b, "<p class=\"note\">");
            kp_text_xml(b, str(t, "tensor", "?"));
            kp_text_puts(b, " against ");
            kp_text_xml(b, str(a, "reference", "?"));
            kp_text_printf(b, " (reported only): %lld over the same bound, max abs %.3g, NMSE %.3g.</p>\n",
                           (long long)inum(a, "over_tolerance", 0), num(a, "max_abs", NAN), num(a, "nmse", NAN));
        }
    }
}

/* --- repeat: distinct outputs and flip rate per row, with Wilson intervals --- */

static int distinct_strings(const cJSON *list) {
    int n = 0;
    for (const cJSON *a = list ? list->child : NULL; a; a = a->next) {
        int seen = 0;
        for (const cJSON *p = list->child; p != a; p = p->next)
            seen |= cJSON_IsString(a) && cJSON_IsString(p) && !strcmp(a->valuestring, p->valuestring);
        n += !seen;
    }
    return n;
}

static void wilson(const cJSON *rate, double *lo, double *hi) {
    const cJSON *w = get(rate, "wilson95");
    if (kp_json_value_double(cJSON_GetArrayItem(w, 0), lo)) *lo = NAN;
    if (kp_json_value_double(cJSON_GetArrayItem(w, 1), hi)) *hi = NAN;
}

void kp_plot_repeat(kp_text *b, const cJSON *chk, const cJSON *f) {
    const cJSON *varying = get(f, "rows_varying"), *e, *all = get(f, "rows_varying_rate");
    const int64_t runs = inum(f, "runs", inum(get(chk, "params"), "runs", 2));
    const int64_t nrows = (int64_t)fmax((double)rows_spanned(NULL, varying), num(all, "of", 1));
    const kp_box d = {KP_PLOT_LEFT, 48, KP_PLOT_W - 110, 80}, fr = {KP_PLOT_LEFT, 160, KP_PLOT_W - 110, 150};
    const kp_box share = {KP_PLOT_WIDTH - 90, 160, 40, 150};
    kp_svg_open(b, KP_PLOT_WIDTH, fr.y + fr.h + 34, "repeat: distinct outputs and flip rate per row");
    double x = KP_PLOT_LEFT;
    x = kp_svg_legend(b, x, 16, KP_RED, 1, "row varies");
    kp_svg_legend(b, x, 16, KP_GREY, -1, "Wilson 95% interval");
    cJSON_ArrayForEach(e, varying) {
        shade_row(b, d, nrows, inum(e, "row", 0), d.y, d.y + d.h);
        shade_row(b, fr, nrows, inum(e, "row", 0), fr.y, fr.y + fr.h);
    }
    kp_svg_panel(b, d, "distinct outputs per row");
    kp_svg_textf(b, KP_PLOT_LEFT - 6, d.y + 10, "end", NULL, 0, "%lld", (long long)runs);
    kp_svg_text(b, KP_PLOT_LEFT - 6, d.y + d.h, "end", NULL, 0, "1");
    kp_svg_panel(b, fr, "flip rate per row (runs whose row differs from run 1's)");
    for (int q = 0; q <= 4; q++) {
        const double y = fr.y + fr.h * (1 - q / 4.0);
        kp_svg_line(b, fr.x, y, fr.x + fr.w, y, "#eeeeee", 1, 0);
        kp_svg_textf(b, KP_PLOT_LEFT - 6, y + 4, "end", NULL, 0, "%d%%", q * 25);
    }
    const double bw = fmax(1, fmin(14, kp_svg_row_w(d, nrows) * 0.8)), r_dot = fmax(2, fmin(4.5, kp_svg_row_w(d, nrows) * 0.35));
    cJSON_ArrayForEach(e, varying) {
        const int64_t r = inum(e, "row", 0);
        const int distinct = distinct_strings(get(e, "digests"));
        const cJSON *rate = get(e, "flip_rate");
        const double cx = kp_svg_row_x(d, nrows, r), v = num(rate, "rate", NAN);
        double lo, hi;
        wilson(rate, &lo, &hi);
        char title[200];
        snprintf(title, sizeof title,
                 "row %lld: %d distinct outputs over %lld runs; flips %.0f/%.0f = %.3g, Wilson 95%% [%.3g, %.3g]", (long long)r,
                 distinct, (long long)runs, num(rate, "count", NAN), num(rate, "of", NAN), v, lo, hi);
        const double h = runs > 1 ? d.h * (distinct - 1) / (double)(runs - 1) : 0;
        kp_svg_rect(b, cx - bw / 2, d.y + d.h - fmax(h, 2), bw, fmax(h, 2), KP_RED, title);
        if (isfinite(lo) && isfinite(hi)) kp_svg_line(b, cx, fr.y + fr.h * (1 - lo), cx, fr.y + fr.h * (1 - hi), KP_GREY, 1.5, 0);
        if (isfinite(v)) kp_svg_dot(b, cx, fr.y + fr.h * (1 - v), r_dot, KP_RED, 0, title);
    }
    kp_svg_row_axis(b, fr, nrows);
    /* the share of rows that vary, with its interval */
    kp_svg_panel(b, share, NULL);
    kp_svg_text(b, share.x + share.w / 2, share.y - 18, "middle", "ptitle", 0, "rows");
    kp_svg_text(b, share.x + share.w / 2, share.y - 5, "middle", "ptitle", 0, "varying");
    if (all) {
        double lo, hi;
        wilson(all, &lo, &hi);
        const double v = num(all, "rate", NAN), cx = share.x + share.w / 2;
        char title[160];
        snprintf(title, sizeof title, "%.0f/%.0f rows vary = %.3g, Wilson 95%% [%.3g, %.3g]", num(all, "count", NAN),
                 num(all, "of", NAN), v, lo, hi);
        if (isfinite(lo) && isfinite(hi))
            kp_svg_rect(b, cx - 5, share.y + share.h * (1 - hi), 10, share.h * (hi - lo) + 1, KP_LIGHT_SLATE, title);
        if (isfinite(v)) kp_svg_dot(b, cx, share.y + share.h * (1 - v), 4.5, v > 0 ? KP_RED : KP_GREEN, 0, title);
        kp_svg_textf(b, cx, share.y + share.h + 14, "middle", NULL, 0, "%.0f/%.0f", num(all, "count", NAN), num(all, "of", NAN));
    }
    kp_svg_close(b);
    kp_text_printf(b, "<p class=\"note\">%lld distinct outputs over %lld runs", (long long)inum(f, "distinct_outputs", 0),
                   (long long)runs);
    if (all) {
        double lo, hi;
        wilson(all, &lo, &hi);
        kp_text_printf(b, "; rows varying %.0f/%.0f = %.3g (Wilson 95%% [%.3g, %.3g])", num(all, "count", NAN),
                       num(all, "of", NAN), num(all, "rate", NAN), lo, hi);
    }
    const cJSON *by = get(f, "rows_varying_by_tensor"), *t;
    if (by && by->child) {
        kp_text_puts(b, "; rows varying by tensor:");
        cJSON_ArrayForEach(t, by) {
            kp_text_puts(b, " ");
            kp_text_xml(b, t->string);
            kp_text_printf(b, " %lld", (long long)inum(by, t->string, 0));
        }
    }
    if (get(f, "order_changed")) kp_text_printf(b, "; the work order %s", flag(f, "order_changed") ? "changed" : "never changed");
    kp_text_puts(b, ".</p>\n");
}

/* --- batch: rows moved and rows differing per probe --- */

static int is_alone(const cJSON *probe) { return !strncmp(str(probe, "probe", ""), "alone.", 6); }

void kp_plot_batch(kp_text *b, const cJSON *f) {
    const cJSON *probes = get(f, "probes"), *pr;
    const int n = cJSON_GetArraySize(probes);
    const kp_box p = {KP_PLOT_LEFT, 62, KP_PLOT_W, 150};
    const double step = p.w / (n ? n : 1), bw = fmax(1, fmin(10, step * 0.4));
    kp_svg_open(b, KP_PLOT_WIDTH, p.y + p.h + 110, "batch probes: rows moved and rows differing");
    double x = KP_PLOT_LEFT;
    x = kp_svg_legend(b, x, 16, "#e0e0e0", 1, "rows probed");
    x = kp_svg_legend(b, x, 16, "#90caf9", 1, "rows moved");
    x = kp_svg_legend(b, x, 16, KP_RED, 1, "rows differing");
    kp_svg_legend(b, x, 16, KP_ORANGE, 1, "vacuous or failed probe");
    kp_svg_panel(b, p, NULL);
    kp_svg_text(b, p.x, p.y - 22, "start", "ptitle", 0, "per probe, as a share of the rows it probed (above: rows differing)");
    for (int q = 0; q <= 4; q++)
        kp_svg_textf(b, KP_PLOT_LEFT - 6, p.y + p.h * (1 - q / 4.0) + 4, "end", NULL, 0, "%d%%", q * 25);
    int i = 0;
    cJSON_ArrayForEach(pr, probes) {
        const char *name = str(pr, "probe", "?");
        const double probed = (double)inum(pr, "rows_probed", 0), moved = (double)inum(pr, "rows_moved", 0);
        const double differ = (double)cJSON_GetArraySize(get(pr, "rows_differ"));
        const int bad = flag(pr, "vacuous") || get(pr, "error");
        const double cx = p.x + (i + 0.5) * step;
        char title[400];
        snprintf(title, sizeof title, "%s (batch %lld): %.0f rows probed, %.0f moved, %.0f differ%s%s%s", name,
                 (long long)inum(pr, "batch", 0), probed, moved, differ, flag(pr, "vacuous") ? "; vacuous" : "",
                 get(pr, "error") ? "; failed: " : "", str(pr, "error", ""));
        kp_svg_rect(b, cx - step * 0.45, p.y, step * 0.9, p.h, bad ? "#ffe0b2" : "#f5f5f5", title);
        if (probed > 0) {
            kp_svg_rect(b, cx - bw, p.y + p.h, bw, -p.h * moved / probed, "#90caf9", title);
            kp_svg_rect(b, cx, p.y + p.h, bw, -p.h * differ / probed, KP_RED, title);
        }
        if (differ > 0) kp_svg_textf(b, cx, p.y - 3 - (i % 2 ? 0 : 9) * (step < 16), "middle", "small", 0, "%.0f", differ);
        if (bad) kp_svg_text(b, cx, p.y + p.h - 4, "middle", "bad", 0, "!");
        /* every probe named where there is room, else the single-row probes only at the ends of their run */
        const int alone = is_alone(pr), run_end = i == 0 || i == n - 1 || !is_alone(pr->prev) || !is_alone(pr->next);
        if (step >= 11 || !alone || run_end) kp_svg_text(b, cx + 3, p.y + p.h + 8, "end", "small", -60, name);
        i++;
    }
    kp_svg_close(b);
}

