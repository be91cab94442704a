#!/usr/bin/env bash
# Builds the libFuzzer targets with Debian's clang in their own tree and runs each for a bounded
# time from its seed corpus (tests/fuzz/corpus, plus binary seeds make_fuzz_seeds writes from
# the current formats), printing the executions per target. A crash, leak, timeout or
# sanitizer report fails the run and prints the input.
#   Usage: tests/fuzz/run.sh [BUILD_DIR]    (default build/fuzz)
#   LAZYRAG_FUZZ_SECONDS   time per target (default 25)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build/fuzz}
mkdir -p "$build"
build=$(cd "$build" && pwd)
seconds=${LAZYRAG_FUZZ_SECONDS:-25}
cc=$(command -v clang || true)
cxx=$(command -v clang++ || true)
if [ -z "$cxx" ] || [ -z "$cc" ]; then
  echo "fuzz: clang++ not found (deploy/local/bootstrap.sh installs clang)" >&2
  exit 1
fi
flags="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DLAZYRAG_CUDA=OFF -DLAZYRAG_LIBFUZZER=ON -DLAZYRAG_ONLY="proto;http;kvstore;worker/model" \
  "${launcher[@]}" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j"${LAZYRAG_JOBS:-$(nproc)}" \
  --target openai_request_fuzzer kv_format_fuzzer gguf_fuzzer make_fuzz_seeds

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/tests/fuzz/make_fuzz_seeds" "$work/seeds"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
printf '%-24s %12s %10s %10s %8s\n' target executions exec/s new_units result
for spec in "openai_request_fuzzer:$build/tests/fuzz/openai_request_fuzzer:$src/tests/fuzz/corpus/openai" \
            "kv_format_fuzzer:$build/tests/fuzz/kv_format_fuzzer:$work/seeds/kv_format" \
            "gguf_fuzzer:$build/worker/model/gguf_fuzzer:$work/seeds/gguf"; do
  IFS=: read -r name binary seeds <<<"$spec"
  mkdir -p "$work/$name"
  log="$work/$name.log"
  result=ok
  if ! "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$work/$name-" "$work/$name" "$seeds" >"$log" 2>&1; then
    result=FAILED
    status=1
  fi
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  printf '%-24s %12s %10s %10s %8s\n' "$name" "$(stat number_of_executed_units)" \
    "$(stat average_exec_per_sec)" "$(stat new_units_added)" "$result"
  if [ "$result" != ok ]; then
    tail -n 60 "$log"
    for artifact in "$work/$name"-*; do
      [ -f "$artifact" ] || continue
      echo "input $artifact (hex):"
      od -An -tx1 -v "$artifact" | head -n 40
    done
  fi
done
exit $status
