# lazyrag-kvstore: one shard of the document-KV store (RocksDB).
# Build from the repository root:
#   docker build -f deploy/docker/kvstore.Dockerfile -t lazyrag/kvstore:0.1.0 .
# The build is the project's CMake build (Debian 12 packages, as deploy/local/bootstrap.sh
# installs them), restricted to the kvstore and lazyrag-cli (the chart's TLS health probe runs
# `lazyrag-cli health`).
FROM debian:12 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      librocksdb-dev libabsl-dev libgtest-dev libgmock-dev libopenblas-dev \
      libcpp-httplib-dev nlohmann-json3-dev libpcre2-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAZYRAG_CUDA=OFF \
      -DLAZYRAG_ONLY="proto;kvstore;cli" \
    && cmake --build /build --target lazyrag-kvstore lazyrag-cli \
    && install -D -m 0755 /build/kvstore/lazyrag-kvstore /out/usr/local/bin/lazyrag-kvstore \
    && install -D -m 0755 /build/cli/lazyrag-cli /out/usr/local/bin/lazyrag-cli

FROM debian:12-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 librocksdb7.8 libabsl20220623 libcpp-httplib0.11 libssl3 \
      ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /
# The Helm chart runs every container as 65532 with a read-only root filesystem; the data
# folder is the shard's volume.
USER 65532:65532
EXPOSE 50051 9402
ENTRYPOINT ["/usr/local/bin/lazyrag-kvstore"]
CMD ["--listen=0.0.0.0:50051", "--data_dir=/var/lib/lazyrag/kvstore", "--metrics_port=9402", "--metrics_host=0.0.0.0"]
