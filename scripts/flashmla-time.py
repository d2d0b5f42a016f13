"""FlashMLA's sparse FP8 decode kernel timed on its own, at the shape `kparity bench` times kparity's mla impls
(h_q 128, s_q 1, topk 2048, s_kv 4096 a request in its own 64-token pages, indices uniform over the request's tokens,
fp8_ds_mla, d 576/512), the way kparity bench and peers.md time kernels: CUDA events around the kernel alone, L2
flushed before each rep, the median of the reps. The schedule (FlashMLA's metadata) is made by a first untimed call and
reused, as FlashMLA's own benchmark does for fixed lengths. The exec row of scripts/gpu-flashmla.sh times the whole
Python call (the metadata kernel, launches, lse transpose); this is the kernel's figure to set beside kparity's.
TFLOP/s by FlashMLA's formula, 2 * h_q * attended tokens * (576 + 512).
Usage, on the GPU machine with FlashMLA built (scripts/gpu-flashmla.sh) and on PYTHONPATH:
    python3 scripts/flashmla-time.py [--reps 50] [BATCH ...]            (default batches 1 2 4 8 16 32 64 128)
The values are random, not kparity's seeded case: FlashMLA's time depends on the shape and the index pattern, which
are the same; its numerics on kparity's own cases are judged by examples/peers/flashmla_mla.json."""
import argparse
import statistics
import sys

import torch

import flash_mla

H_Q, D_QK, D_V, TOPK, S_KV, PAGE, TOKEN_BYTES = 128, 576, 512, 2048, 4096, 64, 656


def fp8_cache(tokens, gen):
    """tokens x 656 bytes: 512 e4m3 codes, 4 f32 scales (powers of two), 64 bf16 RoPE dims; as fp8 [pages, 64, 1, 656]."""
    codes = (torch.randn(tokens, 512, generator=gen, device="cuda") * 32).to(torch.float8_e4m3fn).view(torch.uint8)
    scales = torch.exp2(torch.randint(-8, -4, (tokens, 4), generator=gen, device="cuda").float()).view(torch.uint8)
    rope = torch.randn(tokens, 64, generator=gen, device="cuda").to(torch.bfloat16).view(torch.uint8)
    raw = torch.cat([codes, scales.reshape(tokens, 16), rope.reshape(tokens, 128)], dim=1)
    assert raw.shape[1] == TOKEN_BYTES
    return raw.view(torch.float8_e4m3fn).reshape(tokens // PAGE, PAGE, 1, TOKEN_BYTES)


def time_batch(batch, reps, gen, flush):
    q = torch.randn(batch, 1, H_Q, D_QK, generator=gen, device="cuda").to(torch.bfloat16)
    cache = fp8_cache(batch * S_KV, gen)
    idx = torch.stack([torch.randperm(S_KV, generator=gen, device="cuda")[:TOPK] + b * S_KV for b in range(batch)])
    idx = idx.to(torch.int32).reshape(batch, 1, TOPK).contiguous()
    sched, _ = flash_mla.get_mla_metadata()

    def call():
        return flash_mla.flash_mla_with_kvcache(q, cache, None, None, D_V, sched, None, softmax_scale=0.135234,
                                                is_fp8_kvcache=True, indices=idx)

    call()  # makes the schedule
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    med = statistics.median(times)
    tflops = 2.0 * H_Q * batch * TOPK * (D_QK + D_V) / (med * 1e-6) / 1e12
    return med, min(times), tflops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("batches", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32, 64, 128])
    a = ap.parse_args()
    if a.reps < 1 or any(b < 1 for b in a.batches):
        print("flashmla-time: --reps and every batch must be at least 1", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(1)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # past the H200's 50 MB L2
    print(f"FlashMLA sparse decode kernel, {torch.cuda.get_device_name()}, h_q {H_Q}, topk {TOPK}, reps {a.reps}")
    print("batch  median_us  min_us  TFLOP/s")
    for b in a.batches:
        med, lo, tf = time_batch(b, a.reps, gen, flush)
        print(f"{b:5d}  {med:9.1f}  {lo:6.1f}  {tf:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
