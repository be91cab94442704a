#!/usr/bin/env bash
# The two-minute tour: installs what is missing, builds, downloads the bundled model
# (SmolLM2-135M-Instruct), then sends RAG requests that share documents in different orders
# and prints each answer with its time to first token and how many document tokens came
# from the cache. Everything runs on this machine; nothing is left running at exit.
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
cmake --build "$build" -j"$(nproc)" --target lazyrag-cli
docs=deploy/local/docs
echo
echo "== Four RAG requests over the same four documents, each in a new order (LAZY mode)."
echo "   The first computes every document once; the others reuse them at new positions."
"$build/cli/lazyrag-cli" generate --model "$model" --max_tokens 48 --shuffle_docs --seed 7 \
  --doc $docs/kestrel.txt --doc $docs/vantor.txt --doc $docs/ostrova.txt --doc $docs/glass.txt \
  --system "Answer the question in one sentence using only the documents." \
  --query "What colour was the Kestrel Bay lighthouse painted in 1911?" \
  --query "Who invented the folding telescope?" \
  --query "When does the Vantor river freeze?" \
  --query "Who founded the Glass Archive of Pellorin?"
echo
echo "== The same last request in FULL mode (no reuse): compare the time to first token."
"$build/cli/lazyrag-cli" generate --model "$model" --max_tokens 48 --mode full \
  --doc $docs/glass.txt --doc $docs/kestrel.txt --doc $docs/ostrova.txt --doc $docs/vantor.txt \
  --system "Answer the question in one sentence using only the documents." \
  --query "Who founded the Glass Archive of Pellorin?"
