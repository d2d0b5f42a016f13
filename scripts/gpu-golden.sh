#!/bin/sh
# gpu-golden.sh BASE [CONFIG...]: on the GPU machine, every shipped gate (ci/gates/*.json, or the configs named) run
# by the carried build (.device/kparity) and by an older one carried beside it (.device/BASE/kparity, made with
# device-bundle from that commit's build), and what each concludes compared: its data digests, verdict, every case's
# result and every check's result, summary and findings digest (scripts/bundle-digests.py --checks). A refactor must
# leave them all equal; the plain build's gate_* tests hold the host gates to tests/golden/ the same way. The older
# build runs each gate twice: a line that differs between its own two runs (an incumbent the gate exists to catch
# varying run to run: an atomic MoE, a top-k picking ties by arrival), and every check of an impl whose output so
# varies, is reported as varying, not compared. The runs
# of one gate go side by side. Writes <config>.diff per gate and golden.log under $OUT; exits 1 when a line that does
# not vary differs, 2 on bad arguments.
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
    rm -rf "/tmp/golden-base-$name" "/tmp/golden-again-$name" "/tmp/golden-new-$name"
    start=$(date +%s)
    "$B/kparity" gate --config "$cfg" --out "/tmp/golden-base-$name" --quiet >"$O/$name.base.log" 2>&1 &
    base_pid=$!
    "$B/kparity" gate --config "$cfg" --out "/tmp/golden-again-$name" --quiet >"$O/$name.again.log" 2>&1 &
    again_pid=$!
    "$D/kparity" gate --config "$cfg" --out "/tmp/golden-new-$name" --quiet >"$O/$name.new.log" 2>&1
    new_rc=$?
    wait $base_pid
    base_rc=$?
    wait $again_pid
    for run in base again new; do
        "$PY" scripts/bundle-digests.py --checks "/tmp/golden-$run-$name" >"/tmp/golden-$run-$name.txt"
        cp "/tmp/golden-$run-$name.txt" "$O/$name.$run.txt"
    done
    # a line's key: what it is of (case, check number and kind and impl, or data and tensor), without its value
    verdict=$("$PY" - "/tmp/golden-base-$name.txt" "/tmp/golden-again-$name.txt" "/tmp/golden-new-$name.txt" \
              "$O/$name.diff" <<'PY'
import re, sys
def keyed(path):
    out = {}
    for line in open(path):
        line = line.rstrip("\n")
        m = re.match(r"(.*? check \d+ \S+ \S+) ", line) or re.match(r"(.*) \S+$", line)
        out[m.group(1) if m else line] = line
    return out
base, again, new = (keyed(p) for p in sys.argv[1:4])
varying = {k for k in set(base) | set(again) if base.get(k) != again.get(k)}
# a check of an impl whose output varies varies with it (exact's count of differing elements, say)
moving = {k.replace(" output ", " ", 1) for k in varying if " output " in k}
varying |= {k for k in set(base) | set(new) if re.sub(r" check \d+ \S+ ", " ", k) in moving}
changed = sorted(k for k in set(base) | set(new) if base.get(k) != new.get(k) and k not in varying)
with open(sys.argv[4], "w") as f:
    for k in sorted(varying):
        f.write("varying in the base's own two runs: %s\n" % k)
    for k in changed:
        f.write("- %s\n+ %s\n" % (base.get(k), new.get(k)))
print("%d lines, %d varying between the base's runs, %d changed" % (len(new), len(varying), len(changed)))
PY
)
    case "$verdict" in *" 0 changed") same=same ;; *) same=DIFFERENT; differ=1 ;; esac
    [ "$base_rc" = "$new_rc" ] || { same=DIFFERENT; differ=1; }
    echo "$name: exit base $base_rc new $new_rc; $verdict; $same ($(($(date +%s) - start)) s)" | tee -a "$log"
done
exit $differ
