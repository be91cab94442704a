// The projections of one Llama-3-8B layer and the lm_head, y[rows, n] = x[rows, k] w[n, k]^T in
// bf16 with fp32 accumulation, at 1, 16, 32 and 64 rows, one launch at a time: cuBLAS (the CUDA
// backend's cublasGemmEx call; for the fused row, cuBLAS gate_up + cuda_model::LaunchSwiGlu)
// beside the bench/dev SmallGemm (small_gemm.h) as its launcher configures it (small_gemm), the
// same launched without PDL (sg_nopdl), and two variants: no 256-byte L2 prefetch hint (sg_nol2),
// 4 warps per block with 4 blocks per SM (sg_warps4); and the serving kernel of
// worker/kernels/wgmma_gemm.h (TMA + wgmma) with and without PDL (wgmma, wgmma_nopdl) and with
// each block shape forced (wgmma_r64: 64 weight rows a block, an 8-stage ring; wgmma_r128). A grid
// that leaves SMs idle lets the next of the timed PDL launches stream its weights on them, which
// overstates it: compare such shapes on the _nopdl rows. The rows
// kernel_bench --gemm printed on the branch where the experiment started
// (bench/results/2026-12-04-h200-small-gemm/).
//
// Timing as kernel_bench's TimeMedianMs: 20 calls (weights rotating over enough copies to exceed
// 4x the L2, so every call reads HBM) captured in a CUDA graph, replayed between two events after
// at least 30 ms of warm-up replays; median over --iters samples of one replay / 20. The read
// ceiling is measured in the same run (a read-only kernel over 2 GiB, eager, median). bytes:
// weights + x + y. Prints a table and, with --out PATH, writes JSON (batch = rows, context = k).
//
// Usage: small_gemm_bench [--out PATH] [--iters N]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "bench/bench_cuda.cuh"
#include "bench/dev/small_gemm/small_gemm.cuh"  // the variants
#include "bench/dev/small_gemm/small_gemm.h"
#include "worker/kernels/model_kernels.h"
#include "worker/kernels/wgmma_gemm.h"

namespace lazyrag::kernels {
namespace {

using bench_cuda::DeviceAlloc;
using bench_cuda::FillRandom;
using bench_cuda::MeasureReadTbs;
using bench_cuda::TimeMedianMs;

// A SmallGemm variant (small_gemm.cuh) beside the launcher's configuration: kWarps warps per
// block, the 256-byte L2 prefetch hint or not, min blocks per SM for buckets 8-32 and 64.
template <int kBucket, int kWarps, bool kL2, int kMinBlocks>
absl::Status LaunchGemmVariant(const SmallGemmParams& p, cudaStream_t st) {
  namespace sgi = small_gemm_internal;
  constexpr int kQueue = kBucket == 8 || kBucket == 64 ? 8 : 4;  // as small_gemm.cu
  const auto kernel = sgi::SmallGemmKernel<kBucket, kWarps, kQueue, kL2, kMinBlocks>;
  static const int slots = [&] {
    int per_sm = 0, sms = 0, device = 0;
    BENCH_CUDA(cudaGetDevice(&device));
    BENCH_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, 0));
    BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return std::max(1, per_sm * sms);
  }();
  return sgi::LaunchSmallGemmKernel(kernel, sgi::PlanSmallGemm(p, kWarps, kBucket, slots),
                                    kWarps * 32, slots, p.programmatic, st);
}
template <int kWarps, bool kL2, int kMinBlocks, int kMinBlocks64>
absl::Status RunGemmVariant(const SmallGemmParams& p, cudaStream_t st) {
  if (p.rows <= 8) return LaunchGemmVariant<8, kWarps, kL2, kMinBlocks>(p, st);
  if (p.rows <= 16) return LaunchGemmVariant<16, kWarps, kL2, kMinBlocks>(p, st);
  if (p.rows <= 32) return LaunchGemmVariant<32, kWarps, kL2, kMinBlocks>(p, st);
  return LaunchGemmVariant<64, kWarps, kL2, kMinBlocks64>(p, st);
}

