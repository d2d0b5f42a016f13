/* registry.c: every impl kparity can run, the built-in ones and those loaded from plugins, found by
 * name; plugin loading (dlopen) lives here too, with the checks that keep a bad plugin out whole. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_case.h"
#include "../cases/kp_sha256.h"
#include "kp_registry.h"

static const kp_impl *const builtin_impls[] = {
    &kp_topp_split_logit_host,
    &kp_topp_split_prob_host,
    &kp_topk_radix_buffer_host,
    &kp_topk_radix_exact_host,
    &kp_moe_marlin_like_host,
    &kp_moe_marlin_gemv32_host,
    &kp_moe_invariant_host,
    &kp_mla_split_count_host,
    &kp_mla_split_size_host,
#ifdef KP_HAVE_CUDA
    &kp_topp_split_logit_cuda,
    &kp_topp_split_prob_cuda,
    &kp_topk_radix_buffer_cuda,
    &kp_topk_radix_exact_cuda,
    &kp_moe_marlin_like_cuda,
    &kp_moe_marlin_gemv32_cuda,
    &kp_moe_invariant_cuda,
    &kp_mla_split_count_cuda,
    &kp_mla_split_size_cuda,
    &kp_mla_split_size_wg_cuda,
#endif
};
#define BUILTIN_COUNT ((int)(sizeof builtin_impls / sizeof builtin_impls[0]))

/* One impl registered from a plugin; the library stays loaded for the life of the process, since
 * the impl's strings and functions live in it. */
typedef struct plugin_entry {
    const kp_impl *impl;
    const char *path;                /* shared by every entry of one plugin */
    const char *sha256_hex;          /* likewise */
    int judged;                      /* registered by kp_impl_register_judged (outputs read from files) */
} plugin_entry;

/* Loading is meant for startup, before any run: the registry is not locked. */
static plugin_entry *plugin_entries;
static int plugin_count;

int kp_impl_count(void) { return BUILTIN_COUNT + plugin_count; }

const kp_impl *kp_impl_at(int i) {
    if (i < 0) return NULL;
    if (i < BUILTIN_COUNT) return builtin_impls[i];
    if (i < BUILTIN_COUNT + plugin_count) return plugin_entries[i - BUILTIN_COUNT].impl;
    return NULL;
}

const kp_impl *kp_impl_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < kp_impl_count(); i++) {
        const kp_impl *impl = kp_impl_at(i);
        if (impl->name && strcmp(impl->name, name) == 0) return impl;
    }
    return NULL;
}

const char *kp_impl_origin(const kp_impl *impl, const char **sha256_hex) {
    for (int i = 0; impl && i < plugin_count; i++) {
        if (plugin_entries[i].impl != impl) continue;
        if (sha256_hex) *sha256_hex = plugin_entries[i].sha256_hex;
        return plugin_entries[i].path;
    }
    if (sha256_hex) *sha256_hex = NULL;
    return NULL;
}

