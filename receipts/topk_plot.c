/* topk_plot.c: the top-k family's rule and exact plot in report.html (a row of receipts/plot_families.c): per row,
 * the extra indices an output holds and the ones of the answer it misses. */
#include "kp_plot_parts.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kp_plot_topk(kp_text *b, const cJSON *f, const kp_plot_series *s, int ns) {
    const cJSON *per_row = get(f, "per_row"), *e;
    const int64_t nrows = rows_spanned(f, per_row);
    double cmax = 1;
    cJSON_ArrayForEach(e, per_row) {
        for (int k = 0; k < ns; k++) {
            const cJSON *j = get(e, s[k].key);
            const double missing = (double)list_count(j, "missing");
            const double extra = (double)(list_count(j, "strict") + list_count(j, "tie")) - missing;
            cmax = fmax(cmax, fmax(missing, extra));
        }
    }
    const kp_box p = {KP_PLOT_LEFT, 48, KP_PLOT_W, 200};
    kp_svg_open(b, KP_PLOT_WIDTH, p.y + p.h + 34, "top-k missing and extra indices per row");
    double x = KP_PLOT_LEFT;
    x = kp_svg_legend(b, x, 16, KP_RED, 1, "extra (breaks the rule)");
    x = kp_svg_legend(b, x, 16, KP_PINK, 1, "missing (breaks the rule)");
    x = kp_svg_legend(b, x, 16, KP_SLATE, 1, "extra (allowed)");
    kp_svg_legend(b, x, 16, KP_LIGHT_SLATE, 1, "missing (allowed)");
    if (ns > 1) {
        char label[200];
        snprintf(label, sizeof label, "left bar of a row: %s; right bar: %s", s[0].name, s[1].name);
        kp_svg_text(b, KP_PLOT_LEFT, 32, "start", NULL, 0, label);
    }
    cJSON_ArrayForEach(e, per_row) {
        int broken = 0;
        for (int k = 0; k < ns; k++) broken |= get(e, s[k].key) && !flag(get(e, s[k].key), "meets_rule");
        if (broken) shade_row(b, p, nrows, inum(e, "row", 0), p.y, p.y + p.h);
    }
    kp_svg_panel(b, p, "indices per row: extra ones the output holds (up), missing ones of the answer (down)");
    const double zero = p.y + p.h / 2, unit = (p.h / 2 - 4) / cmax;
    kp_svg_line(b, p.x, zero, p.x + p.w, zero, "#212121", 1, 0);
    kp_svg_textf(b, KP_PLOT_LEFT - 6, p.y + 12, "end", NULL, 0, "+%.0f extra", cmax);
    kp_svg_text(b, KP_PLOT_LEFT - 6, zero + 4, "end", NULL, 0, "0");
    kp_svg_textf(b, KP_PLOT_LEFT - 6, p.y + p.h - 2, "end", NULL, 0, "%.0f missing", cmax);
    const double roww = kp_svg_row_w(p, nrows), bw = fmax(1, fmin(14, roww * 0.8 / ns));
    cJSON_ArrayForEach(e, per_row) {
        const int64_t r = inum(e, "row", 0);
        for (int k = 0; k < ns; k++) {
            const cJSON *j = get(e, s[k].key);
            if (!j) continue;
            const int64_t strict = list_count(j, "strict"), tie = list_count(j, "tie"), missing = list_count(j, "missing");
            const int64_t extra = strict + tie - missing;
            const int ok = flag(j, "meets_rule");
            char title[300];
            snprintf(title, sizeof title, "row %lld, %s: %lld extra, %lld missing (%lld strict, %lld tie); %lld dropped "
                     "candidates; %s", (long long)r, s[k].name, (long long)extra, (long long)missing, (long long)strict,
                     (long long)tie, (long long)inum(j, "dropped", 0), ok ? "meets the rule" : "breaks the rule");
            const double bx = kp_svg_row_x(p, nrows, r) + (k - (ns - 1) / 2.0) * bw - bw / 2;
            if (extra > 0) kp_svg_rect(b, bx, zero, bw, -(double)extra * unit, ok ? KP_SLATE : KP_RED, title);
            if (missing > 0) kp_svg_rect(b, bx, zero, bw, (double)missing * unit, ok ? KP_LIGHT_SLATE : KP_PINK, title);
        }
    }
    kp_svg_row_axis(b, p, nrows);
    kp_svg_close(b);
    for (int k = 0; k < ns; k++) {
        row_list l = {b, 0};
        kp_text_puts(b, "<p class=\"note\">");
        kp_text_xml(b, s[k].name);
        kp_text_puts(b, ": rows breaking the rule: ");
        cJSON_ArrayForEach(e, per_row) {
            const cJSON *j = get(e, s[k].key);
            if (j && !flag(j, "meets_rule")) row_list_add(&l, inum(e, "row", 0));
        }
        if (!l.n) kp_text_puts(b, "none");
        else kp_text_printf(b, " (%lld of %lld)", (long long)l.n, (long long)nrows);
        kp_text_puts(b, ".</p>\n");
    }
}
