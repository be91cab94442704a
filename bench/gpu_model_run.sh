#!/usr/bin/env bash
# One GPU session for the CUDA model backend (issue 6 must-show 2 and 4): correctness first
# (cuda_backend_test: the CUDA model against the CPU model), then ttft_bench (LAZY /
# MATERIALIZE / FULL TTFT on the Llama-3.1-8B shape). Run ON THE GPU MACHINE from the
# repository root, with the binaries built here in $GPU_DIR/bin and their non-CUDA libraries
# in $GPU_DIR/lib (GPU_DIR defaults to .gpu). About 2-4 minutes of GPU time.
# Results go to $OUT: log.txt, cuda_backend_test.xml, ttft.json, hf_prefill.json.
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
  echo "== cuda_backend_test"
  start=$(date +%s)
  timeout 240 "$GPU_DIR/bin/cuda_backend_test" --gtest_output="xml:$OUT/cuda_backend_test.xml"
  echo "cuda_backend_test: exit $? in $(( $(date +%s) - start )) s"
  echo "== ttft_bench"
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout 240 "$GPU_DIR/bin/ttft_bench" --out "$OUT/ttft.json" $TTFT_ARGS
  echo "ttft_bench: exit $? in $(( $(date +%s) - start )) s"
  if [[ "${HF:-1}" == 1 ]]; then
    echo "== hf_prefill (Hugging Face transformers, same shape, same GPU)"
    start=$(date +%s)
    PYTHONUNBUFFERED=1 timeout 240 python3 bench/hf_prefill.py --out "$OUT/hf_prefill.json"
    echo "hf_prefill: exit $? in $(( $(date +%s) - start )) s"
  fi
} 2>&1 | tee "$OUT/log.txt"
