/* main.c: the kparity command line: list, run, gate, verify, sign, export. The only place that exits;
 * exit codes: 0 passed, 1 incorrect, 2 usage/config, 3 environment/kernel failure, 4 timeout, 77 nothing ran. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kp_bench.h"
#include "kp_exec.h"
#include "kp_export.h"
#include "kp_checks.h"
#include "kp_device.h"
#include "kp_harness.h"
#include "kp_launch.h"
#include "kp_rates.h"
#include "kp_cache.h"
#include "kp_replay.h"
#include "kp_runner.h"
#include "../receipts/kp_sign.h"
#include "../receipts/kp_verify.h"
#ifdef KP_HAVE_CUDA
#include "../cases/cuda/kp_cases_cuda.h"
#include "../reference/cuda/kp_reference_cuda.h"
#endif

/* Each subcommand's usage line: `kparity CMD --help` prints its own, exit 0. */
static const struct {
    const char *name, *line;
} commands[] = {
    {"list", "kparity list [--config FILE]                 impls and families, or a config's cases and checks"},
    {"run", "kparity run  --config FILE [--filter TEXT] [--shard I/N] [--out DIR] [--timeout S] [--quiet] [--json]\n"
            "             [--cache DIR | --no-cache]      --shard: config cases i with i mod N = I - 1 (kparity merge joins them)"},
    {"gate", "kparity gate --config FILE [--out DIR] [--timeout S] [--quiet] [--json] [--cache DIR | --no-cache]\n"
             "             [-- COMMAND ...]                runs the whole config; execs COMMAND only when it passes;\n"
             "                                             inputs and references are read back from the cache when\n"
             "                                             their digests check out (default: $KPARITY_CACHE, else\n"
             "                                             $XDG_CACHE_HOME/kparity or ~/.cache/kparity)"},
    {"verify", "kparity verify DIR [--replay] [--pubkey PUB.pem]\n"
               "                                             recheck a bundle's bytes and chain (and regenerate inputs,\n"
               "                                             check its signature and that it covers every file)"},
    {"sign", "kparity sign DIR --key KEY.pem               sign a bundle that verifies: DIR/" KP_SIGN_ENVELOPE "\n"
             "                                             (an in-toto statement of every file's SHA-256 and the verdict,\n"
             "                                             Ed25519 in a DSSE envelope; openssl genpkey -algorithm ed25519)"},
    {"export", "kparity export CASE --out DIR [--impl NAME]... [--force] [--cache DIR | --no-cache]\n"
               "                                             inputs, reference and outputs as .npy, and a case.json\n"
               "                                             that says what each file is"},
    {"bench", "kparity bench [--impl NAME]... [--exec FAMILY:IMPL=CMD]... [--absent IMPL=OUT[,OUT...]]... [--case CASE]...\n"
              "              [--reps N] [--no-reference] [--quiet] [--json] [--cache DIR | --no-cache]\n"
              "                                             time impls (CUDA events on a GPU) and outside programs (--absent:\n"
              "                                             outputs an --exec program does not produce), and the float64\n"
              "                                             reference once a case; no --case: the GPU shapes with a CUDA\n"
              "                                             device, else host-sized ones (only of --impl's families)"},
    {"merge", "kparity merge B1 B2 ... --out B                shards of one config into one bundle (one verdict, re-chained)"},
    {"judge", "kparity judge CASE --impl NAME=FILE.npy[,...] [--impl NAME@N=...] [--exec ROLE=CMD] --config FILE --out B\n"
              "                                             judge outputs made elsewhere by the config's checks for CASE\n"
              "  kparity judge DIR --config FILE --out B [--impl ...]\n"
              "                                             the same for a kparity export's folder: its case, and each\n"
              "                                             exported impl's outputs as the config role naming that impl"},
    {"rates", "kparity rates --a K/N [--b K/N] [--alpha A] [--power P] [--json]\n"
              "                                             Wilson intervals; whether two rates differ; trials needed"},
};
#define NCOMMANDS ((int)(sizeof commands / sizeof commands[0]))

static void print_usage(FILE *to, const char *only) {
    fprintf(to, "usage:\n");
    for (int i = 0; i < NCOMMANDS; i++)
        if (!only || !strcmp(only, commands[i].name)) fprintf(to, "  %s\n", commands[i].line);
    fprintf(to, "options anywhere: --plugin PATH (load a plugin's impls)\n"
                "exit codes: 0 passed, 1 incorrect, 2 usage or config error, 3 environment or kernel failure,\n"
                "            4 timeout, 77 nothing could run\n");
}

