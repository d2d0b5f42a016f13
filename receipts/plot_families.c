/* plot_families.c: the figure each family's rule findings plot per row in report.html (kp_plot_figure), the one place
 * receipts/ lists families. Adding a family with a rule check: one row below (without one, its rule plot draws the
 * index lists alone). */
#include <stddef.h>

#include "kp_report.h"

/* top-p: the mass a row kept against top_p, beside the reference's; masses differ meaningfully from 1e-9 on */
static const kp_plot_figure topp = {"topp", "kept_mass", "kept mass", "top_p", 1e-9};
/* top-k: the answer's indices a row misses */
static const kp_plot_figure topk = {"topk", "missing", "missing indices", NULL, 0};

static const void *const builtin[] = {&topp, &topk};
_Static_assert(offsetof(kp_plot_figure, name) == 0, "a table row begins with its name (kp_table)");
kp_table kp_plot_figures = {builtin, (int)(sizeof builtin / sizeof builtin[0]), {0}, 0};
