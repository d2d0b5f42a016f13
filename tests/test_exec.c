/* test_exec.c: outside programs as impls (harness/exec.c, python/kparity_exec.py; issue 27). A NumPy top-k served
 * through the real protocol (tests/fixtures/exec_topk.py) passes the rule, repeat and batch with every probe sent to
 * it; each planted defect is caught and named: an answer that depends on its batch-mates (batch), one that varies run
 * to run (repeat), a wrong dtype, a wrong shape, a crash, a hang, a reply that is not the protocol, a program that
 * dies before its handshake. A crash costs its case, the next case runs in a fresh program, and the bundle verifies
 * with --replay. A pinned file off its digest is refused before the program runs. A case's shared inputs reach the
 * program once: later requests of the case hand them over as the same objects, never across cases. A bench killed
 * while a program hangs has printed the rows that finished before it. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../cases/kp_sha256.h"
#include "kp_test_util.h"

TestSuite(exec, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 300);

/* Small cases: each gate here starts Python and sends it a dozen requests; the protocol, not the size, is tested. */
#define CASE2 "topk(k=256,profile=randn,rows=8,seed=2,width=4096)"
#define CASE3 "topk(k=512,profile=randn,rows=5,seed=3,width=4000)"

static char *script(void) {
    char *p;
    cr_assert(asprintf(&p, "%s/tests/fixtures/exec_topk.py", kpt_source_dir()) > 0);
    return kpt_scratch(p);
}

/* A config with the twin as role np (planting `defect`), its rule, repeat and batch on `cases` (a JSON list body);
 * extra: more fields of the impl's object. */
static char *config(const char *defect, const char *cases, const char *extra) {
    char *body, *path;
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"exec\",\"impls\":{\"topk.np\":{\"exec\":[\"%s\",\"%s\",\"%s\"],"
                       "\"impl\":\"numpy.topk\",\"timeout_s\":3%s}},\"defaults\":{\"runs\":3,\"ties\":\"lowest_index\",\"order\":\"index\"},"
                       "\"check_sets\":{\"s\":[{\"check\":\"rule\",\"impl\":\"np\"},{\"check\":\"repeat\",\"impl\":\"np\"},"
                       "{\"check\":\"batch\",\"impl\":\"np\"}]},\"cases\":[%s]}",
                       kpt_python(), script(), defect, extra ? extra : "", cases) > 0);
    cr_assert(asprintf(&path, "%s/%s.json", kpt_dir, defect) > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    free(body);
    return kpt_scratch(path);
}

static const char *one_case(void) { return "{\"case\":\"" CASE2 "\",\"checks\":\"s\"}"; }

/* kparity gate on cfg into DIR/name; the exit code, stderr kept in *errout when asked. */
static int gate(const char *cfg, const char *name, char **bundle, char **errout) {
    char *dir, *o, *e;
    cr_assert(asprintf(&dir, "%s/%s", kpt_dir, name) > 0);
    const int rc = kpt_gate(cfg, dir, &o, &e);
    free(o);
    if (errout) *errout = kpt_scratch(e);
    else free(e);
    *bundle = kpt_scratch(dir);
    return rc;
}


static const char *result_of(const cJSON *rec, int check) {
    char p[32];
    snprintf(p, sizeof p, "checks.%d.result", check);
    return kpt_at(rec, p)->valuestring;
}

static const char *summary_of(const cJSON *rec, int check) {
    char p[32];
    snprintf(p, sizeof p, "checks.%d.summary", check);
    return kpt_at(rec, p)->valuestring;
}

static void verifies_with_replay(const char *bundle) {
    char *o, *e;
    char *argv[] = {kpt_binary(), "verify", (char *)bundle, "--replay", NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 0, "verify --replay: %s%s", o, e);
    free(o), free(e);
}

/* A case whose conventions are all in its defaults-filled fields: windows that start past 0, indices counted from the
 * window, INT32_MAX fill for short windows. */
#define CASE_WINDOW "topk(base=window,fill=int32_max,k=512,profile=bits,rows=8,seed=3,width=20000,window=prefill)"

