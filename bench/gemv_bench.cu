// One token's projections of a Llama-3-8B layer and the lm_head, y[n] = w[n, k] x[k] (bf16,
// fp32 accumulation): cuBLAS (CudaBackend's cublasGemmEx call; gate_up then LaunchSwiGlu)
// beside cuda_model::LaunchGemv (gemv.h, SwiGLU fused) and the GEMV kernel's other shapes that
// chose the launcher's (gemv_internal.cuh: rN rows per block, uN steps of loads in flight, pN
// steps loaded before the wait on the previous kernel); then one layer's four projections back
// to back (qkv, o, gate_up + SwiGLU, down) as the decode step runs them, without and with the
// two RMSNorms between them, and with the norms folded into the GEMVs (no attention).
//
// Timing as kernel_bench's TimeMedianMs: 20 calls (weights rotating over enough copies to exceed
// 4x the L2, so every call reads HBM) captured in a CUDA graph, replayed between two events after
// at least 30 ms of warm-up replays; median over --iters samples of one replay / 20. The read
// ceiling is measured in the same run. bytes: weights + x + y. Prints a table and, with --out
// PATH, writes JSON.
//
// Usage: gemv_bench [--out PATH] [--iters N]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "bench/bench_cuda.cuh"
#include "worker/kernels/gemv.h"
#include "worker/kernels/gemv_internal.cuh"
#include "worker/kernels/model_kernels.h"

namespace lazyrag::cuda_model {
namespace {

using bench_cuda::DeviceAlloc;
using bench_cuda::FillRandom;
using bench_cuda::MeasureReadTbs;
using bench_cuda::TimeMedianMs;

struct Result {
  std::string name, variant;
  int n = 0, k = 0;
  double ms = 0, bytes = 0;
  double Tbs() const { return bytes / (ms * 1e-3) / 1e12; }
};

struct Shape {
  const char* name;
  int n, k;  // n: outputs (gate_up with SwiGLU: ff outputs from 2 * ff weight rows)
  bool fp32, swiglu;
  int64_t WeightElems() const { return int64_t(swiglu ? 2 * n : n) * k; }
  double Bytes() const { return double(WeightElems()) * 2 + k * 2.0 + n * (fp32 ? 4.0 : 2.0); }
};

const Shape kShapes[] = {{"qkv", 6144, 4096, true, false},
                         {"o", 4096, 4096, false, false},
                         {"gate_up_swiglu", 14336, 4096, false, true},
                         {"down", 4096, 14336, false, false},
                         {"lm_head", 128256, 4096, true, false}};

using Launcher = absl::Status (*)(const GemvParams&, cudaStream_t);
const struct {
  const char* name;
  Launcher launch;
} kVariants[] = {{"gemv", LaunchGemv},
                 {"r1_u1_p4", gemv_internal::LaunchGemvKernel<1, 1, 4>},
                 {"r1_u2_p2", gemv_internal::LaunchGemvKernel<1, 2, 2>},
                 {"r2_u1_p1", gemv_internal::LaunchGemvKernel<2, 1, 1>},
                 {"r2_u1_p4", gemv_internal::LaunchGemvKernel<2, 1, 4>},
                 {"r2_u2_p1", gemv_internal::LaunchGemvKernel<2, 2, 1>},
                 {"r4_u1_p1", gemv_internal::LaunchGemvKernel<4, 1, 1>},
                 {"r4_u1_p2", gemv_internal::LaunchGemvKernel<4, 1, 2>}};

struct Weights {
  uint16_t* base = nullptr;
  int copies = 1;
  int64_t elems = 0;
  const uint16_t* At(int i) const { return base + size_t(i % copies) * elems; }
};

Weights MakeWeights(const Shape& s, size_t l2_bytes) {
  Weights w;
  w.elems = s.WeightElems();
  w.copies = int(std::max<size_t>(1, (4 * l2_bytes) / (size_t(w.elems) * 2) + 1));
  w.base = DeviceAlloc<uint16_t>(size_t(w.elems) * w.copies);
  FillRandom(w.base, size_t(w.elems) * w.copies, 5);
  return w;
}

struct Context {
  cublasHandle_t cublas = nullptr;
  uint16_t* x = nullptr;
  void* y = nullptr;
  uint16_t* gate_up = nullptr;
  uint16_t* act = nullptr;

