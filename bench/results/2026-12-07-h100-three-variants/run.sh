#!/usr/bin/env bash
# Issue 29, one call: main db544b4 (status), pw = wip/wgmma-pre-wait 2db2efe (--wgmma_pre_wait 1),
# qt = wip/qkv-gemv-trigger (QKV-output GEMV triggers at its start), deep = wip/wgmma-deep-ring
# 29f73f7 (64-row blocks 192 KiB ring; deep2 = --wgmma_gemm 2: O and down on it too).
# kernel_bench base = 5e71a32.
set -uo pipefail
OUT=${OUT:?}
mkdir -p /tmp/p && tar xJf .gpu-h/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64
B=/tmp/p/bin
mkdir -p /tmp/o/ttft /tmp/o/kernel /tmp/o/tests
args() { case $1 in pw1) echo "--wgmma_pre_wait 1";; deep2) echo "--wgmma_gemm 2";; esac; }
bin() { case $1 in pw1) echo pw;; deep2) echo deep;; *) echo $1;; esac; }
ttft_round() {
  for n in main pw1 qt deep deep2; do
    echo "== ttft $n round $1 $(date +%T)"
    timeout 60 $B/ttft_$(bin $n) $(args $n) --out /tmp/o/ttft/$n-$1.json > /tmp/o/ttft/$n-$1.txt 2>&1
    grep -E "^read ceiling|^TTFT (LAZY|MATERIALIZE|FULL)|floor of|decode step" /tmp/o/ttft/$n-$1.txt
  done
  tar cf $OUT/ttft.tar -C /tmp/o ttft
}
kb() {
  echo "== kernel_bench $1 $3 run $2 $(date +%T)"
  timeout 90 $B/kernel_bench_$1 $3 --out /tmp/o/kernel/$1$3-$2.json > /tmp/o/kernel/$1$3-$2.txt 2>&1
  grep -E -i "ceiling|prefill_q32 |prefill_q32_b1|decode_b1 |q2048|chunk" /tmp/o/kernel/$1$3-$2.txt | head -12
}
t() {
  echo "== $1 $(date +%T)"
  timeout 150 $B/$1 --gtest_output=xml:/tmp/o/tests/$1.xml > /tmp/o/tests/$1.txt 2>&1; echo "rc=$?"
  grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran" /tmp/o/tests/$1.txt | head -20
  tar cf $OUT/tests.tar -C /tmp/o tests
}
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  t small_gemm_test_deep; t small_gemm_test_pw; t cuda_backend_test_qt
  ttft_round 1
  echo "== small_gemm_bench deep $(date +%T)"
  timeout 120 $B/small_gemm_bench_deep --iters 10 --out /tmp/o/kernel/small-gemm-deep.json > /tmp/o/kernel/small-gemm-deep.txt 2>&1
  grep -E "read ceiling|gemm_(o|qkv|down) .*(cublas|wgmma_r64|wgmma_r64s8|wgmma_r64_nopdl|wgmma_r64s8_nopdl) +(16|32|64) " /tmp/o/kernel/small-gemm-deep.txt
  tar cf $OUT/kernel.tar -C /tmp/o kernel
  ttft_round 2
  kb base 1 ""; kb main 1 ""
  tar cf $OUT/kernel.tar -C /tmp/o kernel
  for n in main deep2; do
    echo "== trace $n $(date +%T)"
    CUDA_INJECTION64_PATH=/tmp/p/libkernel_trace.so KERNEL_TRACE_OUT=/tmp/o/trace-$n.csv \
      timeout 60 $B/ttft_$(bin $n) $(args $n) --profile > /tmp/o/trace-$n.txt 2>&1; tail -1 /tmp/o/trace-$n.txt
  done
  tar cJf $OUT/traces.tar.xz -C /tmp/o $(cd /tmp/o && ls trace-*)
  ttft_round 3
  t gemv_test; t small_gemm_test; t cuda_backend_test; t kernels_test
  date +%T
} 2>&1 | tee "$OUT/log.txt"
