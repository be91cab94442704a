#!/usr/bin/env bash
# Installs what is missing, configures, builds and runs every test (ctest). No GPU needed:
# GPU tests skip with a message. Usage: ./tests/run.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
model_line=$(./deploy/local/bootstrap.sh | tail -n 1)
export LAZYRAG_MODEL=${LAZYRAG_MODEL:-${model_line#model: }}
[ -s "$LAZYRAG_MODEL" ] || unset LAZYRAG_MODEL
build=${LAZYRAG_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
