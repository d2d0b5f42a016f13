/* test_cache.c: the cache of inputs and references (harness/kp_cache.h) through the command line: a second run reads
 * both back with the same digests and says so in its receipts; an entry with one flipped byte (in a tensor, in its
 * metadata), a truncated one and another key's entry planted under the right name are each refused, recomputed with
 * the same digests, and rewritten; inputs made again are checked against their digests entry, and a well-formed one
 * recording another digest is named, the inputs hashed, the entry rewritten; two gates started at once on one folder
 * both pass and leave whole entries; `verify --replay` never reads it; the options' errors. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../harness/kp_cache.h"
#include "kp_test_util.h"

TestSuite(cache, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 600);

/* Two moe cases at the host gates' shapes: generating their experts and computing the reference each take far longer
 * than writing them (kp_cache_worth), so both stages are stored. */
static const char *const config_text =
    "{\"schema\":\"kparity.gate/v1\",\"name\":\"cache\",\"impls\":{\"candidate\":\"moe.invariant@host\"},"
    "\"defaults\":{\"atol\":0.04,\"rtol\":0,\"nmse\":0.001},\"cases\":["
    "{\"case\":\"moe(hidden=256,inter=128,m=33,model=glm53,profile=straddle,seed=22)\","
    "\"checks\":[{\"check\":\"tolerance\",\"impl\":\"candidate\"}]},"
    "{\"case\":\"moe(hidden=256,inter=128,m=1,model=qwen3,profile=single,seed=23)\","
    "\"checks\":[{\"check\":\"tolerance\",\"impl\":\"candidate\"}]}]}";

static char *path_in(const char *name) {
    char *p;
    cr_assert(asprintf(&p, "%s/%s", kpt_dir, name) > 0);
    return kpt_scratch(p);
}

static char *config(void) {
    char *cfg = path_in("cache.json");
    cr_assert_eq(kpt_write(cfg, config_text, strlen(config_text)), 0);
    return cfg;
}

/* `kparity gate` on the config into bundle `name`, with the cache folder `cache` (NULL: --no-cache); exit 0 asserted.
 * Returns what it printed on stderr (scratch). */
static char *gate(const char *cfg, const char *name, const char *cache) {
    char *out, *err;
    char *argv[] = {kpt_binary(), "gate", "--config", (char *)cfg, "--out", path_in(name), "--quiet",
                    cache ? "--cache" : "--no-cache", (char *)cache, NULL};
    const int rc = kpt_run(argv, &out, &err);
    cr_assert_eq(rc, 0, "gate %s exited %d\n%s%s", name, rc, out, err);
    free(out);
    return kpt_scratch(err);
}

/* The receipt of case `index` (from 0): cache.<stage>.<key>, a string. */
static const char *cached(const char *bundle, int index, const char *stage, const char *key) {
    cJSON *r = kpt_receipt(path_in(bundle), index + 1);
    char path[64];
    snprintf(path, sizeof path, "cache.%s.%s", stage, key);
    char *v = kpt_scratch(strdup(kpt_str(r, path)));
    cJSON_Delete(r);
    return v;
}

/* What must not change between runs however the inputs and reference were had: every data digest, verdict, result,
 * summary and findings digest (scripts/bundle-digests.py --checks, as the golden gate tests compare). */
static char *digests(const char *bundle) {
    char *out, *err, *script;
    cr_assert(asprintf(&script, "%s/scripts/bundle-digests.py", kpt_source_dir()) > 0);
    char *argv[] = {kpt_python(), script, "--checks", path_in(bundle), NULL};
    cr_assert_eq(kpt_run(argv, &out, &err), 0, "%s", err);
    free(err), free(script);
    return kpt_scratch(out);
}

/* The entry file of a stage's key (as a hit's receipt names it). */
static char *entry_file(const char *cache, const char *stage, const char *key) {
    char *p;
    cr_assert(asprintf(&p, "%s/v1/%s/%.2s/%s", cache, stage, key, key) > 0);
    return kpt_scratch(p);
}

