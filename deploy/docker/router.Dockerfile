# lazyrag-router: the front door (document affinity, retries), no GPU.
# Build from the repository root:
#   docker build -f deploy/docker/router.Dockerfile -t lazyrag/router:0.1.0 .
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
      -DLAZYRAG_ONLY="proto;http;router;cli" \
    && cmake --build /build --target lazyrag-router lazyrag-cli \
    && install -D -m 0755 /build/router/lazyrag-router /out/usr/local/bin/lazyrag-router \
    && install -D -m 0755 /build/cli/lazyrag-cli /out/usr/local/bin/lazyrag-cli

FROM debian:12-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libcpp-httplib0.11 libssl3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /
USER 65532:65532
EXPOSE 50050 9400
ENTRYPOINT ["/usr/local/bin/lazyrag-router"]
CMD ["--listen=0.0.0.0:50050", "--metrics_port=9400", "--metrics_host=0.0.0.0"]
