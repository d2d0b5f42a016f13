/* test_report.c: Criterion tests (label cpu) for report.html: it is well-formed XML (checked by a small
 * tag-balance checker here, itself tested on planted defects) and draws exactly one plot per finding, each
 * saying what its receipt says, on hand-made receipt rows and on a real run's bundle. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_json.h"
#include "../receipts/kp_report.h"
#include "kp_test_util.h"

TestSuite(report, .init = kpt_dir_setup, .fini = kpt_dir_teardown);

/* ---------------------------------------------------------------- a well-formedness checker */

static int name_len(const char *p) {
    int n = 0;
    if (!(isalpha((unsigned char)*p) || *p == '_' || *p == ':')) return 0;
    while (isalnum((unsigned char)p[n]) || p[n] == '-' || p[n] == '_' || p[n] == ':' || p[n] == '.') n++;
    return n;
}

/* Length of the entity reference at p ("&amp;", "&#10;", "&#x2212;"), 0 if there is none: XML knows
 * only these five names without a DTD. */
static int entity_len(const char *p) {
    static const char *const names[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (int i = 0; i < 5; i++)
        if (!strncmp(p, names[i], strlen(names[i]))) return (int)strlen(names[i]);
    int n = 2;
    if (p[1] != '#') return 0;
    const int hex = p[2] == 'x';
    n += hex;
    const int start = n;
    while (hex ? isxdigit((unsigned char)p[n]) : isdigit((unsigned char)p[n])) n++;
    return n > start && p[n] == ';' ? n + 1 : 0;
}

#define BAD(...) return snprintf(why, why_size, __VA_ARGS__), 0

/* 1 when s is well-formed XML: one root element (after an optional <!DOCTYPE> and comments), every element
 * closed in order, attributes quoted, no bare '&' or '<' in text or attribute values, no text outside the
 * root. Otherwise 0 and why, with the byte offset. What an XHTML reader needs; no DTD, no namespaces. */
static int well_formed(const char *s, char *why, size_t why_size) {
    const char *open[256];
    int open_len[256], depth = 0, roots = 0;
    const char *p = s;
    while (*p) {
        const long at = (long)(p - s);
        if (*p == '&') {
            const int n = entity_len(p);
            if (!n) BAD("bare '&' in text at byte %ld", at);
            p += n;
            continue;
        }
        if (*p != '<') {
            if (!depth && !isspace((unsigned char)*p)) BAD("text outside the root element at byte %ld", at);
            p++;
            continue;
        }
        if (!strncmp(p, "<!--", 4)) {
            const char *end = strstr(p + 4, "-->");
            if (!end) BAD("comment never closed at byte %ld", at);
            p = end + 3;
            continue;
        }
        if (!strncmp(p, "<!DOCTYPE", 9)) {
            if (depth || roots) BAD("DOCTYPE inside or after the root at byte %ld", at);
            const char *end = strchr(p, '>');
            if (!end) BAD("DOCTYPE never closed");
            p = end + 1;
            continue;
        }
        if (p[1] == '/') {
            const int n = name_len(p + 2);
            if (!n) BAD("bad end tag at byte %ld", at);
            if (!depth) BAD("</%.*s> closes nothing at byte %ld", n, p + 2, at);
            if (n != open_len[depth - 1] || strncmp(p + 2, open[depth - 1], (size_t)n))
                BAD("</%.*s> closes <%.*s> at byte %ld", n, p + 2, open_len[depth - 1], open[depth - 1], at);
            depth--;
            p += 2 + n;
            while (isspace((unsigned char)*p)) p++;
            if (*p != '>') BAD("end tag not closed at byte %ld", at);
            p++;
            continue;
        }
        const int n = name_len(p + 1);
        if (!n) BAD("'<' that starts no tag at byte %ld", at);
        if (!depth && roots) BAD("a second root element <%.*s> at byte %ld", n, p + 1, at);
        const char *name = p + 1;
        p += 1 + n;
        for (;;) {
            const char *before = p;
            while (isspace((unsigned char)*p)) p++;
            if (*p == '>' || (p[0] == '/' && p[1] == '>')) {
                const int empty = *p == '/';
                p += empty ? 2 : 1;
                if (!depth) roots++;
                if (!empty) {
                    if (depth == 256) BAD("nested deeper than 256");
                    open[depth] = name, open_len[depth] = n, depth++;
                }
                break;
            }
            const int an = name_len(p);
            if (!an || p == before) BAD("bad attribute in <%.*s> at byte %ld", n, name, (long)(p - s));
            p += an;
            if (*p != '=') BAD("attribute %.*s without a value at byte %ld", an, p - an, (long)(p - s));
            const char quote = *++p;
            if (quote != '"' && quote != '\'') BAD("unquoted attribute %.*s at byte %ld", an, p - 1 - an, (long)(p - s));
            for (p++; *p != quote; p++) {
                if (!*p || *p == '<') BAD("attribute value not closed, or holding '<', at byte %ld", (long)(p - s));
                if (*p == '&' && !entity_len(p)) BAD("bare '&' in an attribute at byte %ld", (long)(p - s));
            }
            p++;
        }
    }
    if (depth) BAD("<%.*s> never closed", open_len[depth - 1], open[depth - 1]);
    if (roots != 1) BAD("no root element");
    return 1;
}

Test(report, the_checker_refuses_every_planted_defect) {
    char why[200];
    cr_assert(well_formed("<!DOCTYPE html>\n<html a=\"1\" b='x &amp; y'><!-- c --><p>&lt;&#10;&#x2212;</p><br/></html>\n", why,
                          sizeof why), "%s", why);
    static const char *const bad[] = {
        "<html><p></html>",            /* unclosed element */
        "<html><p><b></p></b></html>", /* crossed */
        "<html a=1></html>",           /* unquoted attribute */
        "<html>a & b</html>",          /* bare ampersand */
        "<html>a < b</html>",          /* bare less-than */
        "<html a=\"<\"></html>",       /* less-than in an attribute */
        "<html></html><html></html>",  /* two roots */
        "<html></html>x",              /* text after the root */
        "<html><meta charset=\"utf-8\"></html>", /* an HTML void element left open */
        "<html>&nbsp;</html>",         /* an entity XML does not know */
        "<html a></html>",             /* attribute without a value */
        "",                            /* nothing */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert(!well_formed(bad[i], why, sizeof why), "planted defect %zu passed: %s", i, bad[i]);
}

/* ---------------------------------------------------------------- counting plots */

/* The figures' ids and plot kinds in page order ("finding-0-1=topp-rule;..."), and whether each figure
 * holds exactly one <svg> with at least one mark carrying its numbers (a <title>). 0 and why otherwise. */
static int figures(const char *html, char *list, size_t list_size, char *why, size_t why_size) {
    list[0] = '\0';
    size_t used = 0;
    for (const char *p = html; (p = strstr(p, "<figure class=\"finding\"")); p++) {
        const char *end = strstr(p, "</figure>");
        if (!end) BAD("figure never closed");
        const char *id = strstr(p, "id=\""), *kind = strstr(p, "data-plot=\"");
        if (!id || !kind || id > end || kind > end) BAD("figure without id or data-plot");
        id += 4, kind += 11;
        used += (size_t)snprintf(list + used, list_size - used, "%.*s=%.*s;", (int)(strchr(id, '"') - id), id,
                                 (int)(strchr(kind, '"') - kind), kind);
        if (used >= list_size) BAD("too many figures for the list");
        int svgs = 0;
        for (const char *q = p; (q = strstr(q, "<svg")) && q < end; q++) svgs++;
        if (svgs != 1) BAD("figure %.*s holds %d plots", (int)(strchr(id, '"') - id), id, svgs);
        const char *title = strstr(p, "<title>");
        if (strncmp(kind, "none", 4) && (!title || title > end))
            BAD("figure %.*s draws no mark", (int)(strchr(id, '"') - id), id);
    }
    return 1;
}

static size_t count(const char *s, const char *what) {
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

/* The page with the first figure cut out: a report missing one plot. */
static char *without_first_figure(const char *html) {
    const char *a = strstr(html, "<figure class=\"finding\""), *z = a ? strstr(a, "</figure>\n") : NULL;
    cr_assert(a && z);
    char *out = NULL;
    cr_assert(asprintf(&out, "%.*s%s", (int)(a - html), html, z + strlen("</figure>\n")) > 0);
    return out;
}

/* The number attribute `attr` of the first <tag> mark whose tooltip starts with `title`, inside the figure
 * starting at fig (NAN when there is none). */
static double mark_attr(const char *fig, const char *tag, const char *title, const char *attr) {
    const char *end = strstr(fig, "</figure>");
    char open[32], want[200], key[32];
    snprintf(open, sizeof open, "<%s ", tag), snprintf(want, sizeof want, "<title>%s", title);
    snprintf(key, sizeof key, " %s=\"", attr);
    for (const char *p = fig; (p = strstr(p, open)) && p < end; p++) {
        const char *close = strchr(p, '>'), *a = strstr(p, key);
        if (close && !strncmp(close + 1, want, strlen(want)) && a && a < close) return atof(a + strlen(key));
    }
    return NAN;
}

/* ---------------------------------------------------------------- hand-made receipt rows */

/* Receipt rows as the bundle keeps them (kp_bundle.h), checks with the harness's field names: top-p rule
 * and exact, top-k rule inside an expect, repeat, batch, tolerance, a FAILED check and a receipt without
 * checks. Findings: 0-0 exact, 0-1 rule broken, 0-2 rule passed with a band difference, 1-0 the expect,
 * 1-1 repeat varying, 1-3 batch differing, 2-0 tolerance over, 2-2 an expect that did not reproduce. */
static const char *const planted_rows =
    "[{\"file\": \"receipts/0001.json\", \"case\": \"topp(batch=4,profile=ordinary,seed=1,top_p=0.95,vocab=100)\", "
    " \"result\": \"INCORRECT\", \"reasons\": [], \"checks\": [  {\"check\": \"exact\", "
    "\"label\": \"exact topp.a@host vs topp.b@host\", \"impl\": \"topp.a@host\", \"impl_b\": \"topp.b@host\", "
    "  \"result\": \"INCORRECT\", \"summary\": \"2/4 rows bit-identical\", \"findings\": {\"rows\": 4, "
    "\"rows_identical\": 2,   \"rows_differ\": 2, \"elements_differ\": 3, \"per_row\": [    {\"row\": 1, "
    "\"differ\": {\"count\": 2, \"first\": [5, 9]}, \"reference\": {\"top_p\": 0.95, \"kept\": 10, "
    "\"kept_mass\": 0.9500001},     \"topp.a@host\": {\"kept\": 12, \"kept_mass\": 0.95001, \"meets_rule\": false, "
    "\"strict\": {\"count\": 1, \"first\": [5]},      \"tie\": {\"count\": 0, \"first\": []}, "
    "\"band\": {\"count\": 1, \"first\": [9]}},     \"topp.b@host\": {\"kept\": 10, \"kept_mass\": 0.9500001, "
    "\"meets_rule\": true, \"strict\": {\"count\": 0, \"first\": []},      \"tie\": {\"count\": 0, \"first\": []}, "
    "\"band\": {\"count\": 0, \"first\": []}}, \"meets_rule\": \"topp.b@host\"},    {\"row\": 3, "
    "\"differ\": {\"count\": 1, \"first\": [7]}, \"reference\": {\"top_p\": 0.95, \"kept\": 3, "
    "\"kept_mass\": 0.96},     \"topp.a@host\": {\"kept\": 0, \"kept_mass\": 0, \"meets_rule\": false, "
    "\"all_neginf\": true, \"strict\": {\"count\": 1, \"first\": [7]},      \"tie\": {\"count\": 0, "
    "\"first\": []}, \"band\": {\"count\": 0, \"first\": []}},     \"topp.b@host\": {\"kept\": 3, "
    "\"kept_mass\": 0.96, \"meets_rule\": true, \"strict\": {\"count\": 0, \"first\": []}, "
    "     \"tie\": {\"count\": 0, \"first\": []}, \"band\": {\"count\": 0, \"first\": []}}, "
    "\"meets_rule\": \"topp.b@host\"}]}},  {\"check\": \"rule\", \"label\": \"rule topp.a@host\", "
    "\"impl\": \"topp.a@host\", \"result\": \"INCORRECT\",   \"summary\": \"2/4 rows meet the rule\", "
    "\"findings\": {\"rows\": 4, \"rows_meeting_rule\": 2, \"strict\": 2, \"tie\": 0, \"band\": 1, "
    "  \"per_row\": [    {\"row\": 0, \"reference\": {\"top_p\": 0.95, \"kept\": 5, \"kept_mass\": 0.951}, "
    "\"impl\": {\"kept\": 5, \"kept_mass\": 0.951,     \"meets_rule\": true, \"strict\": {\"count\": 0, "
    "\"first\": []}, \"tie\": {\"count\": 0, \"first\": []}, \"band\": {\"count\": 0, \"first\": []}}}, "
    "   {\"row\": 1, \"reference\": {\"top_p\": 0.95, \"kept\": 10, \"kept_mass\": 0.9500001}, "
    "\"impl\": {\"kept\": 12, \"kept_mass\": 0.95001,     \"meets_rule\": false, \"strict\": {\"count\": 1, "
    "\"first\": [5]}, \"tie\": {\"count\": 0, \"first\": []}, \"band\": {\"count\": 1, \"first\": [9]}}}, "
    "   {\"row\": 2, \"reference\": {\"top_p\": 0.95, \"kept\": 7, \"kept_mass\": 0.952}, \"impl\": {\"kept\": 7, "
    "\"kept_mass\": 0.952,     \"meets_rule\": true, \"strict\": {\"count\": 0, \"first\": []}, "
    "\"tie\": {\"count\": 0, \"first\": []}, \"band\": {\"count\": 0, \"first\": []}}},    {\"row\": 3, "
    "\"reference\": {\"top_p\": 0.95, \"kept\": 3, \"kept_mass\": 0.96}, \"impl\": {\"kept\": 0, \"kept_mass\": 0, "
    "    \"meets_rule\": false, \"all_neginf\": true, \"strict\": {\"count\": 1, \"first\": [7]}, "
    "\"tie\": {\"count\": 0, \"first\": []},     \"band\": {\"count\": 0, \"first\": []}}}]}}, "
    " {\"check\": \"rule\", \"label\": \"rule topp.b@host\", \"impl\": \"topp.b@host\", \"result\": \"PASSED\", "
    "  \"summary\": \"2/2 rows meet the rule; 0 strict, 0 tie, 1 band\", \"findings\": {\"rows\": 2, "
    "\"rows_meeting_rule\": 2, \"per_row\": [    {\"row\": 0, \"reference\": {\"top_p\": 0.95, \"kept\": 5, "
    "\"kept_mass\": 0.951}, \"impl\": {\"kept\": 5, \"kept_mass\": 0.951,     \"meets_rule\": true, "
    "\"strict\": {\"count\": 0, \"first\": []}, \"tie\": {\"count\": 0, \"first\": []}, \"band\": {\"count\": 0, "
    "\"first\": []}}},    {\"row\": 1, \"reference\": {\"top_p\": 0.95, \"kept\": 10, \"kept_mass\": 0.9500001}, "
    "\"impl\": {\"kept\": 9, \"kept_mass\": 0.9499995,     \"meets_rule\": true, \"strict\": {\"count\": 0, "
    "\"first\": []}, \"tie\": {\"count\": 0, \"first\": []}, \"band\": {\"count\": 1, \"first\": [4]}}}]}}, "
    " {\"check\": \"rule\", \"label\": \"rule topp.c@host\", \"impl\": \"topp.c@host\", \"result\": \"PASSED\", "
    "  \"summary\": \"1/1 rows meet the rule\", \"findings\": {\"rows\": 1, \"rows_meeting_rule\": 1, "
    "\"per_row\": [    {\"row\": 0, \"reference\": {\"top_p\": 0.95, \"kept\": 5, \"kept_mass\": 0.951}, "
    "\"impl\": {\"kept\": 5, \"kept_mass\": 0.951,     \"meets_rule\": true, \"strict\": {\"count\": 0, "
    "\"first\": []}, \"tie\": {\"count\": 0, \"first\": []}, \"band\": {\"count\": 0, \"first\": []}}}]}}]}, "
    "{\"file\": \"receipts/0002.json\", \"case\": \"topk(k=4,profile=narrow,rows=3,seed=1,width=64)\", "
    "\"result\": \"INCORRECT\",  \"reasons\": [], \"checks\": [  {\"check\": \"expect\", "
    "\"label\": \"expect rule=INCORRECT topk.inc@host\", \"impl\": \"topk.inc@host\", \"result\": \"PASSED\", "
    "  \"summary\": \"known defect reproduced: dropped_values on 1/3 rows\", "
    "\"findings\": {\"rows_with_defect\": 1},   \"inner\": {\"check\": \"rule\", "
    "\"label\": \"rule topk.inc@host\", \"impl\": \"topk.inc@host\", \"result\": \"INCORRECT\", "
    "   \"summary\": \"2/3 rows meet the rule\", \"findings\": {\"rows\": 3, \"rows_meeting_rule\": 2, "
    "\"per_row\": [     {\"row\": 0, \"reference\": {\"count\": 4}, \"impl\": {\"dropped\": 0, "
    "\"meets_rule\": true, \"strict\": {\"count\": 0, \"first\": []},      \"tie\": {\"count\": 0, \"first\": []}, "
    "\"missing\": {\"count\": 0, \"first\": []}}},     {\"row\": 1, \"reference\": {\"count\": 4}, "
    "\"impl\": {\"dropped\": 0, \"meets_rule\": true, \"strict\": {\"count\": 0, \"first\": []}, "
    "     \"tie\": {\"count\": 2, \"first\": [3, 8]}, \"missing\": {\"count\": 1, \"first\": [3]}}}, "
    "    {\"row\": 2, \"reference\": {\"count\": 4}, \"impl\": {\"dropped\": 1, \"meets_rule\": false, "
    "\"strict\": {\"count\": 2, \"first\": [1, 60]},      \"tie\": {\"count\": 0, \"first\": []}, "
    "\"missing\": {\"count\": 1, \"first\": [1]}}}]}}},  {\"check\": \"repeat\", "
    "\"label\": \"repeat topk.inc@host\", \"impl\": \"topk.inc@host\", \"result\": \"INCORRECT\", "
    "  \"summary\": \"4 distinct outputs over 5 runs; 2/3 rows vary\", \"findings\": {\"runs\": 5, "
    "\"distinct_outputs\": 4, \"rows_varying\": [    {\"row\": 0, \"digests\": [\"a\", \"b\", \"c\", \"d\", "
    "\"a\"], \"flip_rate\": {\"count\": 4, \"of\": 4, \"rate\": 1,     \"wilson95\": [0.5101091635454027, 1]}}, "
    "   {\"row\": 2, \"digests\": [\"e\", \"e\", \"f\", \"e\", \"e\"], \"flip_rate\": {\"count\": 1, \"of\": 4, "
    "\"rate\": 0.25,     \"wilson95\": [0.045586062644636, 0.69935]}}],    \"rows_varying_rate\": {\"count\": 2, "
    "\"of\": 3, \"rate\": 0.6666666666666666, \"wilson95\": [0.2076, 0.9386]}, "
    "   \"rows_varying_by_tensor\": {\"indices\": 2, \"values\": 1}}},  {\"check\": \"repeat\", "
    "\"label\": \"repeat topk.ex@host\", \"impl\": \"topk.ex@host\", \"result\": \"PASSED\", "
    "  \"summary\": \"1 distinct outputs over 5 runs; 0/3 rows vary\", \"findings\": {\"runs\": 5, "
    "\"distinct_outputs\": 1,    \"rows_varying\": [], \"rows_varying_rate\": {\"count\": 0, \"of\": 3, "
    "\"rate\": 0, \"wilson95\": [0, 0.56]}}},  {\"check\": \"batch\", \"label\": \"batch topk.inc@host\", "
    "\"impl\": \"topk.inc@host\", \"result\": \"INCORRECT\", "
    "  \"summary\": \"4 probes; 2 row differences; 0 vacuous probes\", \"findings\": {\"row_differences\": 2, "
    "\"vacuous_probes\": 0, \"probes\": [    {\"probe\": \"alone.row0\", \"batch\": 1, \"rows_differ\": [], "
    "\"rows_probed\": 1, \"rows_moved\": 1, \"vacuous\": false},    {\"probe\": \"alone.row1\", \"batch\": 1, "
    "\"rows_differ\": [{\"row\": 1, \"position\": 0}], \"rows_probed\": 1, \"rows_moved\": 1, "
    "    \"vacuous\": false},    {\"probe\": \"permuted\", \"batch\": 3, \"rows_differ\": [{\"row\": 2, "
    "\"position\": 0}], \"rows_probed\": 3, \"rows_moved\": 2,     \"vacuous\": false}, "
    "   {\"probe\": \"reversed33\", \"batch\": 33, \"rows_differ\": [], \"rows_probed\": 3, \"rows_moved\": 3, "
    "\"vacuous\": false}]}},  {\"check\": \"batch\", \"label\": \"batch topk.ex@host\", "
    "\"impl\": \"topk.ex@host\", \"result\": \"PASSED\",   \"summary\": \"1 probes; 0 row differences\", "
    "\"findings\": {\"row_differences\": 0, \"vacuous_probes\": 0, \"probes\": [    {\"probe\": \"alone.row0\", "
    "\"batch\": 1, \"rows_differ\": [], \"rows_probed\": 1, \"rows_moved\": 1, \"vacuous\": false}]}}]}, "
    "{\"file\": \"receipts/0003.json\", \"case\": \"mla(batch=2,profile=holes,seed=2)\", "
    "\"result\": \"INCORRECT\", \"reasons\": [],  \"impls\": [{\"name\": \"mla.count@host\", "
    "\"timing\": {\"wall_us\": 2000}}, {\"name\": \"mla.size@host\", \"timing\": {\"wall_us\": 3000}}], "
    " \"checks\": [  {\"check\": \"tolerance\", \"label\": \"tolerance mla.count@host\", "
    "\"impl\": \"mla.count@host\", \"result\": \"INCORRECT\",   \"summary\": \"out: 1/4 over\", "
    "\"findings\": {\"tensors\": [{\"tensor\": \"out\", \"dtype\": \"bf16\", \"result\": \"INCORRECT\", "
    "   \"elements\": 4, \"finite_pairs\": 4, \"nonfinite_mismatch\": {\"count\": 0, \"first\": []}, "
    "   \"over_tolerance\": {\"count\": 1, \"first\": [65636]},    \"metrics\": {\"max_abs\": 0.0025, "
    "\"bf16_ulp_histogram\": {\"0\": 1, \"1\": 0, \"2\": 0, \"3-4\": 0, \"5-8\": 0, \"9-16\": 0,     \"17-64\": 0, "
    "\">64\": 3}},    \"against\": [{\"reference\": \"out@unquantized\", \"counts\": \"no: reported only\", "
    "\"over_tolerance\": 2, \"max_abs\": 0.01,     \"nmse\": 0.0008}],    \"worst_per_row\": [{\"row\": 0, "
    "\"index\": 12, \"value\": 0.5, \"reference\": 0.5004, \"abs\": 0.0004, \"excess\": -0.0006},     {\"row\": 1, "
    "\"index\": 65636, \"value\": 0.09130859375, \"reference\": 0.0888671875, \"abs\": 0.00244140625, "
    "     \"excess\": 0.00104591369628906}]}]}},  {\"check\": \"tolerance\", "
    "\"label\": \"tolerance mla.size@host\", \"impl\": \"mla.size@host\", \"result\": \"PASSED\", "
    "  \"summary\": \"out: 0/4 over\", \"findings\": {\"tensors\": [{\"tensor\": \"out\", \"dtype\": \"bf16\", "
    "\"result\": \"PASSED\",    \"elements\": 4, \"nonfinite_mismatch\": {\"count\": 0, \"first\": []}, "
    "\"over_tolerance\": {\"count\": 0, \"first\": []},    \"against\": [{\"reference\": \"out@unquantized\", "
    "\"over_tolerance\": 5}], \"worst_per_row\": []}]}},  {\"check\": \"expect\", "
    "\"label\": \"expect batch=INCORRECT mla.count@host\", \"impl\": \"mla.count@host\", "
    "\"result\": \"INCORRECT\", "
    "  \"summary\": \"KNOWN DEFECT DID NOT REPRODUCE: batch mla.count@host was PASSED\", "
    "\"inner\": {\"check\": \"batch\",    \"label\": \"batch mla.count@host\", \"impl\": \"mla.count@host\", "
    "\"result\": \"PASSED\", \"summary\": \"1 probes\",    \"findings\": {\"probes\": [{\"probe\": \"alone.row0\", "
    "\"batch\": 1, \"rows_differ\": [], \"rows_probed\": 1, \"rows_moved\": 1,     \"vacuous\": false}], "
    "\"row_differences\": 0, \"vacuous_probes\": 0}}},  {\"check\": \"repeat\", "
    "\"label\": \"repeat mla.size@host\", \"impl\": \"mla.size@host\", \"result\": \"FAILED\", "
    "  \"summary\": \"run 2 of 5: launch error\"}]}, {\"file\": \"receipts/0004.json\", "
    "\"case\": \"topp(batch=1,profile=flat,seed=9,top_p=0.9,vocab=10)\", \"result\": \"FAILED\", "
    " \"reasons\": [\"guard region overwritten\"], \"checks\": []}]";

#define PLANTED_FIGURES                                                                                             \
    "finding-0-0=rule-exact;finding-0-1=rule;finding-0-2=rule;finding-1-0=rule;finding-1-1=repeat;" \
    "finding-1-3=batch;finding-2-0=tolerance;finding-2-2=batch;"

static char *render(const char *rows_json) {
    cJSON *rows = cJSON_Parse(rows_json);
    cr_assert_not_null(rows, "the planted rows do not parse near: %.60s", cJSON_GetErrorPtr());
    char *html = kp_report_html(rows, "INCORRECT", 1);
    cr_assert_not_null(html);
    cJSON_Delete(rows);
    return html;
}

Test(report, planted_rows_give_one_well_formed_plot_per_finding) {
    char *html = render(planted_rows), why[300], list[4096];
    cr_assert(well_formed(html, why, sizeof why), "report.html: %s", why);
    cr_assert(figures(html, list, sizeof list, why, sizeof why), "%s", why);
    cr_assert_str_eq(list, PLANTED_FIGURES, "one plot per finding, in receipt order, of the right kind");
    cr_assert_eq(count(html, ">plot</a>"), 8, "each finding's table row links to its plot");
    cr_assert(strstr(html, "<h2>Findings (8)</h2>"));

    /* The counter and the checker catch a report missing a plot or an element left open. */
    char *short_one = without_first_figure(html);
    cr_assert(figures(short_one, list, sizeof list, why, sizeof why));
    cr_assert_str_neq(list, PLANTED_FIGURES, "a missing plot must change what is counted");
    cr_assert_eq(count(short_one, "<figure class=\"finding\""), 7);
    char *broken = strdup(html), *close = strstr(broken, "</figcaption>");
    memcpy(close, "<figcaption>", 12); /* as long: the caption now opens where it closed */
    cr_assert(!well_formed(broken, why, sizeof why), "a report with an unclosed element passed");
    free(short_one), free(broken), free(html);
}

Test(report, plots_say_what_the_receipts_say) {
    char *html = render(planted_rows);
    /* top-p (its figure: kept mass against top_p): which rows broke the rule, each impl's mass and the reference's */
    cr_assert(strstr(html, "topp.a@host: rows breaking the rule: 1, 3 (2 of 4); most kept mass beyond the reference's: "
                           "+9.9e-06 (row 1); most kept mass short of the reference's: -0.96 (row 3)."), "%s", html);
    cr_assert(strstr(html, "row 1, topp.a@host: 1 strict, 0 tie, 1 band; kept mass - top_p = +1e-05 (reference +1e-07); "
                           "breaks the rule"), "%s", html);
    cr_assert(strstr(html, "row 3, topp.a@host: 1 strict, 0 tie, 0 band; kept mass - top_p = -0.95 (reference +0.01); "
                           "breaks the rule"));
    cr_assert(strstr(html, "topp.b@host: rows breaking the rule: none; most kept mass short of the reference's: -6e-07 (row 1)."),
              "a passing rule check's allowed band difference is drawn");
    /* top-k (its figure: the missing indices): each list per row, allowed ties apart from breaks */
    cr_assert(strstr(html, "row 1, topk.inc@host: 0 strict, 2 tie, 1 missing; meets the rule"));
    cr_assert(strstr(html, "row 2, topk.inc@host: 2 strict, 0 tie, 1 missing; breaks the rule"));
    cr_assert(strstr(html, "topk.inc@host: rows breaking the rule: 2 (1 of 3); most missing indices: 1 (row 1)."));
    /* marks sit where their numbers say: row 1's excess mass above top_p and row 3's shortfall below it,
       one bar up for an extra index and one down for a missing one */
    const char *rule_fig = strstr(html, "id=\"finding-0-1\""), *topk_fig = strstr(html, "id=\"finding-1-0\"");
    const char *zero_text = strstr(rule_fig, "text-anchor=\"end\">top_p</text>");
    cr_assert(zero_text);
    while (strncmp(zero_text, " y=\"", 4)) zero_text--;
    const double zero = atof(zero_text + 4) - 4; /* the label sits 4 px below its line */
    const double excess_y = mark_attr(rule_fig, "circle", "row 1, topp.a@host", "cy");
    const double short_y = mark_attr(rule_fig, "circle", "row 3, topp.a@host", "cy");
    cr_assert(excess_y < zero && short_y > zero, "top_p at y %g: excess at %g, shortfall at %g", zero, excess_y, short_y);
    cr_assert(mark_attr(rule_fig, "rect", "row 3, topp.a@host", "height") > 0, "row 3's strict mismatch has a bar");
    cr_assert_eq(count(topk_fig, "<title>row 2, topk.inc@host: 2 strict, 0 tie, 1 missing") -
                     count(strstr(topk_fig, "</figure>"), "<title>row 2, topk.inc@host: 2 strict, 0 tie, 1 missing"), 2,
                 "row 2 has a bar for its strict entries and one for its missing one, no tie bar");
    /* repeat: distinct outputs and the flip rate with its Wilson interval per varying row, and the share of rows */
    cr_assert(strstr(html, "row 0: 4 distinct outputs over 5 runs; flips 4/4 = 1, Wilson 95% [0.51, 1]"));
    cr_assert(strstr(html, "row 2: 2 distinct outputs over 5 runs; flips 1/4 = 0.25, Wilson 95% [0.0456, 0.699]"));
    cr_assert(strstr(html, "rows varying 2/3 = 0.667 (Wilson 95% [0.208, 0.939])"));
    /* batch: rows moved and differing per probe */
    cr_assert(strstr(html, "permuted (batch 3): 3 rows probed, 2 moved, 1 differ"));
    cr_assert(strstr(html, "reversed33 (batch 33): 3 rows probed, 3 moved, 0 differ"));
    /* tolerance: the ulp histogram, each row's worst element, the worst elements' table, the reported-only reference */
    cr_assert(strstr(html, "&gt;64 ulp: 3 elements"));
    cr_assert(strstr(html, "<tr class=\"over\"><td>out</td><td>1</td><td>65636</td><td>0.0913085938</td><td>0.0888671875</td>"
                           "<td>0.00244</td><td>0.00105</td><td>1.75</td></tr>"), "%s", strstr(html, "<table class=\"worst\">"));
    cr_assert(strstr(html, "out against out@unquantized (reported only): 2 over the same bound"));
    /* every rule check's rows at a glance: four strips (three top-p rule checks, the expect's top-k rule) */
    const char *glance = strstr(html, "<h2>Rows against the rule</h2>"), *glance_end = glance ? strstr(glance, "</svg>") : NULL;
    cr_assert(glance && glance_end);
    size_t strips = 0;
    for (const char *p = glance; (p = strstr(p, "rows meet")) && p < glance_end; p++) strips++;
    cr_assert_eq(strips, 4);
    cr_assert(strstr(glance, "2/4 rows meet; worst row 3: kept mass -0.96"));
    cr_assert(strstr(glance, "2/3 rows meet; worst row 2: 1 missing indices"));
    /* impl times, from the one row that carries impls */
    cr_assert(strstr(html, "<h2>Impl times</h2>") && strstr(html, "3 ms (1.50x the first)"));
    free(html);
}

Test(report, a_clean_run_draws_no_findings_and_hostile_names_stay_text) {
    const char *rows_json =
        "[{\"file\": \"receipts/0001.json\", \"case\": \"topp(<b>&\\\"x'\\u0001)\", \"result\": \"PASSED\", \"reasons\": [],"
        "  \"checks\": [{\"check\": \"repeat\", \"label\": \"repeat <i>\", \"impl\": \"a&b\", \"result\": \"PASSED\","
        "   \"summary\": \"]]> <!--\","
        "   \"findings\": {\"runs\": 2, \"distinct_outputs\": 1, \"rows_varying\": []}}]}]";
    char *html = render(rows_json), why[300], list[64];
    cr_assert(well_formed(html, why, sizeof why), "%s", why);
    cr_assert(figures(html, list, sizeof list, why, sizeof why) && !list[0], "a clean run has no findings: %s", list);
    cr_assert(!strstr(html, "<h2>Findings") && !strstr(html, "<h2>Impl times</h2>") && !strstr(html, "Rows against the rule"));
    cr_assert(strstr(html, "topp(&lt;b&gt;&amp;&quot;x&apos;?)"), "%s", html);
    free(html);

    /* a receipt string with broken UTF-8 is replaced, not copied, inside a plot too */
    char *bad_utf8 = NULL;
    cr_assert(asprintf(&bad_utf8, "[{\"file\": \"f\", \"case\": \"c\", \"result\": \"INCORRECT\", \"checks\": [{"
                                  "\"check\": \"batch\", \"label\": \"l\", \"result\": \"INCORRECT\", \"findings\": {"
                                  "\"probes\": [{\"probe\": \"p\xff<\", \"batch\": 1, \"rows_differ\": [{\"row\": 0}], "
                                  "\"rows_probed\": 1, \"rows_moved\": 1}]}}]}]") > 0);
    html = render(bad_utf8);
    cr_assert(well_formed(html, why, sizeof why), "%s", why);
    cr_assert(strstr(html, "p\xEF\xBF\xBD&lt; (batch 1)"));
    free(html), free(bad_utf8);
}

/* ---------------------------------------------------------------- a real run */

/* What a check found, read from its receipt's totals (not from the difference lists the report walks):
 * a broken check, a reproduced defect, or differences a passing check allows. */
static int found_something(const cJSON *chk) {
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(chk, "check"));
    const char *result = cJSON_GetStringValue(cJSON_GetObjectItem(chk, "result"));
    const cJSON *f = cJSON_GetObjectItem(chk, "findings");
    int64_t a = 0, b = 0, c = 0;
    if (!strcmp(result, "INCORRECT")) return 1;
    if (!strcmp(kind, "expect")) return !strcmp(result, "PASSED") || found_something(cJSON_GetObjectItem(chk, "inner"));
    if (!strcmp(kind, "rule")) {
        kp_json_get_int(f, "strict", &a), kp_json_get_int(f, "tie", &b), kp_json_get_int(f, "band", &c);
        return a + b + c > 0;
    }
    if (!strcmp(kind, "exact")) return kp_json_get_int(f, "rows_differ", &a) == 0 && a > 0;
    if (!strcmp(kind, "repeat")) return kp_json_get_int(f, "distinct_outputs", &a) == 0 && a > 1;
    if (!strcmp(kind, "batch")) return kp_json_get_int(f, "row_differences", &a) == 0 && a > 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(f, "tensors")) {
        kp_json_get_int(cJSON_GetObjectItem(t, "over_tolerance"), "count", &a);
        kp_json_get_int(cJSON_GetObjectItem(t, "nonfinite_mismatch"), "count", &b);
        if (a + b > 0) return 1;
    }
    return 0;
}

Test(report, a_real_run_draws_every_finding_of_its_receipts, .timeout = 300) {
    /* Fast cases on the host ports: top-p exact and rule broken, a forced expect, a clean repeat and
     * batch; top-k's buffer overflow; a MoE row held to a tolerance it cannot meet and to one it meets. */
    const char *cfg_text =
        "{\"schema\": \"kparity.gate/v1\", \"name\": \"report\","
        " \"impls\": {\"incumbent\": \"topp.split_logit@host\", \"candidate\": \"topp.split_prob@host\","
        "  \"topk.incumbent\": \"topk.radix_buffer@host\", \"moe.candidate\": \"moe.invariant@host\"},"
        " \"defaults\": {\"tie_policy\": \"minimal_index\", \"band\": 1e-6, \"runs\": 3},"
        " \"check_sets\": {"
        "  \"control\": [{\"check\": \"exact\", \"impls\": [\"incumbent\", \"candidate\"]},"
        "   {\"check\": \"rule\", \"impl\": \"incumbent\"},"
        "   {\"check\": \"rule\", \"impl\": \"candidate\"}],"
        "  \"forced\": [{\"check\": \"expect\", \"impl\": \"incumbent\", \"of\": \"rule\", \"result\": \"INCORRECT\","
        "   \"defect\": \"all_neginf\"}],"
        "  \"clean\": [{\"check\": \"repeat\", \"impl\": \"candidate\"}, {\"check\": \"batch\", \"impl\": \"candidate\"}],"
        "  \"overflow\": [{\"check\": \"expect\", \"impl\": \"incumbent\", \"of\": \"rule\", \"ties\": \"any\","
        "   \"order\": \"any\","
        "   \"result\": \"INCORRECT\", \"defect\": \"dropped_values\"}],"
        "  \"moe\": [{\"check\": \"tolerance\", \"impl\": \"candidate\", \"atol\": 1e-9, \"rtol\": 0},"
        "   {\"check\": \"tolerance\", \"impl\": \"candidate\", \"atol\": 0.04, \"rtol\": 0}]},"
        " \"cases\": ["
        "  {\"case\": \"topp(batch=4,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)\", \"checks\": \"control\"},"
        "  {\"case\": \"topp(batch=4,force_token=13,force_value=1e9,profile=forced,seed=58231,top_p=0.95,vocab=131072)\","
        "   \"checks\": \"forced\"},"
        "  {\"case\": \"topp(batch=3,profile=ordinary,seed=13,top_p=1e-8,vocab=13)\", \"checks\": \"clean\"},"
        "  {\"case\": \"topk(k=2048,profile=narrow,rows=33,seed=1,width=16385)\", \"checks\": \"overflow\"},"
        "  {\"case\": \"moe(hidden=256,inter=128,m=1,model=qwen3,profile=single,seed=23)\", \"checks\": \"moe\"}]}";
    char *cfg, *bundle, *out, *err;
    cr_assert(asprintf(&cfg, "%s/report.json", kpt_dir) > 0 && asprintf(&bundle, "%s/b", kpt_dir) > 0);
    cr_assert_eq(kpt_write(cfg, cfg_text, strlen(cfg_text)), 0);
    char *argv[] = {kpt_binary(), "run", "--config", cfg, "--out", bundle, "--quiet", NULL};
    cr_assert_eq(kpt_run(argv, &out, &err), 1, "the run breaks declared checks (exit 1): %s", err);

    char want[4096] = "", list[4096], why[300];
    size_t used = 0, findings = 0;
    for (int i = 1; i <= 5; i++) {
        cJSON *rec = kpt_receipt(bundle, i);
        int c = 0;
        const cJSON *chk;
        cJSON_ArrayForEach(chk, cJSON_GetObjectItem(rec, "checks")) {
            if (found_something(chk)) {
                used += (size_t)snprintf(want + used, sizeof want - used, "finding-%d-%d=", i - 1, c);
                findings++;
            }
            c++;
        }
        cJSON_Delete(rec);
    }
    cr_assert_geq(findings, 5, "exact, rule, expect, expect and tolerance at least: %s", want);

    char *path, *html;
    cr_assert(asprintf(&path, "%s/report.html", bundle) > 0);
    cr_assert_not_null(html = kpt_read(path, NULL));
    cr_assert(well_formed(html, why, sizeof why), "report.html: %s", why);
    cr_assert(figures(html, list, sizeof list, why, sizeof why), "%s", why);
    /* the same figures in the same order: compare ids, the kinds cut out */
    char ids[4096] = "";
    used = 0;
    for (char *p = list, *eq; (eq = strchr(p, '=')); p = strchr(eq, ';') + 1)
        used += (size_t)snprintf(ids + used, sizeof ids - used, "%.*s", (int)(eq - p + 1), p);
    cr_assert_str_eq(ids, want, "one plot per finding of the receipts: drawn %s", list);
    cr_assert(strstr(list, "=rule-exact;") && strstr(list, "=rule;") &&
              strstr(list, "=tolerance;"), "%s", list);
    char *short_one = without_first_figure(html);
    cr_assert_eq(count(short_one, "<figure class=\"finding\""), findings - 1, "the count must see a missing plot");
    free(short_one), free(html), free(path), free(cfg), free(bundle), free(out), free(err);
}
