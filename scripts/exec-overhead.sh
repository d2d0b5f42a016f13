#!/bin/sh
# exec-overhead.sh: what the exec protocol costs (README "Outside kernels"). A program that returns its input as its
# output (tests/fixtures/exec_topp.py identity) against topp.split_prob@host:
#   1. per launch: kparity bench of both on a tiny case (the protocol's fixed cost) and at 64 x 154,856 (plus the copy
#      of 39.6 MB in and out);
#   2. a gate: rule, repeat (3 runs) and batch on 64 x 154,856, the same checks on each, wall time to the verdict
#      (the identity's rule check is INCORRECT, as it must be; only the time is read).
# Usage: sh scripts/exec-overhead.sh [KPARITY] [PYTHON]  (defaults build/kparity, python3)
set -u
K=${1:-build/kparity}
PY=${2:-python3}
T=$(mktemp -d)
SMALL='topp(batch=1,profile=ordinary,seed=1,top_p=0.9,vocab=1000)'
BIG='topp(batch=64,profile=ordinary,seed=58231,top_p=0.95,vocab=154856)'
"$K" bench --reps 20 --impl topp.split_prob@host --exec "topp:numpy.topp=$PY tests/fixtures/exec_topp.py identity" \
    --case "$SMALL" --case "$BIG"
for impl in host exec; do
  if [ $impl = host ]; then
    role='"candidate": "topp.split_prob@host"'
  else
    role="\"candidate\": {\"exec\": [\"$PY\", \"tests/fixtures/exec_topp.py\", \"identity\"], \"impl\": \"numpy.topp\", \"family\": \"topp\"}"
  fi
  cat > "$T/$impl.json" <<JSON
{"schema": "kparity.gate/v1", "name": "overhead-$impl", "impls": {$role},
 "defaults": {"tie_policy": "minimal_index", "band": 1e-6, "runs": 3},
 "check_sets": {"s": [{"check": "rule", "impl": "candidate"}, {"check": "repeat", "impl": "candidate"},
                      {"check": "batch", "impl": "candidate"}]},
 "cases": [{"case": "$BIG", "checks": "s"}]}
JSON
  start=$(date +%s.%N)
  "$K" gate --config "$T/$impl.json" --out "$T/b-$impl" --quiet >/dev/null 2>"$T/$impl.err"
  rc=$?
  end=$(date +%s.%N)
  echo "gate $impl: exit $rc, $(awk "BEGIN{printf \"%.2f\", $end - $start}") s wall"
done
rm -rf "$T"
