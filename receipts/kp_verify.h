/* kp_verify.h: `verify` (kp_verify.c), which rechecks every byte of a bundle and its chain, finished or cut short. */
#ifndef KP_VERIFY_H
#define KP_VERIFY_H

#include "../cases/kp_common.h"

/* Recheck a bundle: every manifest line, no file added or removed, bundle.json's receipt digests,
 * the chain, every artifact a receipt names, and what the receipts give: bundle.json's verdict and exit
 * code (kp_bundle_verdict_fits), junit.xml, summary.md and report.html byte for byte. 0 when intact;
 * KP_EXIT_INCORRECT with a message naming the first bad file otherwise; KP_EXIT_USAGE when `dir` is not
 * a bundle. A bundle whose run stopped before its manifest (killed, disk full) is KP_EXIT_INCORRECT with
 * a message that begins "incomplete:", names the last receipt and what is missing, after checking that
 * every file there is whole and chained; damage to what is there is reported as for a finished bundle
 * (its reports and verdict are not rendered again: an unfinished run may not have written them). */
int kp_bundle_verify(const char *dir, kp_error *err);

#endif
