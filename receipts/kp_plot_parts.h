/* kp_plot_parts.h: what report.html's plot files share (kp_plots.c, kp_plot_rule.c, kp_plot_checks.c):
 * page geometry, colours, lenient readers of receipt members, and the plot of each kind of check. */
#ifndef KP_PLOT_PARTS_H
#define KP_PLOT_PARTS_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "kp_json.h"
#include "kp_plots.h"
#include "kp_report.h"
#include "kp_svg.h"
#include "kp_text.h"

#define KP_PLOT_WIDTH 960.0
#define KP_PLOT_LEFT 150.0 /* room for axis labels left of every panel */
#define KP_PLOT_W (KP_PLOT_WIDTH - KP_PLOT_LEFT - 20.0)
#define KP_RED "#c62828"
#define KP_PINK "#ef9a9a"
#define KP_GREEN "#2e7d32"
#define KP_SLATE "#546e7a"
#define KP_LIGHT_SLATE "#b0bec5"
#define KP_ORANGE "#ef6c00"
#define KP_GREY "#757575"
#define KP_SHADE "#ffebee" /* behind a row that broke the rule */

/* Receipt members, read leniently: a missing or mistyped member gives the fallback (the bundle
 * checked the receipt's shape; a report draws what is there). Numbers as kp_json writes them. */
static inline const cJSON *get(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }

static inline const char *str(const cJSON *o, const char *key, const char *fallback) {
    const char *s = cJSON_GetStringValue(get(o, key));
    return s ? s : fallback;
}

static inline double num(const cJSON *o, const char *key, double fallback) {
    double v;
    return o && kp_json_get_double(o, key, &v) == 0 ? v : fallback;
}

static inline int64_t inum(const cJSON *o, const char *key, int64_t fallback) {
    int64_t v;
    return o && kp_json_get_int(o, key, &v) == 0 ? v : fallback;
}

static inline int flag(const cJSON *o, const char *key) { return cJSON_IsTrue(get(o, key)); }

/* Whether o is an index list as the harness writes one: {"count", "first": [...], ["artifact"]}. */
static inline int is_list(const cJSON *o) { return cJSON_IsObject(o) && get(o, "count") && cJSON_IsArray(get(o, "first")); }

/* The count of an index list as the harness writes one. */
static inline int64_t list_count(const cJSON *o, const char *key) { return inum(get(o, key), "count", 0); }

/* The rows a per-row plot spans: findings.rows, else one past the largest row listed. */
static inline int64_t rows_spanned(const cJSON *f, const cJSON *per_row) {
    int64_t n = inum(f, "rows", 0);
    const cJSON *e;
    cJSON_ArrayForEach(e, per_row) {
        const int64_t r = inum(e, "row", -1);
        if (r >= n) n = r + 1;
    }
    return n > 0 ? n : 1;
}

/* A note under a plot listing rows (the first 40) that satisfy something. */
typedef struct {
    kp_text *b;
    int64_t n;
} row_list;

static inline void row_list_add(row_list *l, int64_t r) {
    if (l->n < 40) kp_text_printf(l->b, "%s%lld", l->n ? ", " : "", (long long)r);
    else if (l->n == 40) kp_text_puts(l->b, ", \xE2\x80\xA6");
    l->n++;
}

/* Shade the columns of rows that broke the rule across panels from y0 to y1, so they stand out. */
static inline void shade_row(kp_text *b, kp_box p, int64_t nrows, int64_t r, double y0, double y1) {
    const double w = kp_svg_row_w(p, nrows);
    kp_svg_rect(b, kp_svg_row_x(p, nrows, r) - w / 2, y0, w, y1 - y0, KP_SHADE, NULL);
}

/* One impl's judgements in a rule or exact check's per_row entries. */
typedef struct kp_plot_series {
    const char *name; /* the impl */
    const char *key;  /* its judgement's member in a per_row entry: "impl" (rule) or the impl's name (exact) */
} kp_plot_series;

/* The figure of a receipt row's family (receipts/plot_families.c, by the case name's prefix), or NULL. */
const kp_plot_figure *kp_plot_figure_of(const cJSON *row);
/* Whether the figure is a number in judgement record j (else an index list's count, or absent). */
int kp_plot_figure_is_number(const kp_plot_figure *fig, const cJSON *j);
/* A figure's value in a judgement record j, with the row's reference record ref: a number less the reference's
 * baseline (when it names one), or an index list's count; NaN when j lacks it. */
double kp_plot_figure_value(const kp_plot_figure *fig, const cJSON *j, const cJSON *ref);
/* The reference record's value of the figure, or 0 (the figure's zero: its baseline) when it gives none. */
double kp_plot_figure_reference(const kp_plot_figure *fig, const cJSON *ref);
/* d on a symmetric log scale, linear below floor: 0 at 0, one unit a decade past it. */
double kp_plot_symlog(double d, double lin);

/* The plots, each one SVG (and notes or a table after it) from a check's findings. */
void kp_plot_rule(kp_text *b, const cJSON *findings, const kp_plot_series *s, int ns, const kp_plot_figure *fig);
void kp_plot_differ(kp_text *b, const cJSON *findings); /* kp_plot_rule.c */
void kp_plot_tolerance(kp_text *b, const cJSON *findings); /* kp_plot_checks.c */
void kp_plot_repeat(kp_text *b, const cJSON *check, const cJSON *findings);
void kp_plot_batch(kp_text *b, const cJSON *findings);

#endif