static void flip_byte(const char *file, long at_from_end_or_mid) {
    size_t len;
    char *b = kpt_read(file, &len);
    cr_assert_not_null(b, "%s", file);
    const size_t at = at_from_end_or_mid < 0 ? len / 2 : len - (size_t)at_from_end_or_mid;
    b[at] ^= 0x10;
    cr_assert_eq(kpt_write(file, b, len), 0);
    free(b);
}

/* A cold run and a warm one into "cold" and "warm"; the cache folder's path. */
static char *cold_then_warm(const char *cfg) {
    char *cache = path_in("cache");
    gate(cfg, "cold", cache);
    for (int c = 0; c < 2; c++) {
        cr_assert_str_eq(cached("cold", c, "inputs", "from"), "generated");
        cr_assert_str_eq(cached("cold", c, "reference", "from"), "computed");
        /* inputs new to the cache: no reference lookup (it would wait for their one-thread digests) */
        cr_assert(strstr(cached("cold", c, "reference", "why"), "no record of these inputs"), "case %d: %s", c,
                  cached("cold", c, "reference", "why"));
        cJSON *r = kpt_receipt(path_in("cold"), c + 1);
        cr_assert(cJSON_IsTrue(kpt_at(r, "cache.inputs.stored")) && cJSON_IsTrue(kpt_at(r, "cache.reference.stored")),
                  "case %d: not stored", c);
        cJSON_Delete(r);
    }
    gate(cfg, "warm", cache);
    return cache;
}

Test(cache, a_second_run_reads_inputs_and_reference_back_with_the_same_digests) {
    const char *cfg = config();
    cold_then_warm(cfg);
    for (int c = 0; c < 2; c++) {
        cr_assert_str_eq(cached("warm", c, "inputs", "from"), "cache", "case %d", c);
        cr_assert_str_eq(cached("warm", c, "reference", "from"), "cache", "case %d", c);
    }
    cr_assert_str_eq(digests("warm"), digests("cold"));
    gate(cfg, "none", NULL); /* --no-cache: neither read nor said */
    cJSON *r = kpt_receipt(path_in("none"), 1);
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(r, "cache"), "--no-cache still describes a cache");
    cJSON_Delete(r);
    cr_assert_str_eq(digests("none"), digests("cold"));
}

/* Damage one entry, run again: the stage is recomputed with the same digests, the receipt and stderr say why, and the
 * entry is whole again for the run after. */
static void refused_and_recomputed(const char *stage, void (*damage)(const char *file, const char *cache), const char *why) {
    const char *cfg = config();
    char *cache = cold_then_warm(cfg);
    const char *key = cached("warm", 0, stage, "entry");
    damage(entry_file(cache, stage, key), cache);
    char *err = gate(cfg, "damaged", cache);
    cr_assert_str_eq(cached("damaged", 0, stage, "from"), !strcmp(stage, "inputs") ? "generated" : "computed");
    const char *said = cached("damaged", 0, stage, "why");
    cr_assert(strstr(said, "refused") && strstr(said, why), "the receipt says '%s', not why (%s)", said, why);
    cr_assert(strstr(err, "refused"), "nothing on stderr: %s", err);
    cr_assert_str_eq(digests("damaged"), digests("cold"));
    gate(cfg, "again", cache);
    cr_assert_str_eq(cached("again", 0, stage, "from"), "cache", "the recomputed entry was not written back");
}

static void flip_in_a_tensor(const char *file, const char *cache) { (void)cache, flip_byte(file, -1); }
static void flip_in_the_metadata(const char *file, const char *cache) { (void)cache, flip_byte(file, 100); }
static void truncate_it(const char *file, const char *cache) {
    (void)cache;
    struct stat st;
    cr_assert_eq(stat(file, &st), 0);
    cr_assert_eq(truncate(file, st.st_size - 4096), 0);
}
/* The other case's entry of the same stage, copied over this one. */
static void plant_another_key(const char *file, const char *cache) {
    char *other = NULL;
    const char *stage = strstr(file, "/v1/inputs/") ? "inputs" : "reference";
    other = entry_file(cache, stage, cached("warm", 1, stage, "entry"));
    size_t len;
    char *b = kpt_read(other, &len);
    cr_assert_not_null(b);
    cr_assert_eq(kpt_write(file, b, len), 0);
    free(b);
}

