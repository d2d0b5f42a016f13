#!/bin/sh
# gpu-mla-bench.sh [BASE]: on the GPU machine, the sparse MLA candidate (mla.split_size_wg@cuda) at DeepSeek-V3.2's
# decode shape (h_q 128, topk 2048, fp8_ds_mla cache), batch 1 to 128, by the carried build (.device/kparity) and,
# given BASE, by an older one carried beside it (.device/BASE/kparity, made with device-bundle from that commit's
# build), two rounds alternating: a line a build a round, each batch's median us / TFLOP/s by FlashMLA's formula
# (`kparity bench --reps 50 --no-reference --no-cache`, CUDA events, L2 flushed). The README's table beside
# FlashMLA takes its rows from here and FlashMLA's from scripts/gpu-flashmla.sh, in the same call. Writes
# mla-bench.txt under $OUT; exits 1 when a bench gave no figure, 2 on bad arguments.
set -u
D=$PWD/.device
O=${OUT:-/tmp/kparity-mla-bench}
mkdir -p "$O"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
builds="$D/kparity"
if [ $# -gt 0 ]; then
    [ -x "$D/$1/kparity" ] || { echo "gpu-mla-bench.sh: $D/$1/kparity is not there (device-bundle the base build into it)" >&2; exit 2; }
    builds="$D/$1/kparity $D/kparity"
fi
failed=0
: >"$O/mla-bench.txt"
for round in 1 2; do
    for bin in $builds; do
        line="${bin#"$PWD"/} round $round:"
        for b in 1 2 4 8 16 32 33 34 64 128; do
            m=$("$bin" bench --reps 50 --no-reference --no-cache --impl mla.split_size_wg@cuda \
                --case "mla(batch=$b,h_q=128,profile=uniform,scale=pow2,seed=1,topk=2048)" 2>&1 |
                awk '$1 ~ /^mla\.split_size_wg@cuda/ {print $3 "/" $7}')
            [ -n "$m" ] || { m=none; failed=1; }
            line="$line b$b=$m"
        done
        echo "$line" | tee -a "$O/mla-bench.txt"
    done
done
exit $failed
