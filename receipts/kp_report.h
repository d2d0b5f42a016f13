/* kp_report.h: a bundle's reports (kp_report.c), junit.xml, summary.md and report.html, rendered from its receipt
 * rows, so finish writes them and verify renders them again byte for byte. */
#ifndef KP_REPORT_H
#define KP_REPORT_H

#include <cjson/cJSON.h>

/* The reports, rendered from receipt rows: an array of {"file", "case", "result", "reasons": [str],
 * "checks": [as in the receipt], "impls": [as in the receipt, when it has them]}, which the bundle keeps one per
 * receipt (kp_bundle_add_row). Each check gives one JUnit testcase and one table row; a receipt without checks gives
 * one, labelled "case", carrying the receipt's own result. Malloc'd text; NULL only when out of memory. */
char *kp_report_junit(const cJSON *rows);
char *kp_report_summary_md(const cJSON *rows, const char *verdict, int exit_code);
char *kp_report_html(const cJSON *rows, const char *verdict, int exit_code);

#endif
