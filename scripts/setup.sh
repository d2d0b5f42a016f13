#!/bin/sh
# setup.sh: install what kparity needs on a fresh Debian 12 machine, then configure and build it
# into build/. Safe to run again: it installs only what is missing and rebuilds incrementally.
#   KPARITY_SETUP_TARGET=T   build only target T (gate.sh: kparity, not the tests)
#   KPARITY_CUDA=AUTO|ON|OFF the CUDA impls: AUTO (default) builds them when nvcc works; gate.sh passes OFF on a
#                            machine with no GPU, where they could not run (set on every run, so test.sh's AUTO
#                            builds them again after such a gate)
set -eu
cd "$(dirname "$0")/.."

need=""
command -v cc >/dev/null 2>&1 || need="$need build-essential"
command -v cmake >/dev/null 2>&1 || need="$need cmake"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
pkg-config --exists criterion 2>/dev/null || need="$need libcriterion-dev"
pkg-config --exists libcjson 2>/dev/null || need="$need libcjson-dev"
pkg-config --exists libcrypto 2>/dev/null || need="$need libssl-dev"
# test_judge runs a NumPy top-p as the outside kernel it judges
# (CMake picks the python3 on PATH when it has numpy, else Debian's /usr/bin/python3, which this installs it for)
python3 -c 'import numpy' 2>/dev/null || /usr/bin/python3 -c 'import numpy' 2>/dev/null || need="$need python3-numpy"

# cuRAND's host generator makes every case's inputs, so cuRAND is needed even without a GPU. It comes from the first of:
# a CUDA toolkit ($CUDAToolkit_ROOT, the one whose nvcc is on PATH, /usr/local/cuda), Debian's (/usr/include/curand.h,
# non-free's nvidia-cuda-toolkit), else NVIDIA's PyPI wheel unpacked into .deps/curand/ (CMakeLists.txt looks there when
# CMake finds no toolkit). No toolkit is installed for it: that is gigabytes and non-free, the wheel 68 MB.
# The wheel is pinned by version and SHA-256 so every such build links the same cuRAND; the input digests that
# tests/test_cases*.c pin hold for it as for the toolkit's (Philox LEGACY ordering is promised stable across releases).
curand_wheel="nvidia-curand-cu12 10.3.10.19"
case ${KPARITY_CUDA:=AUTO} in
  AUTO | ON | OFF) ;;
  *) echo "setup: KPARITY_CUDA must be AUTO, ON or OFF, not '$KPARITY_CUDA'" >&2; exit 2;;
esac
case $(uname -m) in
  x86_64)
    curand_url=https://files.pythonhosted.org/packages/31/44/193a0e171750ca9f8320626e8a1f2381e4077a65e69e2fb9708bd479e34a/nvidia_curand_cu12-10.3.10.19-py3-none-manylinux_2_27_x86_64.whl
    curand_sha256=49b274db4780d421bd2ccd362e1415c13887c53c214f0d4b761752b8f9f6aa1e;;
  aarch64)
    curand_url=https://files.pythonhosted.org/packages/14/1c/2a45afc614d99558d4a773fa740d8bb5471c8398eeed925fc0fcba020173/nvidia_curand_cu12-10.3.10.19-py3-none-manylinux_2_27_aarch64.whl
    curand_sha256=de663377feb1697e1d30ed587b07d5721fdd6d2015c738d7528a6002a6134d37;;
  *) curand_url="" curand_sha256="";;
esac
curand_dir=.deps/curand
cuda_root=""
has_curand() { [ -n "$1" ] && [ -e "$1/include/curand.h" ] && cuda_root=$1; }
nvcc=$(command -v nvcc 2>/dev/null || true)
fetch_curand=0
if has_curand "${CUDAToolkit_ROOT:-}" || has_curand "${nvcc%/bin/nvcc}" || has_curand /usr/local/cuda; then
  curand_from="the CUDA toolkit at $cuda_root"
  [ "$cuda_root" != /usr ] || curand_from="Debian's nvidia-cuda-toolkit (/usr/include/curand.h)"
elif [ -e /usr/include/curand.h ]; then
  curand_from="Debian's nvidia-cuda-toolkit (/usr/include/curand.h)"
elif [ "$(cat "$curand_dir/WHEEL" 2>/dev/null)" = "${curand_url##*/} sha256=$curand_sha256" ]; then
  curand_from="NVIDIA's PyPI wheel $curand_wheel in $curand_dir (no CUDA toolkit found)"
elif [ -n "$curand_url" ]; then
  curand_from="NVIDIA's PyPI wheel $curand_wheel (68 MB, SHA-256 pinned), fetched into $curand_dir (no CUDA toolkit found)"
  fetch_curand=1
  # python3's standard library downloads, checks and unzips it: python3 is here for the NumPy tests anyway, where
  # pip (python3-pip, and PEP 668 on Debian), curl or unzip would be one more package a stock image lacks
  command -v python3 >/dev/null 2>&1 || need="$need python3"
  [ -s /etc/ssl/certs/ca-certificates.crt ] || need="$need ca-certificates"
else
  echo "setup: no cuRAND: no CUDA toolkit (set CUDAToolkit_ROOT if one is installed elsewhere), no Debian" \
       "nvidia-cuda-toolkit, and NVIDIA publishes no cuRAND wheel for $(uname -m)" >&2
  exit 2
fi
if [ "${1:-}" = --which-curand ]; then # scripts/test-setup.sh: the choice alone, nothing installed or built
  echo "setup: cuRAND: $curand_from"
  exit 0
fi
echo "setup: cuRAND: $curand_from" >&2

if [ -n "$need" ]; then
  echo "setup: installing:$need" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  # through env: sudo drops the caller's environment (a non-root runner, ubuntu-latest's, goes through sudo)
  if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null; then
    echo "setup: apt-get could not install:$need" >&2
    exit 2
  fi
fi
if [ $fetch_curand = 1 ] && ! python3 scripts/fetch-wheel.py "$curand_url" "$curand_sha256" nvidia/curand/ "$curand_dir"; then
  echo "setup: could not fetch cuRAND's wheel; hint: install the CUDA toolkit and set CUDAToolkit_ROOT instead" >&2
  exit 2
fi

[ -x "$cuda_root/bin/nvcc" ] && export PATH="$cuda_root/bin:$PATH"
build=${KPARITY_BUILD_DIR:-build}
mkdir -p "$build"
# quiet when it works (the gate's output is what a startup log should show); the whole log when not
if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKP_CUDA="$KPARITY_CUDA" ${KPARITY_CMAKE_ARGS:-} &&
       cmake --build "$build" -j"$(nproc)" ${KPARITY_SETUP_TARGET:+--target "$KPARITY_SETUP_TARGET"}; } >"$build/setup.log" 2>&1; then
  cat "$build/setup.log" >&2
  echo "setup: the build failed (log above, also in $build/setup.log)" >&2
  exit 3
fi
