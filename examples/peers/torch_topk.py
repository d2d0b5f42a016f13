"""torch.topk as kparity's topk family (harness/topk_family.c), served through python/kparity_exec.py; run by
`kparity gate --config examples/peers/torch_topk.json`, not by hand.

In: scores f32 [rows, width], each row's window [starts, ends) (int32 [rows]). Out: indices int32 [rows, k], ascending
(the config's order "index"; torch.topk's own order is by value), relative to the row (base=row) or to the window
(base=window); past a window shorter than k the fill index (-1, or INT32_MAX with fill=int32_max) and value -inf;
values f32 [rows, k], the scores at those indices. Case fields left out of case["fields"] are kparity's defaults
(cases/topk_case.c): base row, fill -1. NaN is taken as torch.topk ranks it: above every number."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

import kparity_exec  # noqa: E402

INT32_MAX = 2**31 - 1


def topk(inputs, case):
    fields = case["fields"]
    scores, starts, ends = inputs["scores"], inputs["starts"], inputs["ends"]
    k, (rows, width) = int(fields["k"]), scores.shape
    by_window = fields.get("base", "row") == "window"
    fill = INT32_MAX if fields.get("fill", "-1") == "int32_max" else -1
    if k <= width and bool((starts == 0).all()) and bool((ends == width).all()):  # whole rows: one call
        idx = torch.topk(scores, k, dim=-1).indices.sort(dim=-1).values
        return {"indices": idx.int(), "values": scores.gather(-1, idx)}
    idx = torch.full((rows, k), fill, dtype=torch.int32, device=scores.device)
    val = torch.full((rows, k), float("-inf"), dtype=torch.float32, device=scores.device)
    for r, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):  # a window a row
        n = min(k, e - s)
        if n <= 0:
            continue
        sel = torch.topk(scores[r, s:e], n).indices.sort().values
        idx[r, :n] = (sel if by_window else sel + s).int()
        val[r, :n] = scores[r, s:e][sel]
    return {"indices": idx, "values": val}


if __name__ == "__main__":
    kparity_exec.serve({"torch.topk": topk}, family="topk", device="cuda")
