/* progress.c: the progress line of gate, run and bench (kp_progress.h): one format, one estimate of the time
 * left, so every long command says the same thing the same way. */
#include "kp_progress.h"

#include <stdio.h>

void kp_progress(int json, int i, int n, const char *name, const char *result, double item_s, double elapsed) {
    const double left = i + 1 < n ? elapsed / (i + 1) * (n - i - 1) : 0.0;
    if (json) {
        printf("{\"event\":\"case\",\"index\":%d,\"of\":%d,\"case\":\"%s\",\"result\":\"%s\",\"seconds\":%.3f,"
               "\"elapsed\":%.3f,\"eta\":%.3f}\n", i + 1, n, name, result, item_s, elapsed, left);
        fflush(stdout);
    } else {
        fprintf(stderr, "[%d/%d] %-13s %6.2fs  elapsed %6.1fs  left ~%5.1fs  %s\n", i + 1, n, result, item_s, elapsed,
                left, name);
    }
}
