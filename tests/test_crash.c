/* test_crash.c: crash consistency of the gate's bundle (issue 20, part 3), through the kparity binary and its
 * fault hook (KPARITY_FAULT, receipts/kp_fileio.c): SIGKILL at every file operation of a run, a full disk and an
 * unwritable folder mid-run, and verify telling an incomplete bundle from a damaged one. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kp_test_util.h"

TestSuite(crash, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 900);

/* Four quick cases of three families: top-p exact and rule, a MoE tolerance it cannot meet (32 elements over
 * atol, more than the 16 a receipt holds inline: the list goes to an artifact, so artifacts are written too), a
 * top-p exact the incumbent fails, top-k rule and repeat. One row each where one will do: a gate here runs about
 * 170 times, and a case costs about one cuRAND call a row. About 60 file operations: 3 folders, then 6 per file (create, write, sync, close, rename,
 * folder sync) for 1 artifact, 4 receipts and the 5 files of the finish. */
static const char *const CONFIG =
    "{\"schema\":\"kparity.gate/v1\",\"name\":\"crash\",\"impls\":{\"incumbent\":\"topp.split_logit@host\","
    "\"candidate\":\"topp.split_prob@host\",\"topk.candidate\":\"topk.radix_exact@host\",\"moe.candidate\":\"moe.invariant@host\"},"
    "\"defaults\":{\"tie_policy\":\"minimal_index\",\"band\":1e-6,\"runs\":2,\"ties\":\"lowest_index\",\"order\":\"index\"},"
    "\"cases\":["
    "{\"case\":\"topp(batch=1,profile=ordinary,seed=4,top_p=0.95,vocab=1000)\",\"checks\":[{\"check\":\"exact\",\"impls\":"
    "[\"incumbent\",\"candidate\"]},{\"check\":\"rule\",\"impl\":\"candidate\"}]},"
    "{\"case\":\"moe(hidden=32,inter=16,m=1,model=glm47,profile=uniform,seed=11)\",\"checks\":[{\"check\":\"tolerance\","
    "\"impl\":\"moe.candidate\",\"atol\":1e-9,\"rtol\":0}]},"
    "{\"case\":\"topp(batch=1,force_token=3,force_value=1e9,profile=forced,seed=4,top_p=0.95,vocab=1000)\",\"checks\":"
    "[{\"check\":\"rule\",\"impl\":\"candidate\"},{\"check\":\"exact\",\"impls\":[\"incumbent\",\"candidate\"]}]},"
    "{\"case\":\"topk(k=512,profile=randn,rows=1,seed=2,width=3000)\",\"checks\":[{\"check\":\"rule\",\"impl\":"
    "\"topk.candidate\"},{\"check\":\"repeat\",\"impl\":\"topk.candidate\"}]}]}";
#define NCASES 4
#define CLEAN_EXIT 1 /* the uninterrupted run's verdict: INCORRECT (the MoE tolerance and the incumbent's exact) */

static char *path_in(const char *dir, const char *rel) {
    char *p;
    cr_assert(asprintf(&p, "%s/%s", dir, rel) > 0);
    return p;
}

static char *write_config(void) {
    char *cfg = path_in(kpt_dir, "crash.json");
    cr_assert_eq(kpt_write(cfg, CONFIG, strlen(CONFIG)), 0);
    return cfg;
}

/* kparity gate into `out`, with KPARITY_FAULT=fault (NULL: none); the exit status (128 + signal when killed). */
static int gate(const char *cfg, const char *out, const char *fault, char **err) {
    if (fault) setenv("KPARITY_FAULT", fault, 1);
    int rc = kpt_gate(cfg, out, NULL, err);
    unsetenv("KPARITY_FAULT");
    return rc;
}

static int verify(const char *out, char **err) {
    char *argv[] = {kpt_binary(), "verify", (char *)out, NULL};
    return kpt_run(argv, NULL, err);
}

