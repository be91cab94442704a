// SmallGemm (small_gemm.h) against cuBLAS (every element) and a CPU double-precision reference (a
// sample of weight rows, every token) on every projection shape of the models the CUDA backend
// serves (Llama-3-8B, its tensor-parallel halves, SmolLM2-135M, synthetic:tiny) and odd shapes, for
// rows 1, 2, 7, 8, 16, 31, 32, 33, 63, 64; the fused SwiGLU epilogue against cuBLAS +
// cuda_model::LaunchSwiGlu; repeated and graph-captured launches; bad shapes. Outputs are poisoned
// (NaN) before each run, with one poisoned row past the end that must stay untouched. Weights come
// from the synthetic fill on the device (fresh seed per test). The same tests (WgmmaGemm.*) cover
// the serving kernel of worker/kernels/wgmma_gemm.h through this harness.
#include "bench/dev/small_gemm/small_gemm.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/kernels/kernels_test_support.h"
#include "worker/kernels/model_kernels.h"
#include "worker/kernels/wgmma_gemm.h"

namespace lazyrag::kernels::testing {
namespace {

constexpr int kRowSweep[] = {1, 2, 7, 8, 16, 31, 32, 33, 63, 64};

struct Shape {
  const char* name;
  int n, k;
  SmallGemmEpilogue epilogue;
};

// Every projection of the served models: (n, k) of y = x w^T.
const Shape kModelShapes[] = {
    {"8b_qkv", 6144, 4096, SmallGemmEpilogue::kFloat},
    {"8b_o", 4096, 4096, SmallGemmEpilogue::kBf16},
    {"8b_gate_up", 28672, 4096, SmallGemmEpilogue::kBf16},
    {"8b_down", 4096, 14336, SmallGemmEpilogue::kBf16},
    {"8b_lm_head", 128256, 4096, SmallGemmEpilogue::kFloat},
    {"8b_tp2_qkv", 3072, 4096, SmallGemmEpilogue::kFloat},
    {"8b_tp2_o", 4096, 2048, SmallGemmEpilogue::kBf16},
    {"8b_tp2_gate_up", 14336, 4096, SmallGemmEpilogue::kBf16},
    {"8b_tp2_down", 4096, 7168, SmallGemmEpilogue::kBf16},
    {"smol_qkv", 960, 576, SmallGemmEpilogue::kFloat},
    {"smol_o", 576, 576, SmallGemmEpilogue::kBf16},
    {"smol_gate_up", 3072, 576, SmallGemmEpilogue::kBf16},
    {"smol_down", 576, 1536, SmallGemmEpilogue::kBf16},
    {"smol_lm_head", 49152, 576, SmallGemmEpilogue::kFloat},
    {"tiny_qkv", 128, 64, SmallGemmEpilogue::kFloat},
    {"tiny_o", 64, 64, SmallGemmEpilogue::kBf16},
    {"tiny_gate_up", 320, 64, SmallGemmEpilogue::kBf16},
    {"tiny_down", 64, 160, SmallGemmEpilogue::kBf16},
    {"tiny_lm_head", 259, 64, SmallGemmEpilogue::kFloat},
};

// Shapes off every tile boundary: n of 1, 17, 130, 1000; k of 32, 96, 4128.
const Shape kOddShapes[] = {
    {"n1_k32", 1, 32, SmallGemmEpilogue::kFloat},
    {"n17_k96", 17, 96, SmallGemmEpilogue::kBf16},
    {"n130_k4128", 130, 4128, SmallGemmEpilogue::kFloat},
    {"n1000_k2080", 1000, 2080, SmallGemmEpilogue::kBf16},
};

// k off the wgmma kernel's 64-wide steps (multiples of 8 it takes that SmallGemm does not).
const Shape kWgmmaOddShapes[] = {
    {"n3_k8", 3, 8, SmallGemmEpilogue::kFloat},
    {"n1001_k4104", 1001, 4104, SmallGemmEpilogue::kBf16},
    {"n129_k200", 129, 200, SmallGemmEpilogue::kFloat},
};

// A cuBLAS handle and a SmallGemm workspace (counters zeroed) shared by one test.
struct GemmContext {
  GemmContext() {
    cublasCreate(&cublas);
    cudaMalloc(&workspace, kSmallGemmWorkspaceBytes);
    cudaMemset(workspace, 0, kSmallGemmWorkspaceBytes);
  }
  ~GemmContext() {
    cublasDestroy(cublas);
    cudaFree(workspace);
  }
  // y = x w^T with cuBLAS (the backend's call), y of `type`.
  void Cublas(const uint16_t* x, const uint16_t* w, void* y, cudaDataType type, int rows, int n,
              int k) {
    const float one = 1.f, zero = 0.f;
    ASSERT_EQ(
        cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, w, CUDA_R_16BF, k, x,
                     CUDA_R_16BF, k, &zero, y, type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        CUBLAS_STATUS_SUCCESS);
  }
  absl::Status Small(const uint16_t* x, const uint16_t* w, void* y, int rows, int n, int k,
                     SmallGemmEpilogue epilogue, cudaStream_t stream = nullptr) {
    SmallGemmParams p;
    p.x = x;
    p.w = w;
    p.y = y;
    p.rows = rows;
    p.n = n;
    p.k = k;
    p.epilogue = epilogue;
    p.workspace = workspace;
    p.workspace_bytes = kSmallGemmWorkspaceBytes;
    if (!wgmma) return SmallGemm(p, stream);
    WgmmaGemmParams q;
    q.x = x;
    q.w = w;
    q.y = y;
    q.y_fp32 = epilogue == SmallGemmEpilogue::kFloat;
    q.swiglu = epilogue == SmallGemmEpilogue::kSwiGluBf16;
    q.rows = rows;
    q.n = n;
    q.k = k;
    q.rows_per_block = rows_per_block;
    return LaunchWgmmaGemm(q, stream);
  }
  int rows_per_block = 0;  // WgmmaGemmParams::rows_per_block
  // The serving kernel of worker/kernels/wgmma_gemm.h instead of SmallGemm (its tests share this
  // file's harness: WgmmaGemm.*).
  bool wgmma = false;
  cublasHandle_t cublas = nullptr;
  void* workspace = nullptr;
};

std::vector<uint16_t> RandomBf16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> v(n);
  for (uint16_t& e : v) e = ToBf16(u(rng));
  return v;
}

// w: [n, k] bf16 with the loader's synthetic linear fill (bound 1 / sqrt(k)).
void FillWeights(DeviceArray<uint16_t>& w, int n, int k, uint32_t seed) {
  cuda_model::SyntheticFillParams f;
  f.dst = w.get();
  f.n = int64_t(n) * k;
  f.seed = seed;
  f.tag = 7;
  f.bound = 1.0f / std::sqrt(float(k));
  ASSERT_TRUE(cuda_model::LaunchSyntheticFill(f, nullptr).ok());
}

// Weight row r of a device [n, k] matrix as floats.
std::vector<float> WeightRow(const DeviceArray<uint16_t>& w, int r, int k) {
  std::vector<uint16_t> h(k);
  cudaMemcpy(h.data(), w.get() + size_t(r) * k, size_t(k) * 2, cudaMemcpyDeviceToHost);
  return ToFloat(h);
}

// The outputs of a [rows + 1, n] buffer as floats (fp32 or bf16).
std::vector<float> Outputs(const void* y, size_t count, bool bf16) {
  std::vector<float> out(count);
  if (bf16) {
    std::vector<uint16_t> h(count);
    cudaMemcpy(h.data(), y, count * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < count; ++i) out[i] = FromBf16(h[i]);
  } else {
    cudaMemcpy(out.data(), y, count * 4, cudaMemcpyDeviceToHost);
  }
  return out;
}

// One shape at one row count: SmallGemm vs cuBLAS everywhere, vs the CPU on sampled rows.
void CheckShape(GemmContext& ctx, const Shape& s, const DeviceArray<uint16_t>& w, int rows,
                std::mt19937& rng) {
  SCOPED_TRACE(absl::StrCat(s.name, " rows=", rows));
  const bool bf16 = s.epilogue == SmallGemmEpilogue::kBf16;
  const size_t elem = bf16 ? 2 : 4;
  const std::vector<uint16_t> xh = RandomBf16(size_t(rows) * s.k, rng);
  DeviceArray<uint16_t> x(xh);
  // One extra row, poisoned, past the end of y.
  DeviceArray<char> y(size_t(rows + 1) * s.n * elem), ref(size_t(rows) * s.n * elem);
  ASSERT_TRUE(ctx.Small(x.get(), w.get(), y.get(), rows, s.n, s.k, s.epilogue).ok());
  ctx.Cublas(x.get(), w.get(), ref.get(), bf16 ? CUDA_R_16BF : CUDA_R_32F, rows, s.n, s.k);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = Outputs(y.get(), size_t(rows + 1) * s.n, bf16);
  const std::vector<float> want = Outputs(ref.get(), size_t(rows) * s.n, bf16);
  // fp32: two fp32 sums of exact products in different orders; bf16: one rounding step apart.
  const float rtol = bf16 ? 8e-3f : 1e-4f, atol = bf16 ? 1e-4f : 5e-5f;
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i) {
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      ADD_FAILURE() << "token " << i / s.n << " row " << i % s.n << ": " << got[i] << " vs cuBLAS "
                    << want[i];
      ++bad;
    }
  }
  for (size_t i = want.size(); i < got.size(); ++i) {
    if (!std::isnan(got[i])) {
      ADD_FAILURE() << "wrote past the end at row " << i - want.size();
      break;
    }
  }
  // CPU double reference on the first, last and a few random weight rows.
  std::vector<int> sample = {0, s.n - 1};
  std::uniform_int_distribution<int> pick(0, s.n - 1);
  for (int i = 0; i < 6; ++i) sample.push_back(pick(rng));
  const std::vector<float> xf = ToFloat(xh);
  for (int r : sample) {
    const std::vector<float> wr = WeightRow(w, r, s.k);
    for (int t = 0; t < rows; ++t) {
      double dot = 0, mag = 0;
      for (int e = 0; e < s.k; ++e) {
        dot += double(xf[size_t(t) * s.k + e]) * wr[e];
        mag += std::fabs(double(xf[size_t(t) * s.k + e]) * wr[e]);
      }
      const double expect = bf16 ? FromBf16(ToBf16(float(dot))) : dot;
      const double tol = (bf16 ? 8e-3 : 1e-5) * std::fabs(dot) + 1e-6 * mag;
      const float g = got[size_t(t) * s.n + r];
      if (!(std::fabs(g - expect) <= tol)) {
        ADD_FAILURE() << "token " << t << " row " << r << ": " << g << " vs CPU " << expect;
        return;
      }
    }
  }
}

