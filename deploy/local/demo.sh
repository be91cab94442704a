#!/usr/bin/env bash
# The two-minute tour: installs what is missing, builds, downloads the bundled model
# (SmolLM2-135M-Instruct), starts a kvstore shard, a CPU worker and the router on free
# loopback ports, sends RAG requests that share documents in different orders through the
# router, and prints each answer with its time to first token and how many document tokens
# came from the cache. Everything it starts is stopped on exit (also on Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/../.."
model_line=$(./deploy/local/bootstrap.sh | tail -n 1)
model=${LAZYRAG_MODEL:-${model_line#model: }}
if [ ! -s "$model" ]; then
  echo "demo: the bundled model could not be downloaded; using synthetic:tiny (answers are noise)" >&2
  model=synthetic:tiny
fi
build=${LAZYRAG_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target lazyrag-kvstore lazyrag-worker lazyrag-router lazyrag-cli

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a server whose stdout announces "... ready grpc=HOST:PORT metrics=PORT" and sets
# $addr to HOST:PORT. Not called in a subshell, so that cleanup knows every pid.
start() {
  local name=$1; shift
  "$@" >"$work/$name.out" 2>"$work/$name.log" &
  pids+=($!)
  for _ in $(seq 1 600); do
    if grep -q " ready grpc=" "$work/$name.out" 2>/dev/null; then
      addr=$(sed -n 's/.* ready grpc=\([^ ]*\).*/\1/p' "$work/$name.out" | head -n 1)
      return 0
    fi
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "demo: $name did not start; its log:" >&2
  cat "$work/$name.log" >&2
  return 1
}

start kvstore "$build/kvstore/lazyrag-kvstore" --listen 127.0.0.1:0 --data_dir "$work/kv" \
  --capacity_bytes $((1 << 30)) --metrics_port 0
kv=$addr
start worker "$build/worker/lazyrag-worker" --listen 127.0.0.1:0 --model "$model" \
  --device cpu --kvstore "$kv" --kv_pool_bytes $((256 << 20)) --metrics_port 0
worker=$addr
start router "$build/router/lazyrag-router" --listen 127.0.0.1:0 --workers "$worker" \
  --metrics_port 0 --http_listen 127.0.0.1:0
router=$addr
http_port=$(sed -n 's/.* ready grpc=.* http=\([0-9]*\).*/\1/p' "$work/router.out" | head -n 1)
echo "demo: kvstore $kv, worker $worker, router $router (OpenAI-compatible HTTP on port $http_port)"

docs=deploy/local/docs
echo
echo "== Four RAG requests through the router over the same four documents, each in a new"
echo "   order (LAZY mode). The first computes every document once (and writes it to the"
echo "   kvstore); the others reuse them from the worker's pool at new positions."
"$build/cli/lazyrag-cli" generate --server "$router" --max_tokens 48 --shuffle_docs --seed 7 \
  --doc $docs/kestrel.txt --doc $docs/vantor.txt --doc $docs/ostrova.txt --doc $docs/glass.txt \
  --system "Answer the question in one sentence using only the documents." \
  --query "What colour was the Kestrel Bay lighthouse painted in 1911?" \
  --query "Who invented the folding telescope?" \
  --query "When does the Vantor river freeze?" \
  --query "Who founded the Glass Archive of Pellorin?"
echo
echo "== The same last request in FULL mode (nothing reused): compare the time to first token."
"$build/cli/lazyrag-cli" generate --server "$router" --max_tokens 48 --mode full \
  --doc $docs/glass.txt --doc $docs/kestrel.txt --doc $docs/ostrova.txt --doc $docs/vantor.txt \
  --system "Answer the question in one sentence using only the documents." \
  --query "Who founded the Glass Archive of Pellorin?"
echo
echo "== The OpenAI-compatible HTTP API of the router (curl; any OpenAI SDK works the same way):"
echo "   the documents (the same texts as above, so cached) go in the body as \"documents\"; the"
echo "   cached document tokens come back in usage.prompt_tokens_details.cached_tokens."
python3 - "$docs" <<'PY' >"$work/body.json"
import json, sys
docs = sys.argv[1]
print(json.dumps({
    "model": "smollm2", "max_tokens": 48,
    "messages": [{"role": "system",
                  "content": "Answer the question in one sentence using only the documents."},
                 {"role": "user", "content": "When does the Vantor river freeze?"}],
    "documents": [{"text": open(f"{docs}/{name}.txt").read()} for name in ("vantor", "glass")]}))
PY
curl -sS "http://127.0.0.1:$http_port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d @"$work/body.json" | python3 -m json.tool
echo
echo "demo: done; stopping kvstore, worker and router"
