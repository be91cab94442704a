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
status=0
ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@" || status=$?
# The counts of the crash loop, the fuzzers and the sanitizer runs (ctest keeps passing tests'
# output in its log only).
grep -hE "^crash loop:|^target +executions|_fuzzer +[0-9]+ |^(asan|tsan): binary|^[a-z_]+_test +[0-9]+ (ok|FAILED)$" \
  Testing/Temporary/LastTest.log 2>/dev/null || true
exit $status
