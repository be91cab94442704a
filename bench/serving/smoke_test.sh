#!/usr/bin/env bash
# ctest serving_loadgen_smoke (label integration, < 30 s): a synthetic:tiny worker on the CPU on
# loopback, then lazyrag-loadgen open loop (zipf, LAZY), closed loop (uniform, FULL, documents
# by text) and closed loop PREFIX, a few requests each; checks that every request succeeded and
# that the JSON has the fields that plot.py reads.
#   smoke_test.sh WORKER_BINARY LOADGEN_BINARY [PYTHON]
set -euo pipefail
WORKER=${1:?worker binary}
LOADGEN=${2:?loadgen binary}
PYTHON=${3:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
WPID=""
cleanup() {
  if [[ -n "$WPID" ]]; then
    kill "$WPID" 2>/dev/null || true
    wait "$WPID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT

"$WORKER" --listen=127.0.0.1:0 --metrics_port=-1 --model=synthetic:tiny --device=cpu \
  --kv_pool_bytes=$((64 << 20)) >"$TMP/worker.out" 2>"$TMP/worker.err" &
WPID=$!
addr=""
for _ in $(seq 1 100); do
  addr=$(sed -n 's/.*ready grpc=\([^ ]*\) .*/\1/p' "$TMP/worker.out")
  [[ -n "$addr" ]] && break
  kill -0 "$WPID" 2>/dev/null || break
  sleep 0.1
done
if [[ -z "$addr" ]]; then
  echo "worker did not start"; cat "$TMP/worker.err"; exit 1
fi
echo "worker at $addr"

common=(--target="$addr" --num_docs=6 --doc_tokens=96 --docs_per_request=3 --query_tokens=12
        --max_tokens=4 --warmup=1 --seed=3 --timeout_s=20 --wait_ready_s=10)
"$LOADGEN" "${common[@]}" --rate=20 --num_requests=8 --zipf=2.1 --mode=lazy \
  --out="$TMP/open.json"
"$LOADGEN" "${common[@]}" --rate=0 --concurrency=3 --num_requests=6 --mode=full \
  --docs_by=text --out="$TMP/closed.json"
"$LOADGEN" "${common[@]}" --rate=0 --concurrency=2 --num_requests=4 --mode=prefix \
  --out="$TMP/prefix.json"

"$PYTHON" "$HERE/check_result.py" "$TMP/open.json" 8 lazy
"$PYTHON" "$HERE/check_result.py" "$TMP/closed.json" 6 full
"$PYTHON" "$HERE/check_result.py" "$TMP/prefix.json" 4 prefix
echo "serving_loadgen_smoke: OK"
