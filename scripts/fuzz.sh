#!/bin/sh
# fuzz.sh: build the libFuzzer targets (fuzz/fuzz_*.c; clang, ASan + UBSan) into build-fuzz/, seed them from the
# repo's own configs, case names, exported .npy files and a small gate's bundle, and run each for SECONDS.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     SECONDS per target (default 60; 0: build and seed only);
#                                             TARGET: config case_name npy judge_output bundle merge (default: all)
#   KPARITY_FUZZ_BUILD_DIR   build folder (build-fuzz); corpora grow in its corpus/<target>/ across runs
#   KPARITY_FUZZ_JOBS        targets run at once (default: the core count; each target uses one core)
#
# Exit 0 when no target found anything; 1 naming the target, with the input under BUILD/findings/ and the log
# under BUILD/logs/ (rerun one input: BUILD/fuzz_<target> FILE); 2 for bad arguments; 3 when it cannot build.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)

if [ "${1:-}" = --run-one ]; then
  # internal: one target for SECONDS, its figures appended to BUILD/results
  target=$2 seconds=$3 build=$4
  dict=$target
  [ "$target" = judge_output ] && dict=npy
  quiet=""
  [ "$target" = merge ] && dict=bundle quiet=-close_fd_mask=3 # merge's refusal on stderr, every input
  mkdir -p "$build/corpus/$target" "$build/findings" "$build/logs"
  log="$build/logs/$target.log"
  # inputs that once found something (each also a test): run first, every time
  regressions=""
  [ -d "$root/fuzz/regressions/$target" ] && regressions="$root/fuzz/regressions/$target"
  rc=0
  # -timeout: one input taking 25 s is a finding (a parser must not hang); -rss_limit_mb: libFuzzer's default
  env KP_FUZZ_BUNDLE="$build/seed-bundle" KP_FUZZ_PUBKEY="$build/seed-key.pub.pem" \
    KP_FUZZ_PART1="$build/seed-part1" KP_FUZZ_PART2="$build/seed-part2" \
    ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$build/fuzz_$target" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 $quiet \
    -dict="$root/fuzz/$dict.dict" -artifact_prefix="$build/findings/$target-" \
    "$build/corpus/$target" "$build/seeds/$target" $regressions >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  secs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  units=$(ls "$build/corpus/$target" | wc -l)
  if [ $rc = 0 ]; then result=clean; else result="FOUND SOMETHING (exit $rc; $log)"; fi
  printf '%-13s %12s execs  %8s exec/s  %6s corpus  %s\n' "$target" "${execs:-?}" "${secs:-?}" "$units" "$result" \
    >>"$build/results"
  exit 0
fi

if [ "${1:-}" = --install-clang ]; then
  install_clang_only=1
else
  install_clang_only=0
