/* topp_plot.c: the top-p family's rule and exact plot in report.html (a row of receipts/plot_families.c): per row,
 * each impl's strict, tie and band mismatches and its kept mass minus top_p. */
#include "kp_plot_parts.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- top-p: mismatches and kept mass per row, for rule (one impl) and exact (two) --- */

/* Kept mass minus top_p on a symmetric log scale: 0 at top_p, one unit a decade from 1e-9 on, so an
 * excess of 1e-6 and a shortfall of 0.95 show on one axis. */
#define MASS_FLOOR 1e-9
static double symlog(double d) { return d >= 0 ? log10(1 + d / MASS_FLOOR) : -log10(1 - d / MASS_FLOOR); }

static const char *const mismatch_kinds[3] = {"strict", "tie", "band"};
static const char *const mismatch_fill[3] = {"#c62828", "#ef6c00", "#f9a825"};

void kp_plot_topp(kp_text *b, const cJSON *f, const kp_plot_series *s, int ns) {
    const cJSON *per_row = get(f, "per_row"), *e;
    const int64_t nrows = rows_spanned(f, per_row);
    double cmax = 1, top = 3, bottom = 0; /* counts; the mass axis spans at least +1e-6 */
    cJSON_ArrayForEach(e, per_row) {
        const double top_p = num(get(e, "reference"), "top_p", NAN);
        const double ref = symlog(num(get(e, "reference"), "kept_mass", NAN) - top_p);
        if (ref > top) top = ref;
        for (int k = 0; k < ns; k++) {
            const cJSON *j = get(e, s[k].key);
            if (!j) continue;
            const double total = (double)(list_count(j, "strict") + list_count(j, "tie") + list_count(j, "band"));
            if (total > cmax) cmax = total;
            const double v = symlog(num(j, "kept_mass", NAN) - top_p);
            if (v > top) top = v;
            if (v < bottom) bottom = v;
        }
    }
    top = fmin(2 * ceil((top + 1) / 2) - 1, 9); /* up to the next labelled decade: 1e-8, 1e-6, ... 1 */
    if (bottom < 0) bottom = fmax(-(2 * ceil((-bottom + 1) / 2) - 1), -9);
    const kp_box counts = {KP_PLOT_LEFT, 60, KP_PLOT_W, 90}, mass = {KP_PLOT_LEFT, 182, KP_PLOT_W, bottom < 0 ? 230 : 160};
    kp_svg_open(b, KP_PLOT_WIDTH, mass.y + mass.h + 34, "top-p mismatches and kept mass per row");

    double x = KP_PLOT_LEFT; /* legend */
    for (int m = 0; m < 3; m++) x = kp_svg_legend(b, x, 16, mismatch_fill[m], 1, mismatch_kinds[m]);
    x = kp_svg_legend(b, x, 16, KP_SHADE, 1, "row breaks the rule");
    x = KP_PLOT_LEFT;
    for (int k = 0; k < ns; k++) { /* the impls by marker shape */
        kp_svg_dot(b, x + 6, 28, 4.5, "#ffffff", k, NULL);
        kp_svg_text(b, x + 16, 32, "start", NULL, 0, s[k].name);
        x += 16 + 7.0 * (double)strlen(s[k].name) + 18;
    }
    x = kp_svg_legend(b, x, 32, KP_GREEN, 1, "meets the rule");
    x = kp_svg_legend(b, x, 32, KP_RED, 1, "breaks it");
    kp_svg_legend(b, x, 32, KP_GREY, -1, "reference");

    cJSON_ArrayForEach(e, per_row) { /* shading under everything */
        int broken = 0;
        for (int k = 0; k < ns; k++) {
            const cJSON *j = get(e, s[k].key);
            broken |= j && !flag(j, "meets_rule");
        }
        if (broken) {
            shade_row(b, counts, nrows, inum(e, "row", 0), counts.y, counts.y + counts.h);
            shade_row(b, mass, nrows, inum(e, "row", 0), mass.y, mass.y + mass.h);
        }
    }
    kp_svg_panel(b, counts, "mismatches against the rule per row");
    kp_svg_textf(b, KP_PLOT_LEFT - 6, counts.y + 10, "end", NULL, 0, "%.0f", cmax);
    kp_svg_text(b, KP_PLOT_LEFT - 6, counts.y + counts.h, "end", NULL, 0, "0");
    kp_svg_panel(b, mass, "kept mass \xE2\x88\x92 top_p per row (symmetric log scale)");
    const double unit = mass.h / (top - bottom);
    const double zero = mass.y + top * unit;
    for (int sign = -1; sign <= 1; sign += 2) /* decades 1e-8 ... 1 either side of top_p */
        for (int dec = -8; dec <= 0; dec += 2) {
            const double v = sign * symlog(pow(10, dec));
            if (v > top + 1e-3 || v < bottom - 1e-3) continue;
            const double y = zero - v * unit;
            kp_svg_line(b, mass.x, y, mass.x + mass.w, y, "#eeeeee", 1, 0);
            kp_svg_textf(b, KP_PLOT_LEFT - 6, y + 4, "end", NULL, 0, "%s1e%d", sign > 0 ? "+" : "\xE2\x88\x92", dec);
        }
    kp_svg_line(b, mass.x, zero, mass.x + mass.w, zero, "#212121", 1, 0);
    kp_svg_text(b, KP_PLOT_LEFT - 6, zero + 4, "end", NULL, 0, "top_p");

    const double roww = kp_svg_row_w(counts, nrows);
    const double bw = fmin(14, roww * 0.8 / ns), r_dot = fmax(2.5, fmin(5, roww * 0.35));
    cJSON_ArrayForEach(e, per_row) {
        const int64_t r = inum(e, "row", 0);
        const cJSON *ref = get(e, "reference");
        const double top_p = num(ref, "top_p", NAN), cx = kp_svg_row_x(counts, nrows, r);
        char title[400];
        const double ref_d = num(ref, "kept_mass", NAN) - top_p;
        snprintf(title, sizeof title, "row %lld, reference: kept %lld tokens, mass = top_p %+.3g", (long long)r,
                 (long long)inum(ref, "kept", 0), ref_d);
        if (isfinite(ref_d)) {
            kp_text_puts(b, "<g>");
            kp_svg_line(b, cx - fmax(3, roww * 0.45), zero - symlog(ref_d) * unit, cx + fmax(3, roww * 0.45),
                        zero - symlog(ref_d) * unit, KP_GREY, 2, 0);
            kp_text_puts(b, "<title>");
            kp_text_xml(b, title);
            kp_text_puts(b, "</title></g>\n");
        }
        for (int k = 0; k < ns; k++) {
            const cJSON *j = get(e, s[k].key);
            if (!j) continue;
            const double bx = cx + (k - (ns - 1) / 2.0) * bw - bw / 2;
            double y = counts.y + counts.h;
            int64_t n[3];
            for (int m = 0; m < 3; m++) n[m] = list_count(j, mismatch_kinds[m]);
            const double d = num(j, "kept_mass", NAN) - top_p;
            snprintf(title, sizeof title, "row %lld, %s: %lld strict, %lld tie, %lld band; kept %lld tokens, mass = top_p %+.3g "
                     "(reference %+.3g)%s; %s", (long long)r, s[k].name, (long long)n[0], (long long)n[1], (long long)n[2],
                     (long long)inum(j, "kept", 0), d, ref_d, flag(j, "all_neginf") ? "; every output logit -inf" : "",
                     flag(j, "meets_rule") ? "meets the rule" : "breaks the rule");
            for (int m = 0; m < 3; m++) {
                const double h = counts.h * (double)n[m] / cmax;
                if (n[m] > 0) kp_svg_rect(b, bx, y - h, bw, h, mismatch_fill[m], title);
                y -= h;
            }
            if (isfinite(d)) /* a receipt without kept_mass draws its bars only */
                kp_svg_dot(b, cx + (k - (ns - 1) / 2.0) * bw, zero - symlog(d) * unit, r_dot,
                           flag(j, "meets_rule") ? KP_GREEN : KP_RED, k, title);
        }
    }
    kp_svg_row_axis(b, mass, nrows);
    kp_svg_close(b);
    for (int k = 0; k < ns; k++) { /* the same in words: which rows, and the extremes */
        row_list l = {b, 0};
        double worst_hi = -INFINITY, worst_lo = INFINITY;
        int64_t at_hi = -1, at_lo = -1;
        kp_text_puts(b, "<p class=\"note\">");
        kp_text_xml(b, s[k].name);
        kp_text_puts(b, ": rows breaking the rule: ");
        cJSON_ArrayForEach(e, per_row) {
            const cJSON *j = get(e, s[k].key);
            if (!j) continue;
            const int64_t r = inum(e, "row", 0);
            const double excess = num(j, "kept_mass", NAN) - num(get(e, "reference"), "kept_mass", NAN);
            if (!flag(j, "meets_rule")) row_list_add(&l, r);
            if (excess > worst_hi) worst_hi = excess, at_hi = r;
            if (excess < worst_lo) worst_lo = excess, at_lo = r;
        }
        if (!l.n) kp_text_puts(b, "none");
        else kp_text_printf(b, " (%lld of %lld)", (long long)l.n, (long long)nrows);
        if (at_hi >= 0 && worst_hi > 0)
            kp_text_printf(b, "; most mass kept beyond the reference's: %+.3g (row %lld)", worst_hi, (long long)at_hi);
        if (at_lo >= 0 && worst_lo < 0)
            kp_text_printf(b, "; most mass short of the reference's: %+.3g (row %lld)", worst_lo, (long long)at_lo);
        kp_text_puts(b, ".</p>\n");
    }
}
