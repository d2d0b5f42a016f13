"""Sparse MLA decode in PyTorch (gather, dequantize, two bmm) as kparity's mla family (harness/mla_family.c,
cases/mla_case.h), served through python/kparity_exec.py; run by `kparity gate --config examples/peers/torch_mla.json`.

FlashMLA's layouts as kparity adapts them: q bf16 [batch, s_q, h_q, 576]; indices int32 [batch, s_q, topk], slots of
the whole paged cache (page * page_size + offset: FlashMLA's indices_in_kvcache), -1 none; cache [pages, page, 656]
bytes in fp8_ds_mla (512 e4m3 NoPE codes, 4 f32 scales one a 128-value tile, 64 bf16 RoPE values) or bf16
[pages, page, 576]; optional topk_length int32 [batch, s_q] (slot j counts only when j < it) and attn_sink f32 [h_q].
V is the first 512 columns. Out: out bf16 [batch, s_q, h_q, 512] = sum_j p_j v_j / (sum_j p_j + exp(sink - max)),
lse f32 (natural log, without the sink), max_logits f32 (the largest scaled score); a row with no counted slot gives
out 0, lse +inf, max_logits -inf; duplicate slots count twice. kparity's `splits` output (how a kernel cut the work)
it does not produce: torch_mla.json declares it absent. Scores and weights are float32 here (FlashMLA's are bf16 products with f32 sums, P in bf16).
Case fields left out of case["fields"] are kparity's defaults (cases/mla_case.c): sm_scale 0.135234."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

import kparity_exec  # noqa: E402

SM_SCALE = 0.135234  # DeepSeek-V3.2's, kparity's default


def dequantize(tokens):
    """fp8_ds_mla tokens [..., 656] bytes -> f32 [..., 576]; bf16 tokens [..., 576] -> f32."""
    if tokens.dtype == torch.bfloat16:
        return tokens.float()
    nope = tokens[..., :512].contiguous().view(torch.float8_e4m3fn).float()
    scales = tokens[..., 512:528].contiguous().view(torch.float32)
    rope = tokens[..., 528:656].contiguous().view(torch.bfloat16).float()
    nope = (nope.unflatten(-1, (4, 128)) * scales.unsqueeze(-1)).flatten(-2)
    return torch.cat((nope, rope), -1)


def mla(inputs, case):
    q, slots, cache = inputs["q"], inputs["indices"], inputs["cache"]
    sm_scale = float(case["fields"].get("sm_scale", SM_SCALE))
    batch, s_q, h_q, d_qk = q.shape
    rows, topk = batch * s_q, slots.shape[-1]
    slots = slots.reshape(rows, topk)
    counted = slots >= 0
    if "topk_length" in inputs:
        counted &= torch.arange(topk, device=q.device) < inputs["topk_length"].reshape(rows, 1)
    kv = dequantize(cache.flatten(0, 1)[slots.clamp(min=0).long()])  # [rows, topk, 576]
    kv = torch.where(counted.unsqueeze(-1), kv, 0.0)  # an uncounted slot may name a NaN token
    scores = torch.bmm(q.reshape(rows, h_q, d_qk).float(), kv.transpose(1, 2)) * sm_scale  # [rows, h_q, topk]
    scores = scores.masked_fill(~counted.unsqueeze(1), float("-inf"))
    max_logits = scores.amax(-1)
    m = torch.where(max_logits == float("-inf"), 0.0, max_logits)  # never exp(-inf - -inf)
    p = torch.exp(scores - m.unsqueeze(-1))
    total = p.sum(-1)
    lse = torch.where(total > 0, m + torch.log(total), float("inf"))
    denom = total
    if "attn_sink" in inputs:
        denom = torch.where(total > 0, total + torch.exp(inputs["attn_sink"] - m), total)
    acc = torch.bmm(p, kv[..., :512])  # [rows, h_q, 512]
    ok = (denom > 0) & torch.isfinite(denom)  # no counted slot, or a +inf sink: out 0
    out = torch.where(ok.unsqueeze(-1), acc / denom.clamp(min=1e-30).unsqueeze(-1), 0.0)
    shape = (batch, s_q, h_q)
    return {"out": out.to(torch.bfloat16).reshape(*shape, 512), "lse": lse.reshape(shape),
            "max_logits": max_logits.reshape(shape)}


if __name__ == "__main__":
    kparity_exec.serve({"torch.sparse_mla": mla}, family="mla", device="cuda")
