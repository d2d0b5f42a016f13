/* kp_report.h: a bundle's reports (kp_report.c), junit.xml, summary.md and report.html, rendered from its receipt
 * rows, so finish writes them and verify renders them again byte for byte. */
#ifndef KP_REPORT_H
#define KP_REPORT_H

#include <cjson/cJSON.h>

#include "../cases/kp_common.h"

/* The reports, rendered from receipt rows: an array of {"file", "case", "result", "reasons": [str],
 * "checks": [as in the receipt], "impls": [as in the receipt, when it has them]}, which the bundle keeps one per
 * receipt (kp_bundle_add_row). Each check gives one JUnit testcase and one table row; a receipt without checks gives
 * one, labelled "case", carrying the receipt's own result. Malloc'd text; NULL only when out of memory. */
char *kp_report_junit(const cJSON *rows);
char *kp_report_summary_md(const cJSON *rows, const char *verdict, int exit_code);
char *kp_report_html(const cJSON *rows, const char *verdict, int exit_code);

/* What report.html plots per row of a rule check, for the family whose judge wrote the findings: one row a family in
 * the table of receipts/plot_families.c (a test's family adds its own), found by the case name's prefix; everything
 * else in report.html is family-blind. key is a member of a row's judgement record: a number (drawn against the same
 * member of the row's reference record, both relative to the reference's `baseline` member when one is named, on a
 * symmetric log scale linear below `floor`) or an index list (its count). A family without a row: the plot draws the
 * rows' index lists alone. */
typedef struct kp_plot_figure {
    const char *name; /* the family */
    const char *key;
    const char *label;    /* what it is, in legends and notes: "kept mass", "missing indices" */
    const char *baseline; /* or NULL */
    double floor;
} kp_plot_figure;
extern kp_table kp_plot_figures;
static inline int kp_plot_figure_register(const kp_plot_figure *f, kp_error *err) {
    return kp_table_add(&kp_plot_figures, f, "plot figure", err);
}

#endif
