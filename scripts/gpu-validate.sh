#!/bin/sh
# gpu-validate.sh: the GPU machine's half of a validation run. Build here, bundle, then run this
# there from the checkout root (see ../shared/tools/README.md):
#   cmake -S . -B build -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build build -j2
#   ../shared/tools/device-bundle .device build/kparity build/test_* build/kpt_plugin_cuda.so build/kpt_plugin_scale.so
#   (device run, carry .device)  sh scripts/gpu-validate.sh
# Everything it prints is also kept under $OUT (or /tmp/kparity-validate): logs and the bundles. It ends with a
# table of every step, its exit code and the code it must give, and exits 1 when any step gave another.
set -u
D=$PWD/.device
O=${OUT:-/tmp/kparity-validate}
mkdir -p "$O"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" KPARITY_BIN="$D/kparity" KPARITY_SOURCE_DIR="$PWD" \
       KPT_CUDA_PLUGIN="$D/kpt_plugin_cuda.so" KPT_SCALE_PLUGIN="$D/kpt_plugin_scale.so"
log="$O/validate.log"
steps="$O/steps.tsv" # one line a step: exit code, expected code, command
: >"$steps"
# run WANT CMD...: CMD's output goes to the log; its own exit code (no pipe in between) is logged and kept beside
# WANT, the code it must give, for the table at the end.
run() {
    want=$1
    shift
    echo "\$ $*" | tee -a "$log"
    "$@" >>"$log" 2>&1
    rc=$?
    echo "exit $rc (expected $want)" | tee -a "$log"
    printf '%s\t%s\t%s\n' "$rc" "$want" "$*" >>"$steps"
}
# run_timed WANT LINES NAME CMD...: as run, under /usr/bin/time -v (which exits with CMD's code), the output kept
# whole in $O/NAME.out and only its last LINES lines put in the log, after the exit code is taken.
run_timed() {
    want=$1 lines=$2 name=$3
    shift 3
    echo "\$ $*" | tee -a "$log"
    /usr/bin/time -v "$@" >"$O/$name.out" 2>&1
    rc=$?
    tail -n "$lines" "$O/$name.out" >>"$log"
    echo "exit $rc (expected $want)" | tee -a "$log"
    printf '%s\t%s\t%s\n' "$rc" "$want" "$*" >>"$steps"
}
{ nvidia-smi -L; nproc; uname -a; } >>"$log" 2>&1
for t in "$D"/test_*; do run 0 "$t"; done
# the seed's gates give 1 (INCORRECT): the incumbent split_logit fails the rule on ordinary rows too, as
# tests/golden/glm-split-topp.txt records for the host ports (and the 2026-12-03 H200 runs for the CUDA ones)
run_timed 1 60 cuda-gate "$D/kparity" gate --config ci/gates/glm-split-topp-cuda.json --out "$O/cuda-gate"
run 0 "$D/kparity" verify "$O/cuda-gate" --replay
run 1 "$D/kparity" gate --config ci/gates/glm-split-topp.json --out "$O/host-gate" --quiet
run 0 "$D/kparity" gate --config ci/gates/default.json --out "$O/default-gate"
run_timed 0 30 topk-gate "$D/kparity" gate --config ci/gates/indexer-topk-cuda.json --out "$O/topk-gate"
run 0 "$D/kparity" verify "$O/topk-gate" --replay
run_timed 0 80 moe-gate "$D/kparity" gate --config ci/gates/nvfp4-moe-cuda.json --out "$O/moe-gate"
run_timed 0 80 mla-gate "$D/kparity" gate --config ci/gates/sparse-mla-cuda.json --out "$O/mla-gate"
run 0 "$D/kparity" verify "$O/mla-gate" --replay
run 0 "$D/kparity" bench --reps 100
run 0 "$D/kparity" bench --reps 100 --case "topp(batch=4,profile=flat,seed=58231,top_p=0.95,vocab=131072)" \
    --case "topp(batch=64,profile=flat,seed=58231,top_p=0.95,vocab=154856)"
run 0 "$D/kparity" bench --reps 50 --impl topk.radix_exact@cuda --impl topk.radix_buffer@cuda \
    --case "topk(k=2048,profile=relu,rows=64,seed=1,width=131072)"
# every kernel test but the division check (its kernel touches memory only for two atomics a thread)
run 0 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$D/test_gpu_topp_kernels" \
    --filter 'gpu_topp/!(division_matches_ieee_wherever_it_counts)'
run 0 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$D/test_gpu_harness" \
    --filter 'gpu_harness/receipts_record_the_gpu'
run 0 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$D/test_gpu_topk_kernels"
run 0 compute-sanitizer --tool racecheck --target-processes all --error-exitcode 9 "$D/test_gpu_topk_kernels" \
    --filter 'gpu_topk/@(short_and_empty_windows_fill_the_tail|buffer_coarse_bin_past_capacity_drops_entries|exact_row_bits_do_not_depend_on_batch)'
run 0 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$D/test_gpu_moe_kernels"
run 0 compute-sanitizer --tool racecheck --target-processes all --error-exitcode 9 "$D/test_gpu_moe_kernels"
run 0 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$D/test_gpu_mla_kernels"
run 0 compute-sanitizer --tool racecheck --target-processes all --error-exitcode 9 "$D/test_gpu_mla_kernels"
for tool in racecheck synccheck; do
    run 0 compute-sanitizer --tool $tool --target-processes all --error-exitcode 9 "$D/test_gpu_topp_kernels" \
        --filter 'gpu_topp/@(level_members_kept_in_rule_order_match_host|large_ties_keep_prefix_every_call|tie_rows_match_host_ports_and_keep_lowest_index_copies|rows_without_finite_logits_are_copied_and_p_one_keeps_all)'
done
(cd "$O" && tar czf bundles.tgz cuda-gate host-gate default-gate topk-gate moe-gate mla-gate && rm -rf cuda-gate host-gate default-gate topk-gate moe-gate mla-gate)
grep -E '^\$|^exit|Synthesis|verdict|stages|Elapsed|Maximum resident|ERROR SUMMARY' "$log"
# Every step with its exit code and the code it must give; any other code fails the run (exit 1).
echo
printf '%-4s %-4s %-8s %s\n' exit want result step
bad=0
while IFS="$(printf '\t')" read -r rc want cmd; do
    if [ "$rc" = "$want" ]; then verdict=ok; else verdict=MISMATCH bad=$((bad + 1)); fi
    printf '%-4s %-4s %-8s %s\n' "$rc" "$want" "$verdict" "$cmd"
done <"$steps"
total=$(wc -l <"$steps")
if [ "$bad" -ne 0 ]; then
    echo "gpu-validate: $bad of $total steps gave an exit code other than the expected one (table above; logs in $O)"
    exit 1
fi
echo "gpu-validate: all $total steps gave their expected exit codes"
