/* test_cases.c: canonical case names, field validation, and seeded generation: the same name
 * gives the same bytes on every machine (pinned digests), whatever the batch or thread count. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../cases/kp_tensor.h"
#include "../cases/topp_case.h"

/* Pinned input digests (see pinned_input_digests). */
#define PIN_ORDINARY "36f8b8b0a2fe0f3985f7b85fa59b0d1706eef2f169f02fe7dfe31764ba7b7df0"
#define PIN_FORCED "0bb8232dfdfeef5d77ff10681e48d475f6496bd4843b86072578f540b4c3227b"
#define PIN_TIES "f79c7f111a93fddd3f0df563abe6da74d442a900f3333b1076f1b854ee75011e"
#define PIN_NEGINF "aa91bb8784a41070f8ad862c9d5bb0194c88359a0b7b39a04d5292621097feaa"

static void canon(const char *in, const char *want) {
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(in, &c, &err), 0, "parse %s: %s", in, err.msg);
    cr_assert_eq(kp_case_normalize(&c, &err), 0, "normalize %s: %s", in, err.msg);
    char buf[KP_CASE_NAME_MAX];
    cr_assert_gt(kp_case_format(&c, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, want);
    /* and the canonical name is a fixed point */
    kp_case again;
    cr_assert_eq(kp_case_parse(buf, &again, &err), 0);
    cr_assert_eq(kp_case_normalize(&again, &err), 0);
    char buf2[KP_CASE_NAME_MAX];
    kp_case_format(&again, buf2, sizeof buf2);
    cr_assert_str_eq(buf2, buf);
}

Test(cases, canonical_names_sort_keys_and_normalize_values) {
    canon("topp(vocab=154856,top_p=0.950,seed=58231,profile=forced,force_value=1000000000,force_token=154842,batch=64)",
          "topp(batch=64,force_token=154842,force_value=1e9,profile=forced,seed=58231,top_p=0.95,vocab=154856)");
    canon("topp(batch=4,force_token=13,force_value=1666666666.6666667,profile=forced,seed=58231,top_p=0.95,vocab=131072)",
          "topp(batch=4,force_token=13,force_value=1666666666.6666667,profile=forced,seed=58231,top_p=0.95,vocab=131072)");
    canon("topp(batch=2,profile=ties,seed=1,tie_count=1000,top_p=1e-08,vocab=5000,stride=5000)",
          "topp(batch=2,profile=ties,seed=1,top_p=1e-8,vocab=5000)");
    canon("topp(batch=2,profile=ordinary,seed=1,top_p=mixed,vocab=50,stride=64)",
          "topp(batch=2,profile=ordinary,seed=1,stride=64,top_p=mixed,vocab=50)");
}

Test(cases, format_number_is_shortest_round_trip) {
    struct { double v; const char *text; } t[] = {
        {1e9, "1e9"}, {0.95, "0.95"}, {1e-8, "1e-8"}, {1666666666.6666667, "1666666666.6666667"},
        {131072, "131072"}, {100, "100"}, {0.30000000000000004, "0.30000000000000004"}, {-2.5, "-2.5"}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        char buf[64];
        kp_format_number(t[i].v, buf, sizeof buf);
        cr_expect_str_eq(buf, t[i].text);
        cr_expect_eq(strtod(buf, NULL), t[i].v);
    }
}

static void bad(const char *name, const char *field) {
    kp_case c;
    kp_error err = {0};
    int rc = kp_case_parse(name, &c, &err);
    if (!rc) rc = kp_case_normalize(&c, &err);
    cr_assert_eq(rc, KP_EXIT_USAGE, "%s was accepted", name);
    cr_assert(strstr(err.msg, field) != NULL, "error for %s does not name '%s': %s", name, field, err.msg);
}

