#!/usr/bin/env bash
# One device session for issue 9's peer tier (document transfer between GPUs of one host):
# peer_copy_test (the page-gather kernel, page-run copies and pool <-> buffer transport against
# a host reference; pull and push across two GPUs), then peer_transfer_bench (a 2048-token
# Llama-3.1-8B-shaped document, 268 MB, GPU0 -> GPU1 by gather kernel, cudaMemcpyPeerAsync page
# runs, NCCL, and host-staged D2H + H2D). Run ON THE GPU MACHINE (2 GPUs: nvidia-h200-x2) from
# the repository root, with the binaries in $GPU_DIR/bin and their non-CUDA libraries in
# $GPU_DIR/lib (GPU_DIR defaults to .gpu-peer). About 1 minute of device time.
# Results go to $OUT: log.txt, peer_copy_test.xml, peer_transfer.json.
#
# Packing here (no GPU needed):
#   cmake -S . -B build-peer -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-peer -j2 --target peer_copy_test peer_transfer_bench
#   mkdir -p .gpu-peer/bin .gpu-peer/lib
#   cp build-peer/worker/backend/peer_copy_test build-peer/bench/peer_transfer_bench .gpu-peer/bin/
#   strip .gpu-peer/bin/*
#   ../shared/device/collect-libs.sh .gpu-peer/lib .gpu-peer/bin/*
# Then on the device, carrying .gpu-peer:  OUT=$OUT bash bench/peer_run.sh
# REPS=N changes the repetitions per method (default 50); RUN_SANITIZER=0 skips memcheck.
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
GPU_DIR=${GPU_DIR:-.gpu-peer}
REPS=${REPS:-50}
RUN_SANITIZER=${RUN_SANITIZER:-1}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$GPU_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
[ "$RUN_SANITIZER" = 1 ] || SANITIZER=

{
  echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv || true
  echo "== GPU topology (NV# = NVLink)"
  nvidia-smi topo -m || true

  echo "== peer_copy_test (page copies vs the host reference; two GPUs: pull and push)"
  timeout 120 "$GPU_DIR"/bin/peer_copy_test --gtest_brief=1 \
    --gtest_output="xml:$OUT/peer_copy_test.xml"
  echo "peer_copy_test rc=$?"

  if [ -n "$SANITIZER" ]; then
    echo "== compute-sanitizer memcheck (peer_copy_test)"
    timeout 120 "$SANITIZER" --tool memcheck --error-exitcode 9 \
      "$GPU_DIR"/bin/peer_copy_test --gtest_brief=1
    echo "memcheck rc=$?"
  else
    echo "== compute-sanitizer not found or RUN_SANITIZER=0; skipped"
  fi

  echo "== peer_transfer_bench (2048-token 8B document, $REPS reps per method)"
  timeout 240 "$GPU_DIR"/bin/peer_transfer_bench --reps "$REPS" --out "$OUT/peer_transfer.json"
  echo "peer_transfer_bench rc=$?"
} 2>&1 | tee "$OUT/log.txt"