void SweepShapes(const Shape* shapes, size_t count, bool wgmma = false, int rows_per_block = 0) {
  GPU_TEST_SETUP(rng);
  GemmContext ctx;
  ctx.wgmma = wgmma;
  ctx.rows_per_block = rows_per_block;
  for (size_t i = 0; i < count; ++i) {
    const Shape& s = shapes[i];
    DeviceArray<uint16_t> w(size_t(s.n) * s.k);
    FillWeights(w, s.n, s.k, seed + uint32_t(i));
    for (int rows : kRowSweep) CheckShape(ctx, s, w, rows, rng);
  }
}

TEST(SmallGemm, ModelShapesMatchCublasAndCpu) {
  SweepShapes(kModelShapes, sizeof(kModelShapes) / sizeof(kModelShapes[0]));
}

TEST(SmallGemm, OddShapesMatchCublasAndCpu) {
  SweepShapes(kOddShapes, sizeof(kOddShapes) / sizeof(kOddShapes[0]));
}

// Both block shapes on every shape (the launcher picks one per shape).
TEST(WgmmaGemm, ModelShapesMatchCublasAndCpu) {
  for (int rows_per_block : {64, 128}) {
    SCOPED_TRACE(absl::StrCat(rows_per_block, " rows a block"));
    SweepShapes(kModelShapes, sizeof(kModelShapes) / sizeof(kModelShapes[0]), true, rows_per_block);
  }
}