Test(cases, bad_names_and_fields_are_usage_errors_naming_the_field) {
    bad("topp batch=4", "expected family(");
    bad("topp(batch=4,batch=5,profile=ordinary,seed=1,top_p=0.5,vocab=9)", "'batch' given twice");
    bad("topp(batch=4,)", "trailing");
    bad("topp(batch=4 ,vocab=9)", "batch");
    bad("nope(batch=4)", "nope");
    bad("topp(batch=4,profile=ordinary,seed=1,top_p=0.5,vocab=0)", "'vocab'");
    bad("topp(batch=1099511627776,profile=ordinary,seed=1,top_p=0.5,vocab=9)", "'batch'");
    bad("topp(batch=4,profile=ordinary,seed=1,top_p=-0.5,vocab=9)", "'top_p'");
    bad("topp(batch=4,profile=ordinary,seed=1,top_p=nan,vocab=9)", "'top_p'");
    bad("topp(batch=4,profile=ordinary,seed=1,top_p=0,vocab=9)", "'top_p'");
    bad("topp(batch=4,profile=ordinary,seed=1,top_p=abc,vocab=9)", "'top_p'");
    bad("topp(batch=4,profile=ordinary,seed=1,vocab=9)", "'top_p'");
    bad("topp(batch=4,profile=odd,seed=1,top_p=0.5,vocab=9)", "'profile'");
    bad("topp(batch=4,profile=ordinary,seed=1,top_p=0.5,vocab=9,colour=red)", "'colour'");
    bad("topp(batch=4,force_token=9,force_value=1e9,profile=forced,seed=1,top_p=0.5,vocab=9)", "'force_token'");
    bad("topp(batch=4,force_token=1,profile=ordinary,seed=1,top_p=0.5,vocab=9)", "'force_token'");
    bad("topp(batch=4,force_token=1,force_value=1e39,profile=forced,seed=1,top_p=0.5,vocab=9)", "'force_value'");
    bad("topp(batch=4,profile=ties,seed=1,tie_count=5,top_p=0.5,vocab=9)", "'tie_count'");
    bad("topp(batch=4,profile=ordinary,seed=-1,top_p=0.5,vocab=9)", "'seed'");
    bad("topp(batch=4,profile=ordinary,seed=1,stride=8,top_p=0.5,vocab=9)", "'stride'");
}

static float *gen(const char *name, kp_topp_case *tc) {
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_topp_case_read(&c, tc, &err), 0,
                 "%s", err.msg);
    float *x = malloc(sizeof(float) * (size_t)(tc->batch * tc->stride));
    float *tp = malloc(sizeof(float) * (size_t)tc->batch);
    cr_assert_eq(kp_topp_case_rows(tc, 0, tc->batch, x, tp, NULL, &err), 0, "%s", err.msg);
    free(tp);
    return x;
}

static void digest_of(const char *name, char hex[KP_SHA256_HEX_LEN]) {
    kp_topp_case tc;
    float *x = gen(name, &tc);
    int64_t shape[2] = {tc.batch, tc.vocab};
    kp_buffer_digest(KP_F32, 2, shape, tc.stride, x, hex);
    free(x);
}

/* Pinned: computed once with cuRAND 10.4 (CUDA 13.0) on x86-64 glibc 2.36. A change here means a
 * case name no longer means the same bytes: every stored receipt would stop replaying. */
Test(cases, pinned_input_digests) {
    struct { const char *name, *hex; } pins[] = {
        {"topp(batch=4,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)", PIN_ORDINARY},
        {"topp(batch=4,force_token=154842,force_value=1e9,profile=forced,seed=58231,top_p=0.95,vocab=154856)", PIN_FORCED},
        {"topp(batch=2,profile=ties,seed=7,top_p=0.5,vocab=32000)", PIN_TIES},
        {"topp(batch=3,neginf_frac=0.5,profile=neginf,seed=9,stride=1030,top_p=0.9,vocab=1000)", PIN_NEGINF},
    };
    for (size_t i = 0; i < sizeof pins / sizeof *pins; i++) {
        char hex[KP_SHA256_HEX_LEN];
        digest_of(pins[i].name, hex);
        cr_expect_str_eq(hex, pins[i].hex, "%s", pins[i].name);
    }
}

Test(cases, a_row_is_the_same_in_any_batch_and_with_any_thread_count) {
    kp_topp_case small, big;
    float *a = gen("topp(batch=4,profile=nan,nan_count=3,seed=5,top_p=0.9,vocab=3001)", &small);
    setenv("KPARITY_THREADS", "1", 1);
    float *b = gen("topp(batch=64,profile=nan,nan_count=3,seed=5,top_p=0.9,vocab=3001)", &big);
    unsetenv("KPARITY_THREADS");
    cr_assert_eq(memcmp(a, b, sizeof(float) * 4 * 3001), 0);
    free(a), free(b);
}

