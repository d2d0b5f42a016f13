#!/bin/sh
# gpu-validate.sh: the GPU machine's half of a validation run. Build here, bundle, then run this
# there from the checkout root (see ../shared/tools/README.md):
#   cmake -S . -B build -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build build -j2
#   ../shared/tools/device-bundle .device build/kparity build/test_* build/kpt_plugin_cuda.so build/kpt_plugin_scale.so
#   (device run, carry .device)  sh scripts/gpu-validate.sh
# Everything it prints is also kept under $OUT (or /tmp/kparity-validate): logs and the bundles.
set -u
D=$PWD/.device
O=${OUT:-/tmp/kparity-validate}
mkdir -p "$O"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" KPARITY_BIN="$D/kparity" KPARITY_SOURCE_DIR="$PWD" \
       KPT_CUDA_PLUGIN="$D/kpt_plugin_cuda.so" KPT_SCALE_PLUGIN="$D/kpt_plugin_scale.so"
log="$O/validate.log"
run() { echo "\$ $*" | tee -a "$log"; "$@" >>"$log" 2>&1; rc=$?; echo "exit $rc" | tee -a "$log"; return 0; }
{ nvidia-smi -L; nproc; uname -a; } >>"$log" 2>&1
for t in "$D"/test_*; do run "$t"; done
run sh -c "/usr/bin/time -v $D/kparity gate --config ci/gates/glm-split-topp-cuda.json --out $O/cuda-gate 2>&1 | tail -60"
run "$D/kparity" verify "$O/cuda-gate" --replay
run "$D/kparity" gate --config ci/gates/glm-split-topp.json --out "$O/host-gate" --quiet
run "$D/kparity" gate --config ci/gates/default.json --out "$O/default-gate"
run sh -c "/usr/bin/time -v $D/kparity gate --config ci/gates/indexer-topk-cuda.json --out $O/topk-gate 2>&1 | tail -30"
run "$D/kparity" verify "$O/topk-gate" --replay
run sh -c "/usr/bin/time -v $D/kparity gate --config ci/gates/nvfp4-moe-cuda.json --out $O/moe-gate 2>&1 | tail -80"
run sh -c "/usr/bin/time -v $D/kparity gate --config ci/gates/sparse-mla-cuda.json --out $O/mla-gate 2>&1 | tail -80"
run "$D/kparity" verify "$O/mla-gate" --replay
run "$D/kparity" bench --reps 100
run "$D/kparity" bench --reps 100 --case "topp(batch=4,profile=flat,seed=58231,top_p=0.95,vocab=131072)" \
    --case "topp(batch=64,profile=flat,seed=58231,top_p=0.95,vocab=154856)"
run "$D/kparity" bench --reps 50 --impl topk.radix_exact@cuda --impl topk.radix_buffer@cuda \
    --case "topk(k=2048,profile=relu,rows=64,seed=1,width=131072)"
# every kernel test but the division check (its kernel touches memory only for two atomics a thread)
run compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$D/test_gpu_topp_kernels" \
    --filter 'gpu_topp/!(division_matches_ieee_wherever_it_counts)'
run compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$D/test_gpu_harness" \
    --filter 'gpu_harness/receipts_record_the_gpu'
run compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$D/test_gpu_topk_kernels"
run compute-sanitizer --tool racecheck --target-processes all --error-exitcode 9 "$D/test_gpu_topk_kernels" \
    --filter 'gpu_topk/@(short_and_empty_windows_fill_the_tail|buffer_coarse_bin_past_capacity_drops_entries|exact_row_bits_do_not_depend_on_batch)'
run compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$D/test_gpu_moe_kernels"
run compute-sanitizer --tool racecheck --target-processes all --error-exitcode 9 "$D/test_gpu_moe_kernels"
run compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$D/test_gpu_mla_kernels"
run compute-sanitizer --tool racecheck --target-processes all --error-exitcode 9 "$D/test_gpu_mla_kernels"
for tool in racecheck synccheck; do
    run compute-sanitizer --tool $tool --target-processes all --error-exitcode 9 "$D/test_gpu_topp_kernels" \
        --filter 'gpu_topp/@(level_members_kept_in_rule_order_match_host|large_ties_keep_prefix_every_call|tie_rows_match_host_ports_and_keep_lowest_index_copies|rows_without_finite_logits_are_copied_and_p_one_keeps_all)'
done
(cd "$O" && tar czf bundles.tgz cuda-gate host-gate default-gate topk-gate moe-gate mla-gate && rm -rf cuda-gate host-gate default-gate topk-gate moe-gate mla-gate)
grep -E '^\$|^exit|Synthesis|verdict|stages|Elapsed|Maximum resident|ERROR SUMMARY' "$log"
