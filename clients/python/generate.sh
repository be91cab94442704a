#!/usr/bin/env bash
# Regenerates the protobuf messages the Python client ships (lazyrag_client/inference_pb2.py
# and its type stubs inference_pb2.pyi) from proto/lazyrag/v1/inference.proto. The generated
# files are committed, so that `pip install ./clients/python` needs no code generator; run this
# after changing the proto and commit the result (ctest python_client_stubs_current fails until
# then).
#
#   clients/python/generate.sh [OUT_DIR]     (default: clients/python/lazyrag_client)
#
# Uses Debian's protoc (protobuf-compiler, installed by deploy/local/bootstrap.sh): its output
# runs on every protobuf runtime >= 4.21. Only messages are generated; the client makes its
# three gRPC calls itself (lazyrag_client/_client.py), so no grpcio-tools are needed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proto_root=$(cd "$here/../../proto" && pwd)
out=${1:-$here/lazyrag_client}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
protoc -I "$proto_root" --python_out="$tmp" --pyi_out="$tmp" "$proto_root/lazyrag/v1/inference.proto"
mkdir -p "$out"
cp "$tmp/lazyrag/v1/inference_pb2.py" "$tmp/lazyrag/v1/inference_pb2.pyi" "$out/"