/* The tail's metadata offset and length made to wrap around 2^64 onto the right sum (offset 2^64 - 1, length one
 * past the body): the fuzzer's find (cache_entry), which read before the mapping. */
static void wrap_the_metadata_offset(const char *file, const char *cache) {
    (void)cache;
    size_t len;
    unsigned char *b = (unsigned char *)kpt_read(file, &len);
    cr_assert(b && len > 80);
    const uint64_t moff = UINT64_MAX, mlen = (uint64_t)(len - 80) + 1;
    for (int i = 0; i < 8; i++) b[len - 80 + i] = (unsigned char)(moff >> (8 * i)), b[len - 72 + i] = (unsigned char)(mlen >> (8 * i));
    cr_assert_eq(kpt_write(file, (char *)b, len), 0);
    free(b);
}

Test(cache, an_entry_whose_metadata_offset_wraps_around_is_refused) {
    refused_and_recomputed("inputs", wrap_the_metadata_offset, "truncated");
}
Test(cache, inputs_with_a_flipped_byte_are_refused_and_regenerated) { refused_and_recomputed("inputs", flip_in_a_tensor, "does not hash to"); }
Test(cache, inputs_whose_metadata_changed_are_refused) { refused_and_recomputed("inputs", flip_in_the_metadata, "metadata"); }
Test(cache, truncated_inputs_are_refused) { refused_and_recomputed("inputs", truncate_it, "truncated"); }
Test(cache, another_keys_inputs_are_refused) { refused_and_recomputed("inputs", plant_another_key, "another key"); }
Test(cache, a_reference_with_a_flipped_byte_is_refused_and_recomputed) {
    refused_and_recomputed("reference", flip_in_a_tensor, "do not hash");
}
Test(cache, a_truncated_reference_is_refused) { refused_and_recomputed("reference", truncate_it, "truncated"); }
Test(cache, another_keys_reference_is_refused) { refused_and_recomputed("reference", plant_another_key, "another key"); }

/* Every file under dir, recursively, into names (at most max). */
static int files_under(const char *dir, char **names, int n, int max);
static int files_under(const char *dir, char **names, int n, int max) {
    DIR *d = opendir(dir);
    if (!d) return n;
    for (struct dirent *e; (e = readdir(d)) && n < max;) {
        if (e->d_name[0] == '.') continue;
        char *p;
        cr_assert(asprintf(&p, "%s/%s", dir, e->d_name) > 0);
        struct stat st;
        cr_assert_eq(stat(p, &st), 0);
        if (S_ISDIR(st.st_mode)) n = files_under(p, names, n, max), free(p);
        else names[n++] = kpt_scratch(p);
    }
    closedir(d);
    return n;
}

Test(cache, two_gates_at_once_on_one_folder_both_pass_and_leave_whole_entries) {
    const char *cfg = config();
    char *cache = path_in("cache");
    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        char *argv[] = {kpt_binary(), "gate", "--config", (char *)cfg, "--out", path_in(i ? "b1" : "b0"), "--quiet",
                        "--cache", cache, NULL};
        posix_spawn_file_actions_t quiet; /* their tables would land in the test's own output */
        cr_assert_eq(posix_spawn_file_actions_init(&quiet), 0);
        cr_assert_eq(posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0), 0);
        cr_assert_eq(posix_spawn(&pid[i], argv[0], &quiet, NULL, argv, environ), 0);
        posix_spawn_file_actions_destroy(&quiet);
    }
    for (int i = 0; i < 2; i++) {
        int status;
        cr_assert_eq(waitpid(pid[i], &status, 0), pid[i]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "gate %d: status %d", i, status);
    }
    char *names[64];
    const int n = files_under(cache, names, 0, 64);
    cr_assert_eq(n, 6, "%d entries, not 2 cases x (inputs, their digests, reference)", n);
    for (int i = 0; i < n; i++) cr_assert_null(strstr(names[i], ".tmp."), "a temporary file was left: %s", names[i]);
    gate(cfg, "after", cache); /* every entry whole: inputs and references read back */
    for (int c = 0; c < 2; c++) {
        cr_assert_str_eq(cached("after", c, "inputs", "from"), "cache");
        cr_assert_str_eq(cached("after", c, "reference", "from"), "cache");
    }
    cr_assert_str_eq(digests("after"), digests("b0"));
    cr_assert_str_eq(digests("b1"), digests("b0"));
}