/* Every digest a receipt records of the case's data: inputs, reference, each impl's output (not timings). */
static void collect_digests(const cJSON *node, const char *at, char **acc) {
    for (const cJSON *c = node ? node->child : NULL; c; c = c->next) {
        char *here;
        cr_assert(asprintf(&here, "%s/%s", at, c->string ? c->string : "[]") > 0);
        if (cJSON_IsString(c) && c->string && strstr(c->string, "sha256")) {
            char *grown;
            cr_assert(asprintf(&grown, "%s%s=%s\n", *acc, here, c->valuestring) > 0);
            free(*acc);
            *acc = grown;
        }
        collect_digests(c, here, acc);
        free(here);
    }
}

static char *case_digests(const cJSON *receipt) {
    char *acc = strdup("");
    const char *parts[] = {"inputs", "reference", "impls"};
    for (int i = 0; i < 3; i++) collect_digests(cJSON_GetObjectItemCaseSensitive(receipt, parts[i]), parts[i], &acc);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(receipt, "case"), "name");
    char *out;
    cr_assert(asprintf(&out, "%s\n%s", cJSON_IsString(name) ? name->valuestring : "?", acc) > 0);
    free(acc);
    return out;
}

/* The receipts of a bundle folder as they are on disk: every receipts/NNNN.json must parse whole and hold its
 * own index; returns how many there are (1..count, no gap), and fills digests[i] for receipt i + 1. Any other
 * entry of receipts/ must be a temporary file of a write that never finished. */
static int receipts_on_disk(const char *bundle, char *digests[NCASES], int *temps) {
    char *dir = path_in(bundle, "receipts");
    DIR *d = opendir(dir);
    int count = 0, max_index = 0;
    if (!d) {
        free(dir);
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || !strcmp(e->d_name, ".."))) continue;
        if (e->d_name[0] == '.') {
            cr_assert(strstr(e->d_name, ".json.tmp-"), "%s: an unexpected file in receipts/: %s", bundle, e->d_name);
            ++*temps;
            continue;
        }
        int index = 0;
        cr_assert(sscanf(e->d_name, "%d.json", &index) == 1 && index >= 1 && index <= NCASES, "%s: receipts/%s", bundle, e->d_name);
        char *path = path_in(dir, e->d_name);
        char *text = kpt_read(path, NULL);
        cJSON *r = text ? cJSON_Parse(text) : NULL;
        cr_assert_not_null(r, "%s is torn: it does not parse as JSON", path);
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(r, "index");
        cr_assert(cJSON_IsNumber(idx) && idx->valueint == index, "%s: index %d", path, idx ? idx->valueint : -1);
        digests[index - 1] = case_digests(r);
        cJSON_Delete(r);
        free(text), free(path);
        count++;
        if (index > max_index) max_index = index;
    }
    closedir(d);
    free(dir);
    cr_assert_eq(count, max_index, "%s: receipts 1..%d with a gap (%d on disk)", bundle, max_index, count);
    return count;
}

static int exists(const char *dir, const char *rel) {
    char *p = path_in(dir, rel);
    struct stat st;
    int there = stat(p, &st) == 0;
    free(p);
    return there;
}

/* The rerun that follows a kill, into a fresh folder: started once the killed run has ended, and checked after the
 * next kill point's run, which it overlaps (two processes, no folder shared; it still follows its own kill). */
typedef struct {
    pid_t pid; /* 0: none pending */
    int n;     /* the kill point it follows */
    char *out, *err_path;
} rerun;

