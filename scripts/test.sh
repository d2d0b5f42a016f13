#!/bin/sh
# test.sh: set up, build, then run every test through ctest: label cpu everywhere; label gpu
# skips (exit 77) without a GPU. Then the cpu tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan/, -DKP_SANITIZE=ON: any report fails its test), and a short libFuzzer run of every parser of
# outside input (scripts/fuzz.sh, which installs clang if it is missing).
#   KPARITY_SANITIZE=0       skip the sanitizer build and its run
#   KPARITY_FUZZ_SECONDS=N   seconds per fuzz target (default 60; 0 skips fuzzing)
# Arguments go to both ctest runs (e.g. -R test_cli).
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
(cd "${KPARITY_BUILD_DIR:-build}" && ctest --output-on-failure --timeout 1800 "$@")

if [ "${KPARITY_SANITIZE:-1}" != 0 ]; then
  asan=${KPARITY_ASAN_BUILD_DIR:-build-asan}
  mkdir -p "$asan"
  if ! { cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKP_SANITIZE=ON -DKP_CUDA=OFF &&
         cmake --build "$asan" -j"$(nproc)"; } >"$asan/setup.log" 2>&1; then
    cat "$asan/setup.log" >&2
    echo "test.sh: the sanitizer build failed (log above, also in $asan/setup.log)" >&2
    exit 3
  fi
  # Criterion runs one test at a time there (CMakeLists.txt says why), so ctest runs binaries side by side
  (cd "$asan" && ctest --output-on-failure --timeout 7200 -j"$(nproc)" -L cpu "$@")
fi

seconds=${KPARITY_FUZZ_SECONDS:-60}
[ "$seconds" = 0 ] || ./scripts/fuzz.sh "$seconds"
