#!/bin/sh
# coverage.sh: line and branch coverage of harness/, reference/, cases/ and receipts/ by the cpu tests: a gcc --coverage
# build in build-cov/ (-DKP_COVERAGE=ON, -O1, no CUDA), `ctest -L cpu`, then gcov (scripts/coverage.py) prints a table
# per folder and the total, and lists the untaken branches of the checks and judges in build-cov/uncovered.txt.
#   --floor-lines N      exit 1 when total line coverage is below N% (default: floor_lines below)
#   --floor-branches M   exit 1 when total branch coverage is below M% (default: floor_branches below)
#   -- ARGS              the rest goes to ctest (default none: every cpu test, the host gates included), e.g.
#                        `-- -E gate_nvfp4_moe` for a quicker, lower figure
#   KPARITY_COV_BUILD_DIR=D  the build dir (default build-cov)
# Exit 0, 1 (a figure below its floor, named), 2 (bad arguments, named), 3 (the build or a test failed).
set -eu
cd "$(dirname "$0")/.."

# The floors: the figures measured (COVERAGE-NOTES.md) rounded down, less a point, so that a change which drops
# coverage a point or more shows, and noise between runs does not.
floor_lines=90
floor_branches=72
is_percent() { # a number from 0 to 100, decimals allowed
  case $1 in '' | *[!0-9.]* | *.*.* | .) return 1;; esac
  awk -v v="$1" 'BEGIN { exit !(v >= 0 && v <= 100) }'
}
while [ $# -gt 0 ]; do
  case $1 in
    --floor-lines | --floor-branches)
      [ $# -ge 2 ] || { echo "coverage.sh: $1 needs a percentage (0-100)" >&2; exit 2; }
      is_percent "$2" || { echo "coverage.sh: $1 takes a percentage from 0 to 100, not '$2'" >&2; exit 2; }
      if [ "$1" = --floor-lines ]; then floor_lines=$2; else floor_branches=$2; fi
      shift 2;;
    --) shift; break;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
    *) echo "coverage.sh: unknown argument '$1' (ctest's go after --). Hint: coverage.sh --help" >&2; exit 2;;
  esac
done

start=$(date +%s)
build=${KPARITY_COV_BUILD_DIR:-build-cov}
command -v gcc >/dev/null 2>&1 && command -v gcov >/dev/null 2>&1 ||
  { echo "coverage.sh: needs gcc and its gcov. Hint: apt-get install build-essential" >&2; exit 3; }
mkdir -p "$build"
# -O1 so that the references and the host gates run in reasonable time; its price: gcc may merge the tests of a compound
# condition into one, so a branch of such a line need not map to one operand (lines never run read as they are).
# kernels/ is not instrumented and builds at -O2 (CMakeLists.txt says why).
if ! { CC=gcc cmake -S . -B "$build" -DKP_COVERAGE=ON -DKP_CUDA=OFF -DKP_TESTS=ON -DCMAKE_BUILD_TYPE=Debug \
         -DCMAKE_C_FLAGS_DEBUG="-O1 -g" && cmake --build "$build" -j"$(nproc)"; } >"$build/setup.log" 2>&1; then
  cat "$build/setup.log" >&2
  echo "coverage.sh: the coverage build failed (log above, also in $build/setup.log)" >&2
  exit 3
fi
echo "coverage.sh: built at $(($(date +%s) - start)) s" >&2

# Counts from an earlier run would add up with this one's.
find "$build" -name '*.gcda' -exec rm -f {} +
tests_rc=0
(cd "$build" && ctest -L cpu -j"$(nproc)" --output-on-failure --timeout 1800 "$@") || tests_rc=$?
echo "coverage.sh: tests done at $(($(date +%s) - start)) s" >&2

report_rc=0
python3 scripts/coverage.py "$build" "$floor_lines" "$floor_branches" || report_rc=$?
echo "coverage.sh: floors: lines ${floor_lines}%, branches ${floor_branches}%; done in $(($(date +%s) - start)) s" >&2
if [ "$tests_rc" != 0 ]; then
  echo "coverage.sh: ctest failed (exit $tests_rc): the figures above are of a run with failing tests" >&2
  exit 3
fi
[ "$report_rc" = 0 ] || exit "$report_rc"
