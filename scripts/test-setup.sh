#!/bin/sh
# test-setup.sh: how scripts/setup.sh gets cuRAND. Its choice (a toolkit named by CUDAToolkit_ROOT or by nvcc on PATH,
# none where a toolkit lacks curand.h), and fetch-wheel.py on a made-up wheel: unpacked whole when its SHA-256 is the
# pin, refused with nothing left behind when the wheel was altered after pinning (the planted defect) or would unpack
# outside its folder. No network: the wheels are file:// URLs.
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test-setup: $*" >&2; exit 1; }

# --- which cuRAND setup.sh takes (--which-curand: the choice alone, nothing installed or built)
mkdir -p "$tmp/tk/include" "$tmp/tk2/include" "$tmp/tk2/bin" "$tmp/bare/include"
: >"$tmp/tk/include/curand.h"
: >"$tmp/tk2/include/curand.h"
printf '#!/bin/sh\nexit 0\n' >"$tmp/tk2/bin/nvcc" && chmod +x "$tmp/tk2/bin/nvcc"
got=$(CUDAToolkit_ROOT="$tmp/tk" PATH="$tmp/tk2/bin:$PATH" "$src/scripts/setup.sh" --which-curand)
[ "$got" = "setup: cuRAND: the CUDA toolkit at $tmp/tk" ] || fail "CUDAToolkit_ROOT first: got '$got'"
got=$(env -u CUDAToolkit_ROOT PATH="$tmp/tk2/bin:$PATH" "$src/scripts/setup.sh" --which-curand)
[ "$got" = "setup: cuRAND: the CUDA toolkit at $tmp/tk2" ] || fail "nvcc on PATH: got '$got'"
# the control: a toolkit without curand.h is passed over, whatever else this machine has
got=$(CUDAToolkit_ROOT="$tmp/bare" "$src/scripts/setup.sh" --which-curand)
case $got in "setup: cuRAND: "*"$tmp/bare"*|"") fail "a toolkit without curand.h was taken: got '$got'";; esac

# --- fetch-wheel.py: a wheel is a zip; only what is under the prefix (less __init__.py) and the licence are kept
python3 - "$tmp" <<'PY'
import sys, zipfile
tmp = sys.argv[1]
with zipfile.ZipFile(tmp + "/good.whl", "w") as z:
    z.writestr("nvidia/__init__.py", "")
    z.writestr("nvidia/curand/include/curand.h", "/* header */\n")
    z.writestr("nvidia/curand/lib/__init__.py", "")
    z.writestr("nvidia/curand/lib/libcurand.so.10", b"\x7fELF" + bytes(4096))
    z.writestr("nvidia_curand_cu12-0.dist-info/License.txt", "licence\n")
with zipfile.ZipFile(tmp + "/escape.whl", "w") as z:
    z.writestr("nvidia/curand/../../escaped.h", "")
PY
sha() { sha256sum "$1" | cut -d' ' -f1; }
fetch() { python3 "$src/scripts/fetch-wheel.py" "file://$1" "$2" nvidia/curand/ "$3"; }
good=$(sha "$tmp/good.whl")
fetch "$tmp/good.whl" "$good" "$tmp/deps/curand" || fail "the pinned wheel was refused"
[ -s "$tmp/deps/curand/include/curand.h" ] && [ -s "$tmp/deps/curand/lib/libcurand.so.10" ] &&
  [ -s "$tmp/deps/curand/License.txt" ] || fail "the pinned wheel did not unpack: $(find "$tmp/deps")"
[ ! -e "$tmp/deps/curand/lib/__init__.py" ] || fail "python package files were unpacked"
[ "$(cat "$tmp/deps/curand/WHEEL")" = "good.whl sha256=$good" ] || fail "the stamp setup.sh reads is off"
[ "$(ls -A "$tmp/deps")" = curand ] || fail "work files left beside the unpacked wheel: $(ls -A "$tmp/deps")"

# the planted defect: the wheel changes after its SHA-256 was pinned
cp "$tmp/good.whl" "$tmp/bad.whl" && printf 'x' >>"$tmp/bad.whl"
if fetch "$tmp/bad.whl" "$good" "$tmp/deps2/curand" 2>"$tmp/err"; then fail "an altered wheel was accepted"; fi
grep -q "not the pinned $good" "$tmp/err" || fail "the refusal does not name the pin: $(cat "$tmp/err")"
[ -z "$(ls -A "$tmp/deps2")" ] || fail "an altered wheel left files: $(ls -A "$tmp/deps2")"
if fetch "$tmp/bad.whl" "$good" "$tmp/deps/curand" 2>/dev/null; then fail "an altered wheel was accepted"; fi
[ "$(cat "$tmp/deps/curand/WHEEL")" = "good.whl sha256=$good" ] || fail "a refused wheel disturbed the one in place"
if fetch "$tmp/escape.whl" "$(sha "$tmp/escape.whl")" "$tmp/deps3/curand" 2>/dev/null; then
  fail "a member outside the prefix's folder was unpacked"
fi
[ ! -e "$tmp/escaped.h" ] && [ -z "$(ls -A "$tmp/deps3")" ] || fail "a refused wheel left files"
echo "test-setup: ok"
