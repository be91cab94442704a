#!/usr/bin/env bash
# Issue 29: the RMSNorm over a cluster of 4 blocks a row (wip/norm-cluster).
set -uo pipefail
OUT=${OUT:?}
mkdir -p /tmp/p && tar xJf .gpu-n/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/tmp/p/tools:/usr/local/cuda/lib64
B=/tmp/p/bin
mkdir -p /tmp/o
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  echo "== cuda_backend_test $(date +%T)"
  timeout 150 $B/cuda_backend_test --gtest_brief=1 > /tmp/o/cuda_backend_test.txt 2>&1; echo "rc=$?"
  grep -E "PASSED|FAILED|tests ran" /tmp/o/cuda_backend_test.txt | head
  for r in 1 2 3; do for c in 1 0; do
    echo "== ttft norm_cluster $c round $r $(date +%T)"
    LAZYRAG_NORM_CLUSTER=$c timeout 90 $B/ttft_bench --out /tmp/o/ttft-c$c-$r.json > /tmp/o/ttft-c$c-$r.txt 2>&1
    grep -E "^read ceiling|^TTFT (LAZY|MATERIALIZE) |floor of|decode step, batch 1" /tmp/o/ttft-c$c-$r.txt
  done; tar cf $OUT/o.tar -C /tmp o 2>/dev/null; done
  for c in 1 0; do
    echo "== trace norm_cluster $c $(date +%T)"
    LAZYRAG_NORM_CLUSTER=$c CUDA_INJECTION64_PATH=/tmp/p/tools/libkernel_trace.so KERNEL_TRACE_OUT=/tmp/o/trace-c$c.csv \
      timeout 60 $B/ttft_bench --profile > /tmp/o/trace-c$c.txt 2>&1; tail -1 /tmp/o/trace-c$c.txt
  done
  xz -T0 /tmp/o/trace-*.csv
  tar cf $OUT/o.tar -C /tmp o 2>/dev/null
  date +%T
} 2>&1 | tee "$OUT/log.txt"