// The serving kernel worker/kernels/wgmma_gemm.h on the same operands (programmatic as p says).
absl::Status Wgmma(const SmallGemmParams& p, cudaStream_t st) {
  WgmmaGemmParams q;
  q.x = p.x;
  q.w = p.w;
  q.y = p.y;
  q.y_fp32 = p.epilogue == SmallGemmEpilogue::kFloat;
  q.swiglu = p.epilogue == SmallGemmEpilogue::kSwiGluBf16;
  q.rows = p.rows;
  q.n = p.n;
  q.k = p.k;
  q.programmatic = p.programmatic;
  return LaunchWgmmaGemm(q, st);
}
template <int kRowsPerBlock>
absl::Status WgmmaBlock(const SmallGemmParams& p, cudaStream_t st) {
  if (p.epilogue == SmallGemmEpilogue::kSwiGluBf16) return Wgmma(p, st);  // 128 rows only
  WgmmaGemmParams q;
  q.x = p.x;
  q.w = p.w;
  q.y = p.y;
  q.y_fp32 = p.epilogue == SmallGemmEpilogue::kFloat;
  q.rows = p.rows;
  q.n = p.n;
  q.k = p.k;
  q.rows_per_block = kRowsPerBlock;
  q.programmatic = p.programmatic;
  return LaunchWgmmaGemm(q, st);
}

struct Result {
  std::string name;
  std::string variant;
  int rows = 0;
  int n = 0, k = 0;
  double ms = 0;
  double bytes = 0;
  double flops = 0;
  double Tbs() const { return bytes / (ms * 1e-3) / 1e12; }
};

std::vector<Result> GemmRows(int iters, size_t l2_bytes) {
  const struct {
    const char* name;
    int n, k;
    SmallGemmEpilogue epilogue;
  } shapes[] = {{"gemm_qkv", 6144, 4096, SmallGemmEpilogue::kFloat},
                {"gemm_o", 4096, 4096, SmallGemmEpilogue::kBf16},
                {"gemm_gate_up", 28672, 4096, SmallGemmEpilogue::kBf16},
                {"gemm_gate_up_swiglu", 28672, 4096, SmallGemmEpilogue::kSwiGluBf16},
                {"gemm_down", 4096, 14336, SmallGemmEpilogue::kBf16},
                {"gemm_lm_head", 128256, 4096, SmallGemmEpilogue::kFloat}};
  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    std::exit(1);
  }
  void* cublas_ws = DeviceAlloc<char>(size_t(32) << 20);
  cublasSetWorkspace(cublas, cublas_ws, size_t(32) << 20);
  char* small_ws = DeviceAlloc<char>(size_t(kSmallGemmWorkspaceBytes));
  BENCH_CUDA(cudaMemset(small_ws, 0, size_t(kSmallGemmWorkspaceBytes)));
  constexpr int kMaxRows = 64, kMaxK = 14336, kMaxN = 128256;
  uint16_t* x = DeviceAlloc<uint16_t>(size_t(kMaxRows) * kMaxK);
  FillRandom(x, size_t(kMaxRows) * kMaxK, 11);
  void* y = DeviceAlloc<char>(size_t(kMaxRows) * kMaxN * 4);
  uint16_t* gate_up = DeviceAlloc<uint16_t>(size_t(kMaxRows) * 28672);
  using Runner = absl::Status (*)(const SmallGemmParams&, cudaStream_t);
  const struct {
    const char* name;
    bool programmatic;
    Runner run;
  } variants[] = {{"small_gemm", true, SmallGemm},
                  {"sg_nopdl", false, SmallGemm},
                  {"sg_nol2", true, RunGemmVariant<8, false, 2, 1>},
                  {"sg_warps4", true, RunGemmVariant<4, true, 4, 2>},
                  {"wgmma", true, Wgmma},
                  {"wgmma_nopdl", false, Wgmma},
                  {"wgmma_r64", true, WgmmaBlock<64>},
                  {"wgmma_r64_nopdl", false, WgmmaBlock<64>},
                  {"wgmma_r128", true, WgmmaBlock<128>}};
  std::vector<Result> results;
  for (const auto& sh : shapes) {
    const size_t w_elems = size_t(sh.n) * sh.k;
    const int copies = int(std::max<size_t>(1, (4 * l2_bytes) / (w_elems * 2) + 1));
    uint16_t* w = DeviceAlloc<uint16_t>(w_elems * copies);
    FillRandom(w, w_elems * copies, 5);
    BENCH_CUDA(cudaDeviceSynchronize());
    const bool fp32 = sh.epilogue == SmallGemmEpilogue::kFloat;
    const bool swiglu = sh.epilogue == SmallGemmEpilogue::kSwiGluBf16;
    for (int rows : {1, 16, 32, 64}) {
      const int out_cols = swiglu ? sh.n / 2 : sh.n;
      const double bytes =
          double(w_elems) * 2 + double(rows) * sh.k * 2 + double(rows) * out_cols * (fp32 ? 4 : 2);
      const double flops = 2.0 * rows * double(w_elems);
      const double cublas_ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        const float one = 1.f, zero = 0.f;
        cublasSetStream(cublas, st);
        void* out = swiglu ? static_cast<void*>(gate_up) : y;
        if (cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, rows, sh.k, &one,
                         w + size_t(i % copies) * w_elems, CUDA_R_16BF, sh.k, x, CUDA_R_16BF, sh.k,
                         &zero, out, fp32 ? CUDA_R_32F : CUDA_R_16BF, sh.n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
          std::fprintf(stderr, "cublasGemmEx failed\n");
          std::exit(1);
        }
        if (swiglu) {
          BENCH_OK(
              cuda_model::LaunchSwiGlu({gate_up, static_cast<uint16_t*>(y), rows, sh.n / 2}, st));
        }
      });
      results.push_back({sh.name, swiglu ? "cublas+swiglu" : "cublas", rows, sh.n, sh.k, cublas_ms,
                         bytes, flops});
      for (const auto& v : variants) {
        const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
          SmallGemmParams p;
          p.x = x;
          p.w = w + size_t(i % copies) * w_elems;
          p.y = y;
          p.rows = rows;
          p.n = sh.n;
          p.k = sh.k;
          p.epilogue = sh.epilogue;
          p.workspace = small_ws;
          p.workspace_bytes = kSmallGemmWorkspaceBytes;
          p.programmatic = v.programmatic;
          BENCH_OK(v.run(p, st));
        });
        results.push_back({sh.name, v.name, rows, sh.n, sh.k, ms, bytes, flops});
      }
    }
    BENCH_CUDA(cudaFree(w));
  }
  BENCH_CUDA(cudaFree(x));
  BENCH_CUDA(cudaFree(y));
  BENCH_CUDA(cudaFree(gate_up));
  BENCH_CUDA(cudaFree(small_ws));
  BENCH_CUDA(cudaFree(cublas_ws));
  cublasDestroy(cublas);
  return results;
}

