#!/bin/sh
# gpu-compare.sh BASE: on the GPU machine, the carried build (.device) against an older one carried
# beside it (.device/BASE, made with device-bundle from that commit's build): the CUDA seed gate's input,
# reference and output digests must be identical (scripts/bundle-digests.py), and `kparity bench` on the
# candidate at 64 x 154,856 runs three times alternating. Writes digests.diff and compare.log under $OUT.
set -u
D=$PWD/.device
B=$D/${1:?usage: gpu-compare.sh BASE}
O=${OUT:-/tmp/kparity-compare}
mkdir -p "$O"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log="$O/compare.log"
cfg=ci/gates/glm-split-topp-cuda.json
rm -rf /tmp/cmp-base /tmp/cmp-new
"$B/kparity" gate --config $cfg --out /tmp/cmp-base --quiet >>"$log" 2>&1; echo "base gate exit $?" >>"$log"
"$D/kparity" gate --config $cfg --out /tmp/cmp-new --quiet >>"$log" 2>&1; echo "new gate exit $?" >>"$log"
python3 scripts/bundle-digests.py /tmp/cmp-base >/tmp/cmp-base.txt
python3 scripts/bundle-digests.py /tmp/cmp-new >/tmp/cmp-new.txt
diff /tmp/cmp-base.txt /tmp/cmp-new.txt >"$O/digests.diff"
echo "digests: $(wc -l </tmp/cmp-new.txt) compared, diff exit $? ($(wc -l <"$O/digests.diff") lines differ)" | tee -a "$log"
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
