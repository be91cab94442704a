#!/usr/bin/env bash
# Issue 29: QKV of 2-64-row steps on cuBLAS again (wip/qkv-cublas-again), after the cluster norm.
set -uo pipefail
OUT=${OUT:?}
mkdir -p /tmp/p && tar xJf .gpu-q/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/tmp/p/tools:/usr/local/cuda/lib64
B=/tmp/p/bin
mkdir -p /tmp/o
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  for r in 1 2 3; do for c in 1 0; do
    echo "== ttft qkv_cublas $c round $r $(date +%T)"
    LAZYRAG_QKV_CUBLAS=$c timeout 90 $B/ttft_bench --out /tmp/o/ttft-q$c-$r.json > /tmp/o/ttft-q$c-$r.txt 2>&1
    grep -E "^read ceiling|^TTFT (LAZY|MATERIALIZE) |decode step" /tmp/o/ttft-q$c-$r.txt
  done; tar cf $OUT/o.tar -C /tmp o 2>/dev/null; done
  echo "== trace qkv_cublas 1 $(date +%T)"
  LAZYRAG_QKV_CUBLAS=1 CUDA_INJECTION64_PATH=/tmp/p/tools/libkernel_trace.so KERNEL_TRACE_OUT=/tmp/o/trace-q1.csv \
    timeout 60 $B/ttft_bench --profile > /tmp/o/trace-q1.txt 2>&1; tail -1 /tmp/o/trace-q1.txt
  xz -T0 /tmp/o/trace-*.csv
  tar cf $OUT/o.tar -C /tmp o 2>/dev/null
  date +%T
} 2>&1 | tee "$OUT/log.txt"
