#!/bin/sh
# gpu-profile.sh: per-kernel GPU times of the topp CUDA impls on the bench shapes, on the GPU
# machine (same bundle as gpu-validate.sh). ncu with --clock-control none (the card's clocks are
# left as found); writes profile.csv and bench.txt under $OUT and prints a per-kernel table.
set -u
D=$PWD/.device
O=${OUT:-/tmp/kparity-profile}
mkdir -p "$O"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cases="topp(batch=64,profile=ordinary,seed=58231,top_p=0.95,vocab=154856)
topp(batch=4,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)
topp(batch=4,profile=flat,seed=58231,top_p=0.95,vocab=131072)
topp(batch=64,profile=flat,seed=58231,top_p=0.95,vocab=154856)"
set --
for c in $cases; do set -- "$@" --case "$c"; done
[ -n "${SKIP_BENCH:-}" ] || "$D/kparity" bench --impl topp.split_prob@cuda --impl topp.split_logit@cuda --reps 100 "$@" 2>&1 | tee "$O/bench.txt"
n=0
for c in ${PROFILE_CASES:-$cases}; do
    n=$((n + 1))
    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        "$D/kparity" bench --impl topp.split_prob@cuda --case "$c" --reps 3 >"$O/ncu-$n.csv" 2>"$O/ncu-$n.err"
    echo "== $c (split_prob@cuda, ncu us per launch, median over the launches of each kernel)"
    python3 - "$O/ncu-$n.csv" <<'PY'
import csv, sys, collections
lines = open(sys.argv[1]).read().splitlines()  # the bench table comes first
lines = lines[[n for n, l in enumerate(lines) if l.startswith('"ID"')][0]:]
rows = [r for r in csv.reader(lines) if len(r) > 5]
head = rows[0]; k, u, v = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
t = collections.OrderedDict()
seen = collections.Counter()
for r in rows[1:]:
    name = r[k].split("(")[0]
    if "stats" in name: seen.clear()
    seen[name] += 1
    t.setdefault("%s #%d" % (name, seen[name]), []).append((float(r[v].replace(",", "")), r[u]))
for name, xs in t.items():
    vals = sorted(x for x, _ in xs)
    print("  %-36s median %9.2f %s over %d launches" % (name[:36], vals[len(vals) // 2], xs[0][1], len(vals)))
PY
done
