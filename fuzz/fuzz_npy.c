/* fuzz_npy.c: libFuzzer target for the .npy reader (kp_npy_decode), on which replay, merge and judge read files
 * from elsewhere. Beyond "no crash": what a decode accepts lies inside the buffer, and encoding its header again
 * decodes to the same array description. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kp_npy_info info, again;
    kp_error err = {0};
    if (kp_npy_decode(data, size, &info, &err)) {
        KP_ASSERT(err.code == KP_EXIT_USAGE && err.msg[0]);
        return 0;
    }
    KP_ASSERT(info.ndim >= 0 && info.ndim <= KP_NPY_MAX_DIMS);
    KP_ASSERT(info.data_offset <= size && size - info.data_offset == info.data_bytes);
    unsigned char *buf = NULL;
    size_t len = 0;
    /* what decode accepts, encode writes (one descr table, one shape rule) */
    KP_ASSERT(kp_npy_encode(info.descr, info.ndim, info.shape, data + info.data_offset, info.data_bytes, &buf, &len, &err) == 0);
    KP_ASSERT(kp_npy_decode(buf, len, &again, &err) == 0);
    KP_ASSERT(!strcmp(info.descr, again.descr) && info.ndim == again.ndim && info.itemsize == again.itemsize &&
              info.data_bytes == again.data_bytes);
    KP_ASSERT(!memcmp(info.shape, again.shape, sizeof info.shape));
    KP_ASSERT(!memcmp(buf + again.data_offset, data + info.data_offset, info.data_bytes));
    free(buf);
    return 0;
}
