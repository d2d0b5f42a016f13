/* kp_exec.h: outside impls that are programs (a Python module serving a torch op, a Triton or CUDA kernel of another
 * project): kparity starts the program in its worker process and drives it through every check like an impl of its own.
 *
 * The protocol, kparity.exec/1 (python/kparity_exec.py is a client; any language that reads JSON lines and .npy
 * headers can be one):
 *   - kparity starts the program with: fd 0 its requests (JSON lines), fd 1 its replies (JSON lines; a client keeps
 *     its own prints off it), fd 2 captured (its tail goes into the receipt when something fails), fd 3 a shared
 *     memory file (memfd) that holds the arrays, and KPARITY_EXEC_PROTOCOL=kparity.exec/1, KPARITY_EXEC_SHM_FD=3 in
 *     its environment.
 *   - The program's first line is its handshake: {"protocol": "kparity.exec/1", "impls": {"NAME": {"family": F}, ...},
 *     "versions": {"python": ..., "torch": ..., ...}}. kparity refuses a program of another protocol, one that does
 *     not serve the impl the config names, or serves it for another family.
 *   - One request per launch (every full-batch run, every repeat, every batch probe):
 *     {"op": "run", "id": N, "impl": NAME, "case": {"name", "family", "fields": {...}}, "rows": [case rows run, in
 *     order], "nrows": N, "time": bool, "shm_bytes": size of the shared file now, "absent": [outputs not asked for],
 *     "inputs": [{"name", "offset", "bytes"}], "outputs": [{"name", "offset", "capacity", "dtype", "shape"}]}.
 *     Each input is a whole .npy (header and data) at its offset, in the family's names, dtypes and layouts (bf16 as
 *     '<u2' bits; a batched input holds the run's rows only). A shared (not batched) input that is, byte for byte and at
 *     the same offset, the one of the program's previous request has "reused": true: the program may keep what it made
 *     of it (a batch check at 800 rows is 800+ requests, each re-reading hundreds of MB of weights otherwise). The program writes each output as a whole .npy at its
 *     offset, at most `capacity` bytes, and replies
 *     {"id": N, "status": "ok" | "error" | "not_supported", "message": ..., "outputs": {"NAME": bytes written},
 *     "device_us": its own timing of the call (optional), "note": free text (optional), "context_lost": true (with
 *     an error whose CUDA context is gone: kparity ends the program and starts a fresh one for the next launch)}.
 *     kparity reads every output's header itself: a wrong dtype or shape fails the case whatever the reply says.
 *     An output the config declares absent is not asked for (not in "outputs"); any other left unwritten fails.
 *   - End: kparity closes fd 0 and the program exits. A crash, a reply that is not the protocol, no reply within the
 *     impl's timeout: the case FAILS with the program's stderr tail, the program is ended, and the next launch
 *     starts it afresh. */
#ifndef KP_EXEC_H
#define KP_EXEC_H

#include <cjson/cJSON.h>

#include "kp_harness.h"

#define KP_EXEC_PROTOCOL "kparity.exec/1"

/* An outside program as a config declares it: impls.ROLE = {"exec": [argv...], "impl": NAME (absent: the one impl the
 * program serves), "family": F (when the role does not name it), "absent": [outputs it does not produce, e.g.
 * an output the program does not make, or an order output], "sha256": {"FILE": hex, ...} (pins), "timeout_s": seconds a
 * request may take}. */
typedef struct kp_exec_decl {
    char family[16];
    const cJSON *absent;   /* outputs it does not produce (an array of names), or NULL */
    char program_impl[64]; /* the name the program serves, e.g. "mylib.filter_v2"; "": the one impl it serves */
    char role[64];         /* names the impl when program_impl is "" */
    char **argv;           /* NULL-terminated */
    const cJSON *pins;     /* object FILE: hex, or NULL */
    double timeout_s;      /* 0: 300 s */
} kp_exec_decl;

/* Register the program as an impl named "<family>.<program impl>@exec" (dots of the program's name become '_'):
 * every file its command names (the program found on PATH included) is hashed now, a pinned one with another digest
 * refused (exit 2 naming it) before anything runs. The program itself starts at the first launch, in the process that
 * launches. `where` names the config field in errors. */
int kp_exec_register(const kp_exec_decl *decl, const char *where, const kp_impl **out, kp_error *err);
/* The command line's form, "[FAMILY:]IMPL=COMMAND ARGS..." (split at spaces; family defaults to `family` when not
 * NULL), e.g. --exec FAMILY:NAME="python3 PROGRAM.py": into decl (kp_exec_decl_free). */
int kp_exec_arg(const char *arg, const char *family, kp_exec_decl *decl, kp_error *err);
/* Parse impls.ROLE's object form into decl (argv malloc'd: kp_exec_decl_free). */
int kp_exec_parse(const cJSON *obj, const char *role, const char *where, kp_exec_decl *decl, kp_error *err);
void kp_exec_decl_free(kp_exec_decl *decl);

/* Whether impl is an exec impl; what a receipt records of one (command, the program's impl, each file's SHA-256,
 * the versions it reported, requests and restarts so far) into an impl entry; nothing for other impls. */
int kp_impl_is_exec(const kp_impl *impl);
void kp_exec_describe(const kp_impl *impl, cJSON *entry);
/* End every running program (at the end of a run; each is started again on its next launch). */
void kp_exec_stop_all(void);

#endif
