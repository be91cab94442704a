#!/usr/bin/env bash
# Builds the Go example client from the proto alone, offline, with Debian's packages only
# (golang-go, golang-goprotobuf-dev for protoc-gen-go, golang-google-grpc-dev; installed by
# deploy/local/bootstrap.sh): generates lazyrag/v1 (messages + gRPC client) into a GOPATH
# under OUT_DIR and builds OUT_DIR/bin/lazyrag-go-example in GOPATH mode against
# /usr/share/gocode. Nothing generated is committed.
#
#   clients/go/build.sh OUT_DIR
#
# Exits 77 when a tool is missing (go, protoc, protoc-gen-go or the gRPC-Go sources).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
proto_root=$(cd "$here/../../proto" && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
for tool in go protoc protoc-gen-go; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool not found (bootstrap.sh installs it)"; exit 77; }
done
[ -d /usr/share/gocode/src/google.golang.org/grpc ] ||
  { echo "build.sh: /usr/share/gocode has no gRPC-Go (golang-google-grpc-dev)"; exit 77; }

mkdir -p "$out/src/lazyrag-go-example" "$out/bin"
# protoc-gen-go 1.3: messages and the gRPC client in one file, package lazyrag/v1.
protoc -I "$proto_root" --go_out=plugins=grpc:"$out/src" "$proto_root/lazyrag/v1/inference.proto"
cp "$here/main.go" "$out/src/lazyrag-go-example/main.go"
cd "$out/src/lazyrag-go-example"
GO111MODULE=off GOPATH="$out:/usr/share/gocode" GOCACHE="$out/cache" GOFLAGS= \
  go build -o "$out/bin/lazyrag-go-example" .
echo "built $out/bin/lazyrag-go-example"
