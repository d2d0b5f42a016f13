/* kp_sign.h: signed promotion evidence: an in-toto Statement v1 naming every file of a bundle by
 * SHA-256, with the gate's verdict as its predicate, in a DSSE envelope signed with Ed25519.
 *
 * The bundle keeps one extra file, KP_SIGN_ENVELOPE, written after manifest.sha256 and never listed
 * in it (nor in the statement: it cannot name its own digest):
 *   { "payloadType": KP_SIGN_PAYLOAD_TYPE, "payload": base64(statement),
 *     "signatures": [ {"keyid": sha256 hex of the public key's DER SubjectPublicKeyInfo, "sig": base64} ] }
 * The signature is Ed25519 (pure, no prehash) over DSSE's pre-authentication encoding of the
 * statement bytes, PAE(payloadType, statement), so the payload type is signed too.
 * The statement (printed by kp_json_print, so the same bundle always gives the same bytes):
 *   { "_type": KP_SIGN_STATEMENT_TYPE,
 *     "subject": [ {"name": relative path, "digest": {"sha256": hex}} ... sorted by name, every file
 *                  but the envelope, manifest.sha256 included ],
 *     "predicateType": KP_SIGN_PREDICATE_TYPE,
 *     "predicate": { "verdict", "exit_code", "config": {"name", "sha256"}, "kparity_version",
 *                    "environment" (as bundle.json records it), "chain_head" } }
 * The predicate repeats what bundle.json says, which is itself a subject; verify checks they agree. */
#ifndef KP_SIGN_H
#define KP_SIGN_H

#include <stddef.h>

#include "../cases/kp_common.h"

#define KP_SIGN_ENVELOPE "attestation.dsse.json"
#define KP_SIGN_PAYLOAD_TYPE "application/vnd.in-toto+json"
#define KP_SIGN_STATEMENT_TYPE "https://in-toto.io/Statement/v1"
#define KP_SIGN_PREDICATE_TYPE "https://kparity.dev/gate-verdict/v1"

typedef struct kp_sign_key kp_sign_key;

/* An Ed25519 key from a PEM file: the private key for signing (`openssl genpkey -algorithm ed25519
 * -out key.pem`, unencrypted), the public key for verifying (`openssl pkey -in key.pem -pubout -out
 * pub.pem`). KP_EXIT_USAGE naming the file and the reason: unreadable, no PEM key of the wanted
 * kind in it (a private key given where the public one is wanted says so), another algorithm
 * (named), an encrypted private key. */
int kp_sign_key_load(const char *path, int want_private, kp_sign_key **out, kp_error *err);
void kp_sign_key_free(kp_sign_key *key);
/* SHA-256 hex of the key's public half (DER SubjectPublicKeyInfo): the envelope's keyid. */
const char *kp_sign_keyid(const kp_sign_key *key);

/* DSSE's pre-authentication encoding: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body, LEN the
 * byte count in ASCII decimal. Malloc'd (*len bytes, NUL after them); NULL when out of memory. */
char *kp_dsse_pae(const char *payload_type, const void *body, size_t body_len, size_t *len);

/* The statement of bundle `dir` as it is on disk now (every file but the envelope), malloc'd with
 * a NUL after its *len bytes. KP_EXIT_USAGE when the folder cannot be listed or read, or when
 * bundle.json lacks what the predicate needs (verdict, config.sha256). */
int kp_sign_statement(const char *dir, char **text, size_t *len, kp_error *err);

/* Whether a bundle path is the temporary file of an envelope write that never finished (a `sign` killed or out of
 * space mid-write: "." KP_SIGN_ENVELOPE ".tmp-XXXXXX" at the top). No part of the record: verify passes over it
 * and names it (kp_sign_leftovers); signing leaves it out of the statement and removes it. */
int kp_sign_is_leftover(const char *path);

/* The leftovers in dir's top folder, named in `names` (", " between, cut at `len`): how many, or -1 with err filled
 * when the folder cannot be read. */
int kp_sign_leftovers(const char *dir, char *names, size_t len, kp_error *err);

/* Write dir/KP_SIGN_ENVELOPE atomically (a crash leaves the old envelope or none, never half of
 * one, and at most a leftover the next sign removes); *subjects (if given) receives how many files it names. It signs what is on disk: verify
 * the bundle first (kp_bundle_verify), as `kparity sign` does. */
int kp_sign_bundle(const char *dir, const kp_sign_key *key, size_t *subjects, kp_error *err);

/* Check dir/KP_SIGN_ENVELOPE with a public key: the signature over PAE(payloadType, payload) first
 * (KP_EXIT_INCORRECT, "signature does not verify"), then every subject's digest against the file on
 * disk, no file missing and none added (KP_EXIT_INCORRECT naming the file), then the predicate
 * against bundle.json. KP_EXIT_USAGE when the bundle has no envelope (it was never signed) or cannot
 * be listed. Run after kp_bundle_verify, which checks what the statement does not: the chain. */
int kp_sign_check(const char *dir, const kp_sign_key *key, size_t *subjects, kp_error *err);

#endif
