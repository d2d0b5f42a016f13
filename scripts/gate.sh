#!/bin/sh
# gate.sh: set up, build, then run the default startup gate (ci/gates/default.json): the CUDA
# impls when a GPU is present, their host ports otherwise. Extra arguments go to `kparity gate`.
set -eu
cd "$(dirname "$0")/.."
# The binary only (the tests are test.sh's), and without a GPU without the CUDA impls, which could not run here:
# nvcc is most of a fresh build's time.
if [ -z "${KPARITY_CUDA:-}" ]; then
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    KPARITY_CUDA=AUTO
  else
    KPARITY_CUDA=OFF
    echo "gate.sh: no GPU (nvidia-smi lists none): building the host impls only (KPARITY_CUDA=AUTO builds all)" >&2
  fi
fi
KPARITY_CUDA=$KPARITY_CUDA KPARITY_SETUP_TARGET=kparity ./scripts/setup.sh
exec "${KPARITY_BUILD_DIR:-build}/kparity" gate --config ci/gates/default.json "$@"
