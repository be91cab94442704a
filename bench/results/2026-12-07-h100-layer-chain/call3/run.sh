#!/bin/bash
# Issue 29: the layer chain (wip/layer-chain, COMMIT: the norms folded into the next projection)
# on a GPU, most important first: its match against the backend's kernels, its benchmark beside
# them with the phase trace, the CUDA model with it against the CPU, ttft_bench --layer_chain 1 / 0
# alternating, the other tests, then kernel_bench of the branch (bin) and main (base) alternating.
# Run from the repository root: OUT=/tmp/o bash .gpu-lc/run.sh (unpacks pack.tar.xz itself).
D=$(cd "$(dirname "$0")" && pwd)
[ -d $D/bin ] || tar xJf $D/pack.tar.xz -C $D
export LD_LIBRARY_PATH=$D/lib:$LD_LIBRARY_PATH
mkdir -p $OUT
echo "commit $(cat $D/COMMIT)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t() {
  echo "== $1 $(date +%T)"
  timeout ${TEST_TIMEOUT:-120} $D/bin/layer_chain_test --gtest_filter=$1 > $OUT/test-$2.txt 2>&1
  rc=$?; echo "rc=$rc"; grep -E "FAILED|OK \]|Failure|rows=32 \]" $OUT/test-$2.txt | head -n 20
  return $rc
}
t LayerChain.MatchesTheKernelSequence match; ok=$?
echo "== bench $(date +%T)"
timeout 150 $D/bin/layer_chain_bench --iters ${ITERS:-8} --trace --out $OUT/bench.json > $OUT/bench.txt 2>&1
echo "rc=$?"; tail -n 40 $OUT/bench.txt
if [ $ok = 0 ]; then
  echo "== cuda_backend_test $(date +%T)"
  timeout 200 $D/bin/cuda_backend_test --gtest_brief=1 > $OUT/cuda_backend_test.txt 2>&1
  rc=$?; echo "rc=$rc"; grep -E "FAILED|PASSED|tests ran|Failure" $OUT/cuda_backend_test.txt | head
  for r in ${ROUNDS_LIST:-1 2}; do
    for c in 1 0; do
      echo "== ttft_bench layer_chain $c round $r $(date +%T)"
      timeout 100 $D/bin/ttft_bench --layer_chain $c --out $OUT/ttft-chain$c-$r.json > $OUT/ttft-chain$c-$r.txt 2>&1
      echo "rc=$?"; grep -E "read ceiling|TTFT LAZY \(|forward step on|MATERIALIZE|decode step" $OUT/ttft-chain$c-$r.txt
    done
  done
fi
t LayerChain.GridSizesAgree grids
t LayerChain.TraceStampsEveryBlockInOrder trace
t 'LayerChainArgs.*' args
for r in 1 2; do
  for d in base bin; do
    echo "== kernel_bench $d round $r $(date +%T)"
    timeout 100 $D/$d/kernel_bench --iters 10 --out $OUT/kernel-$d-$r.json > $OUT/kernel-$d-$r.txt 2>&1
    echo "rc=$?"; grep -E "prefill_q32_b1 |decode_b1 |decode_b128 " $OUT/kernel-$d-$r.txt | head -n 6
  done
done
