#!/usr/bin/env bash
# One GPU session for the CUDA model backend (issue 6 must-show 2 and 4): correctness first
# (cuda_backend_test: the CUDA model against the CPU model), then ttft_bench (LAZY /
# MATERIALIZE / FULL TTFT on the Llama-3.1-8B shape). Run ON THE GPU MACHINE from the
# repository root, with the binaries built here in $GPU_DIR/bin and their non-CUDA libraries
# in $GPU_DIR/lib (GPU_DIR defaults to .gpu). About 2-4 minutes of GPU time.
# Results go to $OUT: log.txt, <test>.xml, ttft.json, ttft_nographs.json, tp.json, hf_prefill.json.
#
# Packing here (no GPU needed; cuBLAS/cudart are on the GPU machine and are not carried):
#   cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-cuda -j2 --target cuda_backend_test ttft_bench
#   mkdir -p .gpu/bin .gpu/lib
#   cp build-cuda/worker/backend/cuda_backend_test build-cuda/bench/ttft_bench .gpu/bin/
#   strip .gpu/bin/*
#   ../shared/device/collect-libs.sh .gpu/lib .gpu/bin/*
#   du -sh .gpu   # everything carried must stay under 64 MiB
# Then on the device, carrying .gpu:  OUT=$OUT bash bench/gpu_model_run.sh
# (or another ignored folder, carried and named:  GPU_DIR=.gpu-model OUT=$OUT bash ...)
# Every *_test binary in $GPU_DIR/bin runs first. ttft_bench runs with CUDA graphs on
# (ttft.json) and off (ttft_nographs.json; GRAPHS_OFF=0 skips it). TP_CONFIGS runs tp_bench
# when carried (e.g. TP_CONFIGS=synthetic:llama3-8b:1,synthetic:llama3-8b:2: tp.json).
# TTFT_ARGS adds ttft_bench flags (e.g. TTFT_ARGS="--runs 11 --chunk 4096"). HF=0 skips the
# Hugging Face peer (bench/hf_prefill.py, FULL prefill of the same 10,272 tokens: hf_prefill.json).
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
GPU_DIR=${GPU_DIR:-.gpu}
TTFT_ARGS=${TTFT_ARGS:-}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$GPU_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
    --format=csv || true
  # Every GPU test binary carried (cuda_backend_test, cuda_tensor_parallel_test, ...).
  for t in "$GPU_DIR"/bin/*_test; do
    [[ -x "$t" ]] || continue
    name=$(basename "$t")
    echo "== $name"
    start=$(date +%s)
    timeout 240 "$t" --gtest_output="xml:$OUT/$name.xml"
    echo "$name: exit $? in $(( $(date +%s) - start )) s"
  done
  echo "== ttft_bench (CUDA graphs on)"
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout 240 "$GPU_DIR/bin/ttft_bench" --out "$OUT/ttft.json" $TTFT_ARGS
  echo "ttft_bench: exit $? in $(( $(date +%s) - start )) s"
  if [[ "${GRAPHS_OFF:-1}" == 1 ]]; then
    echo "== ttft_bench (CUDA graphs off)"
    start=$(date +%s)
    # shellcheck disable=SC2086
    timeout 240 "$GPU_DIR/bin/ttft_bench" --cuda_graphs 0 --out "$OUT/ttft_nographs.json" $TTFT_ARGS
    echo "ttft_bench --cuda_graphs 0: exit $? in $(( $(date +%s) - start )) s"
  fi
  if [[ -x "$GPU_DIR/bin/tp_bench" && -n "${TP_CONFIGS:-}" ]]; then
    echo "== tp_bench $TP_CONFIGS"
    start=$(date +%s)
    timeout "${TP_TIMEOUT:-300}" "$GPU_DIR/bin/tp_bench" --configs "$TP_CONFIGS" --out "$OUT/tp.json"
    echo "tp_bench: exit $? in $(( $(date +%s) - start )) s"
  fi
  if [[ "${HF:-1}" == 1 ]]; then
    echo "== hf_prefill (Hugging Face transformers, same shape, same GPU)"
    start=$(date +%s)
    PYTHONUNBUFFERED=1 timeout 240 python3 bench/hf_prefill.py --out "$OUT/hf_prefill.json"
    echo "hf_prefill: exit $? in $(( $(date +%s) - start )) s"
  fi
} 2>&1 | tee "$OUT/log.txt"
