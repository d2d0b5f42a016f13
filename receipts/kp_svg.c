/* kp_svg.c: inline-SVG marks for report.html (the findings' plots), well-formed XML so the page opens
 * offline, prints, and parses with any XML parser. */
#include "kp_svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void kp_svg_open(kp_text *b, double width, double height, const char *label) {
    kp_text_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                      "role=\"img\" aria-label=\"", width, height, width, height);
    kp_text_xml(b, label);
    kp_text_puts(b, "\">\n");
}

void kp_svg_close(kp_text *b) { kp_text_puts(b, "</svg>\n"); }

static void end_mark(kp_text *b, const char *tag, const char *title) {
    if (!title) {
        kp_text_puts(b, "/>\n");
        return;
    }
    kp_text_puts(b, "><title>");
    kp_text_xml(b, title);
    kp_text_printf(b, "</title></%s>\n", tag);
}

void kp_svg_rect(kp_text *b, double x, double y, double w, double h, const char *fill, const char *title) {
    if (h < 0) y += h, h = -h;
    kp_text_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"", x, y, w, h, fill);
    end_mark(b, "rect", title);
}

void kp_svg_dot(kp_text *b, double x, double y, double r, const char *fill, int square, const char *title) {
    if (square) {
        kp_text_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" stroke=\"#212121\" "
                          "stroke-width=\"0.6\"", x - r, y - r, 2 * r, 2 * r, fill);
        end_mark(b, "rect", title);
    } else {
        kp_text_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\" stroke=\"#212121\" stroke-width=\"0.6\"",
                       x, y, r, fill);
        end_mark(b, "circle", title);
    }
}

void kp_svg_line(kp_text *b, double x1, double y1, double x2, double y2, const char *stroke, double width, int dashed) {
    kp_text_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%.1f\"%s/>\n",
                   x1, y1, x2, y2, stroke, width, dashed ? " stroke-dasharray=\"4 3\"" : "");
}

void kp_svg_text(kp_text *b, double x, double y, const char *anchor, const char *cls, double deg, const char *s) {
    kp_text_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"", x, y, anchor);
    if (cls) kp_text_printf(b, " class=\"%s\"", cls);
    if (deg != 0) kp_text_printf(b, " transform=\"rotate(%.0f %.1f %.1f)\"", deg, x, y);
    kp_text_puts(b, ">");
    kp_text_xml(b, s);
    kp_text_puts(b, "</text>\n");
}

void kp_svg_textf(kp_text *b, double x, double y, const char *anchor, const char *cls, double deg, const char *fmt, ...) {
    char s[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s, sizeof s, fmt, ap);
    va_end(ap);
    kp_svg_text(b, x, y, anchor, cls, deg, s);
}

double kp_svg_legend(kp_text *b, double x, double y, const char *fill, int square, const char *label) {
    if (square < 0) kp_svg_line(b, x, y - 4, x + 12, y - 4, fill, 2, 0); /* a line swatch */
    else if (square) kp_svg_rect(b, x, y - 10, 12, 12, fill, NULL);
    else kp_svg_dot(b, x + 6, y - 4, 5, fill, 0, NULL);
    kp_svg_text(b, x + 16, y, "start", NULL, 0, label);
    return x + 16 + 7.0 * (double)strlen(label) + 18; /* 11px monospace: about 7px a character */
}

void kp_svg_panel(kp_text *b, kp_box p, const char *title) {
    kp_text_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#bdbdbd\"/>\n",
                   p.x, p.y, p.w, p.h);
    if (title) kp_svg_text(b, p.x, p.y - 5, "start", "ptitle", 0, title);
}

double kp_svg_row_w(kp_box p, int64_t nrows) { return p.w / (double)(nrows > 0 ? nrows : 1); }

double kp_svg_row_x(kp_box p, int64_t nrows, int64_t r) { return p.x + ((double)r + 0.5) * kp_svg_row_w(p, nrows); }

void kp_svg_row_axis(kp_text *b, kp_box p, int64_t nrows) {
    static const int64_t steps[] = {1, 2, 5};
    int64_t step = 1;
    for (int64_t scale = 1; step * kp_svg_row_w(p, nrows) < 30; scale *= 10)
        for (int i = 0; i < 3 && step * kp_svg_row_w(p, nrows) < 30; i++) step = steps[i] * scale;
    for (int64_t r = 0; r < nrows; r += step) {
        const double x = kp_svg_row_x(p, nrows, r);
        kp_svg_line(b, x, p.y + p.h, x, p.y + p.h + 3, "#757575", 1, 0);
        kp_svg_textf(b, x, p.y + p.h + 13, "middle", NULL, 0, "%lld", (long long)r);
    }
    kp_svg_text(b, p.x + p.w, p.y + p.h + 26, "end", "axis", 0, "row");
}

void kp_svg_num(char *out, size_t size, double v) {
    const double a = fabs(v);
    if (a >= 1e9) snprintf(out, size, "%.3gG", v / 1e9);
    else if (a >= 1e6) snprintf(out, size, "%.3gM", v / 1e6);
    else if (a >= 1e4) snprintf(out, size, "%.3gk", v / 1e3);
    else if (v == floor(v)) snprintf(out, size, "%.0f", v);
    else snprintf(out, size, "%.3g", v);
}