static int usage(const char *why) {
    if (why) fprintf(stderr, "kparity: %s\n", why);
    print_usage(stderr, NULL);
    return KP_EXIT_USAGE;
}

static int fail(const kp_error *err) {
    fprintf(stderr, "kparity: %s\n", err->msg);
    return err->code ? err->code : KP_EXIT_ENV;
}

static void default_out(char *buf, size_t len) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(buf, len, "kparity-bundle-%04d%02d%02d-%02d%02d%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec);
}

static void on_watchdog(int sig) {
    (void)sig;
    static const char msg[] = "kparity: timeout: the gate did not finish in time; receipts written so far are intact\n";
    if (write(2, msg, sizeof msg - 1) < 0) {}
    _exit(KP_EXIT_TIMEOUT);
}

static int cmd_list(const char *config) {
    kp_error err = {0};
    if (!config) {
        printf("impls:\n");
        for (int i = 0; i < kp_impl_count(); i++) {
            const kp_impl *impl = kp_impl_at(i);
            const char *sha = NULL, *origin = kp_impl_origin(impl, &sha);
            printf("  %-28s %s%s\n", impl->name, impl->memory == KP_MEMORY_CUDA ? "cuda" : "host",
                   origin ? origin : "");
        }
        printf("families:\n");
        for (int i = 0; i < kp_family_count(); i++) {
            const kp_family *fam = kp_family_at(i);
            char line[1024];
            kp_case_family_help(fam->cases, line, sizeof line);
            printf("  %-6s %s (inputs %s)\n", fam->name, line, fam->cases->generator_version);
            for (int k = 0; k < fam->cases->nfields; k++) { /* one line a field, from its table */
                kp_case_field_describe(&fam->cases->fields[k], line, sizeof line);
                printf("         %-12s %s\n", fam->cases->fields[k].name, line);
            }
        }
        printf("cuda: %s build, %d device(s)\n", kp_registry_has_cuda() ? "CUDA" : "CPU-only", kp_device_count());
        return 0;
    }
    kp_config cfg;
    if (kp_config_load(config, &cfg, &err)) {
        kp_config_free(&cfg);
        return fail(&err);
    }
    for (int i = 0; i < cfg.nroles; i++) printf("role %s = %s\n", cfg.roles[i].role, cfg.roles[i].impl->name);
    for (int i = 0; i < cfg.ncases; i++) {
        printf("%s\n", cfg.cases[i].name);
        for (int k = 0; k < cfg.cases[i].nchecks; k++) printf("  %s\n", cfg.cases[i].checks[k].label);
    }
    kp_config_free(&cfg);
    return 0;
}

/* "I/N" with 1 <= I <= N into *index, *count; NULL: no sharding. */
static int parse_shard(const char *s, int *index, int *count) {
    *index = *count = 0;
    if (!s) return 0;
    char *end;
    const long i = strtol(s, &end, 10);
    if (end == s || *end != '/') return -1;
    const char *rest = end + 1;
    const long n = strtol(rest, &end, 10);
    if (end == rest || *end || n < 1 || n > 4096 || i < 1 || i > n) return -1;
    *index = (int)i, *count = (int)n;
    return 0;
}

/* The plugins named with --plugin. */
typedef struct kp_plugin_list {
    const char *const *paths;
    int count;
} kp_plugin_list;

static int load_plugins(const kp_plugin_list *pl, kp_error *err) {
    for (int i = 0; i < pl->count; i++)
        if (kp_plugin_load(pl->paths[i], err)) return err->code;
    return 0;
}

