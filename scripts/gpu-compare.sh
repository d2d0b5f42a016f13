#!/bin/sh
# gpu-compare.sh BASE: on the GPU machine, the carried build (.device) against an older one carried
# beside it (.device/BASE, made with device-bundle from that commit's build): the CUDA seed gate's conclusions
# must be identical (scripts/gpu-golden.sh: data digests, verdicts, summaries, findings), and `kparity bench` on
# the candidate at 64 x 154,856 runs three times alternating. Writes glm-split-topp-cuda.diff and compare.log under $OUT.
set -u
D=$PWD/.device
B=$D/${1:?usage: gpu-compare.sh BASE}
O=${OUT:-/tmp/kparity-compare}
mkdir -p "$O"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log="$O/compare.log"
cfg=ci/gates/glm-split-topp-cuda.json
OUT="$O" sh scripts/gpu-golden.sh "$1" $cfg >>"$log" 2>&1; echo "gpu-golden.sh exit $? (the seed gate's digests, verdicts and findings; $O/glm-split-topp-cuda.diff)" | tee -a "$log"
c='topp(batch=64,profile=ordinary,seed=58231,top_p=0.95,vocab=154856)'
for i in 1 2 3; do
    for who in base new; do
        bin="$D/kparity"; [ $who = base ] && bin="$B/kparity"
        printf '%s run %d: ' $who $i | tee -a "$log"
        "$bin" bench --impl topp.split_prob@cuda --impl topp.split_logit@cuda --case "$c" --reps 100 2>&1 | grep '@cuda' \
            | awk '{printf "%s %s us; ", $1, $3}' | tee -a "$log"
        echo | tee -a "$log"
    done
done
