#!/bin/sh
# gpu-golden.sh BASE [CONFIG...]: on the GPU machine, every shipped gate (ci/gates/*.json, or the configs named) run
# by the carried build (.device/kparity) and by an older one carried beside it (.device/BASE/kparity, made with
# device-bundle from that commit's build), and what each concludes compared: its data digests, verdict, every case's
# result and every check's result, summary and findings digest (scripts/bundle-digests.py --checks). A refactor must
# leave them all equal; the plain build's gate_* tests hold the host gates to tests/golden/ the same way. The two builds
# run one gate at a time, side by side. Writes <config>.diff per gate and golden.log under $OUT; exits 1 when any
# differs, 2 on bad arguments.
set -u
D=$PWD/.device
B=$D/${1:?usage: gpu-golden.sh BASE [CONFIG...]}
shift
[ -x "$B/kparity" ] || { echo "gpu-golden.sh: $B/kparity is not there (device-bundle the base build into it)" >&2; exit 2; }
O=${OUT:-/tmp/kparity-golden}
mkdir -p "$O"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PY=python3
[ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
log="$O/golden.log"
[ $# -gt 0 ] || set -- ci/gates/*.json
differ=0
for cfg in "$@"; do
    name=$(basename "$cfg" .json)
    rm -rf "/tmp/golden-base-$name" "/tmp/golden-new-$name"
    start=$(date +%s)
    "$B/kparity" gate --config "$cfg" --out "/tmp/golden-base-$name" --quiet >"$O/$name.base.log" 2>&1 &
    base_pid=$!
    "$D/kparity" gate --config "$cfg" --out "/tmp/golden-new-$name" --quiet >"$O/$name.new.log" 2>&1
    new_rc=$?
    wait $base_pid
    base_rc=$?
    "$PY" scripts/bundle-digests.py --checks "/tmp/golden-base-$name" >"/tmp/golden-base-$name.txt"
    "$PY" scripts/bundle-digests.py --checks "/tmp/golden-new-$name" >"/tmp/golden-new-$name.txt"
    if diff "/tmp/golden-base-$name.txt" "/tmp/golden-new-$name.txt" >"$O/$name.diff" && [ $base_rc = $new_rc ]; then
        verdict=same
    else
        verdict=DIFFERENT
        differ=1
    fi
    echo "$name: exit base $base_rc new $new_rc; $(wc -l <"/tmp/golden-new-$name.txt") lines compared; $verdict" \
         "($(($(date +%s) - start)) s)" | tee -a "$log"
done
exit $differ