static int cmd_run(int gate, const char *config, const char *out, const char *filter, const char *shard, double timeout,
                   int quiet, int json, char **command, const kp_plugin_list *pl) {
    kp_error err = {0};
    if (!config) return usage("--config FILE is required");
    int shard_index, shard_count;
    if (parse_shard(shard, &shard_index, &shard_count))
        return usage("--shard: expected I/N with 1 <= I <= N (for example 2/4: the second of four shards)");
    char out_buf[256];
    if (!out) {
        default_out(out_buf, sizeof out_buf);
        out = out_buf;
    }
    kp_run_options opt = {.out_dir = out, .filter = filter, .timeout_s = timeout, .quiet = quiet, .json = json,
                          .command = gate ? "gate" : "run", .shard_index = shard_index, .shard_count = shard_count,
                          .isolate = 1, .await_worker_end = gate && command && command[0]};
    int code;
    if (kp_run_supervises(&opt)) {
        /* the cases run in a worker process (this command line again, which loads the --plugin libraries), so a
         * crashing impl or plugin is recorded, not fatal */
        code = kp_run_supervise(config, &opt, &err);
    } else {
        kp_config cfg;
        if (load_plugins(pl, &err)) return fail(&err);
        if (kp_config_load(config, &cfg, &err)) {
            kp_config_free(&cfg);
            return fail(&err);
        }
        double limit = timeout > 0 ? timeout : cfg.timeout_s;
        if (limit > 0) { /* the runner stops between checks and its watchdog ends a hung case; this is the last resort */
            signal(SIGALRM, on_watchdog);
            alarm((unsigned)(limit * 2 + 60)); /* a backstop: the runner's watchdog normally ends a hung case first */
        }
        code = kp_run_config(&cfg, &opt, &err);
        alarm(0);
        kp_config_free(&cfg);
    }
    if ((code == KP_EXIT_USAGE || code == KP_EXIT_ENV || code == KP_EXIT_TIMEOUT) && err.msg[0]) return fail(&err);
    if (gate && command && command[0]) {
        if (code != KP_EXIT_OK) {
            fprintf(stderr, "kparity: gate did not pass (exit %d); not starting %s\n", code, command[0]);
            return code;
        }
        fflush(NULL);
        execvp(command[0], command);
        fprintf(stderr, "kparity: gate passed but %s could not be started: %s\n", command[0], strerror(errno));
        return KP_EXIT_ENV;
    }
    return code;
}

static int cmd_verify(const char *dir, int replay, const char *pubkey) {
    kp_error err = {0};
    if (!dir) return usage("verify needs a bundle folder");
    kp_sign_key *key = NULL;
    size_t subjects = 0;
    /* the key first: a usage error is reported before any verdict on the bundle */
    if (pubkey && kp_sign_key_load(pubkey, 0, &key, &err)) return fail(&err);
    int rc = kp_bundle_verify(dir, &err);
    if (!rc && key) rc = kp_sign_check(dir, key, &subjects, &err);
    kp_replay_report replayed = {0};
    if (!rc && replay) rc = kp_replay_bundle(dir, &replayed, &err);
    char leftovers[512];
    const int nleft = rc ? 0 : kp_sign_leftovers(dir, leftovers, sizeof leftovers, &err);
    if (nleft < 0) rc = err.code;
    if (!rc) {
        printf("%s: intact", dir);
        if (key) printf("; signed by %s (keyid %s), covering all %zu files", pubkey, kp_sign_keyid(key), subjects);
        if (replay && replayed.replayed)
            printf("; inputs regenerated to the same digests in every receipt that records them (%d), the reference "
                   "in every one that records it (%d)", replayed.replayed, replayed.with_reference);
        else if (replay)
            printf("; no receipt records inputs to regenerate");
        if (nleft) printf("; passed over %s, what a sign that never finished left (no part of the record; the next sign "
                          "removes it)", leftovers);
        printf("\n");
        if (replayed.not_replayed) /* listed, never passed over in silence */
            printf("not replayed, %d receipt%s with no inputs (a case that FAILED or was NOT_RUN before its inputs were "
                   "made):\n%s", replayed.not_replayed, replayed.not_replayed == 1 ? "" : "s",
                   replayed.not_replayed_list ? replayed.not_replayed_list : "");
    }
    kp_replay_report_free(&replayed);
    kp_sign_key_free(key);
    return rc ? fail(&err) : 0;
}

/* Only an intact bundle is signed: a signature must never vouch for bytes verify would refuse. */
static int cmd_sign(const char *dir, const char *keyfile) {
    kp_error err = {0};
    if (!dir || !keyfile) return usage("sign needs a bundle folder and --key KEY.pem");
    kp_sign_key *key = NULL;
    size_t subjects = 0;
    if (kp_sign_key_load(keyfile, 1, &key, &err)) return fail(&err);
    int rc = kp_bundle_verify(dir, &err);
    if (rc == KP_EXIT_INCORRECT) kp_error_prefix(&err, "not signing: ");
    if (!rc) rc = kp_sign_bundle(dir, key, &subjects, &err);
    if (!rc) printf("%s: signed %zu files into %s/%s (keyid %s)\n", dir, subjects, dir, KP_SIGN_ENVELOPE, kp_sign_keyid(key));
    kp_sign_key_free(key);
    return rc ? fail(&err) : 0;
}

static int cmd_export(const char *name, const char *out, const char **impl_names, int nimpl, int force) {
    kp_error err = {0};
    if (!name || !out) return usage("export needs a case name and --out DIR");
    const kp_export_options opt = {.case_name = name, .out = out, .impls = impl_names, .nimpls = nimpl, .force = force};
    int nfiles;
    if (kp_export_case(&opt, &nfiles, &err)) return fail(&err);
    printf("%s: %d files written to %s (%s says what each is)\n", name, nfiles, out, KP_EXPORT_INDEX);
    return 0;
}