Test(exec, a_clean_numpy_twin_passes_every_check_with_every_probe_sent) {
    char *bundle;
    cr_assert_eq(gate(config("clean", "{\"case\":\"" CASE2 "\",\"checks\":\"s\"},{\"case\":\"" CASE_WINDOW "\",\"checks\":\"s\"}", NULL),
                      "clean", &bundle, NULL),
                 0);
    cJSON *rec = kpt_receipt(bundle, 1);
    cr_assert_str_eq(kpt_at(rec, "checks.0.impl")->valuestring, "topk.numpy_topk@exec");
    for (int c = 0; c < 3; c++) cr_assert_str_eq(result_of(rec, c), "PASSED", "%s", summary_of(rec, c));
    cr_assert_null(strstr(summary_of(rec, 2), "not given"), "every probe went to the program: %s", summary_of(rec, 2));
    cr_assert_geq(cJSON_GetArraySize(kpt_at(rec, "checks.2.findings.probes")), 10, "the batch probes, each a request");
    /* the receipt names the program, its files with their digests and the versions it reported */
    const cJSON *x = kpt_at(rec, "impls.0.exec");
    cr_assert_str_eq(kpt_at(x, "impl")->valuestring, "numpy.topk");
    cr_assert_str_eq(kpt_at(x, "protocol")->valuestring, "kparity.exec/1");
    cr_assert(cJSON_IsString(kpt_at(x, "versions.numpy")));
    char want[KP_SHA256_HEX_LEN];
    kp_error err = {0};
    cr_assert_eq(kp_sha256_file_hex(script(), want, &err), 0);
    int found = 0;
    for (const cJSON *f = kpt_at(x, "files")->child; f; f = f->next)
        found |= !strcmp(kpt_at(f, "path")->valuestring, script()) && !strcmp(kpt_at(f, "sha256")->valuestring, want);
    cr_assert(found, "the script and its SHA-256 are in the receipt");
    cJSON_Delete(rec);
    rec = kpt_receipt(bundle, 2); /* the window conventions came to the program as fields */
    for (int c = 0; c < 3; c++) cr_assert_str_eq(result_of(rec, c), "PASSED", "%s: %s", CASE_WINDOW, summary_of(rec, c));
    cJSON_Delete(rec);
    verifies_with_replay(bundle);
}

/* An answer that depends on the batch: batch INCORRECT, repeat clean; one that varies: repeat INCORRECT. */
Test(exec, planted_numerical_defects_are_caught_by_their_checks) {
    char *bundle;
    cr_assert_eq(gate(config("batchmates", one_case(), NULL), "batchmates", &bundle, NULL), 1);
    cJSON *rec = kpt_receipt(bundle, 1);
    cr_assert_str_eq(result_of(rec, 0), "PASSED");
    cr_assert_str_eq(result_of(rec, 1), "PASSED");
    cr_assert_str_eq(result_of(rec, 2), "INCORRECT", "%s", summary_of(rec, 2));
    cJSON_Delete(rec);
    cr_assert_eq(gate(config("varies", one_case(), NULL), "varies", &bundle, NULL), 1);
    rec = kpt_receipt(bundle, 1);
    cr_assert_str_eq(result_of(rec, 1), "INCORRECT", "%s", summary_of(rec, 1));
    cr_assert(strstr(summary_of(rec, 1), "1/8 rows vary"), "%s", summary_of(rec, 1));
    cJSON_Delete(rec);
}

/* Each broken program fails its case (exit 3) with what went wrong, and the bundle verifies. */
Test(exec, broken_programs_fail_their_case_with_the_reason) {
    static const struct {
        const char *defect, *needle;
    } broken[] = {
        {"dtype", "output 'indices': <i8"},
        {"shape", "shape [8, 255]"},
        {"crash", "killed by signal 11"},
        {"hang", "no reply within 3 s"},
        {"junk", "a reply that is not the protocol: 'this is not the protocol'"},
        {"die", "no handshake"},
    };
    for (size_t i = 0; i < sizeof broken / sizeof *broken; i++) {
        char *bundle;
        cr_assert_eq(gate(config(broken[i].defect, one_case(), NULL), broken[i].defect, &bundle, NULL), 3, "%s", broken[i].defect);
        cJSON *rec = kpt_receipt(bundle, 1);
        for (int c = 0; c < 3; c++) {
            cr_assert_str_eq(result_of(rec, c), "FAILED", "%s: %s", broken[i].defect, summary_of(rec, c));
            cr_assert(strstr(summary_of(rec, c), broken[i].needle), "%s: %s", broken[i].defect, summary_of(rec, c));
        }
        cJSON_Delete(rec);
        verifies_with_replay(bundle);
    }
}