TEST(WgmmaGemm, OddShapesMatchCublasAndCpu) {
  for (int rows_per_block : {64, 128}) {
    SCOPED_TRACE(absl::StrCat(rows_per_block, " rows a block"));
    SweepShapes(kOddShapes, sizeof(kOddShapes) / sizeof(kOddShapes[0]), true, rows_per_block);
    SweepShapes(kWgmmaOddShapes, sizeof(kWgmmaOddShapes) / sizeof(kWgmmaOddShapes[0]), true,
                rows_per_block);
  }
}

// The fused epilogue against the backend's unfused pair: cuBLAS gate_up in bf16, then
// cuda_model::LaunchSwiGlu. Equal but where cuBLAS and SmallGemm round a projection to different
// bf16 neighbours.
void CheckFusedSwiGlu(bool wgmma) {
  GPU_TEST_SETUP(rng);
  GemmContext ctx;
  ctx.wgmma = wgmma;
  const struct {
    const char* name;
    int ff, k;
  } cases[] = {{"8b", 14336, 4096}, {"8b_tp2", 7168, 4096}, {"smol", 1536, 576}, {"odd", 64, 96}};
  for (const auto& c : cases) {
    DeviceArray<uint16_t> w(size_t(2) * c.ff * c.k);
    FillWeights(w, 2 * c.ff, c.k, seed + 99);
    for (int rows : kRowSweep) {
      SCOPED_TRACE(absl::StrCat(c.name, " rows=", rows));
      DeviceArray<uint16_t> x(RandomBf16(size_t(rows) * c.k, rng));
      DeviceArray<uint16_t> act(size_t(rows + 1) * c.ff), gate_up(size_t(rows) * 2 * c.ff),
          ref(size_t(rows) * c.ff);
      ASSERT_TRUE(ctx.Small(x.get(), w.get(), act.get(), rows, 2 * c.ff, c.k,
                            SmallGemmEpilogue::kSwiGluBf16)
                      .ok());
      ctx.Cublas(x.get(), w.get(), gate_up.get(), CUDA_R_16BF, rows, 2 * c.ff, c.k);
      ASSERT_TRUE(cuda_model::LaunchSwiGlu({gate_up.get(), ref.get(), rows, c.ff}, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = ToFloat(act.Download()), want = ToFloat(ref.Download());
      size_t exact = 0;
      int bad = 0;
      for (size_t i = 0; i < want.size() && bad < 5; ++i) {
        exact += got[i] == want[i];
        // One bf16 step in g or u moves silu(g) * u by at most ~2 steps of the output.
        if (!(std::fabs(got[i] - want[i]) <= 1e-4f + 2e-2f * std::fabs(want[i]))) {
          ADD_FAILURE() << "token " << i / c.ff << " feature " << i % c.ff << ": " << got[i]
                        << " vs " << want[i];
          ++bad;
        }
      }
      EXPECT_GE(double(exact), 0.95 * want.size()) << "bit-exact outputs";
      const std::vector<uint16_t> tail = act.Download();
      for (size_t i = want.size(); i < tail.size(); ++i) {
        if (tail[i] != 0xffff) {
          ADD_FAILURE() << "wrote past the end";
          break;
        }
      }
    }
  }
}

TEST(SmallGemm, FusedSwiGluMatchesCublasThenSwiGlu) { CheckFusedSwiGlu(false); }
TEST(WgmmaGemm, FusedSwiGluMatchesCublasThenSwiGlu) { CheckFusedSwiGlu(true); }

// The FFN's RMSNorm folded into the wgmma O and gate|up projections (WgmmaResidualOut,
// WgmmaNormIn) against the kernels it replaces: O to bf16, LaunchRmsNorm adding it to the fp32
// residual, then gate|up with the SwiGLU. The residual equal bit for bit, the scaled rows exactly
// bf16(v * g), each row's parts summing to its sum of squares, the activations within the moved
// bf16 rounding (relative to each value and to its row's rms), two launches bit-identical; the
// model shapes, an odd one (O of 136 outputs: three 64-row blocks, the last partial) and row
// counts on both sides of 32.
TEST(WgmmaGemm, FoldedFfnNormMatchesTheKernelSequence) {
  GPU_TEST_SETUP(rng);
  const struct {
    const char* name;
    int hidden, q_dim, ff;
  } cases[] = {{"8b", 4096, 4096, 14336}, {"smol", 576, 576, 1536}, {"odd", 136, 96, 200}};
  constexpr float kEps = 1e-5f;
  for (const auto& c : cases) {
    DeviceArray<uint16_t> wo(size_t(c.hidden) * c.q_dim), wgu(size_t(2) * c.ff * c.hidden);
    FillWeights(wo, c.hidden, c.q_dim, seed + 5);
    FillWeights(wgu, 2 * c.ff, c.hidden, seed + 6);
    std::uniform_real_distribution<float> weight(0.5f, 1.5f), residual(-2.f, 2.f);
    std::vector<float> g(c.hidden);
    for (float& e : g) e = weight(rng);
    const DeviceArray<float> norm_weight(g);
    for (int rows : {2, 7, 32, 33, 64}) {
      SCOPED_TRACE(absl::StrCat(c.name, " rows=", rows));
      const size_t cells = size_t(rows) * c.hidden;
      std::vector<float> x0(cells);
      for (float& e : x0) e = residual(rng);
      const DeviceArray<uint16_t> attn(RandomBf16(size_t(rows) * c.q_dim, rng));
      // The kernels the fold replaces.
      DeviceArray<float> x_ref(x0);
      DeviceArray<uint16_t> delta(cells), h(cells), act_ref(size_t(rows) * c.ff);
      WgmmaGemmParams o;
      o.x = attn.get();
      o.w = wo.get();
      o.y = delta.get();
      o.rows = rows;
      o.n = c.hidden;
      o.k = c.q_dim;
      ASSERT_TRUE(LaunchWgmmaGemm(o, nullptr).ok());
      cuda_model::RmsNormParams norm;
      norm.x = x_ref.get();
      norm.residual = delta.get();
      norm.x_out = x_ref.get();
      norm.weight = norm_weight.get();
      norm.out = h.get();
      norm.num_rows = rows;
      norm.dim = c.hidden;
      norm.eps = kEps;
      ASSERT_TRUE(cuda_model::LaunchRmsNorm(norm, nullptr).ok());
      WgmmaGemmParams gu;
      gu.x = h.get();
      gu.w = wgu.get();
      gu.y = act_ref.get();
      gu.swiglu = true;
      gu.rows = rows;
      gu.n = 2 * c.ff;
      gu.k = c.hidden;
      ASSERT_TRUE(LaunchWgmmaGemm(gu, nullptr).ok());
      ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<float> want_x = x_ref.Download(), want = ToFloat(act_ref.Download());
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        DeviceArray<float> x(x0), parts(cells);
        DeviceArray<uint16_t> scaled(cells), act(size_t(rows) * c.ff);
        WgmmaGemmParams fo = o;
        fo.y = nullptr;
        fo.residual_out = {x.get(), norm_weight.get(), scaled.get(), parts.get()};
        ASSERT_TRUE(LaunchWgmmaGemm(fo, nullptr).ok());
        const int num_parts = WgmmaGemmNormParts(fo);
        WgmmaGemmParams fg = gu;
        fg.x = scaled.get();
        fg.y = act.get();
        fg.norm_in = {parts.get(), num_parts, kEps};
        ASSERT_TRUE(LaunchWgmmaGemm(fg, nullptr).ok());
        ASSERT_CUDA(cudaDeviceSynchronize());
        const std::vector<float> got_x = x.Download(), got_parts = parts.Download();
        const std::vector<uint16_t> got_scaled = scaled.Download();
        ASSERT_TRUE(got_x == want_x) << "residual";
        for (size_t i = 0; i < cells; ++i) {
          ASSERT_EQ(got_scaled[i], ToBf16(got_x[i] * g[i % c.hidden])) << "scaled " << i;
        }
        for (int t = 0; t < rows; ++t) {
          double sum = 0, ss = 0;
          for (int b = 0; b < num_parts; ++b) sum += got_parts[size_t(t) * num_parts + b];
          for (int j = 0; j < c.hidden; ++j)
            ss += double(got_x[size_t(t) * c.hidden + j]) * got_x[size_t(t) * c.hidden + j];
          EXPECT_NEAR(sum, ss, 1e-5 * ss) << "row " << t << " parts";
        }
        const std::vector<float> got = ToFloat(act.Download());
        if (run == 0) {
          first = got;
        } else {
          EXPECT_TRUE(got == first) << "two launches differ";
        }
        int bad = 0;
        for (int t = 0; t < rows && bad < 5; ++t) {
          double sq = 0;
          for (int j = 0; j < c.ff; ++j)
            sq += double(want[size_t(t) * c.ff + j]) * want[size_t(t) * c.ff + j];
          const double row_rms = std::sqrt(sq / c.ff);
          for (int j = 0; j < c.ff && bad < 5; ++j) {
            const size_t i = size_t(t) * c.ff + j;
            if (!(std::fabs(got[i] - want[i]) <= 2e-2 * std::fabs(want[i]) + 1e-2 * row_rms)) {
              ADD_FAILURE() << "token " << t << " feature " << j << ": " << got[i] << " vs "
                            << want[i] << " (row rms " << row_rms << ")";
              ++bad;
            }
          }
        }
      }
    }
  }
}

// Launches that split k reuse the tile counters: repeated launches (eager and replayed from a CUDA
// graph) give bit-identical outputs.
void CheckDeterministic(bool wgmma) {
  GPU_TEST_SETUP(rng);
  GemmContext ctx;
  ctx.wgmma = wgmma;
  const int n = 4096, k = 14336;  // the 8B down projection: split over k
  DeviceArray<uint16_t> w(size_t(n) * k);
  FillWeights(w, n, k, seed);
  for (int rows : {1, 32, 64}) {
    SCOPED_TRACE(absl::StrCat("rows=", rows));
    DeviceArray<uint16_t> x(RandomBf16(size_t(rows) * k, rng));
    DeviceArray<uint16_t> first(size_t(rows) * n), again(size_t(rows) * n);
    ASSERT_TRUE(
        ctx.Small(x.get(), w.get(), first.get(), rows, n, k, SmallGemmEpilogue::kBf16).ok());
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(
          ctx.Small(x.get(), w.get(), again.get(), rows, n, k, SmallGemmEpilogue::kBf16).ok());
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(first.Download(), again.Download());
    cudaStream_t stream;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ASSERT_TRUE(PrepareSmallGemm().ok());
    DeviceArray<uint16_t> graphed(size_t(rows) * n);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const absl::Status st =
        ctx.Small(x.get(), w.get(), graphed.get(), rows, n, k, SmallGemmEpilogue::kBf16, stream);
    ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(first.Download(), graphed.Download());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

TEST(SmallGemm, RepeatedAndGraphLaunchesAreDeterministic) { CheckDeterministic(false); }
TEST(WgmmaGemm, RepeatedAndGraphLaunchesAreDeterministic) { CheckDeterministic(true); }

// Without a workspace the launcher does not split: same results (launched without PDL).
TEST(SmallGemm, NoWorkspaceMeansNoSplit) {
  GPU_TEST_SETUP(rng);
  GemmContext ctx;
  const int n = 4096, k = 4096, rows = 32;
  DeviceArray<uint16_t> w(size_t(n) * k);
  FillWeights(w, n, k, seed);
  DeviceArray<uint16_t> x(RandomBf16(size_t(rows) * k, rng));
  DeviceArray<float> split(size_t(rows) * n), whole(size_t(rows) * n);
  ASSERT_TRUE(ctx.Small(x.get(), w.get(), split.get(), rows, n, k, SmallGemmEpilogue::kFloat).ok());
  SmallGemmParams p;
  p.x = x.get();
  p.w = w.get();
  p.y = whole.get();
  p.rows = rows;
  p.n = n;
  p.k = k;
  p.programmatic = false;
  ASSERT_TRUE(SmallGemm(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> a = split.Download(), b = whole.Download();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], 1e-5f + 1e-4f * std::fabs(b[i])) << i;
  }
}

// The serving kernel's argument checks: no device needed.
TEST(WgmmaGemmArgs, RejectsBadShapesAndPointers) {
  EXPECT_TRUE(WgmmaGemmShapeOk(64, 6144, 4096, false));
  EXPECT_TRUE(WgmmaGemmShapeOk(0, 1, 8, false));
  EXPECT_FALSE(WgmmaGemmShapeOk(65, 4096, 4096, false));
  EXPECT_FALSE(WgmmaGemmShapeOk(-1, 4096, 4096, false));
  EXPECT_FALSE(WgmmaGemmShapeOk(8, 0, 4096, false));
  EXPECT_FALSE(WgmmaGemmShapeOk(8, 4096, 12, false));
  EXPECT_FALSE(WgmmaGemmShapeOk(8, 129, 64, true));
  EXPECT_EQ(WgmmaGemmBlocks(4096, false, 128), 32);
  EXPECT_EQ(WgmmaGemmBlocks(28672, true, 128), 224);
  EXPECT_EQ(WgmmaGemmBlocks(130, false, 128), 2);
  EXPECT_EQ(WgmmaGemmBlocks(130, false, 64), 3);
  alignas(16) static uint16_t buf[64];
  WgmmaGemmParams p;
  p.x = buf;
  p.w = buf;
  p.y = buf;
  p.rows = 1;
  p.n = 2;
  p.k = 8;
  const auto invalid = [](const WgmmaGemmParams& q, const char* why) {
    SCOPED_TRACE(why);
    const absl::Status s = LaunchWgmmaGemm(q, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("wgmma gemm"), std::string::npos) << s;
  };
  WgmmaGemmParams q = p;
  q.x = buf + 1;
  invalid(q, "x misaligned");
  q = p;
  q.w = nullptr;
  invalid(q, "w null");
  q = p;
  q.k = 12;
  invalid(q, "k not a multiple of 8");
  q = p;
  q.swiglu = true;
  q.y_fp32 = true;
  invalid(q, "fp32 y with swiglu");
  q = p;
  q.rows = 65;
  invalid(q, "too many rows");
  alignas(16) static float cells[64];
  const WgmmaResidualOut residual{cells, cells, buf, cells};
  q = p;
  q.y = nullptr;
  invalid(q, "no y and no residual output");
  q.residual_out = residual;
  q.residual_out.scaled = nullptr;
  invalid(q, "residual output without its scaled rows");
  q.residual_out = residual;
  q.swiglu = true;
  q.n = 4;
  invalid(q, "residual output with swiglu");
  q = p;
  q.residual_out = residual;
  q.y_fp32 = true;
  invalid(q, "residual output with fp32 y");
  q = p;
  q.norm_in = {cells, 0, 1e-5f};
  invalid(q, "norm input without parts");
  q.norm_in = {cells, 4, -1.f};
  invalid(q, "norm input with a negative eps");
}

// Argument checks: no device needed (the launcher validates before any CUDA call).
TEST(SmallGemmArgs, RejectsBadShapesAndPointers) {
  const auto code = [](int rows, int n, int k, SmallGemmEpilogue e) {
    return CheckSmallGemmShape(rows, n, k, e).code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_TRUE(CheckSmallGemmShape(64, 6144, 4096, SmallGemmEpilogue::kFloat).ok());
  EXPECT_TRUE(CheckSmallGemmShape(0, 1, 32, SmallGemmEpilogue::kBf16).ok());
  EXPECT_EQ(code(65, 4096, 4096, SmallGemmEpilogue::kFloat), kInvalid);
  EXPECT_EQ(code(-1, 4096, 4096, SmallGemmEpilogue::kFloat), kInvalid);
  EXPECT_EQ(code(8, 0, 4096, SmallGemmEpilogue::kFloat), kInvalid);
  EXPECT_EQ(code(8, 4096, 0, SmallGemmEpilogue::kFloat), kInvalid);
  EXPECT_EQ(code(8, 4096, 48, SmallGemmEpilogue::kFloat), kInvalid);  // k % 32 != 0
  EXPECT_EQ(code(8, 4096, 4100, SmallGemmEpilogue::kBf16), kInvalid);
  EXPECT_EQ(code(8, 320, 64, SmallGemmEpilogue::kSwiGluBf16), kInvalid);  // tiny: ff 160
  EXPECT_EQ(code(8, 129, 64, SmallGemmEpilogue::kSwiGluBf16), kInvalid);
  EXPECT_TRUE(CheckSmallGemmShape(8, 28672, 4096, SmallGemmEpilogue::kSwiGluBf16).ok());
  EXPECT_EQ(code(8, 64, 64, static_cast<SmallGemmEpilogue>(7)), kInvalid);
  const absl::Status bad_rows = CheckSmallGemmShape(65, 4096, 4096, SmallGemmEpilogue::kFloat);
  EXPECT_NE(bad_rows.message().find("rows 65"), std::string::npos) << bad_rows;

  alignas(16) static uint16_t buf[64];
  SmallGemmParams p;
  p.x = buf;
  p.w = buf;
  p.y = buf;
  p.rows = 1;
  p.n = 1;
  p.k = 32;
  p.x = nullptr;
  EXPECT_EQ(SmallGemm(p, nullptr).code(), kInvalid);
  p.x = buf + 1;  // 2-byte aligned
  EXPECT_EQ(SmallGemm(p, nullptr).code(), kInvalid);
  p.x = buf;
  p.w = buf + 4;  // 8-byte aligned
  EXPECT_EQ(SmallGemm(p, nullptr).code(), kInvalid);
  p.w = buf;
  p.y = nullptr;
  EXPECT_EQ(SmallGemm(p, nullptr).code(), kInvalid);
  p.y = buf;
  p.workspace = buf + 2;
  p.workspace_bytes = 64;
  EXPECT_EQ(SmallGemm(p, nullptr).code(), kInvalid);
  p.workspace = nullptr;
  p.rows = 65;
  EXPECT_EQ(SmallGemm(p, nullptr).code(), kInvalid);
}

}  // namespace
}  // namespace lazyrag::kernels::testing
