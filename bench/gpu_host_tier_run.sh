#!/usr/bin/env bash
# One GPU session for the host tier's copies (issue 23): the copy tests first, then ttft_bench
# with a host tier for the binaries under test and, when carried, a base build beside them
# (alternating, so both see the same machine). Run ON THE GPU MACHINE from the repository root.
#
# Packing here (no GPU needed):
#   mkdir -p .gpu-a/bin .gpu-a/base
#   cp build/worker/backend/{cuda_backend_test,host_transfers_test} build/bench/ttft_bench .gpu-a/bin/
#   cp <base build>/bench/ttft_bench .gpu-a/base/     # optional: the build to compare with
#   strip .gpu-a/bin/* .gpu-a/base/*
#   ../shared/device/collect-libs.sh .gpu-a/lib .gpu-a/bin/* .gpu-a/base/*
#   tar cJf .gpu-a/lib.tar.xz -C .gpu-a lib && rm -rf .gpu-a/lib
# Then one device call carrying [".gpu-a"]:  OUT=$OUT bash bench/gpu_host_tier_run.sh
# Knobs: GPU_DIR=.gpu-a HOST_GB=8 ROUNDS=1 (new/base pairs) TEST_FILTER (cuda_backend_test).
# Results in $OUT: log.txt, ttft-new-<i>.json, ttft-base-<i>.json, <test>.xml.
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
GPU_DIR=${GPU_DIR:-.gpu-a}
HOST_GB=${HOST_GB:-8}
ROUNDS=${ROUNDS:-1}
TEST_FILTER=${TEST_FILTER:-*}
mkdir -p "$OUT"
LIB="$PWD/$GPU_DIR/lib"
if [[ ! -d "$LIB" ]]; then
  LIB=/tmp/lazyrag-host-tier-lib
  mkdir -p "$LIB" && tar xJf "$GPU_DIR/lib.tar.xz" -C "$LIB" && LIB="$LIB/lib"
fi
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  echo "== $(date -u +%FT%TZ) binaries of $(cat "$GPU_DIR/COMMIT" 2>/dev/null) dirty: $(cat "$GPU_DIR/DIRTY" 2>/dev/null | tr '\n' ' ')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
  timeout 60 "$GPU_DIR/bin/host_transfers_test" --gtest_brief=1
  echo "host_transfers_test rc=$?"
  timeout 240 "$GPU_DIR/bin/cuda_backend_test" --gtest_brief=1 --gtest_filter="$TEST_FILTER" \
    --gtest_output="xml:$OUT/cuda_backend_test.xml"
  echo "cuda_backend_test rc=$?"
  for i in $(seq 1 "$ROUNDS"); do
    for which in bin base; do
      [[ -x "$GPU_DIR/$which/ttft_bench" ]] || continue
      name=$([[ $which == bin ]] && echo new || echo base)
      echo "== ttft_bench $name (round $i)"
      timeout 200 "$GPU_DIR/$which/ttft_bench" --host_cache_gb "$HOST_GB" --out "$OUT/ttft-$name-$i.json"
      echo "ttft_bench $name rc=$?"
    done
  done
} 2>&1 | tee "$OUT/log.txt"
