#!/usr/bin/env bash
# One GPU session for worker/kernels: correctness first, then timings. Run ON THE GPU MACHINE
# from the repository root, with the binaries built here in $GPU_DIR/bin and their non-CUDA
# libraries in $GPU_DIR/lib (GPU_DIR defaults to .gpu; about 4-5 minutes of GPU time in all).
# Results go to $OUT: log.txt, kernels_test.xml, kernels.json, sdpa.json.
# RUN_SDPA=0 skips the PyTorch SDPA peers; RUN_SANITIZER=0 skips compute-sanitizer;
# SANITIZER_TIMEOUT (seconds, default 150) bounds each sanitizer pass.
#
# Packing here (no GPU needed):
#   cmake -S . -B build-cuda -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-cuda -j2 --target kernels_test kernel_bench
#   mkdir -p .gpu/bin .gpu/lib
#   cp build-cuda/worker/kernels/kernels_test build-cuda/bench/kernel_bench .gpu/bin/
#   strip .gpu/bin/*
#   ../shared/device/collect-libs.sh .gpu/lib .gpu/bin/*
# Then on the device, carrying .gpu:  OUT=$OUT bash bench/gpu_run.sh
# (or another folder, e.g. .gpu-kernels, carried and named:  GPU_DIR=.gpu-kernels OUT=$OUT ...)
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
GPU_DIR=${GPU_DIR:-.gpu}
RUN_SDPA=${RUN_SDPA:-1}
RUN_SANITIZER=${RUN_SANITIZER:-1}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$GPU_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
[ "$RUN_SANITIZER" = 1 ] || SANITIZER=

{
  echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem \
    --format=csv || true

  echo "== kernels_test (every kernel vs the CPU reference)"
  timeout 300 "$GPU_DIR"/bin/kernels_test --gtest_brief=1 --gtest_output="xml:$OUT/kernels_test.xml"
  echo "kernels_test rc=$?"

  if [ -n "$SANITIZER" ]; then
    # Small shapes only: out-of-bounds accesses and shared-memory races in the cp.async
    # pipelines (both key layouts, both kernels, a forced split, the materialize kernel).
    filter='Shapes/AttentionSweep.*/d64_g3_ps16_*:Materialize.MatchesCpu:LazyAttention.ManySegments'
    filter="$filter:LazyAttention.DecodeSplitMergeWorkspace"
    echo "== compute-sanitizer memcheck ($filter)"
    timeout ${SANITIZER_TIMEOUT:-150} "$SANITIZER" --tool memcheck --error-exitcode 9 \
      "$GPU_DIR"/bin/kernels_test --gtest_brief=1 --gtest_filter="$filter"
    echo "memcheck rc=$?"
    filter='Shapes/AttentionSweep.*/d64_g4_ps16_rotated_local'
    echo "== compute-sanitizer racecheck ($filter)"
    timeout ${SANITIZER_TIMEOUT:-150} "$SANITIZER" --tool racecheck --error-exitcode 9 \
      "$GPU_DIR"/bin/kernels_test --gtest_brief=1 --gtest_filter="$filter"
    echo "racecheck rc=$?"
  else
    echo "== compute-sanitizer not found or RUN_SANITIZER=0; skipped"
  fi

  echo "== kernel_bench"
  timeout 240 "$GPU_DIR"/bin/kernel_bench --out "$OUT/kernels.json"
  echo "kernel_bench rc=$?"

  if [ "$RUN_SDPA" = 1 ]; then
    echo "== sdpa_bench (PyTorch SDPA, flash backend)"
    timeout 240 python3 bench/sdpa_bench.py --out "$OUT/sdpa.json"
    echo "sdpa_bench rc=$?"
  fi
} 2>&1 | tee "$OUT/log.txt"
