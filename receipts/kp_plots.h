/* kp_plots.h: report.html's pictures of what the checks found: one figure with one SVG plot for each
 * finding, and the impls' times against each other. Internal to receipts/; drawn from the receipt rows
 * the bundle keeps (kp_bundle.h), field names as the harness writes them (harness/checks.c,
 * harness/tolerance.c and each family's judge). */
#ifndef KP_PLOTS_H
#define KP_PLOTS_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "kp_text.h"

/* A finding: a check whose result is INCORRECT, an expect whose defect reproduced (result PASSED), or
 * any check whose findings hold a non-empty difference list (an index list {count > 0, first}, a
 * repeat's rows_varying, a batch probe's rows_differ). A rule check that passes with allowed tie or band
 * differences is one; a tolerance check's reported-only `against` counts are not. */
int kp_plot_is_finding(const cJSON *check);

/* The id of the figure drawn for check c of receipt row r ("finding-R-C"), for links to it. */
void kp_plot_anchor(char *out, size_t size, int row, int check);

/* One <figure class="finding"> per finding, in receipt order, each holding exactly one <svg> (the plot
 * for an expect is its inner check's, which shows how the defect showed) and notes or a table after it.
 * Returns how many. */
size_t kp_plot_findings(kp_text *b, const cJSON *rows);

/* Every rule check's rows at a glance: one strip of cells a check, green where a row meets the rule, else shaded
 * by how far it broke it (its family's figure, plot_families.c); writes nothing without one. */
void kp_plot_rule_overview(kp_text *b, const cJSON *rows);

/* The impls' wall times (impls[].timing.wall_us of rows that carry "impls") against each other, per
 * case; writes nothing when no row carries them. */
void kp_plot_timing(kp_text *b, const cJSON *rows);

#endif
