/* rates.c: Wilson and Newcombe intervals, the pooled z test, trials per arm, and `kparity rates` (kp_rates.h). */
#define _GNU_SOURCE /* M_PI */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../cases/kp_common.h"
#include "../receipts/kp_json.h"
#include "kp_rates.h"

static double phi_cdf(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

double kp_normal_quantile(double p) {
    if (!(p > 0 && p < 1)) return p == 0 ? -INFINITY : p == 1 ? INFINITY : NAN;
    const double tail = p < 0.5 ? p : 1 - p;
    double x = sqrt(-2.0 * log(tail)); /* a start on the right side, refined below */
    x = p < 0.5 ? -x : x;
    for (int i = 0; i < 100; i++) {
        const double density = exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
        /* the error in the nearer tail, so a tail probability near 1e-300 keeps its digits */
        const double err = p < 0.5 ? phi_cdf(x) - p : (1 - p) - phi_cdf(-x);
        const double step = err / density;
        x -= step;
        if (fabs(step) < 1e-15 * (1.0 + fabs(x))) break;
    }
    return x;
}

void kp_wilson(double k, double n, double conf, double *lo, double *hi) {
    const double z = kp_normal_quantile(0.5 + conf / 2), z2 = z * z, p = k / n;
    const double denom = 1.0 + z2 / n, centre = (p + z2 / (2.0 * n)) / denom;
    const double half = z * sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom;
    *lo = k <= 0 ? 0.0 : centre - half;
    *hi = k >= n ? 1.0 : centre + half;
}

void kp_newcombe_difference(double k1, double n1, double k2, double n2, double conf, double *lo, double *hi) {
    double l1, u1, l2, u2;
    kp_wilson(k1, n1, conf, &l1, &u1);
    kp_wilson(k2, n2, conf, &l2, &u2);
    const double p1 = k1 / n1, p2 = k2 / n2, d = p1 - p2;
    *lo = d - sqrt((p1 - l1) * (p1 - l1) + (u2 - p2) * (u2 - p2));
    *hi = d + sqrt((u1 - p1) * (u1 - p1) + (p2 - l2) * (p2 - l2));
}

double kp_two_proportion_p(double k1, double n1, double k2, double n2) {
    const double pooled = (k1 + k2) / (n1 + n2), se = sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2));
    if (!(se > 0)) return 1.0;
    const double z = fabs(k1 / n1 - k2 / n2) / se;
    return erfc(z / sqrt(2.0));
}

int64_t kp_trials_per_arm(double p1, double p2, double alpha, double power) {
    if (p1 == p2) return -1;
    const double za = kp_normal_quantile(1 - alpha / 2), zb = kp_normal_quantile(power), pbar = (p1 + p2) / 2;
    const double root = za * sqrt(2 * pbar * (1 - pbar)) + zb * sqrt(p1 * (1 - p1) + p2 * (1 - p2));
    const double n = root * root / ((p1 - p2) * (p1 - p2));
    return n > 9e15 ? -1 : (int64_t)ceil(n - 1e-9); /* 2553.9999999 from rounding is 2554, not 2555 */
}

/* "K/N": 0 <= K <= N, N > 0; K may be fractional (a quoted rate times its trials). */
static int parse_count(const char *field, const char *s, double *k, double *n, kp_error *err) {
    char *slash = s ? strchr(s, '/') : NULL, *end;
    if (!slash) return kp_fail(err, KP_EXIT_USAGE, "%s: expected K/N (flips over trials, e.g. 9/40), got '%s'", field, s ? s : "");
    *k = strtod(s, &end);
    if (end != slash || !isfinite(*k)) return kp_fail(err, KP_EXIT_USAGE, "%s: '%s': K is not a number", field, s);
    *n = strtod(slash + 1, &end);
    if (*end || !isfinite(*n) || slash[1] == '\0') return kp_fail(err, KP_EXIT_USAGE, "%s: '%s': N is not a number", field, s);
    if (!(*n > 0)) return kp_fail(err, KP_EXIT_USAGE, "%s: '%s': N must be above 0", field, s);
    if (!(*k >= 0 && *k <= *n)) return kp_fail(err, KP_EXIT_USAGE, "%s: '%s': K must lie in [0, N]", field, s);
    return 0;
}

static int parse_unit(const char *field, const char *s, double *out, kp_error *err) {
    char *end;
    *out = strtod(s, &end);
    if (*end || !(*out > 0 && *out < 1)) return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' must be a number in (0, 1)", field, s);
    return 0;
}

