// CUDA helpers shared by the benchmark programs (kernel_bench, bench/dev): device buffers,
// deterministic bf16 fill, the read-ceiling kernel and the CUDA-graph timer. Header-only; each
// program includes it in one translation unit (the kernels have internal linkage).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "bench/read_ceiling.h"

namespace lazyrag::bench_cuda {
namespace {

__global__ void FillRandomBf16(uint16_t* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ (seed + uint32_t(i >> 32) * 40503u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float f = (float(h & 0xffffu) / 65535.f) * 2.f - 1.f;  // [-1, 1]
    uint32_t u;
    memcpy(&u, &f, 4);
    x[i] = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

template <typename T>
T* DeviceAlloc(size_t n) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}
template <typename T>
T* DeviceUpload(const std::vector<T>& h) {
  T* d = DeviceAlloc<T>(h.size());
  BENCH_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
void FillRandom(uint16_t* x, size_t n, uint32_t seed) {
  FillRandomBf16<<<1024, 256>>>(x, n, seed);
  BENCH_CUDA(cudaGetLastError());
}

// Median time of one call of fn(i, stream), in milliseconds. kGroup consecutive calls
// (i = 0..kGroup-1, so inputs rotate) are captured into a CUDA graph; each sample replays the
// graph between two events and divides by kGroup, so host launch overhead is not timed (the
// serving engine replays decode steps as graphs too). Median over `iters` samples after
// warm-up replays.
constexpr int kGroup = 20;
template <typename Fn>
double TimeMedianMs(int warmup, int iters, Fn&& fn) {
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fn(0, stream);  // first call outside the capture (one-time setup such as smem limits)
  BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kGroup; ++i) fn(i, stream);
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  // Warm-up: `warmup` replays, then more until about kWarmupMs of replays have run (the first
  // rows of a new setup measured up to 17% slow with a fixed 5 replays, e.g. query block 32 b1
  // 35.3 vs 30.0 us for the same kernel one row later, 2026-11-30).
  constexpr float kWarmupMs = 30.f;
  BENCH_CUDA(cudaEventRecord(ev[0], stream));
  for (int i = 0; i < warmup; ++i) BENCH_CUDA(cudaGraphLaunch(exec, stream));
  BENCH_CUDA(cudaEventRecord(ev[1], stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  float warm_ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&warm_ms, ev[0], ev[1]));
  const float per_replay = std::max(warm_ms / std::max(warmup, 1), 1e-3f);
  const int more = std::min(20000, int(std::max(0.f, kWarmupMs - warm_ms) / per_replay));
  for (int i = 0; i < more; ++i) BENCH_CUDA(cudaGraphLaunch(exec, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(ev[2 * i], stream));
    BENCH_CUDA(cudaGraphLaunch(exec, stream));
    BENCH_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
    ms[i] = t / kGroup;
  }
  for (auto& e : ev) BENCH_CUDA(cudaEventDestroy(e));
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  BENCH_CUDA(cudaStreamDestroy(stream));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

// Read ceiling kernel (what decode does: read K/V, write almost nothing): 16-byte loads,
// 4 in flight per thread, an XOR folded into one word per thread that is stored only when it
// equals a value the data never produces (so the loads are not dead code).
__global__ void __launch_bounds__(256)
    ReadKernel(const uint4* __restrict__ src, size_t n, uint32_t* sink) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  uint32_t x = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
         d.w;
  }
  for (; i < n; i += stride) x ^= src[i].x ^ src[i].y ^ src[i].z ^ src[i].w;
  if (x == 0x9e3779b9u) sink[0] = x;
}

double MedianOf(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The read ceiling in TB/s: ReadKernel over `bytes` (a multiple of 16), median of `iters` eager
// calls after warm-up.
double MeasureReadTbs(int iters, int sms, size_t bytes = size_t(2) << 30) {
  uint16_t* src = DeviceAlloc<uint16_t>(bytes / 2);
  uint32_t* sink = DeviceAlloc<uint32_t>(1);
  FillRandom(src, bytes / 2, 7);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto read = [&] {
    ReadKernel<<<sms * 8, 256, 0, stream>>>(reinterpret_cast<const uint4*>(src), bytes / 16, sink);
    BENCH_CUDA(cudaGetLastError());
  };
  for (int i = 0; i < 20; ++i) read();
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(start, stream));
    read();
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  BENCH_CUDA(cudaStreamDestroy(stream));
  BENCH_CUDA(cudaFree(src));
  BENCH_CUDA(cudaFree(sink));
  return double(bytes) / (MedianOf(ms) * 1e-3) / 1e12;
}

// The main of a projection benchmark (gemv_bench, small_gemm_bench): `--out PATH`, `--iters N`;
// the read ceiling, then run(iters, l2_bytes) -> results, print(results, read_tbs) and, with
// --out, json(results, prop, read_tbs) written to PATH. Exit status 0, 1 (no device, cannot
// write) or 2 (usage).
template <class Run, class Print, class Json>
int ProjectionBenchMain(int argc, char** argv, const char* name, Run run, Print print, Json json) {
  std::string out_path;
  int iters = 50;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--out PATH] [--iters N]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "%s: no CUDA device\n", name);
    return 1;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  const double read_tbs = MeasureReadTbs(iters, prop.multiProcessorCount);
  const auto results = run(iters, size_t(prop.l2CacheSize));
  print(results, read_tbs);
  if (!out_path.empty()) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", out_path.c_str());
      return 1;
    }
    const std::string js = json(results, prop, read_tbs);
    std::fwrite(js.data(), 1, js.size(), f);
    std::fclose(f);
    std::printf("wrote %s\n", out_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace lazyrag::bench_cuda
