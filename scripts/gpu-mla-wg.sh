#!/bin/sh
# gpu-mla-wg.sh: what mla.split_size_wg@cuda, the sparse-mla CUDA gate's candidate, must show on the GPU machine (issue
# 31), in one call: test_gpu_mla_kernels whole (the reference at FlashMLA's tolerances, batch
# invariance, repeats, out-of-range slots, large tile scales, refusals, the printed timing of all three impls), and if
# it fails, the same build with the other reading of the N-major descriptor's offsets (MLA_WG_V_SWAP); then
# compute-sanitizer memcheck, racecheck and synccheck on the new impl's tests, and the CUDA sparse-mla gate and its
# bundle's replay. Here:
#   cmake --build build -j2
#   cmake -S . -B build-vswap -DCMAKE_CUDA_FLAGS=-DMLA_WG_V_SWAP && cmake --build build-vswap -j2 --target test_gpu_mla_kernels
#   ../shared/tools/device-bundle .device build/kparity build/test_gpu_mla_kernels
#   cp build-vswap/test_gpu_mla_kernels .device/test_gpu_mla_kernels_vswap
# then there, from the checkout root, carrying .device: sh scripts/gpu-mla-wg.sh (everything also under $OUT).
set -u
D=$PWD/.device
O=${OUT:-/tmp/kparity-mla-wg}
mkdir -p "$O"
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" KPARITY_BIN="$D/kparity" KPARITY_SOURCE_DIR="$PWD"
t=test_gpu_mla_kernels
timeout 500 "$D/$t" --jobs=1 >"$O/$t.log" 2>&1
rc=$?
echo "$t: exit $rc"
grep -E "FAIL|Assert|timing|split_size_wg" "$O/$t.log" | cut -c1-300 | head -60
if [ "$rc" != 0 ] && [ -x "$D/${t}_vswap" ]; then
    timeout 300 "$D/${t}_vswap" --jobs=1 --filter 'gpu_mla/both_within_flashmla_tolerances_of_the_reference' >"$O/${t}_vswap.log" 2>&1
    echo "${t}_vswap (MLA_WG_V_SWAP): exit $?"
    grep -E "FAIL|Assert|split_size_wg" "$O/${t}_vswap.log" | cut -c1-300 | head -20
fi
[ "$rc" = 0 ] || exit 1
for tool in memcheck racecheck synccheck; do
    timeout 300 compute-sanitizer --tool $tool --target-processes all --error-exitcode 9 "$D/$t" \
        --filter 'gpu_mla/@(out_of_range_indices_do_not_count_and_are_never_read|large_tile_scales_take_the_exact_path|split_pairs_combine_as_the_workspace_does|whole_runs_give_the_bits_of_split_runs)' \
        >"$O/$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? $(grep -c 'ERROR SUMMARY: 0' "$O/$tool.log") clean summaries"
done
"$D/kparity" gate --config ci/gates/sparse-mla-cuda.json --out "$O/B-gate" --quiet
echo "sparse-mla-cuda (split_size_wg the candidate): exit $?"
"$D/kparity" verify "$O/B-gate" --replay | tail -1