// "x cuBLAS": the cuBLAS row's time (same shape and rows, timed first) over the row's.
void PrintTable(const std::vector<Result>& results, double read_tbs) {
  std::printf("\nread ceiling %.3f TB/s (this run); %%4.52: of issue 29's %.2f TB/s\n", read_tbs,
              bench_cuda::kIssue29ReadTbs);
  std::printf("\n%-22s %-14s %5s %10s %9s %8s %8s %9s\n", "gemm", "variant", "rows", "ms", "TB/s",
              "%read", "%4.52", "x cuBLAS");
  double cublas_ms = 0;
  for (const Result& r : results) {
    if (r.variant.rfind("cublas", 0) == 0) cublas_ms = r.ms;
    std::printf("%-22s %-14s %5d %10.4f %9.3f %7.1f%% %7.1f%% %9.3f\n", r.name.c_str(),
                r.variant.c_str(), r.rows, r.ms, r.Tbs(), 100.0 * r.Tbs() / read_tbs,
                100.0 * r.Tbs() / bench_cuda::kIssue29ReadTbs, cublas_ms / r.ms);
  }
}

std::string Json(const std::vector<Result>& rs, const cudaDeviceProp& prop, double read_tbs) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "{\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"l2_bytes\": %d,\n"
                "  \"read_ceiling_tbs\": %.4f,\n  \"results\": [\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize, read_tbs);
  std::string s = buf;
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    std::snprintf(buf, sizeof(buf),
                  "    {\"name\": \"%s\", \"kind\": \"gemm\", \"variant\": \"%s\", \"batch\": %d, "
                  "\"n\": %d, \"context\": %d, \"ms\": %.6f, \"bytes\": %.0f, \"tbs\": %.4f, "
                  "\"flops\": %.0f, \"tflops\": %.3f}%s\n",
                  r.name.c_str(), r.variant.c_str(), r.rows, r.n, r.k, r.ms, r.bytes, r.Tbs(),
                  r.flops, r.flops / (r.ms * 1e-3) / 1e12, i + 1 < rs.size() ? "," : "");
    s += buf;
  }
  s += "  ]\n}\n";
  return s;
}

int Main(int argc, char** argv) {
  return bench_cuda::ProjectionBenchMain(argc, argv, "small_gemm_bench", GemmRows, PrintTable,
                                         Json);
}

}  // namespace
}  // namespace lazyrag::kernels

int main(int argc, char** argv) { return lazyrag::kernels::Main(argc, argv); }