Test(cases, profiles_have_their_shape) {
    kp_topp_case tc;
    float *x = gen("topp(batch=3,force_token=7,force_value=1e9,profile=forced,seed=1,stride=70,top_p=0.95,vocab=64)", &tc);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(x[r * 70 + 7], 1e9f);
        uint32_t bits;
        memcpy(&bits, &x[r * 70 + 64], 4);
        cr_assert_eq(bits, KP_TOPP_PAD_BITS, "row padding holds the sentinel NaN");
    }
    free(x);
    x = gen("topp(batch=2,profile=ties,seed=3,tie_count=100,top_p=0.5,vocab=1000)", &tc);
    for (int r = 0; r < 2; r++) {
        int ones = 0, zeros = 0, low = 0;
        for (int i = 0; i < 1000; i++) {
            float v = x[r * 1000 + i];
            ones += v == 1.0f, zeros += v == 0.0f, low += v < -5.0f;
        }
        cr_assert_eq(ones, 100);
        cr_assert_eq(zeros, 100);
        cr_assert_eq(low, 800, "the rest sits 12 below: %d", low);
    }
    free(x);
    x = gen("topp(batch=2,neginf_frac=0.9,profile=neginf,seed=3,top_p=0.5,vocab=10000)", &tc);
    int ninf = 0;
    for (int i = 0; i < 20000; i++) ninf += isinf(x[i]) && x[i] < 0;
    cr_assert(ninf > 17600 && ninf < 18400, "about 90%% -inf: %d", ninf);
    free(x);
    x = gen("topp(batch=2,nan_count=5,profile=nan,seed=3,top_p=0.5,vocab=100)", &tc);
    int nnan = 0;
    for (int i = 0; i < 200; i++) nnan += isnan(x[i]);
    cr_assert_eq(nnan, 10);
    free(x);
    /* ordinary: a dominant head over a bell-shaped tail; the 0.95 boundary lies in the tail */
    x = gen("topp(batch=4,profile=ordinary,seed=58231,top_p=0.95,vocab=154856)", &tc);
    for (int r = 0; r < 4; r++) {
        const float *row = x + r * 154856;
        double mx = -INFINITY, z = 0, tail_mass = 0, sum = 0, sq = 0;
        int n_tail = 0;
        for (int i = 0; i < 154856; i++) mx = row[i] > mx ? row[i] : mx;
        for (int i = 0; i < 154856; i++) {
            double p = exp(row[i] - mx);
            z += p;
            if (row[i] <= 6.9283f) { /* the tail's range is +-4 sqrt(3) */
                tail_mass += p, sum += row[i], sq += (double)row[i] * row[i], n_tail++;
            }
        }
        double mean = sum / n_tail, sd = sqrt(sq / n_tail - mean * mean);
        cr_assert(n_tail >= 154856 - 16, "only head tokens leave the tail's range: %d", 154856 - n_tail);
        cr_assert(fabs(mean) < 0.05 && fabs(sd - 2.0) < 0.05, "tail mean %g sd %g", mean, sd);
        cr_assert(tail_mass / z > 0.05 && tail_mass / z < 0.6, "row %d: the tail holds %g of the mass", r, tail_mass / z);
    }
    free(x);
}

Test(cases, mixed_top_p_cycles_including_tiny_and_one) {
    kp_topp_case tc;
    kp_case c;
    kp_error err;
    kp_case_parse("topp(batch=9,profile=flat,seed=1,top_p=mixed,vocab=10)", &c, &err);
    cr_assert_eq(kp_topp_case_read(&c, &tc, &err), 0);
    cr_assert_eq(kp_topp_case_row_top_p(&tc, 1), 1e-8f);
    cr_assert_eq(kp_topp_case_row_top_p(&tc, 2), 1.0f);
    cr_assert_eq(kp_topp_case_row_top_p(&tc, 8), 0.95f);
}

/* Ordinary, forced, neginf and nan rows share cached ordinary rows: a cache hit must give the
 * bytes a fresh generation gives. */
Test(cases, cached_rows_match_fresh_ones) {
    const char *names[] = {"topp(batch=6,force_token=7,force_value=1e9,profile=forced,seed=9,top_p=0.9,vocab=5000)",
                           "topp(batch=6,nan_count=4,profile=nan,seed=9,top_p=0.9,vocab=5000)",
                           "topp(batch=6,neginf_frac=0.5,profile=neginf,seed=9,top_p=0.9,vocab=5000)"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        kp_topp_case tc;
        char cold[KP_SHA256_HEX_LEN], warm[KP_SHA256_HEX_LEN];
        kp_topp_case_cache_clear();
        digest_of(names[i], cold);
        float *x = gen("topp(batch=6,profile=ordinary,seed=9,top_p=0.9,vocab=5000)", &tc); /* fills the cache */
        free(x);
        digest_of(names[i], warm);
        cr_assert_str_eq(warm, cold, "%s", names[i]);
    }
    /* and a forced row differs from the ordinary one only at the forced token */
    kp_topp_case a, b;
    float *x = gen("topp(batch=2,profile=ordinary,seed=9,top_p=0.9,vocab=5000)", &a);
    float *y = gen("topp(batch=2,force_token=7,force_value=1e9,profile=forced,seed=9,top_p=0.9,vocab=5000)", &b);
    for (int i = 0; i < 2 * 5000; i++) cr_assert(x[i] == y[i] || i % 5000 == 7, "element %d", i);
    free(x), free(y);
}

