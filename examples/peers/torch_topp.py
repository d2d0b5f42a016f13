"""The PyTorch sort-based top-p filter as kparity's topp family (harness/topp_family.c), served through
python/kparity_exec.py; run by `kparity gate --config examples/peers/torch_topp.json`, not by hand.

In: logits f32 [batch, vocab] (dense: kparity drops any row padding), top_p f32 [batch]. Out: out f32 [batch, vocab],
the logits kept and -inf elsewhere. The filter: probabilities sorted descending (stable: equal ones by index), a token
kept while the float32 cumulative mass before it is below top_p, the first always. Its mass is summed in float32, so
near a flat row's boundary it keeps tokens the float64 rule drops (the config's expect control). With stable=True,
torch 2.11 takes dim only as a keyword: sort(-1, descending=True, stable=True) raises."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

import kparity_exec  # noqa: E402


def topp(inputs, case):
    x, p = inputs["logits"], inputs["top_p"].view(-1, 1)
    probs, idx = x.softmax(-1).sort(dim=-1, descending=True, stable=True)
    keep = (probs.cumsum(-1) - probs) < p
    keep[:, 0] = True
    kept = torch.where(keep, x.gather(-1, idx), float("-inf"))
    return {"out": torch.full_like(x, float("-inf")).scatter(-1, idx, kept)}


if __name__ == "__main__":
    kparity_exec.serve({"torch.topp_sort": topp}, family="topp", device="cuda")