  void Cublas(const Shape& s, const uint16_t* w, const uint16_t* x_in, void* y_out,
              cudaStream_t st) {
    const float one = 1.f, zero = 0.f;
    cublasSetStream(cublas, st);
    const int n = s.swiglu ? 2 * s.n : s.n;
    void* out = s.swiglu ? static_cast<void*>(gate_up) : y_out;
    if (cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, 1, s.k, &one, w, CUDA_R_16BF, s.k, x_in,
                     CUDA_R_16BF, s.k, &zero, out, s.fp32 ? CUDA_R_32F : CUDA_R_16BF, n,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx failed\n");
      std::exit(1);
    }
    if (s.swiglu) {
      BENCH_OK(LaunchSwiGlu({gate_up, static_cast<uint16_t*>(y_out), 1, s.n}, st));
    }
  }
  static GemvParams Params(const Shape& s, const uint16_t* w, const uint16_t* x_in, void* y_out) {
    GemvParams p;
    p.w = w;
    p.x = x_in;
    p.y = y_out;
    p.y_fp32 = s.fp32;
    p.swiglu = s.swiglu;
    p.n = s.n;
    p.k = s.k;
    return p;
  }
  void Gemv(Launcher launch, const Shape& s, const uint16_t* w, const uint16_t* x_in, void* y_out,
            cudaStream_t st) {
    BENCH_OK(launch(Params(s, w, x_in, y_out), st));
  }
};

std::vector<Result> Run(int iters, size_t l2_bytes) {
  Context c;
  if (cublasCreate(&c.cublas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    std::exit(1);
  }
  void* cublas_ws = DeviceAlloc<char>(size_t(32) << 20);
  cublasSetWorkspace(c.cublas, cublas_ws, size_t(32) << 20);
  c.x = DeviceAlloc<uint16_t>(14336);
  FillRandom(c.x, 14336, 11);
  c.y = DeviceAlloc<char>(size_t(128256) * 4);
  c.gate_up = DeviceAlloc<uint16_t>(28672);
  c.act = DeviceAlloc<uint16_t>(14336);
  std::vector<Result> results;
  for (const Shape& s : kShapes) {
    const Weights w = MakeWeights(s, l2_bytes);
    BENCH_CUDA(cudaDeviceSynchronize());
    results.push_back(
        {s.name, s.swiglu ? "cublas+swiglu" : "cublas", s.n, s.k,
         TimeMedianMs(5, iters,
                      [&](int i, cudaStream_t st) { c.Cublas(s, w.At(i), c.x, c.y, st); }),
         s.Bytes()});
    // Every variant sums each output in the same order as LaunchGemv: bit-identical outputs.
    const size_t y_bytes = size_t(s.n) * (s.fp32 ? 4 : 2);
    std::vector<char> want(y_bytes), got(y_bytes);
    c.Gemv(LaunchGemv, s, w.At(0), c.x, c.y, nullptr);
    BENCH_CUDA(cudaMemcpy(want.data(), c.y, y_bytes, cudaMemcpyDeviceToHost));
    for (const auto& v : kVariants) {
      BENCH_CUDA(cudaMemset(c.y, 0xff, y_bytes));
      c.Gemv(v.launch, s, w.At(0), c.x, c.y, nullptr);
      BENCH_CUDA(cudaMemcpy(got.data(), c.y, y_bytes, cudaMemcpyDeviceToHost));
      if (got != want) {
        std::fprintf(stderr, "gemv_bench: %s %s differs from LaunchGemv\n", s.name, v.name);
        std::exit(1);
      }
    }
    for (const auto& v : kVariants) {
      results.push_back({s.name, v.name, s.n, s.k,
                         TimeMedianMs(5, iters,
                                      [&](int i, cudaStream_t st) {
                                        c.Gemv(v.launch, s, w.At(i), c.x, c.y, st);
                                      }),
                         s.Bytes()});
    }
    BENCH_CUDA(cudaFree(w.base));
  }
  // One layer's projections in the decode step's order, each reading the previous output as
  // the next input where the shapes chain (o reads qkv's first 4096 values as bf16 scratch).
  {
    const Shape& qkv = kShapes[0];
    const Shape& o = kShapes[1];
    const Shape& gu = kShapes[2];
    const Shape& down = kShapes[3];
    // Layers rotate over enough copies that the four weights of all of them exceed 4x the L2.
    const double layer_bytes = qkv.Bytes() + o.Bytes() + gu.Bytes() + down.Bytes();
    const int layers = int(std::max(1.0, 4.0 * double(l2_bytes) / layer_bytes + 1));
    std::vector<Weights> ws;
    for (const Shape* s : {&qkv, &o, &gu, &down}) {
      Weights w;
      w.elems = s->WeightElems();
      w.copies = layers;
      w.base = DeviceAlloc<uint16_t>(size_t(w.elems) * layers);
      FillRandom(w.base, size_t(w.elems) * layers, 9);
      ws.push_back(w);
    }
    uint16_t* h = c.x;  // the normed input
    uint16_t* attn = DeviceAlloc<uint16_t>(4096);
    FillRandom(attn, 4096, 3);
    float* qkv_out = DeviceAlloc<float>(6144);
    uint16_t* delta = DeviceAlloc<uint16_t>(4096);
    BENCH_CUDA(cudaDeviceSynchronize());
    // nullptr: cuBLAS (gate_up then LaunchSwiGlu).
    const auto project = [&](Launcher launch, const Shape& s, const uint16_t* w, const uint16_t* in,
                             void* out, cudaStream_t st) {
      if (launch == nullptr) {
        c.Cublas(s, w, in, out, st);
      } else {
        c.Gemv(launch, s, w, in, out, st);
      }
    };
    const auto layer = [&](Launcher launch, int i, cudaStream_t st) {
      project(launch, qkv, ws[0].At(i), h, qkv_out, st);
      project(launch, o, ws[1].At(i), attn, delta, st);
      project(launch, gu, ws[2].At(i), h, c.act, st);
      project(launch, down, ws[3].At(i), c.act, delta, st);
    };
    // With the two RMSNorms (residual add included) before qkv and gate_up, as the step runs
    // them: what the GEMV's weight loads before its wait can overlap.
    float* x_res = DeviceAlloc<float>(4096);
    float* norm_w = DeviceAlloc<float>(4096);
    BENCH_CUDA(cudaMemset(x_res, 0, 4096 * sizeof(float)));
    BENCH_CUDA(cudaMemset(norm_w, 0, 4096 * sizeof(float)));
    const auto norm = [&](cudaStream_t st) {
      RmsNormParams np;
      np.x = x_res;
      np.x_out = x_res;
      np.residual = delta;
      np.weight = norm_w;
      np.out = h;
      np.num_rows = 1;
      np.dim = 4096;
      BENCH_OK(LaunchRmsNorm(np, st));
    };
    const auto layer_norms = [&](Launcher launch, int i, cudaStream_t st) {
      norm(st);
      project(launch, qkv, ws[0].At(i), h, qkv_out, st);
      project(launch, o, ws[1].At(i), attn, delta, st);
      norm(st);
      project(launch, gu, ws[2].At(i), h, c.act, st);
      project(launch, down, ws[3].At(i), c.act, delta, st);
    };
    const struct {
      const char* name;
      Launcher launch;
    } chain[] = {{"cublas", nullptr},
                 {"gemv", LaunchGemv},
                 {"r2_u1_p1", gemv_internal::LaunchGemvKernel<2, 1, 1>},
                 {"r2_u1_p4", gemv_internal::LaunchGemvKernel<2, 1, 4>}};
    for (const auto& v : chain) {
      results.push_back(
          {"layer_4_projections", v.name, 0, 4096,
           TimeMedianMs(5, iters, [&](int i, cudaStream_t st) { layer(v.launch, i, st); }),
           layer_bytes});
    }
    for (const auto& v : chain) {
      results.push_back(
          {"layer_with_norms", v.name, 0, 4096,
           TimeMedianMs(5, iters, [&](int i, cudaStream_t st) { layer_norms(v.launch, i, st); }),
           layer_bytes});
    }
    // The norms folded into the GEMVs (gemv.h, GemvResidualOut / GemvNormIn), as a one-token
    // step of the CUDA backend runs them: O and down update the residual, QKV and gate_up
    // apply 1/rms; no norm kernel.
    float* parts = DeviceAlloc<float>(4096);
    BENCH_CUDA(cudaMemset(parts, 0, 4096 * sizeof(float)));
    const auto layer_folded = [&](int i, cudaStream_t st) {
      const GemvResidualOut out{x_res, norm_w, h, parts};
      const GemvNormIn in{parts, GemvNormParts(4096), 1e-5f};
      const auto run = [&](const Shape& s, const uint16_t* w, const uint16_t* x_in, void* y,
                           bool residual) {
        GemvParams p = Context::Params(s, w, x_in, y);
        if (residual) {
          p.residual_out = out;
        } else {
          p.norm_in = in;
        }
        BENCH_OK(LaunchGemv(p, st));
      };
      run(qkv, ws[0].At(i), h, qkv_out, false);
      run(o, ws[1].At(i), attn, nullptr, true);
      run(gu, ws[2].At(i), h, c.act, false);
      run(down, ws[3].At(i), c.act, nullptr, true);
    };
    results.push_back({"layer_folded_norms", "gemv", 0, 4096,
                       TimeMedianMs(5, iters, layer_folded), layer_bytes});
    BENCH_CUDA(cudaFree(parts));
    BENCH_CUDA(cudaFree(x_res));
    BENCH_CUDA(cudaFree(norm_w));
    for (Weights& w : ws) BENCH_CUDA(cudaFree(w.base));
    BENCH_CUDA(cudaFree(attn));
    BENCH_CUDA(cudaFree(qkv_out));
    BENCH_CUDA(cudaFree(delta));
  }
  BENCH_CUDA(cudaFree(c.x));
  BENCH_CUDA(cudaFree(c.y));
  BENCH_CUDA(cudaFree(c.gate_up));
  BENCH_CUDA(cudaFree(c.act));
  BENCH_CUDA(cudaFree(cublas_ws));
  cublasDestroy(c.cublas);
  return results;
}

// "x cuBLAS": the shape's cuBLAS time (timed first) over the row's.
void PrintTable(const std::vector<Result>& results, double read_tbs) {
  std::printf("\nread ceiling %.3f TB/s (this run); %%4.52: of issue 29's %.2f TB/s\n", read_tbs,
              bench_cuda::kIssue29ReadTbs);
  std::printf("\n%-20s %-14s %7s %6s %10s %8s %7s %7s %9s\n", "projection (1 row)", "variant", "n",
              "k", "us", "TB/s", "%read", "%4.52", "x cuBLAS");
  double cublas_ms = 0;
  for (const Result& r : results) {
    if (r.variant.rfind("cublas", 0) == 0) cublas_ms = r.ms;
    std::printf("%-20s %-14s %7d %6d %10.2f %8.3f %6.1f%% %6.1f%% %9.3f\n", r.name.c_str(),
                r.variant.c_str(), r.n, r.k, r.ms * 1e3, r.Tbs(), 100.0 * r.Tbs() / read_tbs,
                100.0 * r.Tbs() / bench_cuda::kIssue29ReadTbs, cublas_ms / r.ms);
  }
}

std::string Json(const std::vector<Result>& rs, const cudaDeviceProp& prop, double read_tbs) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "{\n  \"benchmark\": \"gemv_bench\",\n  \"device\": \"%s\",\n  \"sms\": %d,\n"
                "  \"l2_bytes\": %d,\n  \"read_ceiling_tbs\": %.4f,\n  \"results\": [\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize, read_tbs);
  std::string s = buf;
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    std::snprintf(buf, sizeof(buf),
                  "    {\"name\": \"%s\", \"variant\": \"%s\", \"n\": %d, \"k\": %d, \"us\": %.3f, "
                  "\"bytes\": %.0f, \"tbs\": %.4f}%s\n",
                  r.name.c_str(), r.variant.c_str(), r.n, r.k, r.ms * 1e3, r.bytes, r.Tbs(),
                  i + 1 < rs.size() ? "," : "");
    s += buf;
  }
  s += "  ]\n}\n";
  return s;
}

int Main(int argc, char** argv) {
  return bench_cuda::ProjectionBenchMain(argc, argv, "gemv_bench", Run, PrintTable, Json);
}

}  // namespace
}  // namespace lazyrag::cuda_model

int main(int argc, char** argv) { return lazyrag::cuda_model::Main(argc, argv); }
