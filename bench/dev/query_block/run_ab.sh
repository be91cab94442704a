#!/usr/bin/env bash
# One device call for a change to the query block (issue 29; first used for the branch
# wip/query-block-fixed-costs, measured 2026-12-07, bench/HISTORY.md): in order of need,
# kernels_test (prefill, merge, stable history) and the CUDA model against the CPU for the new
# build, ttft_bench base / new (early_kv 1 and 0) in two rounds, the query-block phase trace new
# / old (kernel_bench --ws-trace of two trace builds, e.g. the branches wip/ws-trace-fixed2 and
# wip/ws-trace), kernel_bench new / base. Everything streams into $OUT,
# so a run cut short keeps what it has. Run ON THE GPU MACHINE from the repository root.
#
# Packing here (no GPU needed), into an ignored folder, e.g. .gpu-q:
#   the change:       kernels_test, cuda_backend_test, ttft_bench -> ttft_new,
#                     kernel_bench -> kernel_bench_new
#   the base (main):  ttft_bench -> ttft_main, kernel_bench -> kernel_bench_main
#   trace builds (kernel_bench --ws-trace): new -> kernel_bench_trace_new, base -> kernel_bench_trace
#   mkdir -p /tmp/q/bin; cp <those> /tmp/q/bin/; strip /tmp/q/bin/*
#   ../shared/device/collect-libs.sh /tmp/q/lib /tmp/q/bin/*
#   tar cJf .gpu-q/pack.tar.xz -C /tmp/q bin lib
# Then one call carrying [".gpu-q"]:  GPU_DIR=.gpu-q OUT=$OUT bash bench/dev/query_block/run_ab.sh
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
GPU_DIR=${GPU_DIR:-.gpu-q}
mkdir -p /tmp/p && tar xJf "$GPU_DIR/pack.tar.xz" -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib
B=/tmp/p/bin
ttft_round() {
  for c in main:1 new:1 new:0; do
    b=${c%:*}; e=${c#*:}
    echo "== ttft $b early_kv $e round $1 $(date +%T)"
    timeout 60 $B/ttft_$b --early_kv $e |
      grep -E "^read ceiling|^TTFT (LAZY|MATERIALIZE|FULL)|floor of|decode step"
  done
}
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  echo "== kernels_test $(date +%T)"
  timeout 100 $B/kernels_test --gtest_filter="*Prefill*:*Merge*:*StableHistory*:*Chunked*:*FullCausal*:*Split*" 2>&1 |
    grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|tests ran|Expected|Which is" | head -30
  KERNELS_TEST_PROBE_EARLY_READS=1 timeout 30 $B/kernels_test --gtest_filter='*ProbeEarlyReads*' 2>&1 |
    grep -E "^\[  (PASSED|FAILED) |FAILED|OK \]"
  ttft_round 1
  echo "== cuda_backend_test $(date +%T)"
  timeout 80 $B/cuda_backend_test --gtest_filter="*MatchesCpu*:*Graph*" 2>&1 |
    grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|tests ran|Expected|Which is" | head -30
  ttft_round 2
  for b in trace_new trace; do
    echo "== ws $b $(date +%T)"
    timeout 60 $B/kernel_bench_$b --ws-trace --iters 20 > "$OUT/ws-$b.txt" 2>&1
    grep -E "query block|loop end|first tile full|merge" "$OUT/ws-$b.txt" | head -30
  done
  for b in new main; do
    echo "== kernel_bench $b $(date +%T)"
    timeout 100 $B/kernel_bench_$b --iters 15 --out "$OUT/kernel-$b.json" > "$OUT/kernel-$b.txt" 2>&1
    grep -E -i "ceiling|prefill_q32|decode_b1 |decode_b16|decode_b64|prefill_q2048" "$OUT/kernel-$b.txt" | head -40
  done
  date +%T
} 2>&1 | tee "$OUT/log.txt"