/* A crash costs its case: the next case runs in a fresh program and passes. */
Test(exec, a_crash_costs_one_case_and_the_next_runs_in_a_fresh_program) {
    char *bundle;
    const char *cases = "{\"case\":\"" CASE2 "\",\"checks\":\"s\"},{\"case\":\"" CASE3 "\",\"checks\":\"s\"}";
    cr_assert_eq(gate(config("crash2", cases, NULL), "crash2", &bundle, NULL), 3);
    cJSON *first = kpt_receipt(bundle, 1), *second = kpt_receipt(bundle, 2);
    cr_assert_str_eq(kpt_at(first, "result")->valuestring, "FAILED");
    for (int c = 0; c < 3; c++) cr_assert_str_eq(result_of(second, c), "PASSED", "%s", summary_of(second, c));
    cr_assert_gt(kpt_at(second, "impls.0.exec.starts")->valuedouble, kpt_at(first, "impls.0.exec.starts")->valuedouble,
                 "the second case's program is a new one");
    cJSON_Delete(first), cJSON_Delete(second);
    verifies_with_replay(bundle);
}

/* A pinned file off its digest is refused (exit 2, naming it) before the program runs; the right pin passes. */
Test(exec, a_pinned_file_off_its_digest_is_refused_before_it_runs) {
    char *extra, *bundle, *e;
    cr_assert(asprintf(&extra, ",\"sha256\":{\"%s\":\"%064d\"}", script(), 0) > 0);
    cr_assert_eq(gate(config("clean", one_case(), extra), "pinned", &bundle, &e), 2);
    cr_assert(strstr(e, "is pinned") || strstr(e, "not the pinned"), "%s", e);
    cr_assert(strstr(e, "exec_topk.py"), "%s", e);
    free(extra);
    char want[KP_SHA256_HEX_LEN];
    kp_error err = {0};
    cr_assert_eq(kp_sha256_file_hex(script(), want, &err), 0);
    cr_assert(asprintf(&extra, ",\"sha256\":{\"%s\":\"%s\"}", script(), want) > 0);
    cr_assert_eq(gate(config("clean", one_case(), extra), "pinned-right", &bundle, &e), 0, "%s", e);
    free(extra);
}

/* A program that serves the impl for another family is refused at its handshake. */
Test(exec, a_handshake_for_another_family_is_refused) {
    char *path, *bundle;
    cr_assert(asprintf(&path, "%s/family.json", kpt_dir) > 0);
    char *body;
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"exec\",\"impls\":{\"moe.np\":{\"exec\":[\"%s\",\"%s\",\"clean\"],"
                       "\"impl\":\"numpy.topk\",\"timeout_s\":10}},\"defaults\":{\"atol\":0.04,\"rtol\":0},"
                       "\"cases\":[{\"case\":\"moe(hidden=64,inter=32,m=2,model=qwen3,profile=uniform,seed=1)\","
                       "\"checks\":[{\"check\":\"tolerance\",\"impl\":\"np\"}]}]}",
                       kpt_python(), script()) > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    cr_assert_eq(gate(path, "family", &bundle, NULL), 3);
    cJSON *rec = kpt_receipt(bundle, 1);
    cr_assert(strstr(summary_of(rec, 0), "serves 'numpy.topk' for family topk, not moe"), "%s", summary_of(rec, 0));
    cJSON_Delete(rec);
    free(path), free(body);
}

/* judge --exec ROLE=COMMAND binds a role to a program (the one impl it serves), which then gets every launch, batch
 * probes included; bench --exec FAMILY:IMPL=COMMAND times it beside kparity's impls in one table. */
