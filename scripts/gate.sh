#!/bin/sh
# gate.sh: set up, build, then run the default startup gate (ci/gates/default.json): the CUDA
# impls when a GPU is present, their host ports otherwise. Extra arguments go to `kparity gate`.
set -eu
cd "$(dirname "$0")/.."
KPARITY_SETUP_TARGET=kparity ./scripts/setup.sh # the binary only: the tests are test.sh's
exec "${KPARITY_BUILD_DIR:-build}/kparity" gate --config ci/gates/default.json "$@"