Test(cache, verify_replay_never_reads_the_cache) {
    const char *cfg = config();
    char *cache = cold_then_warm(cfg);
    char *names[64];
    const int n = files_under(cache, names, 0, 64);
    cr_assert_eq(n, 6);
    for (int i = 0; i < n; i++) flip_byte(names[i], -1); /* read back, each would be refused, loudly */
    cr_assert_eq(setenv("KPARITY_CACHE", cache, 1), 0);
    char *out, *err;
    char *argv[] = {kpt_binary(), "verify", path_in("warm"), "--replay", NULL};
    const int rc = kpt_run(argv, &out, &err);
    cr_assert_eq(rc, 0, "replay exited %d\n%s%s", rc, out, err);
    cr_assert_null(strstr(err, "cache"), "replay looked at the cache: %s", err);
    free(out), free(err);
    /* the positive control: a gate with that environment does read it, and refuses every entry */
    char *argv2[] = {kpt_binary(), "gate", "--config", (char *)cfg, "--out", path_in("env"), "--quiet", NULL};
    cr_assert_eq(kpt_run(argv2, &out, &err), 0, "%s", err);
    cr_assert(strstr(err, "refused"), "a gate under KPARITY_CACHE did not read it: %s", err);
    free(out), free(err);
}

static void usage_error(char *const argv[], const char *needle) {
    char *out, *err;
    const int rc = kpt_run(argv, &out, &err);
    cr_assert_eq(rc, 2, "exit %d\n%s", rc, err);
    cr_assert(strstr(err, needle), "does not name %s: %s", needle, err);
    free(out), free(err);
}

Test(cache, a_cache_folder_that_cannot_be_used_is_a_usage_error_naming_it) {
    const char *cfg = config();
    char *file = path_in("a_file");
    cr_assert_eq(kpt_write(file, "x", 1), 0);
    char *not_a_dir = path_in("a_file/cache");
    usage_error((char *[]){kpt_binary(), "gate", "--config", (char *)cfg, "--out", path_in("b"), "--cache", not_a_dir, NULL},
                "--cache: the cache folder");
    usage_error((char *[]){kpt_binary(), "gate", "--config", (char *)cfg, "--out", path_in("b"), "--cache", path_in("c"),
                           "--no-cache", NULL},
                "give one");
    usage_error((char *[]){kpt_binary(), "verify", path_in("b"), "--cache", path_in("c"), NULL}, "never reads a cache");
    cr_assert_eq(setenv("KPARITY_CACHE", not_a_dir, 1), 0);
    usage_error((char *[]){kpt_binary(), "gate", "--config", (char *)cfg, "--out", path_in("b"), NULL}, "KPARITY_CACHE");
}

