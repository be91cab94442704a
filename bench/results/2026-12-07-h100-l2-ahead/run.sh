#!/usr/bin/env bash
# Issue 29: L2 prefetch of the wgmma projection's weights past its ring (wip/wgmma-l2-ahead).
set -uo pipefail
OUT=${OUT:?}
mkdir -p /tmp/p && tar xJf .gpu-l/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/tmp/p/tools:/usr/local/cuda/lib64
B=/tmp/p/bin
mkdir -p /tmp/o
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  for r in 1 2 3; do for a in 0,0 4,8 8,16 16,32; do
    echo "== ttft l2_ahead $a round $r $(date +%T)"
    LAZYRAG_L2_AHEAD=$a timeout 90 $B/ttft_bench --out /tmp/o/ttft-a${a/,/_}-$r.json > /tmp/o/ttft-a${a/,/_}-$r.txt 2>&1
    grep -E "^read ceiling|^TTFT (LAZY|MATERIALIZE) |floor of|decode step, batch 1" /tmp/o/ttft-a${a/,/_}-$r.txt
  done; tar cf $OUT/o.tar -C /tmp o 2>/dev/null; done
  for a in 0,0 8,16; do
    echo "== trace l2_ahead $a $(date +%T)"
    LAZYRAG_L2_AHEAD=$a CUDA_INJECTION64_PATH=/tmp/p/tools/libkernel_trace.so KERNEL_TRACE_OUT=/tmp/o/trace-a${a/,/_}.csv \
      timeout 60 $B/ttft_bench --profile > /tmp/o/trace-a${a/,/_}.txt 2>&1; tail -1 /tmp/o/trace-a${a/,/_}.txt
  done
  xz -T0 /tmp/o/trace-*.csv
  tar cf $OUT/o.tar -C /tmp o 2>/dev/null
  date +%T
} 2>&1 | tee "$OUT/log.txt"
