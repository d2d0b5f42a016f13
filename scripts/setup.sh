#!/bin/sh
# setup.sh: install what kparity needs on a fresh Debian 12 machine, then configure and build it
# into build/. Safe to run again: it installs only what is missing and rebuilds incrementally.
#   KPARITY_SETUP_TARGET=T   build only target T (gate.sh: kparity, not the tests)
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

# cuRAND's host generator makes every case's inputs, so the CUDA toolkit is needed even without a GPU.
cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
have_curand=0
[ -e "$cuda_root/include/curand.h" ] && have_curand=1
[ -e /usr/include/curand.h ] && have_curand=1
[ $have_curand = 1 ] || need="$need nvidia-cuda-toolkit"

if [ -n "$need" ]; then
  echo "setup: installing:$need" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $need >/dev/null; then
    echo "setup: apt-get could not install:$need" >&2
    case $need in *nvidia-cuda-toolkit*)
      echo "setup: hint: the CUDA toolkit comes from NVIDIA's CUDA repository, or from Debian's non-free" \
           "component (nvidia-cuda-toolkit); set CUDAToolkit_ROOT if it is installed elsewhere" >&2;;
    esac
    exit 2
  fi
fi

[ -x "$cuda_root/bin/nvcc" ] && export PATH="$cuda_root/bin:$PATH"
build=${KPARITY_BUILD_DIR:-build}
mkdir -p "$build"
# quiet when it works (the gate's output is what a startup log should show); the whole log when not
if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${KPARITY_CMAKE_ARGS:-} &&
       cmake --build "$build" -j"$(nproc)" ${KPARITY_SETUP_TARGET:+--target "$KPARITY_SETUP_TARGET"}; } >"$build/setup.log" 2>&1; then
  cat "$build/setup.log" >&2
  echo "setup: the build failed (log above, also in $build/setup.log)" >&2
  exit 3
fi
