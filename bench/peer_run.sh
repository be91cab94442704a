#!/usr/bin/env bash
# One device session for issue 9's peer tier (document transfer between GPUs of one host), on
# the 2-GPU machine (nvidia-h200-x2), from the repository root:
#   1. peer_copy_test: the page-gather kernel, page-run copies and pool <-> buffer transport
#      against a host reference; pull and push across two GPUs (+ compute-sanitizer memcheck).
#   2. peer_gpu_process_test: two lazyrag-worker processes (--device cuda, --cuda_device 1 holds
#      the documents, --cuda_device 0 takes them with --peers): the fast path (CUDA IPC of the
#      peer's pool, pages copied GPU to GPU, leases released), nothing computed, no kvstore, no
#      bytes; the output equals the peer's, a fresh worker's, and path 1's (--peer_device_copy=0).
#   3. peer_transfer_bench: a 2048-token Llama-3.1-8B-shaped document (268 MB) GPU0 -> GPU1 by
#      gather kernel (pull/push), cudaMemcpyPeerAsync page runs, NCCL, host-staged D2H + H2D.
#   4. End to end (PeerGpuE2E in peer_gpu_process_test, E2E_MODEL, default synthetic:llama3-8b):
#      B on GPU 1 holds 5 documents of E2E_TOKENS (2048) tokens; A on GPU 0 asks for each in its
#      own request (1 output token) by the fast path, by bytes (path 1), and computing it; the
#      time to first token of each, median per mode.
# Every step has its own timeout and the script carries on after a failure; ~3-4 minutes.
#
# Results in $OUT (6 files): log.txt (everything, worker logs included), peer_copy_test.xml,
# peer_gpu_process_test.xml, peer_transfer.json, peer_e2e.json, summary.txt (rc of each step and
# the e2e table).
#
# Packing here (no GPU needed; cudart/cuBLAS/NCCL are on the GPU machine and are not carried):
#   cmake -S . -B build-peer -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-peer -j2 --target peer_copy_test peer_transfer_bench lazyrag-worker \
#     peer_gpu_process_test
#   rm -rf .gpu-peer2 && mkdir -p .gpu-peer2/bin .gpu-peer2/lib
#   cp build-peer/worker/backend/peer_copy_test build-peer/bench/peer_transfer_bench \
#      build-peer/worker/lazyrag-worker build-peer/tests/worker/peer_gpu_process_test .gpu-peer2/bin/
#   strip .gpu-peer2/bin/*
#   ../shared/device/collect-libs.sh .gpu-peer2/lib .gpu-peer2/bin/*
#   tar cJf .gpu-peer2/lib.tar.xz -C .gpu-peer2 lib && rm -rf .gpu-peer2/lib   # unpacked there
#   grep -qx '/.gpu-peer2/' .git/info/exclude || echo /.gpu-peer2/ >> .git/info/exclude
#   git rev-parse HEAD > .gpu-peer2/COMMIT; git status --short > .gpu-peer2/DIRTY
#   du -sh .gpu-peer2   # keep under 40 MiB
# Then one device call (kind nvidia-h200-x2, carry [".gpu-peer2"], timeout_s 600):
#   OUT=$OUT GPU_DIR=.gpu-peer2 bash bench/peer_run.sh
# Knobs: REPS (peer_transfer_bench repetitions per method, 50), RUN_SANITIZER (1), E2E (1),
# E2E_MODEL (synthetic:llama3-8b), E2E_TOKENS (2048), BUDGET_S (560: later steps are skipped
# when less than their timeout is left).
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
GPU_DIR=${GPU_DIR:-.gpu-peer2}
REPS=${REPS:-50}
RUN_SANITIZER=${RUN_SANITIZER:-1}
E2E=${E2E:-1}
E2E_MODEL=${E2E_MODEL:-synthetic:llama3-8b}
E2E_TOKENS=${E2E_TOKENS:-2048}
BUDGET_S=${BUDGET_S:-560}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
SUMMARY="$OUT/summary.txt"
: > "$LOG"
: > "$SUMMARY"
START=$(date +%s)
BIN="$PWD/$GPU_DIR/bin"
LIB="$PWD/$GPU_DIR/lib"
log() { echo "$*" | tee -a "$LOG"; }

# Libraries: carried as lib.tar.xz (or a plain lib/ folder), unpacked under /tmp.
if [ -f "$GPU_DIR/lib.tar.xz" ]; then
  LIB=/tmp/lazyrag-peer-lib
  rm -rf "$LIB" && mkdir -p "$LIB"
  tar xJf "$GPU_DIR/lib.tar.xz" -C "$LIB" --strip-components=1 >>"$LOG" 2>&1 ||
    log "!! unpacking $GPU_DIR/lib.tar.xz failed"
fi
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LAZYRAG_WORKER_BINARY="$BIN/lazyrag-worker"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
[ "$RUN_SANITIZER" = 1 ] || SANITIZER=

# step NAME TIMEOUT_S CMD...: runs CMD with a timeout, output to the log; records the rc.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - START)))
  if [ "$left" -lt 15 ]; then
    log "== $name: SKIPPED (budget: ${left} s left)"
    echo "$name SKIPPED (budget)" >>"$SUMMARY"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "== $name (timeout ${limit} s) $(date -u +%T)"
  local t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  log "== $name rc=$rc ($(($(date +%s) - t0)) s)"
  echo "$name rc=$rc $(($(date +%s) - t0))s" >>"$SUMMARY"
}

{
  echo "== $(date -u +%FT%TZ) commit $(cat "$GPU_DIR/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  [ -f "$GPU_DIR/DIRTY" ] && { echo "== uncommitted at packing:"; cat "$GPU_DIR/DIRTY"; }
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv || true
  echo "== GPU topology (NV# = NVLink)"
  nvidia-smi topo -m || true
  for b in "$BIN"/*; do
    echo "-- ldd $(basename "$b") (missing):"
    ldd "$b" | grep "not found" || echo "   none"
  done
} >>"$LOG" 2>&1

step peer_copy_test 120 "$BIN/peer_copy_test" --gtest_brief=1 \
  --gtest_output="xml:$OUT/peer_copy_test.xml"

step peer_gpu_process_test 240 "$BIN/peer_gpu_process_test" --gtest_brief=1 \
  --gtest_filter='PeerGpuProcessTest.*' --gtest_output="xml:$OUT/peer_gpu_process_test.xml"

step peer_transfer_bench 180 "$BIN/peer_transfer_bench" --reps "$REPS" \
  --out "$OUT/peer_transfer.json"

if [ "$E2E" = 1 ]; then
  step peer_e2e 300 env LAZYRAG_PEER_E2E_MODEL="$E2E_MODEL" LAZYRAG_PEER_E2E_TOKENS="$E2E_TOKENS" \
    LAZYRAG_PEER_E2E_OUT="$OUT/peer_e2e.json" "$BIN/peer_gpu_process_test" --gtest_brief=1 \
    --gtest_filter='PeerGpuE2E.*'
  # The table the test printed.
  grep -E -A4 '^mode +ttft_med_ms' "$LOG" >>"$SUMMARY" || true
else
  echo "peer_e2e SKIPPED (E2E=0)" >>"$SUMMARY"
fi

if [ -n "$SANITIZER" ]; then
  step memcheck_peer_copy_test 120 "$SANITIZER" --tool memcheck --error-exitcode 9 \
    "$BIN/peer_copy_test" --gtest_brief=1
else
  log "== compute-sanitizer not found or RUN_SANITIZER=0; memcheck skipped"
fi

log "== done in $(($(date +%s) - START)) s"
cat "$SUMMARY" | tee -a "$LOG"
