# lazyrag-worker: one model on one GPU (CUDA backend) or on the CPU.
# Build from the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t lazyrag/worker:0.1.0 .
#   (--build-arg CUDA_ARCHITECTURES=90a for H100/H200, the CMake default)
# NVIDIA publishes CUDA images on Ubuntu, not Debian, so both stages are Ubuntu 24.04 with the
# same packages as deploy/local/bootstrap.sh. Ubuntu names its runtime libraries differently
# (t64 suffixes), so the runtime stage gets the worker's shared libraries copied by ldd rather
# than by package name; the CUDA libraries come from the CUDA runtime base.
# A model is not baked in: mount one (Helm worker.model.source=volume) or build a derived image
# that COPYs it (worker.model.source=image).
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
ARG CUDA_ARCHITECTURES=90a
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      librocksdb-dev libabsl-dev libgtest-dev libgmock-dev libopenblas-dev \
      libcpp-httplib-dev nlohmann-json3-dev libpcre2-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAZYRAG_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES} \
    && cmake --build /build --target lazyrag-worker lazyrag-cli \
    && install -D -m 0755 /build/worker/lazyrag-worker /out/usr/local/bin/lazyrag-worker \
    && install -D -m 0755 /build/cli/lazyrag-cli /out/usr/local/bin/lazyrag-cli \
    && mkdir -p /out/usr/local/lib/lazyrag \
    && ldd /build/worker/lazyrag-worker /build/cli/lazyrag-cli | awk '/=> \// { print $3 }' \
       | grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|/libcuda\.so|/usr/local/cuda' \
       | xargs -r -I{} cp -L {} /out/usr/local/lib/lazyrag/

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
COPY --from=build /out/ /
ENV LD_LIBRARY_PATH=/usr/local/lib/lazyrag:${LD_LIBRARY_PATH}
USER 65532:65532
EXPOSE 50052 9401
ENTRYPOINT ["/usr/local/bin/lazyrag-worker"]
CMD ["--listen=0.0.0.0:50052", "--device=cuda", "--metrics_port=9401", "--metrics_host=0.0.0.0"]
