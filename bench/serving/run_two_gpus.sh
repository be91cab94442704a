#!/usr/bin/env bash
# Two run_serving.sh instances side by side on a 2-GPU machine (nvidia-h200-x2), one mode per
# GPU, each with its own worker, router, WORK folder and output: the paper's points at 120
# requests each take ~8 minutes per mode and distribution, so two modes fit one device call.
# Run ON THE GPU MACHINE from the repository root, carrying .gpu-serve (packed as described at
# the top of run_serving.sh):
#   OUT=$OUT MODE0=lazy MODE1=materialize DISTS=zipf bash bench/serving/run_two_gpus.sh
# Other knobs are passed through to run_serving.sh (QUICK, RATES, N, SAT_S, BUDGET_S, ...);
# the defaults here are the paper's sizes (QUICK=0: 120 requests per point), no saturation
# point, BUDGET_S=570.
# What comes back in $OUT: serving-<mode>.tgz (each instance's output folder: log.txt,
# serving-results.tgz, summary.md/json, plots) and log.txt (both logs' tails). The instances
# write into $OUT/<mode> in place and the folders are archived at the end: a call cut short
# still returns what was written (but only 8 files come back, so archive when you can).
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
MODE0=${MODE0:-lazy}
MODE1=${MODE1:-materialize}
export QUICK=${QUICK:-0} SAT_S=${SAT_S:-0} BUDGET_S=${BUDGET_S:-570} DISTS=${DISTS:-zipf}
# NVLink multicast stays off on these machines (KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(dirname "${BASH_SOURCE[0]}")
mkdir -p "$OUT"
pids=()
gpu=0
for mode in "$MODE0" "$MODE1"; do
  CUDA_VISIBLE_DEVICES=$gpu WORK=/tmp/lazyrag-serve-$gpu OUT="$OUT/$mode" MODES=$mode \
    bash "$here/run_serving.sh" >/tmp/serving-$mode.console 2>&1 &
  pids+=($!)
  gpu=$((gpu + 1))
done
for pid in "${pids[@]}"; do wait "$pid"; done
: >"$OUT/log.txt"
for mode in "$MODE0" "$MODE1"; do
  { echo "== $mode"; tail -n 40 "$OUT/$mode/log.txt"; } >>"$OUT/log.txt"
  tar czf "$OUT/serving-$mode.tgz" -C "$OUT" "$mode" && rm -rf "${OUT:?}/$mode"
done
cat "$OUT/log.txt"
