/* kp_fileio.h: the file I/O under receipts and bundles (kp_fileio.c): atomic whole-file writes, whole-file reads,
 * the sorted recursive file list the manifest and verify share, and the fault injection the crash tests drive. */
#ifndef KP_FILEIO_H
#define KP_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "../cases/kp_common.h"

/* Write a whole file atomically: temporary file in the same folder, fsync, rename, fsync folder.
 * KP_EXIT_USAGE naming the path when it cannot be created there, KP_EXIT_ENV when a write or sync fails. */
int kp_write_file_atomic(const char *path, const void *data, size_t len, kp_error *err);
/* The same with the folder's sync left to the caller (sync_folder false): many files into one folder, then one
 * kp_sync_folder for all their names, before anything that relies on them is written. */
int kp_write_file_atomic_in(const char *path, const void *data, size_t len, bool sync_folder, kp_error *err);
/* fsync a folder (one file operation of the fault hook); what: the path the error message names. */
int kp_sync_folder(const char *folder, const char *what, kp_error *err);
/* Read a whole file into a malloc'd buffer with a NUL after the data; KP_EXIT_USAGE naming the path. */
int kp_read_file(const char *path, char **buf, size_t *len, kp_error *err);

/* Every file under `dir` as sorted relative paths ('/'-separated, strcmp order = LC_ALL=C sort),
 * folders walked recursively. KP_EXIT_USAGE naming an entry that is neither a regular file nor a
 * folder (a symlink, a socket), or whose name a manifest line cannot hold (control character, backslash). */
int kp_bundle_list_files(const char *dir, char ***paths, size_t *count, kp_error *err);
void kp_bundle_free_list(char **paths, size_t count);
/* Whether a name (no folder) is a temporary file of kp_write_file_atomic: ".<name>.tmp-XXXXXX". */
int kp_bundle_is_temp_name(const char *name);

/* Fault injection for the crash-consistency tests (tests/test_crash.c). KPARITY_FAULT=kill@N,
 * enospc@N or eacces@N acts at this process's Nth file operation that writes (a bundle folder made; a file
 * created, written, synced, closed, renamed into place, its folder synced; counted from 1):
 *   kill@N    SIGKILL there, after writing half when it is a write (the torn temporary file a crash leaves),
 *             and the pid given to kp_fault_also_kill first (a run's supervisor: the whole gate dies at once);
 *   enospc@N  that operation and every later one fails with ENOSPC (a full disk stays full);
 *   eacces@N  every operation from the Nth on that adds or renames a folder entry fails with EACCES.
 * Unset, it costs one predicted branch per operation. kp_fault_point counts one operation and returns 0 (go
 * ahead) or the errno to fail it with (kill does not return); in_folder: the operation adds or renames an
 * entry (mkdir, create, rename). */
int kp_fault_point(int in_folder);
/* Whether KPARITY_FAULT arms a fault in this process (its operations must then come in one order). */
int kp_fault_armed(void);
void kp_fault_also_kill(pid_t pid);

#endif
