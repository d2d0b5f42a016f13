/* plot_families.c: the families' rule and exact plots in report.html, one row each (the one place receipts/ lists
 * them): the member of a per-row judgement that marks the family's findings, the figure's data-plot names, and the
 * function in the family's own file (receipts/<family>_plot.c) that draws it. Adding a family's plot: its file and
 * a row here. A family with no row gets the generic plots (kp_plot_differ for exact). */
#include "kp_plot_parts.h"

void kp_plot_topp(kp_text *b, const cJSON *findings, const kp_plot_series *s, int ns); /* topp_plot.c */
void kp_plot_topk(kp_text *b, const cJSON *findings, const kp_plot_series *s, int ns); /* topk_plot.c */

const kp_rule_plot kp_rule_plots[] = {
    {"kept_mass", "topp-rule", "topp-exact", kp_plot_topp},
    {"missing", "topk-rule", "topk-exact", kp_plot_topk},
};
const int kp_rule_plot_count = (int)(sizeof kp_rule_plots / sizeof kp_rule_plots[0]);
