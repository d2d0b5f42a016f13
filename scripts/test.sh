#!/bin/sh
# test.sh: set up, build, then run every test through ctest: label cpu everywhere; label gpu
# skips (exit 77) without a GPU.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
cd "${KPARITY_BUILD_DIR:-build}"
exec ctest --output-on-failure --timeout 1800 "$@"
