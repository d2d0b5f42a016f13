/* kp_svg.h: the few inline-SVG marks report.html draws with (panels, bars, dots, axes, text), written
 * as well-formed XML into a kp_text: every element closed, every attribute quoted, all text escaped. */
#ifndef KP_SVG_H
#define KP_SVG_H

#include <stddef.h>
#include <stdint.h>

#include "kp_text.h"

/* A panel's plotting area in SVG pixels (y grows downward, as in SVG). */
typedef struct kp_box {
    double x, y, w, h;
} kp_box;

/* <svg> of width x height with an accessible label; kp_svg_close ends it. */
void kp_svg_open(kp_text *b, double width, double height, const char *label);
void kp_svg_close(kp_text *b);
/* Marks; `title`, when not NULL, becomes the mark's tooltip (a <title> child). */
void kp_svg_rect(kp_text *b, double x, double y, double w, double h, const char *fill, const char *title);
void kp_svg_dot(kp_text *b, double x, double y, double r, const char *fill, int square, const char *title);
void kp_svg_line(kp_text *b, double x1, double y1, double x2, double y2, const char *stroke, double width, int dashed);
/* Text at (x, y), anchor "start", "middle" or "end"; cls a CSS class or NULL; rotated by deg when not 0. */
void kp_svg_text(kp_text *b, double x, double y, const char *anchor, const char *cls, double deg, const char *s);
__attribute__((format(printf, 7, 8))) void kp_svg_textf(kp_text *b, double x, double y, const char *anchor,
                                                          const char *cls, double deg, const char *fmt, ...);
/* A legend entry at (x, y): a swatch and its label; returns the x after it. */
double kp_svg_legend(kp_text *b, double x, double y, const char *fill, int square, const char *label);

/* A panel's frame and its title above it. */
void kp_svg_panel(kp_text *b, kp_box p, const char *title);
/* Row ticks under a panel whose x axis holds rows [0, nrows): a tick every 1, 2, 5, 10, ... rows so
 * labels stay apart. */
void kp_svg_row_axis(kp_text *b, kp_box p, int64_t nrows);
/* The centre of row r on such an axis, and the width one row gets. */
double kp_svg_row_x(kp_box p, int64_t nrows, int64_t r);
double kp_svg_row_w(kp_box p, int64_t nrows);

/* A short number for labels: 3 significant digits, k/M/G for large counts. */
void kp_svg_num(char *out, size_t size, double v);

#endif
