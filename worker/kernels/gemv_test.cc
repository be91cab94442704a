// LaunchGemv (gemv.h) against a CPU double-precision reference (every output) and cuBLAS (the
// CUDA backend's cublasGemmEx call at one row) on every projection shape of the served models
// (Llama-3-8B, its tensor-parallel halves, SmolLM2-135M, synthetic:tiny) and shapes off every
// block and chunk boundary; the fused SwiGLU against cuBLAS + cuda_model::LaunchSwiGlu; repeated
// and graph-captured launches; the RMSNorm folded into the GEMVs around it; the QKV split (q, RoPE
// on K, the pool slot) fused into the QKV GEMV against LaunchQkvScatter; bad operands.
// Outputs are poisoned (NaN) before each run, with poisoned elements past the end that must stay
// untouched. Weights come from the synthetic fill on the device (fresh seed per test).
#include "worker/kernels/gemv.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/kernels/kernels_test_support.h"
#include "worker/kernels/model_kernels.h"

namespace lazyrag::kernels::testing {
namespace {

struct Shape {
  const char* name;
  int n, k;
  bool fp32;
};

const Shape kModelShapes[] = {
    {"8b_qkv", 6144, 4096, true},       {"8b_o", 4096, 4096, false},
    {"8b_gate_up", 28672, 4096, false}, {"8b_down", 4096, 14336, false},
    {"8b_lm_head", 128256, 4096, true}, {"8b_tp2_qkv", 3072, 4096, true},
    {"8b_tp2_o", 4096, 2048, false},    {"8b_tp2_gate_up", 14336, 4096, false},
    {"8b_tp2_down", 4096, 7168, false}, {"smol_qkv", 960, 576, true},
    {"smol_o", 576, 576, false},        {"smol_gate_up", 3072, 576, false},
    {"smol_down", 576, 1536, false},    {"smol_lm_head", 49152, 576, true},
    {"tiny_qkv", 128, 64, true},        {"tiny_o", 64, 64, false},
    {"tiny_gate_up", 320, 64, false},   {"tiny_down", 64, 160, false},
    {"tiny_lm_head", 259, 64, true},
};

// n of 1, 3, 17, 1001 (odd block counts); k of 8 (one chunk), 24, 2056 and 4104 (a partial
// last step of the block's chunk walk).
const Shape kOddShapes[] = {
    {"n1_k8", 1, 8, true},         {"n3_k24", 3, 24, false},
    {"n17_k2056", 17, 2056, true}, {"n1001_k4104", 1001, 4104, false},
    {"n2_k4096", 2, 4096, false},
};

constexpr int kPoison = 8;  // poisoned outputs past the end

std::vector<uint16_t> RandomBf16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> v(n);
  for (uint16_t& e : v) e = ToBf16(u(rng));
  return v;
}

// w: [n, k] bf16 with the loader's synthetic linear fill (bound 1 / sqrt(k)).
void FillWeights(DeviceArray<uint16_t>& w, int64_t elems, int k, uint32_t seed) {
  cuda_model::SyntheticFillParams f;
  f.dst = w.get();
  f.n = elems;
  f.seed = seed;
  f.tag = 11;
  f.bound = 1.0f / std::sqrt(float(k));
  ASSERT_TRUE(cuda_model::LaunchSyntheticFill(f, nullptr).ok());
}

std::vector<float> Outputs(const void* y, size_t count, bool fp32) {
  std::vector<float> out(count);
  if (fp32) {
    cudaMemcpy(out.data(), y, count * 4, cudaMemcpyDeviceToHost);
  } else {
    std::vector<uint16_t> h(count);
    cudaMemcpy(h.data(), y, count * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < count; ++i) out[i] = FromBf16(h[i]);
  }
  return out;
}

struct Cublas {
  Cublas() { cublasCreate(&handle); }
  ~Cublas() { cublasDestroy(handle); }
  // y[n] = w[n, k] x[k], as CudaBackend::Gemm at one row.
  void Run(const uint16_t* x, const uint16_t* w, void* y, bool fp32, int n, int k) {
    const float one = 1.f, zero = 0.f;
    ASSERT_EQ(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, 1, k, &one, w, CUDA_R_16BF, k, x,
                           CUDA_R_16BF, k, &zero, y, fp32 ? CUDA_R_32F : CUDA_R_16BF, n,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
  }
  cublasHandle_t handle = nullptr;
};

void CheckShape(Cublas& cublas, const Shape& s, std::mt19937& rng) {
  SCOPED_TRACE(s.name);
  const size_t elem = s.fp32 ? 4 : 2;
  DeviceArray<uint16_t> w(size_t(s.n) * s.k);
  FillWeights(w, int64_t(s.n) * s.k, s.k, rng());
  const std::vector<uint16_t> xh = RandomBf16(s.k, rng);
  DeviceArray<uint16_t> x(xh);
  DeviceArray<char> y((size_t(s.n) + kPoison) * elem), ref(size_t(s.n) * elem);
  cuda_model::GemvParams p;
  p.w = w.get();
  p.x = x.get();
  p.y = y.get();
  p.y_fp32 = s.fp32;
  p.n = s.n;
  p.k = s.k;
  ASSERT_TRUE(cuda_model::LaunchGemv(p, nullptr).ok());
  cublas.Run(x.get(), w.get(), ref.get(), s.fp32, s.n, s.k);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = Outputs(y.get(), size_t(s.n) + kPoison, s.fp32);
  const std::vector<float> want = Outputs(ref.get(), s.n, s.fp32);
  std::vector<uint16_t> wh(size_t(s.n) * s.k);
  cudaMemcpy(wh.data(), w.get(), wh.size() * 2, cudaMemcpyDeviceToHost);
  const std::vector<float> xf = ToFloat(xh);
  int bad = 0;
  for (int r = 0; r < s.n && bad < 5; ++r) {
    double dot = 0, mag = 0;
    for (int e = 0; e < s.k; ++e) {
      const double prod = double(FromBf16(wh[size_t(r) * s.k + e])) * xf[e];
      dot += prod;
      mag += std::fabs(prod);
    }
    // fp32: an fp32 sum of exact products; bf16: that, rounded once.
    const double expect = s.fp32 ? dot : FromBf16(ToBf16(float(dot)));
    const double tol = (s.fp32 ? 1e-5 : 8e-3) * std::fabs(dot) + 1e-6 * mag;
    if (!(std::fabs(got[r] - expect) <= tol)) {
      ADD_FAILURE() << "row " << r << ": " << got[r] << " vs CPU " << expect;
      ++bad;
    }
    const float rtol = s.fp32 ? 1e-4f : 8e-3f, atol = s.fp32 ? 5e-5f : 1e-4f;
    if (!(std::fabs(got[r] - want[r]) <= atol + rtol * std::fabs(want[r]))) {
      ADD_FAILURE() << "row " << r << ": " << got[r] << " vs cuBLAS " << want[r];
      ++bad;
    }
  }
  for (int i = 0; i < kPoison; ++i) {
    EXPECT_TRUE(std::isnan(got[size_t(s.n) + i])) << "wrote past the end at " << i;
  }
}

TEST(Gemv, ModelShapesMatchCpuAndCublas) {
  GPU_TEST_SETUP(rng);
  Cublas cublas;
  for (const Shape& s : kModelShapes) CheckShape(cublas, s, rng);
}

TEST(Gemv, OddShapesMatchCpuAndCublas) {
  GPU_TEST_SETUP(rng);
  Cublas cublas;
  for (const Shape& s : kOddShapes) CheckShape(cublas, s, rng);
}

// The fused SwiGLU against cuBLAS gate_up then LaunchSwiGlu: equal but where the two round a
// gate or up sum to different bf16 neighbours (then within that step through silu * up).
TEST(Gemv, FusedSwiGluMatchesCublasThenSwiGlu) {
  GPU_TEST_SETUP(rng);
  Cublas cublas;
  const struct {
    int ff, k;
  } shapes[] = {{14336, 4096}, {7168, 4096}, {1536, 576}, {160, 64}, {5, 24}};
  for (const auto& s : shapes) {
    SCOPED_TRACE(absl::StrCat("ff ", s.ff, " k ", s.k));
    DeviceArray<uint16_t> w(size_t(2) * s.ff * s.k);
    FillWeights(w, int64_t(2) * s.ff * s.k, s.k, rng());
    DeviceArray<uint16_t> x(RandomBf16(s.k, rng));
    DeviceArray<uint16_t> gate_up(size_t(2) * s.ff), ref(s.ff), y(size_t(s.ff) + kPoison);
    cuda_model::GemvParams p;
    p.w = w.get();
    p.x = x.get();
    p.y = y.get();
    p.swiglu = true;
    p.n = s.ff;
    p.k = s.k;
    ASSERT_TRUE(cuda_model::LaunchGemv(p, nullptr).ok());
    cublas.Run(x.get(), w.get(), gate_up.get(), false, 2 * s.ff, s.k);
    ASSERT_TRUE(cuda_model::LaunchSwiGlu({gate_up.get(), ref.get(), 1, s.ff}, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = Outputs(y.get(), size_t(s.ff) + kPoison, false);
    const std::vector<float> want = Outputs(ref.get(), s.ff, false);
    const std::vector<float> gu = Outputs(gate_up.get(), size_t(2) * s.ff, false);
    int exact = 0, bad = 0;
    for (int j = 0; j < s.ff && bad < 5; ++j) {
      if (got[j] == want[j]) {
        ++exact;
        continue;
      }
      // One bf16 step of gate (slope of silu <= 1.1) and of up, then the output's own rounding.
      const float g = gu[j], u = gu[s.ff + j];
      const float tol = 1.1f * std::fabs(u) * std::fabs(g) / 128.f +
                        std::fabs(g) * std::fabs(u) / 128.f + std::fabs(want[j]) / 128.f + 1e-6f;
      if (!(std::fabs(got[j] - want[j]) <= tol)) {
        ADD_FAILURE() << "feature " << j << ": " << got[j] << " vs " << want[j];
        ++bad;
      }
    }
    EXPECT_GE(exact, s.ff * 9 / 10) << "most features round the same";
    for (int i = 0; i < kPoison; ++i) EXPECT_TRUE(std::isnan(got[size_t(s.ff) + i]));
  }
}

// The RMSNorm folded into the GEMVs around it (GemvResidualOut, GemvNormIn) against the path it
// replaces: GEMV to bf16, LaunchRmsNorm adding it to the residual, GEMV of the normed row. The
// residual is the same bits, the scaled row and the parts are what they say, and the next
// projection (fp32 out, bf16 out, SwiGLU) equals the unfolded one but for the one bf16 rounding
// that moves (each input rounded before 1/rms instead of after).
TEST(Gemv, FoldedRmsNormMatchesRmsNormThenGemv) {
  GPU_TEST_SETUP(rng);
  const struct {
    int d, k_before, n_after;
    bool swiglu, fp32;
  } cases[] = {{4096, 4096, 6144, false, true},    // 8B: O then QKV
               {4096, 14336, 14336, true, false},  // 8B: down then gate|up (ff 14336)
               {2048, 2048, 3000, false, false},   // odd n after, bf16 out
               {8, 24, 5, false, true}};           // a few outputs, one chunk of k after
  for (const auto& c : cases) {
    SCOPED_TRACE(absl::StrCat("d ", c.d, " k ", c.k_before, " n ", c.n_after));
    const float eps = 1e-5f;
    DeviceArray<uint16_t> w_before(size_t(c.d) * c.k_before);
    FillWeights(w_before, int64_t(c.d) * c.k_before, c.k_before, rng());
    const int after_rows = c.swiglu ? 2 * c.n_after : c.n_after;
    DeviceArray<uint16_t> w_after(size_t(after_rows) * c.d);
    FillWeights(w_after, int64_t(after_rows) * c.d, c.d, rng());
    DeviceArray<uint16_t> x(RandomBf16(c.k_before, rng));
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> gain(0.5f, 1.5f);
    std::vector<float> residual_h(c.d), g_h(c.d);
    for (float& v : residual_h) v = normal(rng);
    for (float& v : g_h) v = gain(rng);
    DeviceArray<float> g(g_h), residual_ref(residual_h), residual_fold(residual_h);
    const int parts = cuda_model::GemvNormParts(c.d);
    DeviceArray<uint16_t> delta(c.d), normed(c.d), scaled(size_t(c.d) + kPoison);
    DeviceArray<float> sums(size_t(parts) + kPoison);
    const size_t elem = c.fp32 ? 4 : 2;
    DeviceArray<char> y_ref(size_t(c.n_after) * elem), y_fold((size_t(c.n_after) + kPoison) * elem);

    cuda_model::GemvParams before;  // unfolded: GEMV, RMSNorm, GEMV
    before.w = w_before.get();
    before.x = x.get();
    before.y = delta.get();
    before.n = c.d;
    before.k = c.k_before;
    ASSERT_TRUE(cuda_model::LaunchGemv(before, nullptr).ok());
    cuda_model::RmsNormParams norm;
    norm.x = residual_ref.get();
    norm.x_out = residual_ref.get();
    norm.residual = delta.get();
    norm.weight = g.get();
    norm.out = normed.get();
    norm.num_rows = 1;
    norm.dim = c.d;
    norm.eps = eps;
    ASSERT_TRUE(cuda_model::LaunchRmsNorm(norm, nullptr).ok());
    cuda_model::GemvParams after;
    after.w = w_after.get();
    after.x = normed.get();
    after.y = y_ref.get();
    after.y_fp32 = c.fp32;
    after.swiglu = c.swiglu;
    after.n = c.n_after;
    after.k = c.d;
    ASSERT_TRUE(cuda_model::LaunchGemv(after, nullptr).ok());

    cuda_model::GemvParams fold_before = before;  // folded
    fold_before.y = nullptr;
    fold_before.residual_out.residual = residual_fold.get();
    fold_before.residual_out.norm_weight = g.get();
    fold_before.residual_out.scaled = scaled.get();
    fold_before.residual_out.sum_squares = sums.get();
    ASSERT_TRUE(cuda_model::LaunchGemv(fold_before, nullptr).ok());
    cuda_model::GemvParams fold_after = after;
    fold_after.x = scaled.get();
    fold_after.y = y_fold.get();
    fold_after.norm_in.sum_squares = sums.get();
    fold_after.norm_in.parts = parts;
    fold_after.norm_in.eps = eps;
    ASSERT_TRUE(cuda_model::LaunchGemv(fold_after, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    const std::vector<float> v = residual_fold.Download();
    EXPECT_EQ(v, residual_ref.Download()) << "the residual add is LaunchRmsNorm's";
    const std::vector<uint16_t> scaled_h = scaled.Download();
    const std::vector<float> sums_h = sums.Download();
    double ss = 0;
    for (int j = 0; j < c.d; ++j) {
      ASSERT_EQ(scaled_h[j], ToBf16(v[j] * g_h[j])) << "scaled " << j;
      ss += double(v[j]) * v[j];
    }
    double parts_sum = 0;
    for (int b = 0; b < parts; ++b) parts_sum += sums_h[b];
    EXPECT_NEAR(parts_sum, ss, 1e-5 * ss);
    for (int i = 0; i < kPoison; ++i) {
      EXPECT_TRUE(std::isnan(sums_h[size_t(parts) + i])) << "part past the end " << i;
      EXPECT_EQ(scaled_h[size_t(c.d) + i], 0xffff) << "scaled past the end " << i;
    }

    // The next projection against the unfolded one: per input, one bf16 step (2^-8 relative)
    // of |w u| / rms, then the output's own rounding (bf16, and through silu * up).
    const double inv = 1.0 / std::sqrt(ss / c.d + eps);
    std::vector<uint16_t> wa(size_t(after_rows) * c.d);
    cudaMemcpy(wa.data(), w_after.get(), wa.size() * 2, cudaMemcpyDeviceToHost);
    const std::vector<float> got = Outputs(y_fold.get(), size_t(c.n_after) + kPoison, c.fp32);
    const std::vector<float> want = Outputs(y_ref.get(), c.n_after, c.fp32);
    const auto magnitude = [&](int row) {
      double m = 0;
      for (int e = 0; e < c.d; ++e) {
        m += std::fabs(double(FromBf16(wa[size_t(row) * c.d + e])) * FromBf16(scaled_h[e]));
      }
      return m * inv;
    };
    int bad = 0;
    for (int j = 0; j < c.n_after && bad < 5; ++j) {
      double tol = magnitude(j) / 128.0 + std::fabs(want[j]) / 128.0 + 1e-5;
      if (c.swiglu) tol = 4.0 * tol * (1.0 + magnitude(c.n_after + j));
      if (!(std::fabs(got[j] - want[j]) <= tol)) {
        ADD_FAILURE() << "output " << j << ": " << got[j] << " vs unfolded " << want[j]
                      << " (tolerance " << tol << ")";
        ++bad;
      }
    }
    for (int i = 0; i < kPoison; ++i) EXPECT_TRUE(std::isnan(got[size_t(c.n_after) + i]));
  }
}

// The QKV split fused into the GEMV (GemvQkvOut) against the path it replaces: the GEMV to fp32,
// then LaunchQkvScatter at one token. Same bits in q, in the token's K and V slots, and nothing
// written elsewhere in the pool; with and without a folded norm in front.
TEST(Gemv, FusedQkvSplitMatchesGemvThenScatter) {
  GPU_TEST_SETUP(rng);
  const struct {
    int k, heads, kv_heads, head_dim;
  } cases[] = {{4096, 32, 8, 128},  // Llama-3-8B
               {2048, 16, 4, 128},  // synthetic:wide
               {576, 9, 3, 64},     // SmolLM2-135M
               {24, 3, 1, 12}};     // a head of 12: three blocks of two pairs
  for (const auto& c : cases) {
    for (const bool norm : {false, true}) {
      SCOPED_TRACE(absl::StrCat("k ", c.k, " heads ", c.heads, "/", c.kv_heads, " d ", c.head_dim,
                                norm ? " norm in" : ""));
      const int qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim, n = qd + 2 * kvd;
      const int half = c.head_dim / 2, slots = 5;
      const int64_t slot = 3;
      DeviceArray<uint16_t> w(size_t(n) * c.k);
      FillWeights(w, int64_t(n) * c.k, c.k, rng());
      DeviceArray<uint16_t> x(RandomBf16(c.k, rng));
      // The norm's parts: any positive sums (the test is of the split, not of the norm).
      std::uniform_real_distribution<float> part(0.5f, 2.f);
      std::vector<float> parts_h(7);
      for (float& v : parts_h) v = part(rng) * float(c.k) / 7.f;
      DeviceArray<float> parts(parts_h);
      std::vector<float> rope_h(2 * size_t(half));
      for (int i = 0; i < half; ++i) {
        const double angle = 1234.0 * std::pow(500000.0, -2.0 * i / c.head_dim);
        rope_h[2 * i] = float(std::cos(angle));
        rope_h[2 * i + 1] = float(std::sin(angle));
      }
      DeviceArray<float> rope(rope_h);
      DeviceArray<int64_t> kv_slot(std::vector<int64_t>{slot});
      const std::vector<uint16_t> pool_h = RandomBf16(size_t(slots) * kvd, rng);
      DeviceArray<uint16_t> k_ref(pool_h), v_ref(pool_h), k_got(pool_h), v_got(pool_h);
      DeviceArray<uint16_t> q_ref(qd), q_got(size_t(qd) + kPoison);
      DeviceArray<float> qkv(n);

      cuda_model::GemvParams gemv;  // unfused: the GEMV to fp32, then the scatter
      gemv.w = w.get();
      gemv.x = x.get();
      gemv.y = qkv.get();
      gemv.y_fp32 = true;
      gemv.n = n;
      gemv.k = c.k;
      if (norm) gemv.norm_in = {parts.get(), 7, 1e-5f};
      ASSERT_TRUE(cuda_model::LaunchGemv(gemv, nullptr).ok());
      cuda_model::QkvScatterParams scatter;
      scatter.qkv = qkv.get();
      scatter.rope = rope.get();
      scatter.kv_slot = kv_slot.get();
      scatter.q = q_ref.get();
      scatter.k_cache = k_ref.get();
      scatter.v_cache = v_ref.get();
      scatter.num_tokens = 1;
      scatter.num_heads = c.heads;
      scatter.num_kv_heads = c.kv_heads;
      scatter.head_dim = c.head_dim;
      ASSERT_TRUE(cuda_model::LaunchQkvScatter(scatter, nullptr).ok());

      cuda_model::GemvParams fused = gemv;
      fused.y = nullptr;
      fused.y_fp32 = false;
      fused.qkv_out = {rope.get(), kv_slot.get(), q_got.get(), k_got.get(), v_got.get(),
                       qd,         kvd,           c.head_dim};
      ASSERT_TRUE(cuda_model::GemvSupports(fused));
      ASSERT_TRUE(cuda_model::LaunchGemv(fused, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

      const std::vector<uint16_t> q = q_got.Download();
      EXPECT_EQ(std::vector<uint16_t>(q.begin(), q.begin() + qd), q_ref.Download());
      for (int i = 0; i < kPoison; ++i) EXPECT_EQ(q[size_t(qd) + i], 0xffff) << "q past the end";
      EXPECT_EQ(k_got.Download(), k_ref.Download()) << "K: the token's slot, no other";
      EXPECT_EQ(v_got.Download(), v_ref.Download()) << "V: the token's slot, no other";
      const std::vector<uint16_t> k = k_got.Download();
      EXPECT_NE(
          std::vector<uint16_t>(k.begin() + slot * kvd, k.begin() + (slot + 1) * kvd),
          std::vector<uint16_t>(pool_h.begin() + slot * kvd, pool_h.begin() + (slot + 1) * kvd))
          << "the slot was written";
    }
  }
}

// Same inputs, same bits: eager launches and replays of a captured graph.
TEST(Gemv, RepeatedAndGraphLaunchesAreDeterministic) {
  GPU_TEST_SETUP(rng);
  const int n = 4096, k = 14336;
  DeviceArray<uint16_t> w(size_t(n) * k);
  FillWeights(w, int64_t(n) * k, k, rng());
  DeviceArray<uint16_t> x(RandomBf16(k, rng)), y0(n), y1(n);
  cuda_model::GemvParams p;
  p.w = w.get();
  p.x = x.get();
  p.y = y0.get();
  p.n = n;
  p.k = k;
  ASSERT_TRUE(cuda_model::LaunchGemv(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> first = y0.Download();
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  p.y = y1.get();
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cuda_model::LaunchGemv(p, stream).ok());
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 4; ++i) ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(y1.Download(), first);
  for (int i = 0; i < 3; ++i) {
    p.y = y0.get();
    ASSERT_TRUE(cuda_model::LaunchGemv(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(y0.Download(), first);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Checked on the host: no device needed.
TEST(GemvArgs, RejectsBadOperands) {
  alignas(16) static uint16_t buf[64];
  cuda_model::GemvParams good;
  good.w = buf;
  good.x = buf;
  good.y = buf;
  good.n = 2;
  good.k = 8;
  EXPECT_TRUE(cuda_model::GemvSupports(good));
  const auto rejected = [](cuda_model::GemvParams p, const char* why) {
    SCOPED_TRACE(why);
    EXPECT_FALSE(cuda_model::GemvSupports(p));
    const absl::Status s = cuda_model::LaunchGemv(p, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("gemv"), std::string::npos) << s;
  };
  cuda_model::GemvParams p = good;
  p.k = 12;
  rejected(p, "k not a multiple of 8");
  p = good;
  p.k = 0;
  rejected(p, "k zero");
  p = good;
  p.n = 0;
  rejected(p, "n zero");
  p = good;
  p.w = buf + 1;
  rejected(p, "w misaligned");
  p = good;
  p.x = nullptr;
  rejected(p, "x null");
  p = good;
  p.y_fp32 = true;
  p.y = buf + 1;
  rejected(p, "fp32 y misaligned");
  p = good;
  p.y_fp32 = true;
  p.swiglu = true;
  rejected(p, "swiglu with fp32 output");
  alignas(16) static float fbuf[8];
  cuda_model::GemvParams residual = good;
  residual.y = nullptr;
  residual.residual_out = {fbuf, fbuf, buf, fbuf};
  EXPECT_TRUE(cuda_model::GemvSupports(residual));
  p = residual;
  p.residual_out.scaled = nullptr;
  rejected(p, "residual out without its scaled row");
  p = residual;
  p.swiglu = true;
  rejected(p, "residual out with swiglu");
  p = residual;
  p.norm_in = {fbuf, 1, 1e-5f};
  rejected(p, "residual out with norm in");
  p = good;
  p.norm_in = {fbuf, 0, 1e-5f};
  rejected(p, "norm in without parts");
  p = good;
  p.norm_in = {fbuf, 4, -1.f};
  rejected(p, "norm in with negative eps");
  alignas(16) static int64_t slot[2];
  cuda_model::GemvParams qkv = good;  // q_dim 8, kv_dim 4 in heads of 4: n 16
  qkv.y = nullptr;
  qkv.n = 16;
  qkv.qkv_out = {fbuf, slot, buf, buf, buf, 8, 4, 4};
  EXPECT_TRUE(cuda_model::GemvSupports(qkv));
  p = qkv;
  p.n = 15;
  rejected(p, "qkv out with n != q_dim + 2 kv_dim");
  p = qkv;
  p.qkv_out.head_dim = 2;
  p.qkv_out.q_dim = 8;
  p.qkv_out.kv_dim = 4;
  rejected(p, "qkv out with a head of 2");
  p = qkv;
  p.qkv_out.kv_slot = nullptr;
  rejected(p, "qkv out without its slot");
  p = qkv;
  p.qkv_out.rope = fbuf + 1;
  rejected(p, "qkv out with a misaligned rope table");
  p = qkv;
  p.swiglu = true;
  rejected(p, "qkv out with swiglu");
  p = qkv;
  p.residual_out = {fbuf, fbuf, buf, fbuf};
  rejected(p, "qkv out with a residual out");
}

}  // namespace
}  // namespace lazyrag::kernels::testing
