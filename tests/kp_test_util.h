/* kp_test_util.h: helpers shared by the Criterion tests: run the kparity binary and capture
 * what it printed, make scratch folders, read and patch files. */
#ifndef KP_TEST_UTIL_H
#define KP_TEST_UTIL_H

#include <stddef.h>

/* Run `argv` (NULL-terminated) with stdout and stderr captured (each truncated to 64 KiB).
 * Returns the exit status, or 128 + signal. The caller frees *out and *errout. */
int kpt_run(char *const argv[], char **out, char **errout);
/* A fresh empty folder under $TMPDIR (or /tmp); the caller frees the path. */
char *kpt_tempdir(void);
/* Read a whole file (NUL-terminated); NULL if it cannot be read. */
char *kpt_read(const char *path, size_t *len);
int kpt_write(const char *path, const void *data, size_t len);
/* Remove a folder tree (best effort). */
void kpt_rmtree(const char *path);

#endif
