#!/usr/bin/env bash
# Builds a sanitizer tree of the unit tests and runs them; any sanitizer report fails the run.
#   Usage: tests/sanitizers/run.sh asan|tsan [BUILD_DIR]    (default build/KIND)
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer (-fno-sanitize-recover: UB aborts) over
#         the unit tests of common/, kvstore/, worker/cache, worker/engine and http/.
#   tsan: ThreadSanitizer over the same unit tests less the gRPC-level ones that pass messages
#         (kvstore_service_test, document_store_test); Debian's absl is not instrumented, so
#         test binaries link tests/sanitizers/tsan_absl_shim.cc (absl::Mutex made visible).
# gcc with its own runtime libraries; ccache when present. Prints one line per test binary.
set -euo pipefail
kind=${1:?usage: run.sh asan|tsan [BUILD_DIR]}
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${2:-$src/build/$kind}
mkdir -p "$build"
build=$(cd "$build" && pwd)
extra=()
case "$kind" in
  asan)
    flags="-O1 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
    tests=(common_test logging_test kv_checksum_test metrics_test json_test auth_test common_grpc_test
           kvstore_format_test kvstore_engine_test kvstore_service_test
           cache_test host_tier_test document_store_test
           engine_scheduler_test engine_modes_test host_tier_engine_test fetch_cost_test
           engine_metrics_test openai_api_test openai_http_server_test)
    # allocator_may_return_null: tests ask for impossible sizes (host_tier_test's huge arena)
    # to see the code answer RESOURCE_EXHAUSTED when nothrow new returns null.
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:allocator_may_return_null=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ;;
  tsan)
    flags="-O1 -g1 -fno-omit-frame-pointer -fsanitize=thread"
    # Not the gRPC-level tests that pass messages: gRPC hands buffers between its threads
    # through its own uninstrumented lock-free code, which TSan reports as races (also with
    # called_from_lib suppressions of libgrpc/libgrpc++/libupb: reads in grpc++'s inline
    # ProtoBufferReader and absl::Status refcounts remain). common_grpc_test (servers started,
    # statuses mapped, shut down) runs clean.
    tests=(common_test logging_test kv_checksum_test metrics_test json_test auth_test
           common_grpc_test kvstore_format_test kvstore_engine_test cache_test host_tier_test
           engine_scheduler_test host_tier_engine_test engine_modes_test fetch_cost_test
           engine_metrics_test openai_api_test openai_http_server_test)
    extra=(-DLAZYRAG_TSAN_ABSL_SHIM=ON)
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 allocator_may_return_null=1 suppressions=$src/tests/sanitizers/tsan.supp"
    # OpenBLAS hands a GEMM to its own threads through its uninstrumented synchronisation, which
    # TSan reports as a race between OpenBLAS's writes of the output and the CPU backend's reads
    # (seen with sgemm_beta on a Cooper Lake VM); one OpenBLAS thread keeps each GEMM on the
    # calling thread, and the engine's own threads and ParallelFor stay under TSan.
    export OPENBLAS_NUM_THREADS=1
    ;;
  *)
    echo "usage: run.sh asan|tsan [BUILD_DIR]" >&2
    exit 2
    ;;
esac
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_C_COMPILER=gcc \
  -DCMAKE_CXX_COMPILER=g++ -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DLAZYRAG_CUDA=OFF \
  -DLAZYRAG_ONLY="proto;http;kvstore;worker/model;worker/backend;worker/cache;worker/engine" \
  "${extra[@]}" "${launcher[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"${LAZYRAG_JOBS:-$(nproc)}" --target "${tests[@]}"

status=0
printf '%-26s %8s %s\n' "$kind: binary" seconds result
for t in "${tests[@]}"; do
  bin=$(find "$build" -name "$t" -type f -perm -u+x | head -n 1)
  if [ -z "$bin" ]; then
    echo "$t: not built" >&2
    status=1
    continue
  fi
  log="$build/$t.log"
  start=$(date +%s)
  result=ok
  if ! (cd "$(dirname "$bin")" && "$bin" --gtest_brief=1) >"$log" 2>&1; then
    result=FAILED
    status=1
  fi
  printf '%-26s %8s %s\n' "$t" $(($(date +%s) - start)) "$result"
  if [ "$result" != ok ]; then
    grep -n -A40 -E "Sanitizer|runtime error|FAILED|Failure" "$log" | head -n 120 || tail -n 40 "$log"
  fi
done
exit $status
