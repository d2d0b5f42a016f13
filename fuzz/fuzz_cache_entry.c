/* fuzz_cache_entry.c: libFuzzer target for the cache's entry reader (kp_cache_open), which maps files a disk, another
 * run or a person may have changed. Beyond "no crash": an entry it accepts declares tensors that lie inside the file,
 * one after another, and every byte of each can be read. With KP_FUZZ_WRITE_SEEDS=DIR set it first writes, as seeds,
 * entries kp_cache_put makes under the key this target opens (one dense tensor; a strided one with filler rows and
 * row padding; none). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../harness/kp_cache.h"

#define KEY_TEXT "kparity.fuzz.cache_entry/v1"

static char g_path[4096];

static void write_seeds(const char *dir) {
    float dense[6] = {1, 2, 3, 4, 5, 6};
    int32_t strided[3 * 4] = {7, 8, 9, 0, 10, 11, 12, 0, 13, 14, 15, 0}; /* [3 slices (2 past shape[0]), 3] stride 4 */
    const kp_tensor a = {.name = "dense", .dtype = KP_F32, .ndim = 2, .shape = {2, 3}, .data = dense};
    const kp_tensor b = {.name = "strided", .dtype = KP_I32, .ndim = 2, .shape = {1, 3}, .row_stride = 4, .data = strided};
    const kp_cache_tensor sets[3][2] = {{{&a, 2}}, {{&a, 2}, {&b, 3}}, {{0}}};
    const int counts[3] = {1, 2, 0};
    for (int i = 0; i < 3; i++) {
        cJSON *meta = cJSON_CreateObject();
        cJSON_AddStringToObject(meta, "note", "a seed");
        kp_error err = {0};
        KP_ASSERT(kp_cache_put("inputs", KEY_TEXT, meta, sets[i], counts[i], &err) == 0);
        cJSON_Delete(meta);
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "cp '%s' '%s/entry-%d'", g_path, dir, i);
        KP_ASSERT(system(cmd) == 0);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char tmpl[] = "/tmp/kp-fuzz-cache-XXXXXX";
    const char *dir = mkdtemp(tmpl);
    kp_error err = {0};
    KP_ASSERT(dir && kp_cache_configure(dir, false, &err) == 0 && kp_cache_dir());
    char key[KP_SHA256_HEX_LEN];
    kp_cache_key(KEY_TEXT, key);
    snprintf(g_path, sizeof g_path, "%s/v1/inputs", dir);
    mkdir(g_path, 0777);
    snprintf(g_path, sizeof g_path, "%s/v1/inputs/%.2s", dir, key);
    mkdir(g_path, 0777);
    snprintf(g_path + strlen(g_path), sizeof g_path - strlen(g_path), "/%s", key);
    const char *seeds = getenv("KP_FUZZ_WRITE_SEEDS");
    if (seeds) write_seeds(seeds);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(g_path, "wb");
    KP_ASSERT(f && fwrite(data, 1, size, f) == size && fclose(f) == 0);
    kp_cache_entry e;
    char why[256];
    const int got = kp_cache_open("inputs", KEY_TEXT, &e, why, sizeof why);
    KP_ASSERT(got == 1 || got == -1);
    KP_ASSERT(got == 1 || (why[0] && !e.map && !e.meta));
    if (got == 1) {
        KP_ASSERT(e.len == size && e.ntensors >= 0 && e.ntensors <= 2 * KP_MAX_TENSORS);
        const unsigned char *lo = e.map, *hi = lo + e.len, *last = lo;
        unsigned sum = 0;
        for (int k = 0; k < e.ntensors; k++) {
            const unsigned char *p = e.tensors[k].data;
            const size_t bytes = kp_tensor_slice_bytes(&e.tensors[k]) * (size_t)e.slices[k];
            KP_ASSERT(p >= last && p <= hi && bytes <= (size_t)(hi - p));
            for (size_t i = 0; i < bytes; i++) sum += p[i];
            last = p + bytes;
        }
        (void)sum;
    }
    kp_cache_close(&e);
    return 0;
}
