/* kp_plot_rule.c: report.html's plot of exact findings where no family plot explains them (plot_families.c has
 * the families' rule plots): the elements that differ, per row. */
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