/* The outputs --absent IMPL=OUT[,OUT...] arguments declare for program_impl, as the array a config's "absent" is
 * (NULL when none names it); each argument that names it is marked used. */
static int absent_outputs(const char *const *args, int n, bool *used, const char *program_impl, cJSON **out, kp_error *err) {
    *out = NULL;
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(args[i], '=');
        if (!eq || eq == args[i] || !eq[1])
            return kp_fail(err, KP_EXIT_USAGE, "--absent '%s': expected IMPL=OUTPUT[,OUTPUT...]", args[i]);
        if (strlen(program_impl) != (size_t)(eq - args[i]) || strncmp(args[i], program_impl, (size_t)(eq - args[i]))) continue;
        used[i] = true;
        if (!*out && !(*out = cJSON_CreateArray())) KP_OUT_OF_MEMORY("--absent");
        for (const char *o = eq + 1; *o;) {
            const size_t len = strcspn(o, ",");
            if (!len) return kp_fail(err, KP_EXIT_USAGE, "--absent '%s': an empty output name", args[i]);
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(len < 63 ? len : 63), o);
            cJSON_AddItemToArray(*out, cJSON_CreateString(name));
            o += len + (o[len] == ',');
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(NULL);
    /* Cases allocate and free hundreds of MB each; kept in the heap, freed pages are reused
     * instead of being faulted in afresh (measured: ~900k minor faults for the CUDA gate). */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#ifdef KP_HAVE_CUDA
    /* inputs the GPU makes faster, where there is one, with the host generator's bytes (cases/cuda/cases_cuda.c) */
    kp_cases_cuda_install();
    /* references the GPU computes faster, with the host's bits (reference/cuda/reference_cuda.c) */
    kp_reference_cuda_install();
#endif
    const char *cmd = argv[1];
    if (!strcmp(cmd, "rates") && !(argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))))
        return kp_cmd_rates(argc - 2, argv + 2); /* its own options */
    if (!strcmp(cmd, "merge") && !(argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))))
        return kp_cmd_merge(argc - 2, argv + 2); /* several bundle folders */
    if (!strcmp(cmd, "judge") && !(argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))))
        return kp_cmd_judge(argc - 2, argv + 2); /* NAME=FILE arguments */
    const char *config = NULL, *out = NULL, *filter = NULL, *positional = NULL, *key = NULL, *pubkey = NULL;
    const char *impls[32], *cases[32], *plugins[32], *execs[16], *absents[16];
    int nimpl = 0, ncase = 0, nplugin = 0, nexec = 0, nabsent = 0, quiet = 0, json = 0, replay = 0, reps = 0, help = 0, force = 0;
    int no_reference = 0, no_cache = 0;
    const char *shard = NULL, *cache = NULL;
    double timeout = 0;
    char **command = NULL;
    kp_error err = {0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--")) {
            command = argv + i + 1;
            break;
        } else if (!strcmp(a, "--config") && more) config = argv[++i];
        else if (!strcmp(a, "--out") && more) out = argv[++i];
        else if (!strcmp(a, "--filter") && more) filter = argv[++i];
        else if (!strcmp(a, "--key") && more) key = argv[++i];
        else if (!strcmp(a, "--pubkey") && more) pubkey = argv[++i];
        else if (!strcmp(a, "--impl") && more && nimpl < 32) impls[nimpl++] = argv[++i];
        else if (!strcmp(a, "--case") && more && ncase < 32) cases[ncase++] = argv[++i];
        else if (!strcmp(a, "--exec") && more && nexec < 16) execs[nexec++] = argv[++i];
        else if (!strcmp(a, "--absent") && more && nabsent < 16) absents[nabsent++] = argv[++i];
        else if (!strcmp(a, "--reps") && more) {
            char *end;
            const long n = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || n < 1 || n > 1000000) return usage("--reps: expected a whole number from 1 to 1000000");
            reps = (int)n;
        }
        else if (!strcmp(a, "--shard") && more) shard = argv[++i];
        else if (!strcmp(a, "--cache") && more) cache = argv[++i];
        else if (!strcmp(a, "--no-cache")) no_cache = 1;
        else if (!strcmp(a, "--timeout") && more) {
            char *end;
            timeout = strtod(argv[++i], &end);
            if (*end || !(timeout > 0)) return usage("--timeout: expected a positive number of seconds");
        } else if (!strcmp(a, "--plugin") && more) {
            if (nplugin == 32) return usage("--plugin: at most 32 plugins");
            plugins[nplugin++] = argv[++i];
        } else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--no-reference")) no_reference = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--replay")) replay = 1;
        else if (!strcmp(a, "--force")) force = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) help = 1;
        else if (a[0] == '-') {
            char msg[300];
            snprintf(msg, sizeof msg, "unknown or incomplete option '%s'", a);
            return usage(msg);
        } else if (!positional) positional = a;
        else {
            char msg[300];
            snprintf(msg, sizeof msg, "unexpected argument '%s'", a);
            return usage(msg);
        }
    }
    for (int i = 0; help && i < NCOMMANDS; i++)
        if (!strcmp(cmd, commands[i].name)) {
            print_usage(stdout, cmd);
            if (!strcmp(cmd, "export")) kp_export_help(stdout);
            return 0;
        }
    if (force && strcmp(cmd, "export")) return usage("--force is for export (replace a previous export's folder)");
    if (no_reference && strcmp(cmd, "bench")) return usage("--no-reference is for bench (a gate's checks need the reference)");
    const bool cached = !strcmp(cmd, "run") || !strcmp(cmd, "gate") || !strcmp(cmd, "export") || !strcmp(cmd, "bench");
    if ((cache || no_cache) && !cached)
        return usage("--cache and --no-cache are for run, gate, export and bench (verify --replay never reads a cache)");
    if (cache && no_cache) return usage("--cache DIR and --no-cache: give one");
    if (cached && kp_cache_configure(cache, no_cache, &err)) return fail(&err);
    const kp_plugin_list pl = {plugins, nplugin};
    if (!strcmp(cmd, "run")) return cmd_run(0, config, out, filter, shard, timeout, quiet, json, NULL, &pl);
    if (!strcmp(cmd, "gate")) {
        /* a gate runs its frozen config whole: a subset that passes must not start a server */
        if (filter || shard) return usage("gate runs the whole config; --filter and --shard are for `kparity run`");
        return cmd_run(1, config, out, NULL, NULL, timeout, quiet, json, command, &pl);
    }
    if (load_plugins(&pl, &err)) return fail(&err); /* run and gate load them in their worker process */
    if (!strcmp(cmd, "list")) return cmd_list(config);
    if (!strcmp(cmd, "verify")) {
        if (key) return usage("verify checks a signature with --pubkey PUB.pem; --key is the private key, for sign");
        return cmd_verify(positional, replay, pubkey);
    }
    if (!strcmp(cmd, "sign")) {
        if (pubkey) return usage("sign takes the private key as --key KEY.pem; --pubkey is for verify");
        return cmd_sign(positional, key);
    }
    if (!strcmp(cmd, "export")) return cmd_export(positional, out, impls, nimpl, force);
    if (!strcmp(cmd, "bench")) {
        bool absent_used[16] = {false};
        for (int i = 0; i < nexec; i++) { /* outside programs, benched beside the impls */
            kp_exec_decl decl;
            const kp_impl *impl = NULL;
            int rc = kp_exec_arg(execs[i], NULL, &decl, &err);
            cJSON *absent = NULL;
            if (!rc) rc = absent_outputs(absents, nabsent, absent_used, decl.program_impl, &absent, &err);
            decl.absent = absent;
            if (!rc) rc = kp_exec_register(&decl, "--exec", &impl, &err);
            kp_exec_decl_free(&decl);
            cJSON_Delete(absent);
            if (rc) return fail(&err);
            if (nimpl && nimpl < 32) impls[nimpl++] = impl->name;
        }
        for (int i = 0; i < nabsent; i++)
            if (!absent_used[i]) {
                char msg[400];
                snprintf(msg, sizeof msg, "--absent %s: no --exec serves that impl (--absent IMPL=OUT[,OUT...] names an "
                         "--exec FAMILY:IMPL=COMMAND's IMPL)", absents[i]);
                return usage(msg);
            }
        const kp_bench_options bo = {impls, nimpl, cases, ncase, reps, json, quiet, no_reference};
        int rc = kp_bench(&bo, &err);
        return rc ? fail(&err) : 0;
    }
    if (nexec) return usage("--exec is for bench (and judge); a gate or run names outside programs in its config's impls");
    if (nabsent) return usage("--absent is for bench's --exec (and judge); a gate or run declares it in its config's impls");
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "help") || !strcmp(cmd, "-h")) {
        print_usage(stdout, NULL);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("kparity %s\n", KPARITY_VERSION);
        return 0;
    }
    char msg[300];
    snprintf(msg, sizeof msg, "unknown command '%s'", cmd);
    return usage(msg);
}