Test(cache, an_entry_is_worth_writing_only_when_it_was_slower_to_make_than_to_write) {
    /* a folder with no recorded rate: the hash rule alone (its first large entry will measure the rate) */
    char *fresh = path_in("fresh");
    cr_assert_eq(mkdir(fresh, 0755), 0);
    kp_error err = {0};
    cr_assert_eq(kp_cache_configure(fresh, false, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_cache_write_rate(), 0, "before any entry is written the rate is unknown");
    const double hash = kp_cache_hash_rate() * kp_thread_count(); /* a hit checks on every thread */
    cr_assert(hash > 1e7 && hash < 1e13, "a hash rate of %g bytes a second", hash);
    cr_assert(kp_cache_worth(hash, 1.01));
    cr_assert_not(kp_cache_worth(hash, 0.99));
    cr_assert_not(kp_cache_worth(1e6, 0.0));
    /* a folder remembers the rate its last large entry was written at; a line that is not a rate is ignored */
    char *dir = path_in("rated");
    cr_assert_eq(mkdir(dir, 0755), 0);
    char *file;
    cr_assert(asprintf(&file, "%s/write_rate", dir) > 0);
    cr_assert_eq(kpt_write(file, "nonsense\n", 9), 0);
    cr_assert_eq(kp_cache_configure(dir, false, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_cache_write_rate(), 0);
    cr_assert_eq(kpt_write(file, "4e+08\n", 6), 0);
    cr_assert_eq(kp_cache_configure(dir, false, &err), 0, "%s", err.msg);
    const double rate = kp_cache_write_rate();
    cr_assert_eq(rate, 0.4e9);
    const double write = rate * KP_CACHE_PAYBACK_HITS;
    const double either = hash < write ? hash : write; /* the rule: below both rates */
    cr_assert(kp_cache_worth(either, 1.01));
    cr_assert(kp_cache_worth(either / 100, 0.0101));
    cr_assert_not(kp_cache_worth(either, 0.99));
    cr_assert_not(kp_cache_worth(hash > write ? hash : write, 0.99 * (hash > write ? hash : write) / either));
    /* and a fresh folder does not inherit another folder's rate */
    cr_assert_eq(kp_cache_configure(fresh, false, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_cache_write_rate(), 0);
    free(file);
}

/* The bytes of case c's three entries (inputs, their digests, reference) in a bundle's cache folder. */
static double case_bytes(const char *cache, const char *bundle, int c) {
    const char *key = cached(bundle, c, "inputs", "entry");
    const char *files[3] = {entry_file(cache, "inputs", key), entry_file(cache, "digests", key),
                            entry_file(cache, "reference", cached(bundle, c, "reference", "entry"))};
    double total = 0;
    for (int i = 0; i < 3; i++) {
        struct stat st;
        cr_assert_eq(stat(files[i], &st), 0, "%s", files[i]);
        total += (double)st.st_size;
    }
    return total;
}

static double folder_bytes(const char *cache, int *n) {
    char *names[64];
    *n = files_under(cache, names, 0, 64);
    double total = 0;
    for (int i = 0; i < *n; i++) {
        struct stat st;
        cr_assert_eq(stat(names[i], &st), 0);
        total += (double)st.st_size;
    }
    return total;
}

/* Every entry in the folder last used `seconds` ago. */
static void age_entries(const char *cache, int seconds) {
    char *names[64];
    const int n = files_under(cache, names, 0, 64);
    for (int i = 0; i < n; i++) {
        const struct timespec old[2] = {{time(NULL) - seconds, 0}, {time(NULL) - seconds, 0}};
        cr_assert_eq(utimensat(AT_FDCWD, names[i], old, 0), 0);
    }
}

/* The cap is whole bytes: the test below sets it to a case's entries' bytes over 1e9, and a product one ulp under them
 * (0.01610459 * 1e9 is 16104589.999999998) refused the last entry that fills it exactly. */
Test(cache, the_cap_in_gigabytes_is_whole_bytes) {
    cr_assert_eq(setenv("KPARITY_CACHE_MAX_GB", "0.01610459", 1), 0);
    cr_assert_eq(kp_cache_cap_bytes(), 16104590.0, "%.17g", kp_cache_cap_bytes());
    cr_assert_eq(setenv("KPARITY_CACHE_MAX_GB", "40", 1), 0);
    cr_assert_eq(kp_cache_cap_bytes(), 40e9);
    cr_assert_eq(unsetenv("KPARITY_CACHE_MAX_GB"), 0);
    cr_assert_eq(kp_cache_cap_bytes(), 20e9);
}

Test(cache, past_its_cap_a_run_keeps_its_first_entries_and_evicts_only_older_ones) {
    const char *cfg = config();
    char *all = path_in("all_cache"), *cache = path_in("cache"), cap[64];
    gate(cfg, "all", all); /* uncapped: what each case's entries take */
    cr_assert_str_eq(cached("all", 1, "inputs", "from"), "generated");
    gate(cfg, "all_warm", all);
    const double first = case_bytes(all, "all_warm", 0), second = case_bytes(all, "all_warm", 1);
    snprintf(cap, sizeof cap, "%.17g", first / 1e9); /* room for the first case's entries, none of the second's */
    cr_assert_eq(setenv("KPARITY_CACHE_MAX_GB", cap, 1), 0);
    for (int run = 0; run < 2; run++) { /* twice: the second run finds the same entries, and keeps them */
        const char *name = run ? "capped_warm" : "capped";
        gate(cfg, name, cache);
        cr_assert_str_eq(cached(name, 0, "inputs", "from"), run ? "cache" : "generated");
        cr_assert_str_eq(cached(name, 1, "inputs", "from"), "generated");
        cJSON *r = kpt_receipt(path_in(name), 2);
        cr_assert(cJSON_IsFalse(kpt_at(r, "cache.inputs.stored")), "run %d: the second case's inputs were stored", run);
        cr_assert(strstr(kpt_str(r, "cache.inputs.not_stored"), "cap"), "%s", kpt_str(r, "cache.inputs.not_stored"));
        cJSON_Delete(r);
        int n;
        const double held = folder_bytes(cache, &n);
        cr_assert_eq(n, 3, "run %d: %d entries, not the first case's three", run, n);
        cr_assert_eq(held, first, "run %d: %.0f bytes held, the first case's entries are %.0f", run, held, first);
        if (!run) age_entries(cache, 60); /* the next run's, only as it uses them (its digests entry too: it relies on it) */
    }
    cr_assert_str_eq(digests("capped_warm"), digests("all"));
    /* entries older than the run go to make room: the first case's, aged, give way to the second case's */
    age_entries(cache, 7200);
    snprintf(cap, sizeof cap, "%.17g", (first > second ? first : second) / 1e9);
    cr_assert_eq(setenv("KPARITY_CACHE_MAX_GB", cap, 1), 0);
    char *one = path_in("second.json");
    const char *at = strstr(config_text, "{\"case\":\"moe(hidden=256,inter=128,m=1,");
    char *text;
    cr_assert(at && asprintf(&text, "%.*s%s", (int)(strstr(config_text, "{\"case\":") - config_text), config_text, at) > 0);
    cr_assert_eq(kpt_write(one, text, strlen(text)), 0);
    free(text);
    gate(one, "second", cache);
    cr_assert_str_eq(cached("second", 0, "inputs", "from"), "generated");
    int m;
    const double held = folder_bytes(cache, &m);
    cr_assert(held <= (first > second ? first : second), "%g bytes held past the cap", held);
    cr_assert_eq(case_bytes(cache, "all_warm", 1), second, "the second case's entries were not all written");
    cr_assert(m >= 3 && m < 6, "%d entries: the older ones were not evicted", m);
}

/* A top-p case: its logits are stored, and so are their digests. */
static const char *const quick_text =
    "{\"schema\":\"kparity.gate/v1\",\"name\":\"quick\",\"impls\":{\"candidate\":\"topp.split_prob@host\"},"
    "\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-06},\"cases\":["
    "{\"case\":\"topp(batch=4,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)\","
    "\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]}]}";

/* The one file under cache/v1/<kind>/ (asserted one). */
static char *only_entry(const char *cache, const char *kind) {
    char *dir, *names[8];
    cr_assert(asprintf(&dir, "%s/v1/%s", cache, kind) > 0);
    const int n = files_under(dir, names, 0, 8);
    cr_assert_eq(n, 1, "%d %s entries", n, kind);
    free(dir);
    return names[0];
}

/* An entry's metadata (the JSON its trailer points at). */
static cJSON *entry_meta(const char *file) {
    size_t len;
    unsigned char *b = (unsigned char *)kpt_read(file, &len);
    cr_assert(b && len > 80);
    uint64_t off = 0, n = 0;
    for (int i = 7; i >= 0; i--) off = off << 8 | b[len - 80 + i], n = n << 8 | b[len - 72 + i];
    cr_assert(off + n <= len - 80);
    cJSON *meta = cJSON_ParseWithLength((const char *)b + off, (size_t)n);
    cr_assert_not_null(meta);
    free(b);
    return meta;
}

Test(cache, inputs_made_again_are_checked_against_their_digests_entry_and_a_wrong_one_is_named_and_rewritten) {
    char *cfg = path_in("quick.json"), *cache = path_in("cache");
    cr_assert_eq(kpt_write(cfg, quick_text, strlen(quick_text)), 0);
    gate(cfg, "cold", cache);
    cr_assert_str_eq(cached("cold", 0, "inputs", "from"), "generated");
    cr_assert_str_eq(cached("cold", 0, "inputs", "digests"), "hashed");
    only_entry(cache, "digests");
    cr_assert_eq(unlink(only_entry(cache, "inputs")), 0); /* gone (evicted, say): the inputs are made again */
    gate(cfg, "warm", cache);
    cr_assert_str_eq(cached("warm", 0, "inputs", "from"), "generated");
    cr_assert_str_eq(cached("warm", 0, "inputs", "digests"), "checked against the cache's");
    cr_assert_str_eq(digests("warm"), digests("cold"));

    /* a well-formed entry whose first digest is another's: the inputs are hashed, named, and the entry rewritten */
    char *file = only_entry(cache, "digests");
    cJSON *meta = entry_meta(file);
    char *key_text = kpt_scratch(strdup(kpt_str(meta, "key")));
    cJSON *d = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(meta, "digests"), 0), "sha256");
    d->valuestring[0] = d->valuestring[0] == '0' ? '1' : '0';
    cJSON_DeleteItemFromObjectCaseSensitive(meta, "key");
    cJSON_DeleteItemFromObjectCaseSensitive(meta, "tensors");
    kp_error err = {0};
    cr_assert_eq(kp_cache_configure(cache, false, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_cache_put("digests", key_text, meta, NULL, 0, &err), 0, "%s", err.msg);
    cJSON_Delete(meta);
    cr_assert_eq(unlink(only_entry(cache, "inputs")), 0);
    char *said = gate(cfg, "wrong", cache);
    cr_assert_str_eq(cached("wrong", 0, "inputs", "digests"), "hashed");
    const char *why = cached("wrong", 0, "inputs", "digests_why");
    cr_assert(strstr(why, "does not hash to"), "the receipt says '%s'", why);
    cr_assert(strstr(said, "do not check against their digests entry"), "stderr: %s", said);
    cr_assert_str_eq(digests("wrong"), digests("cold"), "the receipt's digests are the bytes' own");
    cr_assert_eq(unlink(only_entry(cache, "inputs")), 0);
    gate(cfg, "again", cache);
    cr_assert_str_eq(cached("again", 0, "inputs", "digests"), "checked against the cache's", "not rewritten");
}

/* A strided top-p case: its rows' padding holds the generator's NaN sentinel, which the receipts' digests leave out. */
static const char *const strided_text =
    "{\"schema\":\"kparity.gate/v1\",\"name\":\"strided\",\"impls\":{\"candidate\":\"topp.split_prob@host\"},"
    "\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-06},\"cases\":["
    "{\"case\":\"topp(batch=4,profile=ordinary,seed=58231,stride=131075,top_p=0.95,vocab=131072)\","
    "\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]}]}";

Test(cache, row_padding_comes_back_as_generated_and_a_changed_byte_in_it_is_refused) {
    char *cfg = path_in("strided.json"), *cache = path_in("cache");
    cr_assert_eq(kpt_write(cfg, strided_text, strlen(strided_text)), 0);
    gate(cfg, "cold", cache);
    cJSON *r = kpt_receipt(path_in("cold"), 1);
    cr_assert(cJSON_IsTrue(kpt_at(r, "cache.inputs.stored")), "%s", kpt_str(r, "cache.inputs.not_stored"));
    cJSON_Delete(r);
    gate(cfg, "warm", cache); /* the sentinel in the padding is the generator's, not a changed byte */
    cr_assert_str_eq(cached("warm", 0, "inputs", "from"), "cache", "%s", cached("warm", 0, "inputs", "why"));
    cr_assert_str_eq(digests("warm"), digests("cold"));

    char *file = only_entry(cache, "inputs");
    cJSON *meta = entry_meta(file);
    const cJSON *logits = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(meta, "tensors"), 0);
    cr_assert_str_eq(kpt_str(logits, "name"), "logits");
    cr_assert_eq(kpt_num(logits, "row_stride"), 131075);
    const size_t at = (size_t)kpt_num(logits, "offset") + 2 * 131075 * 4 + 131072 * 4 + 5; /* row 2's padding */
    cJSON_Delete(meta);
    size_t len;
    char *b = kpt_read(file, &len);
    cr_assert(b && at < len);
    uint32_t was;
    memcpy(&was, b + at - 1, 4);
    cr_assert_eq(was, 0x7fc0deadu, "not the sentinel: %08x", was);
    b[at] ^= 0x10;
    cr_assert_eq(kpt_write(file, b, len), 0);
    free(b);
    gate(cfg, "changed", cache);
    cr_assert_str_eq(cached("changed", 0, "inputs", "from"), "generated");
    const char *why = cached("changed", 0, "inputs", "why");
    cr_assert(strstr(why, "row's padding"), "the receipt says '%s'", why);
    cr_assert_str_eq(digests("changed"), digests("cold"));
}

/* An ordinary top-p case and a forced one of the same seed: the forced case's ordinary rows are the first case's,
 * reused from memory in a cold run (milliseconds), but drawn afresh in a warm run whose first case came from the
 * cache. Its entry is worth writing for what a run without the first case pays (view.borrowed_s), so the warm run
 * generates nothing; judged by prepare's own seconds it was never stored and every warm run drew the rows again.
 * The rates are pinned so the rule's answer is the same on any machine: one thread, and a folder whose recorded
 * write rate (0.1 GB/s, entries of 64 MiB or less never record theirs) makes an entry worth writing below 0.4 GB/s;
 * drawing the rows runs at about 0.05 GB/s, copying and forcing them at about 3. */
static const char *const shared_rows_text =
    "{\"schema\":\"kparity.gate/v1\",\"name\":\"shared\",\"impls\":{\"candidate\":\"topp.split_prob@host\"},"
    "\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-06},\"cases\":["
    "{\"case\":\"topp(batch=16,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)\","
    "\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
    "{\"case\":\"topp(batch=16,force_token=13,force_value=1e9,profile=forced,seed=58231,top_p=0.95,vocab=131072)\","
    "\"checks\":[{\"check\":\"rule\",\"impl\":\"candidate\"}]}]}";

Test(cache, inputs_that_reused_an_earlier_cases_rows_are_judged_by_what_a_run_without_it_pays) {
    char *cfg = path_in("shared.json"), *cache = path_in("cache"), *rate;
    cr_assert_eq(kpt_write(cfg, shared_rows_text, strlen(shared_rows_text)), 0);
    cr_assert_eq(mkdir(cache, 0755), 0);
    cr_assert(asprintf(&rate, "%s/write_rate", cache) > 0);
    cr_assert_eq(kpt_write(rate, "100000000\n", 10), 0);
    free(rate);
    cr_assert_eq(setenv("KPARITY_THREADS", "1", 1), 0);
    gate(cfg, "cold", cache);
    for (int c = 0; c < 2; c++) {
        cJSON *r = kpt_receipt(path_in("cold"), c + 1);
        cr_assert(cJSON_IsTrue(kpt_at(r, "cache.inputs.stored")), "case %d: %s", c, kpt_str(r, "cache.inputs.not_stored"));
        cJSON_Delete(r);
    }
    gate(cfg, "warm", cache);
    for (int c = 0; c < 2; c++)
        cr_assert_str_eq(cached("warm", c, "inputs", "from"), "cache", "case %d: %s", c, cached("warm", c, "inputs", "why"));
    cr_assert_str_eq(digests("warm"), digests("cold"));
}
