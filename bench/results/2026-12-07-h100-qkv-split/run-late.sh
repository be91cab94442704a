#!/usr/bin/env bash
# Issue 29: the QKV split in the wgmma projection's epilogue (wip/qkv-split-wgmma, late trigger) against main.
set -uo pipefail
OUT=${OUT:?}
mkdir -p /tmp/p && tar xJf .gpu-t/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/tmp/p/tools:/usr/local/cuda/lib64
B=/tmp/p/bin
mkdir -p /tmp/o
t() {
  set -- "$1" "${2-}"
  echo "== $1 ${2-} $(date +%T)"
  timeout 200 $B/$1 --gtest_brief=1 ${2:+--gtest_filter=${2-}} --gtest_output=xml:/tmp/o/$1.xml > /tmp/o/$1.txt 2>&1; echo "rc=$?"
  grep -E "PASSED|FAILED|tests ran|Failure|Expected|Which is" /tmp/o/$1.txt | head -12
}
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  :
  tar cf $OUT/o.tar -C /tmp o 2>/dev/null
  for r in 1 2; do for b in new base; do
    bin=$B/ttft_bench; [[ $b == base ]] && bin=/tmp/p/base/ttft_bench
    echo "== ttft $b round $r $(date +%T)"
    timeout 90 $bin --out /tmp/o/ttft-$b-$r.json > /tmp/o/ttft-$b-$r.txt 2>&1
    grep -E "^read ceiling|^TTFT (LAZY|MATERIALIZE|FULL) |decode step" /tmp/o/ttft-$b-$r.txt
  done; tar cf $OUT/o.tar -C /tmp o 2>/dev/null; done
  echo "== trace new $(date +%T)"
  CUDA_INJECTION64_PATH=/tmp/p/tools/libkernel_trace.so KERNEL_TRACE_OUT=/tmp/o/trace-new.csv \
    timeout 60 $B/ttft_bench --profile > /tmp/o/trace-new.txt 2>&1; tail -1 /tmp/o/trace-new.txt
  xz -T0 /tmp/o/trace-*.csv
  tar cf $OUT/o.tar -C /tmp o 2>/dev/null
  date +%T
} 2>&1 | tee "$OUT/log.txt"
