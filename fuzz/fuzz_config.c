/* fuzz_config.c: libFuzzer target for the gate config loader (kp_config_load): any bytes as a config file.
 * Loading must end in 0 or an exit class with a message; never a crash, leak or sanitizer report. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../harness/kp_harness.h"

static int g_fd = -1;
static char g_path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (g_fd < 0) {
        /* kp_config_load takes a path: an in-memory file keeps each run off the disk */
        g_fd = memfd_create("kparity-fuzz-config", 0);
        KP_ASSERT(g_fd >= 0);
        snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
    }
    /* "plugins" dlopens the paths it names: loading arbitrary libraries is the hostile-plugin tests' ground
       (issue 20, part 4), not a parser's, so such inputs are left out of the corpus */
    cJSON *doc = cJSON_ParseWithLength((const char *)data, size);
    int has_plugins = cJSON_IsObject(doc) && cJSON_GetObjectItemCaseSensitive(doc, "plugins");
    cJSON_Delete(doc);
    if (has_plugins) return -1;
    KP_ASSERT(ftruncate(g_fd, 0) == 0);
    KP_ASSERT(pwrite(g_fd, data, size, 0) == (ssize_t)size);
    kp_config cfg;
    kp_error err = {0};
    int rc = kp_config_load(g_path, &cfg, &err);
    /* a refusal names what is wrong; a load holds at least one case, each named canonically */
    if (rc) {
        KP_ASSERT(rc == KP_EXIT_USAGE || rc == KP_EXIT_ENV);
        KP_ASSERT(err.msg[0] != '\0');
    } else {
        KP_ASSERT(cfg.ncases > 0);
        for (int i = 0; i < cfg.ncases; i++) {
            kp_case again;
            kp_error e2 = {0};
            KP_ASSERT(kp_case_parse(cfg.cases[i].name, &again, &e2) == 0);
        }
    }
    kp_config_free(&cfg);
    return 0;
}