fi
seconds=${1:-60}
[ $install_clang_only = 1 ] && seconds=0
case $seconds in '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, not '$seconds'" >&2; exit 2;; esac
[ $# -gt 0 ] && shift
targets=${*:-config case_name npy judge_output bundle merge cache_entry}
for t in $targets; do
  [ -f "fuzz/fuzz_$t.c" ] || { echo "fuzz.sh: no target '$t' (fuzz/fuzz_$t.c)" >&2; exit 2; }
done
build=${KPARITY_FUZZ_BUILD_DIR:-build-fuzz}
case $build in /*) ;; *) build="$root/$build";; esac
jobs=${KPARITY_FUZZ_JOBS:-$(nproc)}

# clang with libFuzzer's runtime (Debian: clang, libclang-rt-dev), installed like setup.sh installs the rest
install_clang() {
  probe=$(mktemp -d)
  echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' >"$probe/p.c"
  if ! clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >/dev/null 2>&1; then
    echo "fuzz.sh: installing: clang libclang-rt-dev" >&2
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev >/dev/null ||
      { rm -rf "$probe"; echo "fuzz.sh: apt-get could not install clang; libFuzzer needs clang with compiler-rt" >&2; exit 3; }
  fi
  rm -rf "$probe"
}
install_clang
[ $install_clang_only = 0 ] || exit 0

mkdir -p "$build"
# a folder configured with the tests (test.sh's build-asan) keeps them; a fresh one builds the targets only
tests=OFF
grep -q "^KP_TESTS:BOOL=ON" "$build/CMakeCache.txt" 2>/dev/null && tests=ON
if ! { CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKP_FUZZ=ON -DKP_SANITIZE=ON -DKP_TESTS="${KPARITY_FUZZ_TESTS:-$tests}" &&
       cmake --build "$build" -j"$(nproc)"; } >"$build/build.log" 2>&1; then
  cat "$build/build.log" >&2
  echo "fuzz.sh: the build failed (log above, also in $build/build.log)" >&2
  exit 3
fi

# --- seeds, made afresh each run (the corpora under corpus/ keep what the fuzzer found) ---
seeds="$build/seeds"
rm -rf "$seeds" "$build/seed-bundle" "$build/seed-part1" "$build/seed-part2" "$build/export"
mkdir -p "$build/export" "$seeds/config" "$seeds/case_name" "$seeds/npy" "$seeds/judge_output" "$seeds/bundle" "$seeds/merge" \
  "$seeds/cache_entry"
cp ci/gates/*.json ci/matrix/*.json fuzz/seed-gate.json "$seeds/config/"
i=0
for name in $(sed -n 's/.*"case": *"\([^"]*\)".*/\1/p' ci/gates/*.json ci/matrix/*.json fuzz/seed-gate.json | sort -u); do
  i=$((i + 1))
  printf '%s' "$name" >"$seeds/case_name/name-$i"
done
# one small case per family at its batch and at 1 row (fuzz_judge_output offers each input as both), every
# array exported; impl outputs seed the judge's reader, every array under 64 KiB the .npy reader
n=0
for spec in "topp(batch=4,profile=ordinary,seed=1,top_p=0.95,vocab=1000)|topp.split_prob@host" \
            "topp(batch=1,profile=ordinary,seed=1,top_p=0.95,vocab=1000)|topp.split_prob@host" \
            "topk(k=16,profile=randn,rows=4,seed=1,width=100)|topk.radix_exact@host" \
            "topk(k=16,profile=randn,rows=1,seed=1,width=100)|topk.radix_exact@host" \
            "moe(hidden=256,inter=128,m=2,model=glm53,profile=hot,seed=8)|moe.invariant@host" \
            "moe(hidden=256,inter=128,m=1,model=glm53,profile=hot,seed=8)|moe.invariant@host" \
            "mla(batch=1,h_q=64,profile=invalid,s_kv=1024,scale=pow2,seed=6,topk=640)|mla.split_size@host"; do
  n=$((n + 1))
  case_name=${spec%|*} impl=${spec#*|}
  printf '%s' "$case_name" >"$seeds/case_name/small-$n"
  "$build/kparity" export "$case_name" --out "$build/export/$n" --impl "$impl" >/dev/null
  for f in "$build/export/$n"/*.npy; do
    b=$(basename "$f")
    [ "$(wc -c <"$f")" -le 65536 ] && cp "$f" "$seeds/npy/$n-$b"
    case $b in "$impl"*) cp "$f" "$seeds/judge_output/$n-$b";; esac
  done
done
# the bundle: fuzz/seed-gate.json run once (INCORRECT by design: exit 1), signed with a key made here
rc=0
"$build/kparity" gate --config fuzz/seed-gate.json --out "$build/seed-bundle" --quiet >/dev/null || rc=$?
[ $rc -le 1 ] || { echo "fuzz.sh: the seed gate failed (exit $rc)" >&2; exit 3; }
openssl genpkey -algorithm ed25519 -out "$build/seed-key.pem" 2>/dev/null
openssl pkey -in "$build/seed-key.pem" -pubout -out "$build/seed-key.pub.pem"
"$build/kparity" sign "$build/seed-bundle" --key "$build/seed-key.pem" >/dev/null
KP_FUZZ_BUNDLE="$build/seed-bundle" KP_FUZZ_WRITE_SEEDS="$seeds/bundle" "$build/fuzz_bundle" >/dev/null 2>&1
# merge's: the same gate run as two shards
for i in 1 2; do
  rc=0
  "$build/kparity" run --config fuzz/seed-gate.json --shard $i/2 --out "$build/seed-part$i" --quiet >/dev/null || rc=$?
  [ $rc -le 1 ] || { echo "fuzz.sh: shard $i/2 of the seed gate failed (exit $rc)" >&2; exit 3; }
done
KP_FUZZ_PART1="$build/seed-part1" KP_FUZZ_PART2="$build/seed-part2" KP_FUZZ_WRITE_SEEDS="$seeds/merge" "$build/fuzz_merge" \
  >/dev/null 2>&1
# the cache's entries: what kp_cache_put writes under the key the target opens (it writes them itself, then stops)
KP_FUZZ_WRITE_SEEDS="$seeds/cache_entry" "$build/fuzz_cache_entry" -runs=0 >/dev/null 2>&1

# --- run ---
[ "$seconds" != 0 ] || { echo "fuzz.sh: built and seeded $build (SECONDS 0: nothing run)" >&2; exit 0; }
: >"$build/results"
echo "fuzz.sh: $seconds s per target, $jobs at a time: $targets" >&2
for t in $targets; do echo "$t"; done |
  xargs -P "$jobs" -I{} sh "$root/scripts/fuzz.sh" --run-one {} "$seconds" "$build"
cat "$build/results"
if grep -q "FOUND" "$build/results"; then
  echo "fuzz.sh: a target found a crash, leak, hang or sanitizer report; inputs in $build/findings/" >&2
  exit 1
fi