static void rerun_start(rerun *r, const char *cfg, int n) {
    char tag[32];
    snprintf(tag, sizeof tag, "rerun%03d", n);
    r->n = n, r->out = path_in(kpt_dir, tag);
    cr_assert(asprintf(&r->err_path, "%s.stderr", r->out) > 0);
    char *argv[] = {kpt_binary(), "gate", "--config", (char *)cfg, "--out", r->out, "--quiet", NULL};
    r->pid = fork();
    cr_assert_geq(r->pid, 0, "fork: %s", strerror(errno));
    if (r->pid == 0) {
        const int null = open("/dev/null", O_RDWR), err = open(r->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(null, 0), dup2(null, 1), dup2(err, 2);
        unsetenv("KPARITY_FAULT");
        execv(argv[0], argv);
        _exit(127);
    }
}

/* The pending rerun, if any, waited for: the uninterrupted run's verdict and, case by case, its digests. */
static void rerun_check(rerun *r, char *const want[NCASES]) {
    if (!r->pid) return;
    int status;
    while (waitpid(r->pid, &status, 0) < 0) cr_assert_eq(errno, EINTR, "waitpid: %s", strerror(errno));
    r->pid = 0;
    char *err = kpt_read(r->err_path, NULL);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    cr_assert_eq(rc, CLEAN_EXIT, "rerun after kill@%d: %s", r->n, err ? err : "");
    char *got[NCASES] = {0};
    int temps = 0;
    cr_assert_eq(receipts_on_disk(r->out, got, &temps), NCASES);
    for (int i = 0; i < NCASES; i++) {
        cr_assert_str_eq(got[i], want[i], "rerun after kill@%d: receipt %d's digests differ", r->n, i + 1);
        free(got[i]);
    }
    kpt_rmtree(r->out), remove(r->err_path);
    free(err), free(r->out), free(r->err_path);
}

/* SIGKILL at every file operation of a run, from the first to past the last: each time every receipt on disk is
 * whole and has the digests of the uninterrupted run's receipt of that index, verify calls the bundle incomplete
 * (never intact, never damaged) and names the last receipt and what is missing, and a rerun into a fresh folder
 * gives the uninterrupted run's digests case by case. The one exception is the last operation, the sync of the
 * manifest's folder: the manifest is in place by then, and the bundle is whole. */
Test(crash, a_kill_at_any_file_operation_leaves_an_incomplete_bundle_of_whole_receipts) {
    char *cfg = write_config(), *err;
    char *ref = path_in(kpt_dir, "uninterrupted");
    cr_assert_eq(gate(cfg, ref, NULL, &err), CLEAN_EXIT, "%s", err);
    free(err);
    cr_assert_eq(verify(ref, &err), 0, "%s", err);
    free(err);
    char *want[NCASES] = {0};
    int temps = 0;
    cr_assert_eq(receipts_on_disk(ref, want, &temps), NCASES);
    cr_assert(exists(ref, "artifacts") && temps == 0);

    int killed = 0, with_temp = 0, no_bundle_yet = 0, after_bundle_json = 0, after_manifest = 0, n;
    int by_receipts[NCASES + 1] = {0};
    rerun pending = {0};
    for (n = 1; n < 500; n++) {
        char tag[32], fault[32];
        snprintf(tag, sizeof tag, "kill%03d", n);
        snprintf(fault, sizeof fault, "kill@%d", n);
        char *out = path_in(kpt_dir, tag);
        int rc = gate(cfg, out, fault, &err);
        free(err);
        rerun_check(&pending, want); /* the rerun after kill@(n - 1) */
        if (rc != 128 + 9) { /* past the last operation: the run is whole */
            cr_assert_eq(rc, CLEAN_EXIT, "kill@%d: exit %d, neither killed nor the uninterrupted verdict", n, rc);
            cr_assert_eq(verify(out, &err), 0, "kill@%d past the end: %s", n, err);
            free(err);
            kpt_rmtree(out);
            free(out);
            break;
        }
        killed++;
        rerun_start(&pending, cfg, n);
        char *got[NCASES] = {0};
        int t = 0;
        const int count = receipts_on_disk(out, got, &t);
        with_temp += t > 0;
        by_receipts[count]++;
        for (int i = 0; i < count; i++) {
            cr_assert_str_eq(got[i], want[i], "kill@%d: receipt %d records other digests than the uninterrupted run's", n, i + 1);
            free(got[i]);
        }
        const int vrc = verify(out, &err);
        if (exists(out, "manifest.sha256")) {
            /* killed after the manifest was renamed into place (syncing its folder): the record is whole */
            cr_assert_eq(vrc, 0, "kill@%d: a manifest in place, and verify says: %s", n, err);
            cr_assert_eq(count, NCASES);
            after_manifest++;
        } else if (!exists(out, "receipts") && !exists(out, "artifacts")) {
            /* killed before the bundle's first folder inside: no bundle to speak of, and verify says so */
            cr_assert_eq(vrc, 2, "kill@%d: verify exit %d on a folder with nothing in it: %s", n, vrc, err);
            cr_assert(n <= 2, "kill@%d: no receipts/ folder this late", n);
            no_bundle_yet++;
        } else {
            cr_assert_eq(vrc, 1, "kill@%d: verify exit %d: %s", n, vrc, err);
            cr_assert(strstr(err, "incomplete: the run stopped") && strstr(err, "missing:") && strstr(err, "manifest.sha256"),
                      "kill@%d: verify does not call it incomplete: %s", n, err);
            char stopped[64];
            if (count) snprintf(stopped, sizeof stopped, "after receipt %d (", count);
            else snprintf(stopped, sizeof stopped, "before its first receipt");
            cr_assert(strstr(err, stopped), "kill@%d: %d receipts on disk, verify says: %s", n, count, err);
            if (count < NCASES)
                cr_assert(count == 0 || strstr(err, "more of the 4 cases"), "kill@%d: the missing cases not named: %s", n, err);
            after_bundle_json += exists(out, "bundle.json");
        }
        free(err);
        kpt_rmtree(out);
        free(out);
    }
    rerun_check(&pending, want);
    cr_log_info("%d kill points (%d before any bundle folder, %d with a temporary receipt left, %d between bundle.json and "
                "the manifest, %d after the manifest); receipts on disk when killed: 0: %d, 1: %d, 2: %d, 3: %d, 4: %d",
                killed, no_bundle_yet, with_temp, after_bundle_json, after_manifest, by_receipts[0], by_receipts[1],
                by_receipts[2], by_receipts[3], by_receipts[4]);
    cr_assert_leq(after_manifest, 1, "%d kill points after the manifest: only its folder sync comes after it", after_manifest);
    cr_assert_geq(killed, 50, "only %d kill points: the run has fewer file operations than the test needs", killed);
    /* the points cover the whole run: kills with no receipt, every count of receipts, torn writes, the finish */
    for (int i = 0; i <= NCASES; i++) cr_assert_gt(by_receipts[i], 0, "no kill point left exactly %d receipts", i);
    cr_assert_gt(with_temp, 0, "no kill point left a temporary receipt: the steps between create and rename are not covered");
    cr_assert_gt(after_bundle_json, 0, "no kill point fell between bundle.json and the manifest");
    for (int i = 0; i < NCASES; i++) free(want[i]);
    free(cfg), free(ref);
}

/* A full disk (ENOSPC) and a folder that turns unwritable (EACCES) from the Nth file operation on: once the bundle
 * folder is made, every such run ends with exit 3 and a message naming the file and the reason, and what it leaves
 * is an incomplete bundle of whole receipts, never one presented as finished. */
Test(crash, a_full_disk_or_an_unwritable_folder_mid_run_exits_3_naming_the_file) {
    char *cfg = write_config(), *err;
    const struct {
        const char *kind, *why;
    } faults[] = {{"enospc", "No space left on device"}, {"eacces", "Permission denied"}};
    int runs = 0;
    for (int f = 0; f < 2; f++) {
        for (int n = 4; n <= 63; n += 3) { /* past the 3 folders kp_bundle_open makes (there: exit 2, the path given) */
            char tag[32], fault[32];
            snprintf(tag, sizeof tag, "%s%03d", faults[f].kind, n);
            snprintf(fault, sizeof fault, "%s@%d", faults[f].kind, n);
            char *out = path_in(kpt_dir, tag);
            int rc = gate(cfg, out, fault, &err);
            if (rc == CLEAN_EXIT && !strcmp(faults[f].kind, "eacces")) { /* only the folder sync was left: nothing to fail */
                free(err), free(out);
                continue;
            }
            runs++;
            cr_assert_eq(rc, 3, "%s: exit %d, not 3: %s", fault, rc, err);
            cr_assert(strstr(err, out) && strstr(err, faults[f].why) && strstr(err, "unfinished"),
                      "%s: the message does not name the file and why: %s", fault, err);
            free(err);
            char *got[NCASES] = {0};
            int temps = 0;
            int count = receipts_on_disk(out, got, &temps);
            cr_assert_eq(temps, 0, "%s: a failed write left its temporary file", fault);
            for (int i = 0; i < count; i++) free(got[i]);
            cr_assert_eq(verify(out, &err), 1, "%s", fault);
            cr_assert(strstr(err, "incomplete: the run stopped"), "%s: %s", fault, err);
            cr_assert(!exists(out, "manifest.sha256"), "%s: a manifest was written after a failed write", fault);
            free(err);
            kpt_rmtree(out);
            free(out);
        }
    }
    cr_assert_geq(runs, 30, "only %d runs hit a fault", runs);
    free(cfg);
}

/* Flip one byte of a file, or write a new one. */
static void flip(const char *dir, const char *rel) {
    char *p = path_in(dir, rel);
    size_t len;
    char *text = kpt_read(p, &len);
    cr_assert_not_null(text, "%s", p);
    text[len / 2] ^= 0x01;
    cr_assert_eq(kpt_write(p, text, len), 0);
    free(text), free(p);
}

/* What is there in an unfinished bundle is held to the same standard as a finished one: a flipped byte, a file no
 * run writes, a receipt missing from the middle are damage, not "incomplete"; and a finished bundle with its
 * manifest removed is incomplete, never intact. */
Test(crash, verify_tells_an_incomplete_bundle_from_a_damaged_one) {
    char *cfg = write_config(), *err;
    /* a run killed after its third receipt: 3 folders, 1 artifact and 3 receipts of 6 operations each */
    const char *after_three = "kill@28";
    const struct {
        const char *what, *rel, *named;
    } damage[] = {{"a flipped byte in a receipt", "receipts/0002.json", "receipts/0002.json"},
                  {"a flipped byte in the artifact", NULL, "artifacts/"},
                  {"a file no run writes", "receipts/extra.json", "receipts/extra.json"},
                  {"a receipt removed from the middle", "receipts/0001.json", "receipts/0002.json"}};
    for (size_t i = 0; i < sizeof damage / sizeof *damage; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "damaged%zu", i);
        char *out = path_in(kpt_dir, tag);
        cr_assert_eq(gate(cfg, out, after_three, &err), 128 + 9, "%s", err);
        free(err);
        cr_assert_eq(verify(out, &err), 1);
        cr_assert(strstr(err, "incomplete: the run stopped after receipt 3 ("), "the control: %s", err);
        free(err);
        if (i == 0) flip(out, damage[i].rel);
        if (i == 1) {
            char *dir = path_in(out, "artifacts");
            DIR *d = opendir(dir);
            struct dirent *e;
            while ((e = readdir(d)) != NULL)
                if (e->d_name[0] != '.') {
                    char *rel;
                    cr_assert(asprintf(&rel, "artifacts/%s", e->d_name) > 0);
                    flip(out, rel);
                    free(rel);
                }
            closedir(d);
            free(dir);
        }
        if (i == 2) {
            char *p = path_in(out, damage[i].rel);
            cr_assert_eq(kpt_write(p, "{}", 2), 0);
            free(p);
        }
        if (i == 3) {
            char *p = path_in(out, damage[i].rel);
            cr_assert_eq(remove(p), 0);
            free(p);
        }
        cr_assert_eq(verify(out, &err), 1, "%s", damage[i].what);
        cr_assert_null(strstr(err, "incomplete"), "%s called incomplete: %s", damage[i].what, err);
        cr_assert(strstr(err, damage[i].named), "%s: the message does not name %s: %s", damage[i].what, damage[i].named, err);
        free(err), free(out);
    }
    /* a finished bundle: intact; without its manifest, incomplete; with bundle.json but no manifest, incomplete */
    char *done = path_in(kpt_dir, "finished");
    cr_assert_eq(gate(cfg, done, NULL, &err), CLEAN_EXIT, "%s", err);
    free(err);
    cr_assert_eq(verify(done, &err), 0, "%s", err);
    free(err);
    char *manifest = path_in(done, "manifest.sha256");
    cr_assert_eq(remove(manifest), 0);
    cr_assert_eq(verify(done, &err), 1);
    cr_assert(strstr(err, "incomplete: the run stopped after receipt 4 (") && strstr(err, "missing: manifest.sha256"),
              "a finished bundle without its manifest: %s", err);
    free(err);
    /* ... and with a receipt edited on top, damaged again: bundle.json still holds every receipt's digest */
    flip(done, "receipts/0003.json");
    cr_assert_eq(verify(done, &err), 1);
    cr_assert(strstr(err, "receipts/0003.json") && !strstr(err, "incomplete"), "%s", err);
    free(err), free(manifest), free(done), free(cfg);
}
