#!/usr/bin/env bash
# The small CPU serving workload of issue 4: one CPU worker with SmolLM2 (or $MODEL), 20
# documents of ~200 tokens, 3 per request drawn Zipf(1.2), 50 requests one at a time, in
# LAZY, MATERIALIZE, PREFIX and FULL, each on a fresh worker. Writes $OUT/cpu-<mode>.json and
# prints each summary. Usage: OUT=DIR bench/serving/run_cpu.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
OUT=${OUT:?set OUT to the output folder}
MODEL=${MODEL:-$HOME/.cache/lazyrag/SmolLM2-135M-Instruct.Q4_1.gguf}
mkdir -p "$OUT"
work=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
for mode in lazy materialize prefix full; do
  "$build/worker/lazyrag-worker" --listen 127.0.0.1:0 --model "$MODEL" --device cpu \
    --kvstore "embedded:$work/kv-$mode" --kv_pool_bytes $((512 << 20)) --metrics_port 0 \
    >"$work/worker.out" 2>"$work/worker-$mode.log" &
  pid=$!
  for _ in $(seq 1 300); do grep -q " ready grpc=" "$work/worker.out" && break; sleep 0.1; done
  addr=$(sed -n 's/.* ready grpc=\([^ ]*\).*/\1/p' "$work/worker.out")
  echo "== $mode (worker $addr)"
  "$build/bench/lazyrag-loadgen" --target "$addr" --mode "$mode" --concurrency 1 \
    --num_requests 50 --num_docs 20 --doc_tokens 200 --docs_per_request 3 --zipf 1.2 \
    --query_tokens 16 --max_tokens 8 --warmup 2 --seed 7 --label "cpu zipf1.2" \
    --out "$OUT/cpu-$mode.json"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
done
