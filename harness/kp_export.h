/* kp_export.h: `kparity export`, one case as .npy files and a case.json (schema kparity.export/1) that says what each
 * file is (harness/export.c), and the reader with which `kparity judge DIR` takes such a folder back
 * (harness/export_index.c). */
#ifndef KP_EXPORT_H
#define KP_EXPORT_H

#include <stdbool.h>
#include <stdio.h>

#include "kp_harness.h"
#include "kp_launch.h"

#define KP_EXPORT_SCHEMA "kparity.export/1"
#define KP_EXPORT_INDEX "case.json"

typedef struct kp_export_options {
    const char *case_name;
    const char *out;          /* the folder: new, empty, or with force a previous export's */
    const char *const *impls; /* as given, "@auto" resolved as a gate config resolves it; none: every impl of the
                                 family that can run here */
    int nimpls;
    bool force;               /* replace a previous export at out: only a folder whose every file its case.json names */
} kp_export_options;

/* Export a case: inputs, reference arrays, the family's extras, each impl's outputs, and case.json, written into a
 * folder beside out and renamed into place whole, so out never holds a partial export: on any failure nothing is left
 * at out or beside it (a process killed mid-way can leave the hidden folder .<out>.kparity-export-XXXXXX beside).
 * *nfiles gets the files written, case.json included. KP_EXIT_USAGE for a bad case, impl or folder, naming it;
 * KP_EXIT_ENV for an impl that failed or a disk that did. */
int kp_export_case(const kp_export_options *opt, int *nfiles, kp_error *err);

/* Every array a prepared case's export writes (inputs, outputs, reference arrays and extras) is documented by its
 * family (kp_array_doc): KP_EXIT_ENV naming the first that is not. Export checks it before writing anything. */
int kp_export_check_docs(kp_prepared *p, kp_error *err);

/* `kparity export --help`'s list of the files an export may write, per family, from the families' array docs. */
void kp_export_help(FILE *to);

/* Every file dir/case.json names (inputs, reference, extras, each impl's files) with the SHA-256 it records, each a
 * plain name in the folder and a 64-digit digest, none twice (harness/export_index.c); the strings point into *doc
 * (cJSON_Delete it, free *files). KP_EXIT_USAGE naming case.json and the field: no such file, not JSON, another schema. */
typedef struct kp_export_file {
    const char *file, *sha256;
    char where[96]; /* its JSON path, for messages */
} kp_export_file;
int kp_export_index(const char *dir, cJSON **doc, kp_export_file **files, size_t *n, kp_error *err);

/* An export read back: its case and each exported impl's output files (dir/file), in the family's output order.
 * Every file case.json names was checked against the SHA-256 it records. */
typedef struct kp_export_impl {
    char name[128];
    int nfiles;
    char *files[KP_MAX_TENSORS];
} kp_export_impl;
typedef struct kp_export_folder {
    char case_name[KP_CASE_NAME_MAX];
    kp_export_impl *impls;
    int nimpls;
} kp_export_folder;
/* KP_EXIT_USAGE naming dir/case.json and the field, or the file whose bytes are not what case.json records. */
int kp_export_read(const char *dir, kp_export_folder *out, kp_error *err);
void kp_export_folder_free(kp_export_folder *f);

#endif
