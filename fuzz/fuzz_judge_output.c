/* fuzz_judge_output.c: libFuzzer target for `kparity judge`'s reader of outputs made elsewhere
 * (kp_judge_check_output: the .npy decode, then the family's output dtype and shape). Each input is offered as
 * every output tensor of one small case per family, at the case's batch and at a sub-batch of 1 row, as
 * `--impl NAME=FILE` and `NAME@1=FILE` would. Beyond "no crash": a file accepted holds exactly the bytes the
 * judged run will copy (rows x row elements x dtype size), so serving it cannot read past it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/kp_judge.h"
#include "../harness/kp_launch.h"

/* One small case per family: the seed corpus (scripts/fuzz.sh) holds their exported outputs. */
static const char *const cases[] = {
    "topp(batch=4,profile=ordinary,seed=1,top_p=0.95,vocab=1000)",
    "topk(k=16,profile=randn,rows=4,seed=1,width=100)",
    "moe(hidden=256,inter=128,m=2,model=glm53,profile=hot,seed=8)",
    "mla(batch=1,h_q=64,profile=invalid,s_kv=1024,scale=pow2,seed=6,topk=640)",
};

typedef struct target {
    kp_tensor t;
    int64_t rows;
} target;
static target g_targets[64];
static int g_ntargets;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kp_case c;
        kp_error err = {0};
        kp_prepared p;
        if (kp_case_parse(cases[i], &c, &err) || kp_case_normalize(&c, &err))
            kp_abort(__FILE__, __LINE__, "%s: %s", cases[i], err.msg);
        const kp_family *fam = kp_family_find(c.family);
        KP_ASSERT(fam);
        if (kp_prepare(fam, &c, 0, &p, &err)) kp_abort(__FILE__, __LINE__, "%s: %s", cases[i], err.msg);
        const int64_t sizes[2] = {p.v.batch, 1};
        for (int s = 0; s < 2; s++) {
            kp_tensor outs[KP_MAX_TENSORS];
            const int n = fam->outputs(p.v.data, sizes[s], outs);
            for (int k = 0; k < n; k++) {
                KP_ASSERT(g_ntargets < (int)(sizeof g_targets / sizeof *g_targets));
                g_targets[g_ntargets].t = outs[k];
                g_targets[g_ntargets].t.data = NULL;
                g_targets[g_ntargets++].rows = sizes[s];
            }
        }
        kp_prepared_release(&p);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int i = 0; i < g_ntargets; i++) {
        const kp_tensor *t = &g_targets[i].t;
        const int64_t rows = g_targets[i].rows;
        kp_npy_info info;
        kp_error err = {0};
        if (kp_judge_check_output("fuzz.npy", data, size, t, rows, &info, &err)) {
            KP_ASSERT(err.code == KP_EXIT_USAGE && err.msg[0]);
            continue;
        }
        size_t want = kp_dtype_size(t->dtype) * (size_t)rows;
        for (int d = 1; d < t->ndim; d++) want *= (size_t)t->shape[d];
        KP_ASSERT(info.data_bytes == want && info.data_offset + info.data_bytes == size);
        KP_ASSERT(t->dtype != KP_BF16 || !strcmp(info.descr, "<u2") || !strcmp(info.descr, "<i2"));
    }
    return 0;
}