static cJSON *rate_json(double k, double n, double conf) {
    double lo, hi;
    kp_wilson(k, n, conf, &lo, &hi);
    cJSON *o = cJSON_CreateObject();
    kp_json_add_double(o, "flips", k);
    kp_json_add_double(o, "trials", n);
    kp_json_add_double(o, "rate", k / n);
    cJSON *w = cJSON_AddArrayToObject(o, "wilson");
    cJSON_AddItemToArray(w, cJSON_CreateNumber(lo));
    cJSON_AddItemToArray(w, cJSON_CreateNumber(hi));
    return o;
}

int kp_cmd_rates(int argc, char **argv) {
    const char *a = NULL, *b = NULL;
    double alpha = 0.05, power = 0.8;
    int json = 0;
    kp_error err = {0};
    int rc = 0;
    for (int i = 0; i < argc && !rc; i++) {
        const int more = i + 1 < argc;
        if (!strcmp(argv[i], "--a") && more) a = argv[++i];
        else if (!strcmp(argv[i], "--b") && more) b = argv[++i];
        else if (!strcmp(argv[i], "--alpha") && more) rc = parse_unit("--alpha", argv[++i], &alpha, &err);
        else if (!strcmp(argv[i], "--power") && more) rc = parse_unit("--power", argv[++i], &power, &err);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else rc = kp_fail(&err, KP_EXIT_USAGE, "rates: unknown or incomplete option '%s' (--a K/N --b K/N [--alpha A] "
                          "[--power P] [--json])", argv[i]);
    }
    double k1 = 0, n1 = 0, k2 = 0, n2 = 0;
    if (!rc && !a) rc = kp_fail(&err, KP_EXIT_USAGE, "rates: --a K/N is required");
    if (!rc) rc = parse_count("--a", a, &k1, &n1, &err);
    if (!rc && b) rc = parse_count("--b", b, &k2, &n2, &err);
    if (rc) {
        fprintf(stderr, "kparity: %s\n", err.msg);
        return rc;
    }
    const double conf = 1 - alpha;
    cJSON *doc = cJSON_CreateObject();
    kp_json_add_double(doc, "confidence", conf);
    cJSON_AddItemToObject(doc, "a", rate_json(k1, n1, conf));
    double la, ua, lb = 0, ub = 0, lo = 0, hi = 0, p = 1;
    kp_wilson(k1, n1, conf, &la, &ua);
    int64_t need = -1;
    if (b) {
        cJSON_AddItemToObject(doc, "b", rate_json(k2, n2, conf));
        kp_wilson(k2, n2, conf, &lb, &ub);
        kp_newcombe_difference(k1, n1, k2, n2, conf, &lo, &hi);
        p = kp_two_proportion_p(k1, n1, k2, n2);
        need = kp_trials_per_arm(k1 / n1, k2 / n2, alpha, power);
        cJSON *d = cJSON_AddObjectToObject(doc, "difference");
        kp_json_add_double(d, "a_minus_b", k1 / n1 - k2 / n2);
        cJSON *nw = cJSON_AddArrayToObject(d, "newcombe");
        cJSON_AddItemToArray(nw, cJSON_CreateNumber(lo));
        cJSON_AddItemToArray(nw, cJSON_CreateNumber(hi));
        kp_json_add_double(d, "p_value", p);
        cJSON_AddBoolToObject(d, "distinguishable", lo > 0 || hi < 0);
        cJSON *t = cJSON_AddObjectToObject(doc, "trials_per_arm");
        kp_json_add_double(t, "power", power);
        kp_json_add_double(t, "alpha", alpha);
        if (need > 0) kp_json_add_int(t, "needed", need);
        else cJSON_AddNullToObject(t, "needed");
    }
    if (json) {
        char *s = cJSON_Print(doc);
        printf("%s\n", s ? s : "{}");
        free(s);
    } else {
        printf("a: %g/%g = %.4f, %g%% Wilson interval [%.4f, %.4f]\n", k1, n1, k1 / n1, 100 * conf, la, ua);
        if (b) {
            printf("b: %g/%g = %.4f, %g%% Wilson interval [%.4f, %.4f]\n", k2, n2, k2 / n2, 100 * conf, lb, ub);
            printf("a - b = %+.4f, %g%% Newcombe interval [%+.4f, %+.4f]; pooled z test p = %.3g\n", k1 / n1 - k2 / n2,
                   100 * conf, lo, hi, p);
            printf("%s\n", lo > 0 || hi < 0 ? "distinguishable: yes (the interval excludes 0)"
                                            : "distinguishable: no (the interval includes 0)");
            if (need > 0)
                printf("trials per arm to tell %.4f from %.4f (two-sided alpha %g, power %g): %lld\n", k1 / n1, k2 / n2, alpha,
                       power, (long long)need);
            else printf("trials per arm: none tells two equal rates apart\n");
        }
    }
    cJSON_Delete(doc);
    return 0;
}
