#!/bin/sh
# gpu-flashmla.sh: FlashMLA's sparse FP8 decode beside kparity's sparse MLA decodes, on the GPU machine, in one call:
# its build from public source, its gate (examples/peers/flashmla_mla.json), its kernel timed alone
# (scripts/flashmla-time.py) and one bench table of FlashMLA (through exec: the whole Python call) and kparity's
# three CUDA impls at DeepSeek-V3.2's decode shape, batch 1 to 128 (CUDA events, L2 flushed, TFLOP/s by FlashMLA's
# formula). Here, once (both folders git-ignored through .git/info/exclude: never commit them):
#   mkdir -p .peers/FlashMLA/csrc/cutlass
#   git --git-dir=<fetched deepseek-ai/FlashMLA> archive 9241ae3 | tar -x -C .peers/FlashMLA
#   git --git-dir=<fetched NVIDIA/cutlass> archive 147f5673d0c1c3dcf66f78d677fd647e4a020219 include tools/util/include \
#       | tar -x -C .peers/FlashMLA/csrc/cutlass          # FlashMLA's submodule at its pinned commit (30 MB in all)
#   cmake --build build -j2 && ../shared/tools/device-bundle .device build/kparity
# then on the GPU machine, from the checkout root, carrying .device and .peers: sh scripts/gpu-flashmla.sh
# Everything goes under $OUT (or /tmp/kparity-flashmla); exit 3 when FlashMLA does not build.
set -u
D=$PWD/.device
O=${OUT:-/tmp/kparity-flashmla}
mkdir -p "$O"
export PATH="/opt/torch/.venv/bin:$PATH" LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! (cd .peers/FlashMLA && FLASH_MLA_DISABLE_SM100=1 CPLUS_INCLUDE_PATH=/usr/local/cuda/include/cccl NVCC_THREADS=2 \
      MAX_JOBS=16 python setup.py build_ext --inplace) >"$O/flashmla-build.log" 2>&1; then
    tail -n 40 "$O/flashmla-build.log"
    exit 3
fi
export PYTHONPATH="$PWD/.peers/FlashMLA${PYTHONPATH:+:$PYTHONPATH}"
"$D/kparity" gate --config examples/peers/flashmla_mla.json --out "$O/B-flashmla" --quiet
echo "gate examples/peers/flashmla_mla.json: exit $?"
python3 scripts/flashmla-time.py --reps 50 >"$O/flashmla-time.txt" 2>&1
echo "flashmla-time.py: exit $?"
cat "$O/flashmla-time.txt"
set --
for b in 1 2 4 8 16 32 64 128; do set -- "$@" --case "mla(batch=$b,h_q=128,profile=uniform,scale=pow2,seed=1,topk=2048)"; done
"$D/kparity" bench --reps 50 --no-reference --exec "mla:flashmla.sparse_decode=python3 examples/peers/flashmla_mla.py" \
    --absent flashmla.sparse_decode=max_logits,splits \
    --impl mla.split_count@cuda --impl mla.split_size@cuda --impl mla.split_size_wg@cuda "$@" >"$O/bench.txt" 2>&1
rc=$?
cat "$O/bench.txt"
echo "bench: exit $rc"