Test(exec, judge_and_bench_take_a_program_on_the_command_line) {
    char *cfg, *cmd, *dir, *o, *e;
    cr_assert(asprintf(&cfg, "%s/judge.json", kpt_dir) > 0 && asprintf(&dir, "%s/judged", kpt_dir) > 0);
    const char *body = "{\"schema\":\"kparity.gate/v1\",\"name\":\"j\",\"impls\":{},\"defaults\":{\"ties\":\"lowest_index\","
                       "\"order\":\"index\",\"runs\":2},\"check_sets\":{\"judge\":[{\"check\":\"rule\",\"impl\":\"np\"},"
                       "{\"check\":\"repeat\",\"impl\":\"np\"},{\"check\":\"batch\",\"impl\":\"np\"}]}}";
    cr_assert_eq(kpt_write(cfg, body, strlen(body)), 0);
    cr_assert(asprintf(&cmd, "np=%s %s batchmates", kpt_python(), script()) > 0);
    char *argv[] = {kpt_binary(), "judge", CASE3, "--exec", cmd, "--config", cfg, "--out", dir, "--quiet", NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 1, "%s%s", o, e);
    free(o), free(e);
    cJSON *rec = kpt_receipt(dir, 1);
    cr_assert_str_eq(kpt_at(rec, "checks.0.impl")->valuestring, "topk.np@exec");
    cr_assert_str_eq(kpt_at(rec, "impls.0.exec.impl")->valuestring, "numpy.topk", "the one impl the program serves");
    cr_assert_str_eq(result_of(rec, 0), "PASSED", "%s", summary_of(rec, 0));
    cr_assert_str_eq(result_of(rec, 2), "INCORRECT", "the batch-mate defect: %s", summary_of(rec, 2));
    cJSON_Delete(rec);
    free(cmd);
    cr_assert(asprintf(&cmd, "topk:numpy.topk=%s %s clean", kpt_python(), script()) > 0);
    char *bench[] = {kpt_binary(), "bench", "--reps", "3", "--impl", "topk.radix_exact@host", "--exec", cmd, "--case", CASE3, NULL};
    cr_assert_eq(kpt_run(bench, &o, &e), 0, "%s%s", o, e);
    cr_assert(strstr(o, "topk.radix_exact@host") && strstr(o, "topk.numpy_topk@exec"), "one table: %s", o);
    free(o), free(e), free(cmd), free(cfg), free(dir);
}

/* bench --absent IMPL=OUT[,OUT...] declares what an --exec program does not produce, as a config's "absent" does:
 * without it the program's row fails naming the output; with it the row is timed; one that names no --exec program
 * or no output of the family is a usage error naming it. */
Test(exec, bench_takes_the_outputs_a_program_does_not_produce) {
    char *cmd, *o, *e;
    cr_assert(asprintf(&cmd, "topk:numpy.topk=%s %s novalues", kpt_python(), script()) > 0);
    char *undeclared[] = {kpt_binary(), "bench", "--reps", "2", "--exec", cmd, "--case", CASE3, NULL};
    cr_assert_eq(kpt_run(undeclared, &o, &e), 3, "%s%s", o, e);
    cr_assert(strstr(o, "output 'values' was not written"), "%s%s", o, e);
    free(o), free(e);
    char *declared[] = {kpt_binary(), "bench", "--reps", "2", "--exec", cmd, "--absent", "numpy.topk=values", "--case", CASE3, NULL};
    cr_assert_eq(kpt_run(declared, &o, &e), 0, "%s%s", o, e);
    cr_assert(strstr(o, "topk.numpy_topk@exec") && !strstr(o, "failed"), "%s%s", o, e);
    free(o), free(e);
    char *elsewhere[] = {kpt_binary(), "bench", "--reps", "2", "--exec", cmd, "--absent", "other.topk=values", "--case", CASE3, NULL};
    cr_assert_eq(kpt_run(elsewhere, &o, &e), 2, "%s%s", o, e);
    cr_assert(strstr(e, "--absent other.topk=values: no --exec serves that impl"), "%s", e);
    free(o), free(e);
    char *bogus[] = {kpt_binary(), "bench", "--reps", "2", "--exec", cmd, "--absent", "numpy.topk=scores", "--case", CASE3, NULL};
    cr_assert_eq(kpt_run(bogus, &o, &e), 2, "%s%s", o, e);
    cr_assert(strstr(e, "scores"), "names the output: %s", e);
    free(o), free(e), free(cmd);
}

/* A bench killed part way has printed every row that finished: kparity's own impl is timed, then the program hangs on
 * its first request, and the finished row is read from the pipe while kparity still runs, before it is killed. A
 * bench that kept its rows until the end (stdout to a pipe is fully buffered unless flushed) printed nothing before
 * the kill: the planted defect this catches (then no row comes within the guard, or only once kparity has ended). */
