#!/bin/sh
# test.sh: set up, build (gcc), then run every test through ctest: label cpu everywhere; label gpu skips (exit 77)
# without a GPU. Then one clang build (build-asan/: -DKP_SANITIZE=ON -DKP_FUZZ=ON, -Werror like the gcc build, so the
# tests build with both compilers) runs the cpu tests again under AddressSanitizer + UndefinedBehaviorSanitizer (any
# report fails its test; the host gates at the sizes in tests/gates/, chosen for ASan: the full ones ran plain above)
# and its libFuzzer targets run a short while each on every parser of outside input (scripts/fuzz.sh; long runs:
# `scripts/fuzz.sh 1800`). clang is installed if missing.
#   KPARITY_SANITIZE=0       skip the clang build, its sanitizer run and fuzzing
#   KPARITY_FUZZ_SECONDS=N   seconds per fuzz target (default 10; 0 skips fuzzing)
# Arguments go to both ctest runs (e.g. -R test_cli).
set -eu
cd "$(dirname "$0")/.."
start=$(date +%s)
./scripts/setup.sh
jobs=$(nproc)
(cd "${KPARITY_BUILD_DIR:-build}" && ctest --output-on-failure --timeout 1800 -j"$jobs" "$@")
echo "test.sh: plain build and tests done at $(($(date +%s) - start)) s" >&2

if [ "${KPARITY_SANITIZE:-1}" != 0 ]; then
  asan=${KPARITY_ASAN_BUILD_DIR:-build-asan}
  ./scripts/fuzz.sh --install-clang
  mkdir -p "$asan"
  if ! { CC=clang cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKP_SANITIZE=ON -DKP_FUZZ=ON -DKP_CUDA=OFF &&
         cmake --build "$asan" -j"$jobs"; } >"$asan/setup.log" 2>&1; then
    cat "$asan/setup.log" >&2
    echo "test.sh: the clang sanitizer build failed (log above, also in $asan/setup.log)" >&2
    exit 3
  fi
  # Criterion runs one test at a time there (CMakeLists.txt says why), so ctest runs binaries side by side
  (cd "$asan" && ctest --output-on-failure --timeout 1800 -j"$jobs" -L cpu "$@")
  echo "test.sh: sanitizer build and tests done at $(($(date +%s) - start)) s" >&2
  seconds=${KPARITY_FUZZ_SECONDS:-10}
  [ "$seconds" = 0 ] || KPARITY_FUZZ_BUILD_DIR="$asan" ./scripts/fuzz.sh "$seconds"
fi
echo "test.sh: all done in $(($(date +%s) - start)) s" >&2
