#!/usr/bin/env bash
# O-weight L2 prefetch A/B (issue 29), one call: tests, ttft_bench --o_prefetch 0/1 alternating,
# kernel traces of both, kernel_bench. Run from the repository root with OUT set.
set -uo pipefail
OUT=${OUT:?}
P=/tmp/pk; rm -rf $P; mkdir -p $P; tar xJf .gpu-op/pack.tar.xz -C $P
export LD_LIBRARY_PATH=$P/lib
{
  echo "== $(date -u +%FT%TZ) commit $(cat $P/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  s=$(date +%s); timeout 240 $P/bin/kernels_test --gtest_brief=1 --gtest_output=xml:$OUT/kernels_test.xml \
    --gtest_filter='LazyAttentionArgs.*:*L2Prefetch*:*PrefillWgmma*:*DecodeTma*:*StableHistoryWaits*:*Decode256*:*PrefillBatch16*'
  echo "kernels_test rc=$? in $(( $(date +%s) - s )) s"
  s=$(date +%s); timeout 240 $P/bin/cuda_backend_test --gtest_brief=1 --gtest_output=xml:$OUT/cuda_backend_test.xml \
    --gtest_filter='*Prefetching*:*TinyMatches*:*WideShape*:*CudaGraphReplays*'
  echo "cuda_backend_test rc=$? in $(( $(date +%s) - s )) s"
  for r in ${ROUNDS_LIST:-1 2}; do
    for v in "0 0" "1 0" "1 1"; do
      set -- $v; f=o$1e$2
      s=$(date +%s); timeout 200 $P/bin/ttft_bench --o_prefetch $1 --kv_evict_first $2 --out $OUT/ttft-$f-$r.json | tail -n 30
      echo "ttft $f round $r rc=$? in $(( $(date +%s) - s )) s"
    done
  done
  for v in "0 0" "1 0" "1 1"; do
    set -- $v; f=o$1e$2
    LD_LIBRARY_PATH=$P/tools:$LD_LIBRARY_PATH CUDA_INJECTION64_PATH=$P/tools/libkernel_trace.so \
      KERNEL_TRACE_OUT=$OUT/trace-$f.csv timeout 200 $P/bin/ttft_bench --profile --o_prefetch $1 --kv_evict_first $2 | tail -n 2
    python3 bench/dev/kernel_trace/trace_timeline.py $OUT/trace-$f.csv --json $OUT/trace-$f.json --layer 10 | tail -n 60
    xz -f $OUT/trace-$f.csv
  done
  if [[ ${KB:-1} == 1 ]]; then
    timeout 150 $P/bin/kernel_bench --iters 20 --out $OUT/kernel.json | grep -E "prefill_q32_b1 |decode_b1 |read_kernel|device"
  fi
} 2>&1 | tee $OUT/log.txt