int kp_registry_has_cuda(void) {
#ifdef KP_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

/* An algorithm or device part of a name: one or more of [a-z0-9_]. */
static int name_part_ok(const char *s, size_t len) {
    if (len == 0) return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_')) return 0;
    return 1;
}

/* "family.algorithm@device" with this impl's family as the prefix. */
static int impl_name_ok(const char *family, const char *name) {
    size_t flen = strlen(family);
    if (strncmp(name, family, flen) != 0 || name[flen] != '.') return 0;
    const char *algorithm = name + flen + 1;
    const char *at = strchr(algorithm, '@');
    if (!at || strchr(at + 1, '@')) return 0;
    return name_part_ok(algorithm, (size_t)(at - algorithm)) && name_part_ok(at + 1, strlen(at + 1));
}

/* Check impl `i` of a plugin against the ABI and against every name registered so far, including the
 * plugin's own earlier entries. */
static int check_plugin_impl(const char *path, const kp_impl *impls, int i, kp_error *err) {
    const kp_impl *impl = &impls[i];
    if (impl->abi != KP_ABI_VERSION)
        return kp_fail(err, KP_EXIT_USAGE, "plugin %s: impl %d: field abi is %u, this kparity speaks ABI %u", path, i,
                       impl->abi, KP_ABI_VERSION);
    if (!impl->family || !kp_case_family_find(impl->family)) { /* one list of families: cases/case_families.c */
        char known[256];
        kp_case_family_names(known, sizeof known);
        return kp_fail(err, KP_EXIT_USAGE, "plugin %s: impl %d: field family is '%s', expected a family kparity knows (%s)",
                       path, i, impl->family ? impl->family : "(null)", known);
    }
    if (!impl->name)
        return kp_fail(err, KP_EXIT_USAGE, "plugin %s: impl %d: field name is NULL", path, i);
    if (!impl_name_ok(impl->family, impl->name))
        return kp_fail(err, KP_EXIT_USAGE,
                       "plugin %s: impl %d: field name '%s' is not '%s.algorithm@device' "
                       "(algorithm and device: lowercase letters, digits, '_')",
                       path, i, impl->name, impl->family);
    if (impl->memory != KP_MEMORY_HOST && impl->memory != KP_MEMORY_CUDA)
        return kp_fail(err, KP_EXIT_USAGE, "plugin %s: impl %s: field memory is %d, expected KP_MEMORY_HOST (0) or "
                       "KP_MEMORY_CUDA (1)", path, impl->name, (int)impl->memory);
    if (!impl->run)
        return kp_fail(err, KP_EXIT_USAGE, "plugin %s: impl %s: field run is NULL", path, impl->name);
    const kp_impl *clash = kp_impl_find(impl->name);
    if (clash) {
        const char *from = kp_impl_origin(clash, NULL);
        return kp_fail(err, KP_EXIT_USAGE, "plugin %s: impl %d: field name '%s' is already registered by %s%s", path, i,
                       impl->name, from ? "plugin " : "kparity itself", from ? from : "");
    }
    for (int j = 0; j < i; j++)
        if (impls[j].name && strcmp(impls[j].name, impl->name) == 0)
            return kp_fail(err, KP_EXIT_USAGE, "plugin %s: impl %d: field name '%s' repeats impl %d of the same plugin",
                           path, i, impl->name, j);
    return 0;
}

int kp_plugin_load(const char *path, kp_error *err) { return kp_plugin_load_pinned(path, NULL, err); }

int kp_plugin_load_pinned(const char *path, const char *pin, kp_error *err) {
    if (!path || !*path) return kp_fail(err, KP_EXIT_USAGE, "plugin path is empty");
    /* A bare name would make dlopen search the library path: demand a path so the digest in the
     * receipt is of the file that was really loaded. */
    if (!strchr(path, '/'))
        return kp_fail(err, KP_EXIT_USAGE, "plugin %s: give a path (e.g. ./%s), not a bare library name", path, path);
    char sha[KP_SHA256_HEX_LEN];
    int rc;
    /* Before dlopen: loading runs the library's constructors, so a file that is not the pinned one must
     * never get that far. */
    if (pin) {
        if ((rc = kp_sha256_file_hex(path, sha, err))) {
            kp_error_prefix(err, "plugin %s: ", path);
            return rc;
        }
        if (strcmp(sha, pin))
            return kp_fail(err, KP_EXIT_USAGE, "plugin %s has SHA-256 %s, the config pins %s; it was not loaded", path, sha, pin);
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        return kp_fail(err, KP_EXIT_USAGE, "plugin %s: cannot load: %s", path, why ? why : "dlopen failed");
    }
    rc = kp_sha256_file_hex(path, sha, err);
    if (rc) {
        dlclose(lib);
        kp_error_prefix(err, "plugin %s: ", path);
        return rc;
    }
    /* The digest receipts record is taken after the load; with a pin it must still be the pin, or the
     * file changed between the check and the load (its constructors have run: refuse it all the same). */
    if (pin && strcmp(sha, pin)) {
        dlclose(lib);
        return kp_fail(err, KP_EXIT_USAGE, "plugin %s changed while it was loaded (SHA-256 %s, the config pins %s); "
                       "refused", path, sha, pin);
    }
    dlerror();
    void *sym = dlsym(lib, KP_PLUGIN_ENTRY_NAME);
    if (!sym) {
        const char *why = dlerror();
        rc = kp_fail(err, KP_EXIT_USAGE, "plugin %s: no symbol %s (a plugin exports const kp_impl *%s(int *count)): %s",
                     path, KP_PLUGIN_ENTRY_NAME, KP_PLUGIN_ENTRY_NAME, why ? why : "not found");
        dlclose(lib);
        return rc;
    }
    kp_plugin_entry entry;
    memcpy(&entry, &sym, sizeof entry); /* ISO C has no object-to-function pointer cast */
    int count = -1;
    const kp_impl *impls = entry(&count);
    if (!impls || count <= 0) {
        rc = kp_fail(err, KP_EXIT_USAGE, "plugin %s: %s returned %s with count %d; expected at least one impl", path,
                     KP_PLUGIN_ENTRY_NAME, impls ? "an array" : "NULL", count);
        dlclose(lib);
        return rc;
    }
    for (int i = 0; i < count; i++) {
        rc = check_plugin_impl(path, impls, i, err);
        if (rc) {
            dlclose(lib);
            return rc;
        }
    }

    char *path_copy = strdup(path), *sha_copy = strdup(sha);
    plugin_entry *grown = realloc(plugin_entries, (size_t)(plugin_count + count) * sizeof *grown);
    if (!path_copy || !sha_copy || !grown) {
        free(path_copy);
        free(sha_copy);
        if (grown) plugin_entries = grown;
        dlclose(lib);
        return kp_fail(err, KP_EXIT_ENV, "plugin %s: out of host memory registering %d impls", path, count);
    }
    plugin_entries = grown;
    for (int i = 0; i < count; i++)
        plugin_entries[plugin_count + i] = (plugin_entry){&impls[i], path_copy, sha_copy, 0};
    plugin_count += count;
    return 0;
}

int kp_impl_register_judged(const kp_impl *impl, const char *origin, const char *sha256_hex, kp_error *err) {
    return kp_impl_register_outside(impl, origin, sha256_hex, 1, err);
}

int kp_impl_register_outside(const kp_impl *impl, const char *origin, const char *sha256_hex, int judged, kp_error *err) {
    if (kp_impl_find(impl->name)) return kp_fail(err, KP_EXIT_USAGE, "%s: the name is already registered", impl->name);
    char *o = strdup(origin), *sha = strdup(sha256_hex);
    plugin_entry *grown = o && sha ? realloc(plugin_entries, (size_t)(plugin_count + 1) * sizeof *grown) : NULL;
    if (!grown) {
        free(o), free(sha);
        return kp_fail(err, KP_EXIT_ENV, "out of host memory registering %s", impl->name);
    }
    plugin_entries = grown;
    plugin_entries[plugin_count++] = (plugin_entry){impl, o, sha, judged};
    return 0;
}

int kp_impl_is_judged(const kp_impl *impl) {
    for (int i = 0; impl && i < plugin_count; i++)
        if (plugin_entries[i].impl == impl) return plugin_entries[i].judged;
    return 0;
}

/* Declared-absent outputs, (impl, output name) pairs: few, and set at startup like the plugin entries. */
typedef struct absent_entry {
    const kp_impl *impl;
    char output[64];
} absent_entry;
static absent_entry *absent_entries;
static int absent_count;

int kp_impl_declare_absent(const kp_impl *impl, const char *output_name, kp_error *err) {
    if (!impl || !output_name || !output_name[0] || strlen(output_name) >= sizeof absent_entries->output)
        return kp_fail(err, KP_EXIT_USAGE, "%s: an absent output needs a name of 1 to %zu bytes",
                       impl && impl->name ? impl->name : "(no impl)", sizeof absent_entries->output - 1);
    if (kp_impl_output_absent(impl, output_name)) return 0;
    absent_entry *grown = realloc(absent_entries, (size_t)(absent_count + 1) * sizeof *grown);
    if (!grown) return kp_fail(err, KP_EXIT_ENV, "out of host memory declaring %s's output %s absent", impl->name, output_name);
    absent_entries = grown;
    absent_entries[absent_count].impl = impl;
    snprintf(absent_entries[absent_count++].output, sizeof absent_entries->output, "%s", output_name);
    return 0;
}

int kp_impl_output_absent(const kp_impl *impl, const char *output_name) {
    for (int i = 0; impl && output_name && i < absent_count; i++)
        if (absent_entries[i].impl == impl && !strcmp(absent_entries[i].output, output_name)) return 1;
    return 0;
}
