/* exec_decl.c: an outside program as a config (impls.ROLE's object form) or a command line (--exec) declares it, parsed
 * into a kp_exec_decl for kp_exec_register (exec.c, which runs it). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_exec.h"

void kp_exec_decl_free(kp_exec_decl *decl) {
    for (int i = 0; decl->argv && decl->argv[i]; i++) free(decl->argv[i]);
    free(decl->argv);
    decl->argv = NULL;
}

int kp_exec_parse(const cJSON *obj, const char *role, const char *where, kp_exec_decl *decl, kp_error *err) {
    memset(decl, 0, sizeof *decl);
    for (const cJSON *m = obj->child; m; m = m->next) {
        static const char *const allowed[] = {"exec", "impl", "family", "absent", "sha256", "timeout_s"};
        int ok = 0;
        for (size_t i = 0; i < sizeof allowed / sizeof *allowed; i++) ok |= !strcmp(m->string, allowed[i]);
        if (!ok)
            return kp_fail(err, KP_EXIT_USAGE, "%s.%s: unknown field (an outside program is exec, impl, family, absent, sha256, timeout_s)",
                           where, m->string);
    }
    const cJSON *argv = cJSON_GetObjectItemCaseSensitive(obj, "exec");
    if (!cJSON_IsArray(argv) || cJSON_GetArraySize(argv) < 1)
        return kp_fail(err, KP_EXIT_USAGE, "%s.exec: expected the program's command as a non-empty array of strings", where);
    const int n = cJSON_GetArraySize(argv);
    decl->argv = calloc((size_t)n + 1, sizeof *decl->argv);
    if (!decl->argv) return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    int i = 0;
    for (const cJSON *a = argv->child; a; a = a->next, i++) {
        if (!cJSON_IsString(a) || !a->valuestring[0]) {
            kp_exec_decl_free(decl);
            return kp_fail(err, KP_EXIT_USAGE, "%s.exec[%d]: expected a non-empty string", where, i);
        }
        decl->argv[i] = strdup(a->valuestring);
    }
    const char *s = NULL;
    char at[256];
    snprintf(at, sizeof at, "%s.impl", where);
    const cJSON *impl = cJSON_GetObjectItemCaseSensitive(obj, "impl"); /* absent: the one impl the program serves */
    if (impl && (kp_want_string(impl, at, &s, err) || strlen(s) >= sizeof decl->program_impl)) {
        kp_exec_decl_free(decl);
        return err->code ? err->code : kp_fail(err, KP_EXIT_USAGE, "%s: too long", at);
    }
    snprintf(decl->program_impl, sizeof decl->program_impl, "%s", impl ? s : "");
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(obj, "family");
    const char *dot = strchr(role, '.');
    snprintf(decl->role, sizeof decl->role, "%s", dot ? dot + 1 : role);
    if (fam) {
        snprintf(at, sizeof at, "%s.family", where);
        if (kp_want_string(fam, at, &s, err)) return kp_exec_decl_free(decl), err->code;
        snprintf(decl->family, sizeof decl->family, "%s", s);
    } else if (dot) {
        snprintf(decl->family, sizeof decl->family, "%.*s", (int)(dot - role < 15 ? dot - role : 15), role);
    } else {
        kp_exec_decl_free(decl);
        return kp_fail(err, KP_EXIT_USAGE, "%s: an outside program's role names its family ('<family>.%s') or it says \"family\"",
                       where, role);
    }
    if (!kp_family_find(decl->family)) {
        kp_exec_decl_free(decl);
        return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is no family", where, decl->family);
    }
    decl->absent = cJSON_GetObjectItemCaseSensitive(obj, "absent");
    if (decl->absent && !cJSON_IsArray(decl->absent)) {
        kp_exec_decl_free(decl);
        return kp_fail(err, KP_EXIT_USAGE, "%s.absent: expected an array of output names", where);
    }
    decl->pins = cJSON_GetObjectItemCaseSensitive(obj, "sha256");
    if (decl->pins && !cJSON_IsObject(decl->pins)) {
        kp_exec_decl_free(decl);
        return kp_fail(err, KP_EXIT_USAGE, "%s.sha256: expected an object of FILE: SHA-256 (hex)", where);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "timeout_s");
    if (t) {
        snprintf(at, sizeof at, "%s.timeout_s", where);
        if (kp_want_number(t, at, &decl->timeout_s, err)) return kp_exec_decl_free(decl), err->code;
        if (!(decl->timeout_s > 0 && decl->timeout_s < 1e6))
            return kp_exec_decl_free(decl), kp_fail(err, KP_EXIT_USAGE, "%s: %g is not a positive number of seconds", at, decl->timeout_s);
    }
    return 0;
}

int kp_exec_arg(const char *arg, const char *family, kp_exec_decl *decl, kp_error *err) {
    memset(decl, 0, sizeof *decl);
    const char *eq = strchr(arg, '='), *colon = strchr(arg, ':');
    if (colon && eq && colon > eq) colon = NULL;
    const char *name = colon ? colon + 1 : arg;
    if (!eq || eq == name || !eq[1] || (size_t)(eq - name) >= sizeof decl->program_impl)
        return kp_fail(err, KP_EXIT_USAGE, "--exec '%s': expected [FAMILY:]IMPL=COMMAND [ARGS...]", arg);
    if (colon) snprintf(decl->family, sizeof decl->family, "%.*s", (int)(colon - arg < 15 ? colon - arg : 15), arg);
    else if (family) snprintf(decl->family, sizeof decl->family, "%s", family);
    else return kp_fail(err, KP_EXIT_USAGE, "--exec '%s': name the family the program serves (FAMILY:IMPL=COMMAND)", arg);
    if (!kp_family_find(decl->family)) return kp_fail(err, KP_EXIT_USAGE, "--exec '%s': '%s' is no family", arg, decl->family);
    snprintf(decl->program_impl, sizeof decl->program_impl, "%.*s", (int)(eq - name), name);
    char *copy = strdup(eq + 1), *save = NULL;
    int n = 0;
    decl->argv = calloc(strlen(eq + 1) / 2 + 2, sizeof *decl->argv);
    for (char *t = copy && decl->argv ? strtok_r(copy, " ", &save) : NULL; t; t = strtok_r(NULL, " ", &save)) decl->argv[n++] = strdup(t);
    free(copy);
    if (!n) {
        kp_exec_decl_free(decl);
        return kp_fail(err, KP_EXIT_USAGE, "--exec '%s': no command", arg);
    }
    return 0;
}