Test(exec, a_killed_bench_has_printed_its_finished_rows) {
    char *cmd;
    cr_assert(asprintf(&cmd, "topk:numpy.topk=%s %s hang", kpt_python(), script()) > 0);
    char *argv[] = {kpt_binary(), "bench", "--reps", "1", "--impl", "topk.radix_exact@host", "--exec", cmd, "--case", CASE3, NULL};
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    const pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        const int devnull = open("/dev/null", O_RDWR);
        dup2(devnull, 0), dup2(devnull, 2);
        close(fds[0]), close(fds[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    char text[8192] = "";
    size_t used = 0;
    int alive_at_row = 0;
    for (;;) { /* until the row is in, kparity ends, or the guard (a safety net, not a measurement) runs out */
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        if (poll(&pfd, 1, 120 * 1000) <= 0) break;
        const ssize_t got = read(fds[0], text + used, sizeof text - 1 - used);
        if (got <= 0) break;
        text[used += (size_t)got] = '\0';
        if (strstr(text, "topk.radix_exact@host") && strstr(strstr(text, "topk.radix_exact@host"), "\n")) {
            alive_at_row = waitpid(pid, NULL, WNOHANG) == 0;
            break;
        }
    }
    kill(pid, SIGKILL); /* the program goes with it (it dies with its parent) */
    int status = 0;
    waitpid(pid, &status, 0);
    close(fds[0]);
    cr_assert(strstr(text, "topk.radix_exact@host      " CASE3), "the finished row was not printed:\n%s", text);
    cr_assert(alive_at_row, "the row came only once kparity had ended:\n%s", text);
    cr_assert(WIFSIGNALED(status), "kparity ended by itself (the program did not hang?):\n%s", text);
    cr_assert_null(strstr(text, "topk.numpy_topk@exec"), "the hung program's row was printed:\n%s", text);
    free(cmd);
}

/* The README's exec example, run as written (its block between the marker and the closing fence): python3 on PATH is
 * the one with numpy (kpt_python), and the paths it names resolve from the source tree and the build. */
Test(exec, the_readme_example_runs_as_written) {
    char *readme_path;
    cr_assert(asprintf(&readme_path, "%s/README.md", kpt_source_dir()) > 0);
    char *readme = kpt_read(readme_path, NULL);
    cr_assert(readme, "%s", readme_path);
    const char *mark = strstr(readme, "<!-- example: exec");
    cr_assert(mark, "the README has no exec example");
    const char *start = strstr(mark, "```sh\n");
    cr_assert(start);
    start += 6;
    const char *end = strstr(start, "```");
    cr_assert(end);
    char *block = strndup(start, (size_t)(end - start)), *script_path, *bin, *cmd, *o, *e;
    cr_assert(asprintf(&script_path, "%s/example.sh", kpt_dir) > 0 && asprintf(&bin, "%s/bin", kpt_dir) > 0);
    cr_assert_eq(kpt_write(script_path, block, strlen(block)), 0);
    /* the folder it runs in: tests/ and python/ of the source, build/ with the kparity binary, python3 with numpy */
    char *binary_dir = strdup(kpt_binary());
    *strrchr(binary_dir, '/') = '\0';
    /* python3 a wrapper, not a link: a virtual environment's python run through a link elsewhere loses its packages */
    cr_assert(asprintf(&cmd, "set -e; cd '%s'; mkdir -p bin; printf '#!/bin/sh\\nexec \"%s\" \"$@\"\\n' > bin/python3; "
                             "chmod +x bin/python3; ln -s '%s/tests' tests; ln -s '%s/python' python; "
                             "ln -s '%s' build; PATH=\"$PWD/bin:$PATH\" sh -e example.sh",
                       kpt_dir, kpt_python(), kpt_source_dir(), kpt_source_dir(), binary_dir) > 0);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    cr_assert_eq(kpt_run(argv, &o, &e), 0, "the README's exec example failed:\n%s%s", o, e);
    cr_assert(strstr(o, "verdict: PASSED"), "%s", o);
    free(o), free(e), free(cmd), free(block), free(script_path), free(bin), free(binary_dir), free(readme), free(readme_path);
}

/* A MoE's weights are written once a case and marked "reused" after: the client hands the program the same objects on
 * every later request of the case (repeat and every batch probe), the batched inputs afresh, and a second case of the
 * very same shapes (so the same offsets) its own weights at its first request. Without the mark every request re-read
 * them (800+ requests of 340 MB at Qwen3's 800 rows). */
Test(exec, shared_inputs_reach_the_program_once_a_case) {
    char *fixture, *logpath, *path, *body, *bundle;
    cr_assert(asprintf(&fixture, "%s/tests/fixtures/exec_shared.py", kpt_source_dir()) > 0);
    cr_assert(asprintf(&logpath, "%s/shared.log", kpt_dir) > 0);
    cr_assert(asprintf(&path, "%s/shared.json", kpt_dir) > 0);
    cr_assert(asprintf(&body,
                       "{\"schema\":\"kparity.gate/v1\",\"name\":\"exec\",\"impls\":{\"moe.np\":{\"exec\":[\"%s\",\"%s\",\"%s\"],"
                       "\"impl\":\"numpy.moe_shared\",\"timeout_s\":30}},\"defaults\":{\"runs\":3},\"check_sets\":{\"s\":["
                       "{\"check\":\"repeat\",\"impl\":\"np\"},{\"check\":\"batch\",\"impl\":\"np\"}]},\"cases\":["
                       "{\"case\":\"moe(hidden=64,inter=32,m=4,model=glm47,profile=uniform,seed=1)\",\"checks\":\"s\"},"
                       "{\"case\":\"moe(hidden=64,inter=32,m=4,model=glm47,profile=uniform,seed=2)\",\"checks\":\"s\"}]}",
                       kpt_python(), fixture, logpath) > 0);
    cr_assert_eq(kpt_write(path, body, strlen(body)), 0);
    const int rc = gate(path, "shared", &bundle, NULL);
    cr_assert(rc == 0 || rc == 1, "the program served every request (exit %d)", rc);
    char *log = kpt_read(logpath, NULL);
    cr_assert(log, "the program kept its log");
    const char *shared = "[\"global_scales\", \"s13\", \"s2\", \"w13\", \"w2\"]";
    char last_case[256] = "";
    int requests = 0, firsts = 0;
    for (char *save = NULL, *line = strtok_r(log, "\n", &save); line; line = strtok_r(NULL, "\n", &save), requests++) {
        cJSON *j = cJSON_Parse(line);
        cr_assert(j, "a log line: %s", line);
        const char *name = kpt_at(j, "case")->valuestring;
        char *same = cJSON_PrintUnformatted(kpt_at(j, "same"));
        if (strcmp(name, last_case)) { /* a case's first request: everything afresh */
            cr_assert_str_eq(same, "[]", "%s's first request was handed %s from before", name, same);
            snprintf(last_case, sizeof last_case, "%s", name);
            firsts++;
        } else {
            char *want = strdup(shared);
            for (char *c = want; *c; c++) if (*c == ' ') memmove(c, c + 1, strlen(c));
            cr_assert_str_eq(same, want, "request %d of %s: the same objects were %s", requests, name, same);
            free(want);
        }
        free(same);
        cJSON_Delete(j);
    }
    cr_assert_eq(firsts, 2, "two cases, each with a first request");
    cr_assert_geq(requests, 2 * (3 + 7), "a full run, 2 repeats and the batch probes a case: %d requests", requests);
    free(log), free(fixture), free(logpath), free(path), free(body);
}

/* An output the program does not produce: left unwritten it fails the case, naming the remedy; declared absent in the
 * config it is not asked for, checks that need it say NOT_RUN and why, and the others judge what is there. */
Test(exec, an_output_not_produced_fails_unless_declared_absent) {
    char *bundle;
    cr_assert_eq(gate(config("novalues", one_case(), NULL), "undeclared", &bundle, NULL), 3);
    cJSON *rec = kpt_receipt(bundle, 1);
    cr_assert_str_eq(result_of(rec, 1), "FAILED");
    cr_assert(strstr(summary_of(rec, 1), "output 'values' was not written") && strstr(summary_of(rec, 1), "\"absent\""), "%s",
              summary_of(rec, 1));
    cJSON_Delete(rec);
    cr_assert_eq(gate(config("novalues", one_case(), ",\"absent\":[\"values\"]"), "declared", &bundle, NULL), 77);
    rec = kpt_receipt(bundle, 1);
    cr_assert_str_eq(result_of(rec, 0), "NOT_RUN", "the rule needs the values: %s", summary_of(rec, 0));
    cr_assert_str_eq(result_of(rec, 1), "PASSED", "repeat on the indices: %s", summary_of(rec, 1));
    cr_assert_str_eq(result_of(rec, 2), "PASSED", "batch on the indices: %s", summary_of(rec, 2));
    cr_assert(strstr(summary_of(rec, 1), "values"), "repeat names what it left out: %s", summary_of(rec, 1));
    cr_assert_str_eq(kpt_at(rec, "impls.0.absent_outputs.0")->valuestring, "values");
    cJSON_Delete(rec);
}