/* Every field filled (what an outside program is told of a case): the defaults a name omits are there, and the
 * filled case normalizes back to the same name, so filling changes nothing but the spelling. */
static void filled(const char *name, const char *const *want) {
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_case_normalize(&c, &err), 0, "%s", err.msg);
    kp_case all = c;
    cr_assert_eq(kp_case_fill_defaults(&all, &err), 0, "%s: %s", name, err.msg);
    for (int i = 0; want[i]; i += 2) {
        const char *v = kp_case_get(&all, want[i]);
        cr_assert(v, "%s: field %s not filled", name, want[i]);
        cr_assert_str_eq(v, want[i + 1], "%s: field %s", name, want[i]);
    }
    cr_assert_eq(kp_case_normalize(&all, &err), 0, "%s", err.msg);
    char a[KP_CASE_NAME_MAX], b[KP_CASE_NAME_MAX];
    cr_assert_gt(kp_case_format(&c, a, sizeof a), 0);
    cr_assert_gt(kp_case_format(&all, b, sizeof b), 0);
    cr_assert_str_eq(a, b, "filled then normalized is the same case");
}

Test(cases, every_field_is_filled_with_its_default) {
    filled("mla(batch=2,profile=uniform,seed=1)",
           (const char *const[]){"s_q", "1", "h_q", "128", "topk", "2048", "s_kv", "4096", "page", "64", "cache", "fp8_ds_mla",
                                 "scale", "raw", "topk_length", "off", "sink", "off", "sm_scale", "0.135234", NULL});
    filled("mla(batch=2,cache=bf16,profile=uniform,seed=1)", (const char *const[]){"cache", "bf16", NULL});
    filled("moe(m=4,model=qwen3,profile=uniform,seed=1)",
           (const char *const[]){"hidden", "2048", "inter", "768", "scale_dir", "divide", NULL});
    filled("moe(hidden=256,m=4,model=nemotron,profile=uniform,seed=1)", (const char *const[]){"hidden", "256", "inter", "1856", NULL});
    filled("topk(k=512,profile=randn,rows=2,seed=1,width=1000)",
           (const char *const[]){"stride", "1000", "window", "full", "base", "row", "fill", "-1", NULL});
    filled("topk(ctx=1500,k=2048,next_n=4,profile=nan,rows=8,seed=4,width=20000,window=decode)",
           (const char *const[]){"next_n", "4", "ctx", "1500", "window", "decode", NULL});
    filled("topp(batch=2,profile=ties,seed=1,top_p=0.5,vocab=32000)", (const char *const[]){"stride", "32000", "tie_count", "1000", NULL});
    filled("topp(batch=2,profile=flat,seed=1,top_p=0.5,vocab=1000)", (const char *const[]){"spread", "1e-6", NULL});
}

/* The one way out where a void helper runs out of host memory: exit 3 (KP_EXIT_ENV, an environment failure) with a
 * message naming what was being allocated, not abort()'s SIGABRT (a BUG). Control: a child that returns normally
 * exits 0 and prints nothing, so the pipe and the status are read right. */
static int oom_child(int planted, char *msg, size_t len) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        if (planted) KP_OUT_OF_MEMORY("for %d planted rows", 7);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t got;
    while (n + 1 < len && (got = read(fds[0], msg + n, len - 1 - n)) > 0) n += (size_t)got;
    msg[n] = '\0';
    close(fds[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child ended by signal %d, not an exit", WTERMSIG(status));
    return WEXITSTATUS(status);
}

Test(cases, out_of_memory_in_a_void_helper_exits_env_naming_the_allocation) {
    char msg[512];
    cr_assert_eq(oom_child(0, msg, sizeof msg), 0);
    cr_assert_str_empty(msg);
    cr_assert_eq(oom_child(1, msg, sizeof msg), KP_EXIT_ENV);
    cr_assert(strstr(msg, "kparity: out of host memory for 7 planted rows (") && strstr(msg, "test_cases.c:") &&
                  strstr(msg, "hint: "),
              "%s", msg);
}
