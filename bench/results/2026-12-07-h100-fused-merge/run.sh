#!/usr/bin/env bash
# Issue 29: the in-kernel split merge of the query block (merge_sync). One call.
set -uo pipefail
OUT=${OUT:?}
mkdir -p /tmp/p && tar xJf .gpu-m/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/tmp/p/tools:/usr/local/cuda/lib64
B=/tmp/p/bin
mkdir -p /tmp/o
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  echo "== kernels_test prefill $(date +%T)"
  timeout 200 $B/kernels_test --gtest_filter='LazyAttention.Prefill*:LazyAttention.*Merge*:LazyAttention.*Chunk*:LazyAttention.*Causal*' --gtest_brief=1 --gtest_output=xml:/tmp/o/kernels_prefill.xml > /tmp/o/kernels_prefill.txt 2>&1; echo "rc=$?"
  grep -E "PASSED|FAILED|tests ran|Failure|note:" /tmp/o/kernels_prefill.txt | head -20
  tar cf $OUT/o.tar -C /tmp o 2>/dev/null
  echo "== kernel_bench --query-blocks $(date +%T)"
  for r in 1 2; do timeout 120 $B/kernel_bench --query-blocks --out /tmp/o/kernel-qb-$r.json > /tmp/o/kernel-qb-$r.txt 2>&1; grep -E "ceiling|prefill_q32" /tmp/o/kernel-qb-$r.txt | head -16; done
  tar cf $OUT/o.tar -C /tmp o 2>/dev/null
  for r in 1 2; do for f in 1 0; do
    echo "== ttft fused_merge $f round $r $(date +%T)"
    timeout 90 $B/ttft_bench --fused_merge $f --out /tmp/o/ttft-f$f-$r.json > /tmp/o/ttft-f$f-$r.txt 2>&1
    grep -E "^read ceiling|^TTFT (LAZY|MATERIALIZE|FULL)|floor of|decode step" /tmp/o/ttft-f$f-$r.txt
  done; done
  tar cf $OUT/o.tar -C /tmp o 2>/dev/null
  for f in 1 0; do
    echo "== trace fused_merge $f $(date +%T)"
    CUDA_INJECTION64_PATH=/tmp/p/tools/libkernel_trace.so KERNEL_TRACE_OUT=/tmp/o/trace-f$f.csv \
      timeout 60 $B/ttft_bench --fused_merge $f --profile > /tmp/o/trace-f$f.txt 2>&1; tail -1 /tmp/o/trace-f$f.txt
  done
  xz -T0 /tmp/o/trace-*.csv
  tar cf $OUT/o.tar -C /tmp o 2>/dev/null
  echo "== cuda_backend_test $(date +%T)"
  timeout 150 $B/cuda_backend_test --gtest_brief=1 --gtest_output=xml:/tmp/o/cuda_backend_test.xml > /tmp/o/cuda_backend_test.txt 2>&1; echo "rc=$?"
  grep -E "PASSED|FAILED|tests ran" /tmp/o/cuda_backend_test.txt | head
  echo "== kernels_test all $(date +%T)"
  timeout 200 $B/kernels_test --gtest_brief=1 --gtest_output=xml:/tmp/o/kernels_test.xml > /tmp/o/kernels_test.txt 2>&1; echo "rc=$?"
  grep -E "PASSED|FAILED|tests ran" /tmp/o/kernels_test.txt | head
  tar cf $OUT/o.tar -C /tmp o 2>/dev/null
  date +%T
} 2>&1 | tee "$OUT/log.txt"
