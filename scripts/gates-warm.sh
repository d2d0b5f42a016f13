#!/bin/sh
# gates-warm.sh [GATE...]: issue 30's table. Each gate (a name under ci/gates/, without .json) runs cold, warm and warm
# again on a cache folder of its own, made fresh: one line a run with its exit status, its process seconds and the
# gate's own stages line and its kernels line (the kernels stage's runs taken apart). Default gates: every
# ci/gates/*-cuda.json and default.json (on the GPU machine: carry .device with kparity built here and run
# `sh scripts/gates-warm.sh`). The binary is $KPARITY_BIN, else .device/kparity (with
# .device/lib), else build/kparity; folders and bundles go under ${WARM_DIR:-/tmp/kparity-warm}, each gate's own
# (cache-GATE, GATE-RUN) removed before it runs; its cache folder is removed again after its third run (the large gates'
# entries together fill a 64 GiB disk), its bundles and logs kept.
# Large gates need a cache cap above their inputs: KPARITY_CACHE_MAX_GB (40 here unless set).
set -u
bin=${KPARITY_BIN:-}
if [ -z "$bin" ]; then
    if [ -x .device/kparity ]; then
        bin=$PWD/.device/kparity
        export LD_LIBRARY_PATH="$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
        bin=$PWD/build/kparity
    fi
fi
[ -x "$bin" ] || { echo "gates-warm.sh: no kparity at $bin (set KPARITY_BIN)" >&2; exit 2; }
export KPARITY_CACHE_MAX_GB=${KPARITY_CACHE_MAX_GB:-40}
if [ $# -eq 0 ]; then
    for f in ci/gates/*-cuda.json ci/gates/default.json; do set -- "$@" "$(basename "$f" .json)"; done
fi
for g in "$@"; do
    [ -f "ci/gates/$g.json" ] || { echo "gates-warm.sh: no ci/gates/$g.json" >&2; exit 2; }
done
dir=${WARM_DIR:-/tmp/kparity-warm}
mkdir -p "$dir" || exit 2
for g in "$@"; do
    rm -rf "$dir/cache-$g" "$dir/$g-cold" "$dir/$g-warm" "$dir/$g-again" || exit 2
    for run in cold warm again; do
        b=$dir/$g-$run
        t0=$(date +%s.%N)
        "$bin" gate --config "ci/gates/$g.json" --out "$b" --cache "$dir/cache-$g" >"$b.log" 2>&1
        rc=$?
        t1=$(date +%s.%N)
        # the gate's own stages line (printed when its bundle is written)
        stages=$(grep -o 'stages: .*' "$b.log" | tail -1)
        kernels=$(grep -o '^kernels: .*' "$b.log" | tail -1)
        printf '%-22s %-5s exit %s %7s s | %s | %s\n' "$g" "$run" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" "${stages:-no stages line: $b.log}" "$kernels"
    done
    rm -rf "$dir/cache-$g" # the large gates' entries together pass a 64 GiB disk
done
