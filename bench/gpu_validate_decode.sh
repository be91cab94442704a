#!/usr/bin/env bash
# One H200 call that validates and times the per-warp-pipeline decode kernel of branch
# wip/decode-warp-pipes (DecodeKernel::kWarpPipes; written 2026-11-30 without device time). Its
# kernels_test run also validates main's kernel mends of 2026-11-30 (OnlineSoftmaxTile,
# MaskRowMax, StoreRows<D>, the wgmma operand macros: checked by PTX equivalence only).
# About 2 minutes. Run ON THE GPU MACHINE from the repository root with GPU_DIR (default
# .gpu-dec) carried: bin/ and lib.tar.xz.
#
# Packing here:
#   cmake -S . -B build-next -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
#     "-DLAZYRAG_ONLY=worker/model;worker/model/tokenizer;worker/backend;worker/kernels;worker/cache;worker/engine;bench"
#   ninja -C build-next kernels_test kernel_bench
#   mkdir -p .gpu-dec/bin && cp build-next/worker/kernels/kernels_test build-next/bench/kernel_bench \
#     .gpu-dec/bin/ && strip .gpu-dec/bin/*
#   ../shared/device/collect-libs.sh .gpu-dec/lib .gpu-dec/bin/* && \
#     (cd .gpu-dec && tar cJf lib.tar.xz lib && rm -rf lib)
#   echo /.gpu-dec/ >> .git/info/exclude
# Then: run(command="OUT=$OUT bash bench/gpu_validate_decode.sh", carry=[".gpu-dec"]).
# Expect: kernels_test all pass (DecodeWarpPipesMatchBlockTiles: bit-identical to the block
# tiles and within tolerance of the CPU), memcheck and racecheck clean on that test; then compare
# the decode rows lazy vs lazy_warp_pipes (b1 target: 14 us = 3 TB/s) and the b1 split sweeps
# lazy_s* vs warp_s*. If warp pipelines win at batch 1 and do not lose at batch 128, make them
# the kAuto choice.
set -uo pipefail
OUT=${OUT:?set OUT}
GPU_DIR=${GPU_DIR:-.gpu-dec}
(cd "$GPU_DIR" && tar xJf lib.tar.xz)
export LD_LIBRARY_PATH="$PWD/$GPU_DIR/lib"
B="$GPU_DIR/bin"
S=/usr/local/cuda/bin/compute-sanitizer
{
  echo "== $(date -u +%FT%TZ)"
  echo "== kernels_test"; timeout 150 "$B"/kernels_test --gtest_brief=1; echo "rc=$?"
  for tool in memcheck racecheck; do
    echo "== $tool"
    timeout 150 "$S" --tool "$tool" --error-exitcode 9 "$B"/kernels_test --gtest_brief=1 \
      --gtest_filter='*DecodeWarpPipes*'
    echo "rc=$?"
  done
  echo "== kernel_bench"
  timeout 200 "$B"/kernel_bench --out "$OUT/kernels.json" | grep "ceil\|decode"
  echo "rc=$?"
} >"$OUT/log.txt" 2>&1
tail -c 11000 "$OUT/log.txt"
