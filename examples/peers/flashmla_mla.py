"""FlashMLA's sparse FP8 decode (deepseek-ai/FlashMLA, `flash_mla_with_kvcache` with `indices`, SM90) as kparity's mla
family, served through python/kparity_exec.py; run by `kparity gate --config examples/peers/flashmla_mla.json` and
timed beside kparity's kernels by scripts/gpu-flashmla.sh. FlashMLA is installed nowhere: that script builds it from its
public source in a git-ignored folder and puts it on PYTHONPATH (never commit that source).

kparity's layouts (examples/peers/torch_mla.py has them whole) are FlashMLA's own but for these, declared, not judged:
- FlashMLA's decode returns no max_logits: flashmla_mla.json declares it absent, with kparity's `splits`.
- FlashMLA returns lse as [batch, h_q, s_q]; it goes back as kparity's [batch, s_q, h_q] (the same values).
- In the V3.2 layout (d_qk 576) FlashMLA applies no topk_length to a slot's validity (families.md D3) and takes one a
  request, kparity one a (request, query row): the slots past a row's topk_length are handed over as -1, FlashMLA's
  invalid slot, which is kparity's rule for them.
- Only fp8_ds_mla caches: a bf16 cache is refused (NOT_SUPPORTED), as FlashMLA's sparse decode refuses it.
The cache arrives as bytes [pages, page, 656] and goes to FlashMLA as its float8_e4m3fn [pages, page, 1, 656] view.
Case fields left out of case["fields"] are kparity's defaults (cases/mla_case.c): sm_scale 0.135234."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

import flash_mla  # noqa: E402
import kparity_exec  # noqa: E402

SM_SCALE = 0.135234  # DeepSeek-V3.2's, kparity's default


def mla(inputs, case):
    q, slots, cache = inputs["q"], inputs["indices"], inputs["cache"]
    if cache.dtype != torch.uint8 or cache.shape[-1] != 656:
        raise kparity_exec.NotSupported("FlashMLA's sparse decode reads fp8_ds_mla caches (656 bytes a token) only")
    if q.shape[-1] != 576:
        raise kparity_exec.NotSupported("the V3.2 layout (d_qk 576) only")
    sm_scale = float(case["fields"].get("sm_scale", SM_SCALE))
    if "topk_length" in inputs:
        topk = slots.shape[-1]
        keep = torch.arange(topk, device=slots.device) < inputs["topk_length"].unsqueeze(-1)
        slots = torch.where(keep, slots, torch.full_like(slots, -1))
    sched, _ = flash_mla.get_mla_metadata()  # per call: a schedule may be reused only for the same lengths
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, cache.view(torch.float8_e4m3fn).unsqueeze(2), None, None, 512, sched, None, softmax_scale=sm_scale,
        is_fp8_kvcache=True, indices=slots.contiguous(), attn_sink=inputs.get("attn_sink"))
    return {"out": out, "lse": lse.transpose(1, 2).contiguous()}


if __name__ == "__main__":
    kparity_exec.serve({"flashmla.sparse_decode": mla}, family="mla", device="cuda")
