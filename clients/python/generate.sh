#!/usr/bin/env bash
# Generates the Python gRPC stubs of the lazyrag API (proto/lazyrag/v1/inference.proto) into
# OUT_DIR, as the package lazyrag.v1 (inference_pb2.py, inference_pb2_grpc.py). Nothing
# generated is committed: run this once, then put OUT_DIR on PYTHONPATH (or pass it to
# lazyrag_client.Client(stubs_dir=...)).
#
#   clients/python/generate.sh OUT_DIR
#
# Needs grpcio-tools (pip install -r clients/python/requirements.txt).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
proto_root=$(cd "$here/../../proto" && pwd)
out=$1
mkdir -p "$out"
python3 -m grpc_tools.protoc -I "$proto_root" --python_out="$out" --grpc_python_out="$out" \
  "$proto_root/lazyrag/v1/inference.proto"
# Regular packages, so that the stubs import the same way on every Python 3.
touch "$out/lazyrag/__init__.py" "$out/lazyrag/v1/__init__.py"
