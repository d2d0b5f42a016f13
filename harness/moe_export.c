/* moe_export.c: the moe family's export stage: what case.json and `kparity export --help` say of each array. */
#include "moe_family.h"

/* What an export says of each array (kparity export, case.json). */
const kp_array_doc kp_moe_array_docs[] = {
    {KP_ARRAY_INPUT, "x", "[m, hidden]: row t is token t", "activations, each with nonzero low 16 bits (rounding one to "
     "bf16 changes it)"},
    {KP_ARRAY_INPUT, "ids", "[m, topk]: as weights", "the experts token t is routed to, distinct within a row"},
    {KP_ARRAY_INPUT, "weights", "[m, topk]: weights[t, j] goes with ids[t, j]", "routing weights (a row sums to 1; none "
     "bf16-representable)"},
    {KP_ARRAY_INPUT, "w13", "[experts, w13_rows, hidden / 2]: w13_rows = 2 inter ([gate; up], gated SiLU) or inter "
     "(relu^2, model=nemotron)", "W13's NVFP4 E2M1 codes, two a byte: element 2i in the low nibble, bit 3 the sign"},
    {KP_ARRAY_INPUT, "s13", "[experts, w13_rows, hidden / 16]", "W13's E4M3 block scales, one per 16 elements along hidden "
     "(linear layout)"},
    {KP_ARRAY_INPUT, "w2", "[experts, hidden, inter / 2]", "W2's NVFP4 E2M1 codes, packed as w13's"},
    {KP_ARRAY_INPUT, "s2", "[experts, hidden, inter / 16]", "W2's E4M3 block scales, one per 16 elements along inter"},
    {KP_ARRAY_INPUT, "global_scales", "[2, experts]: row 0 W13's, row 1 W2's", "per-expert global scales as the case's "
     "scale_dir stores them: divide (2688 / amax; dequantization divides) or multiply (amax / 2688)"},
    {KP_ARRAY_OUTPUT, "out", "[m, hidden]", "sum over j of weights[t, j] * W2_e act(W13_e x_t), e = ids[t, j]"},
    {KP_ARRAY_OUTPUT, "slots", "[m, topk]: as ids", "where each routed pair went: its position among the rows the impl "
     "ran for that expert (the order it worked in, not part of the answer)"},
    {KP_ARRAY_REFERENCE, "out", "[m, hidden]", "out in float64 on the exactly dequantized weights"},
    {KP_ARRAY_REFERENCE, "out@bf16_activations", "[m, hidden]", "the same with each x rounded to bf16 first (nearest, "
     "ties to even), as every W4A16 kernel reads its activations: reported beside a tolerance check's verdict, never in "
     "it"}, 
    {0, NULL, NULL, NULL},
};

