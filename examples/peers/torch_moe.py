"""An NVFP4 MoE in PyTorch (dequantize to bf16, torch._grouped_mm) as kparity's moe family (harness/moe_family.c,
cases/moe_case.h, cases/kp_nvfp4.h), served through python/kparity_exec.py; run by
`kparity gate --config examples/peers/torch_moe.json`. `torch_moe.py loop` runs a bf16 matmul per expert instead.

In: x f32 [m, hidden]; ids int32 [m, topk] (distinct experts a row) and weights f32 [m, topk]; w13 [experts, R, hidden / 2]
and w2 [experts, hidden, inter / 2] packed E2M1 codes (element 2i in the low nibble of byte i), s13 [experts, R,
hidden / 16] and s2 [experts, hidden, inter / 16] E4M3 block scales, global_scales f32 [2, experts] (W13's, W2's).
R = 2 inter ([gate; up]) for the gated SiLU models, inter for nemotron's relu(up)^2. Out: out f32 [m, hidden] =
sum_j weights[t, j] W2_e act(W13_e x_t), and slots int32 [m, topk]: pair (t, j)'s position among the rows run for
its expert (here in (t, j) order: a stable sort by expert), which batch probes read to see rows move.
Case fields left out of case["fields"] are kparity's defaults (cases/moe_case.c): scale_dir divide (the global scale
stored as 2688 / amax; dequantization divides by it; `multiply`: stored as amax / 2688). Sizes come from the tensors."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

import kparity_exec  # noqa: E402

RELU2_MODELS = {"nemotron"}  # the others: silu(gate) * up
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
GROUPED = (sys.argv[1] if len(sys.argv) > 1 else "grouped") == "grouped"
_weights = {}  # dequantized weights of the inputs last seen (kparity hands unchanged ones over as the same objects)


def dequantize(packed, scales, gscale, divide, chunk=16):
    """[E, N, K / 2] codes, [E, N, K / 16] E4M3 scales, [E] global -> bf16 [E, N, K], a chunk of experts at a time."""
    e, n, k = packed.shape[0], packed.shape[1], packed.shape[2] * 2
    lut = torch.tensor(E2M1, device=packed.device)
    out = torch.empty((e, n, k), dtype=torch.bfloat16, device=packed.device)
    for a in range(0, e, chunk):
        b = min(e, a + chunk)
        codes = torch.stack((packed[a:b] & 0xF, packed[a:b] >> 4), -1).flatten(-2)
        v = lut[codes.long()].unflatten(-1, (k // 16, 16)) * scales[a:b].view(torch.float8_e4m3fn).float().unsqueeze(-1)
        g = gscale[a:b].view(-1, 1, 1)
        out[a:b] = (v.flatten(-2) / g if divide else v.flatten(-2) * g).to(torch.bfloat16)
    return out


def weights(inputs, divide):
    key = tuple(inputs[n] for n in ("w13", "s13", "w2", "s2", "global_scales")) + (divide,)
    held = _weights.get("key")
    if held is None or len(held) != len(key) or any(a is not b for a, b in zip(held, key)):
        g = inputs["global_scales"]
        _weights.update(key=key, w13=dequantize(inputs["w13"], inputs["s13"], g[0], divide),
                        w2=dequantize(inputs["w2"], inputs["s2"], g[1], divide))
    return _weights["w13"], _weights["w2"]


def expert_mm(a, w, counts, offs):
    """Rows of a grouped by expert (counts[e] rows for expert e, offs its cumulative ends) times w[e]^T: bf16 [rows, N]."""
    if GROUPED:
        return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    out, start = a.new_empty((a.shape[0], w.shape[1])), 0
    for e, c in enumerate(counts.tolist()):
        if c:
            out[start:start + c] = a[start:start + c] @ w[e].T
            start += c
    return out


def moe(inputs, case):
    fields = case["fields"]
    x, ids, wts = inputs["x"], inputs["ids"], inputs["weights"]
    w13, w2 = weights(inputs, fields.get("scale_dir", "divide") == "divide")
    m, topk = ids.shape
    inter = w2.shape[2]
    gated = fields["model"] not in RELU2_MODELS
    assert w13.shape[1] == (2 if gated else 1) * inter, "W13 rows do not match the model's activation"
    flat = ids.flatten().long()
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, (t, j) order inside one
    counts = torch.bincount(flat, minlength=w13.shape[0])
    offs = counts.cumsum(0).int()
    h = expert_mm(x[order // topk].to(torch.bfloat16), w13, counts, offs).float()
    act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:] if gated else torch.relu(h) ** 2
    y = expert_mm(act.to(torch.bfloat16), w2, counts, offs).float()
    pair = torch.empty_like(y)
    pair[order] = y  # back to (t, j) order: the sum over j below runs in a fixed order, no atomics
    out = (pair.view(m, topk, -1) * wts.unsqueeze(-1)).sum(1)
    position = torch.empty_like(flat)
    position[order] = torch.arange(flat.numel(), device=flat.device)
    slots = position - (offs.long() - counts)[flat]
    return {"out": out, "slots": slots.view(m, topk).int()}


if __name__ == "__main__":
    kparity_exec.serve({"torch.nvfp4_moe": moe}, family="moe", device="cuda")
