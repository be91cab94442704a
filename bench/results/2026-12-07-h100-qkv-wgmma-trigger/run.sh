#!/usr/bin/env bash
# Binaries: ttft_main kernel_bench_main = main 339fb1a; ttft_qkv = wip/qkv-wgmma 292d43f;
# ttft_both kernel_bench_both + all tests = wip/step-both 43d7b55 (qkv + gemv early trigger);
# kernel_bench_base = 5e71a32 (issue 29's baseline).
set -uo pipefail
OUT=${OUT:?}
mkdir -p /tmp/p && tar xJf .gpu-s/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64
B=/tmp/p/bin
mkdir -p /tmp/o/ttft /tmp/o/kernel /tmp/o/tests
ttft_round() {
  for b in main qkv both; do
    echo "== ttft $b round $1 $(date +%T)"
    timeout 60 $B/ttft_$b --out /tmp/o/ttft/$b-$1.json > /tmp/o/ttft/$b-$1.txt 2>&1
    grep -E "^read ceiling|^TTFT (LAZY|MATERIALIZE|FULL)|floor of|decode step" /tmp/o/ttft/$b-$1.txt
  done
}
kb() {
  echo "== kernel_bench $1 run $2 $(date +%T)"
  timeout 60 $B/kernel_bench_$1 --iters 15 --out /tmp/o/kernel/$1-$2.json > /tmp/o/kernel/$1-$2.txt 2>&1
  grep -E -i "ceiling|prefill_q32 |prefill_q32_b1|decode_b1 |q2048|chunk" /tmp/o/kernel/$1-$2.txt | head -12
}
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  ttft_round 1
  for r in 1 2 3; do kb base $r; kb main $r; done
  ttft_round 2
  for b in main both; do
    echo "== trace $b $(date +%T)"
    CUDA_INJECTION64_PATH=/tmp/p/libkernel_trace.so KERNEL_TRACE_OUT=/tmp/o/trace-$b.csv \
      timeout 60 $B/ttft_$b --profile > /tmp/o/trace-$b.txt 2>&1; tail -2 /tmp/o/trace-$b.txt
    xz -T4 -k /tmp/o/trace-$b.csv && cp /tmp/o/trace-$b.csv.xz $OUT/
  done
  ttft_round 3
  tar cf $OUT/ttft.tar -C /tmp/o ttft; tar cf $OUT/kernel.tar -C /tmp/o kernel
  for t in gemv_test small_gemm_test cuda_backend_test kernels_test; do
    echo "== $t $(date +%T)"
    timeout 150 $B/$t --gtest_output=xml:/tmp/o/tests/$t.xml > /tmp/o/tests/$t.txt 2>&1; echo "rc=$?"
    grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran" /tmp/o/tests/$t.txt | head -20
    tar cf $OUT/tests.tar -C /tmp/o tests
  done
  echo "== probes $(date +%T)"
  KERNELS_TEST_PROBE_EARLY_READS=1 timeout 30 $B/kernels_test --gtest_filter='*ProbeEarlyReads*' 2>&1 |
    grep -E "^\[  (PASSED|FAILED) |FAILED|OK \]|Failure|Expected|Which" | head
  date +%T
} 2>&1 | tee "$OUT/log.txt"
tar cf $OUT/tests.tar -C /tmp/o tests
