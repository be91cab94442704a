// The CUDA model's RMSNorm (worker/kernels/model_kernels.h) against a CPU reference on both of
// its paths (one block a row, and a row over a cluster of blocks for few rows). Part of
// kernels_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/kernels/kernels_test_support.h"
#include "worker/kernels/model_kernels.h"

namespace lazyrag::kernels::testing {
namespace {

// Rows of the residual stream: x (fp32) plus the bf16 residual, stored back to x_out bit for bit
// as the fp32 sum, and out = bf16(v / rms(v) * weight) within one bf16 rounding of a double
// reference; through a row map (the final norm's logit rows) and in place; row counts on both
// sides of the cluster path's limit and dims it does and does not take.
TEST(RmsNorm, MatchesCpuOnBothPaths) {
  GPU_TEST_SETUP(rng);
  int sms = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int cluster_rows = sms / 4;  // the most rows the cluster path takes
  const struct {
    int rows, dim;
  } cases[] = {{1, 4096},  {32, 4096}, {cluster_rows, 4096}, {cluster_rows + 1, 4096},
               {64, 4096}, {7, 2048},  {3, 8192},            {5, 100},
               {2, 8},     {9, 16},    {4, 8208}};
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> gain(0.5f, 1.5f);
  int cluster_runs = 0, block_runs = 0;
  for (const auto& c : cases) {
    for (int variant = 0; variant < 3; ++variant) {  // 0 plain, 1 in place, 2 row map
      SCOPED_TRACE(absl::StrCat("rows ", c.rows, " dim ", c.dim, " variant ", variant));
      const int src_rows = variant == 2 ? c.rows + 3 : c.rows;
      std::vector<float> x_h(size_t(src_rows) * c.dim), w_h(c.dim);
      std::vector<uint16_t> res_h(x_h.size());
      for (float& v : x_h) v = 4.f * normal(rng);
      for (uint16_t& v : res_h) v = ToBf16(normal(rng));
      for (float& v : w_h) v = gain(rng);
      std::vector<int32_t> map_h(c.rows);
      for (int r = 0; r < c.rows; ++r) map_h[r] = (r * 7 + 2) % src_rows;
      DeviceArray<float> x(x_h), w(w_h), x_out(size_t(c.rows) * c.dim);
      DeviceArray<uint16_t> res(res_h), out(size_t(c.rows) * c.dim);
      DeviceArray<int32_t> map(map_h);
      cuda_model::RmsNormParams p;
      p.x = x.get();
      p.residual = res.get();
      p.x_out = variant == 1 ? x.get() : x_out.get();
      p.rows = variant == 2 ? map.get() : nullptr;
      p.weight = w.get();
      p.out = out.get();
      p.num_rows = c.rows;
      p.dim = c.dim;
      p.eps = 1e-5f;
      (cuda_model::RmsNormUsesClusters(p) ? cluster_runs : block_runs) += 1;
      ASSERT_TRUE(cuda_model::LaunchRmsNorm(p, nullptr).ok());
      ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<float> x_got = (variant == 1 ? x : x_out).Download();
      const std::vector<float> got = ToFloat(out.Download());
      for (int r = 0; r < c.rows; ++r) {
        const int src = variant == 2 ? map_h[r] : r;
        double ss = 0;
        for (int i = 0; i < c.dim; ++i) {
          const float v = x_h[size_t(src) * c.dim + i] + FromBf16(res_h[size_t(src) * c.dim + i]);
          ASSERT_EQ(x_got[size_t(r) * c.dim + i], v) << "x_out row " << r << " col " << i;
          ss += double(v) * v;
        }
        const double inv = 1.0 / std::sqrt(ss / c.dim + 1e-5);
        for (int i = 0; i < c.dim; ++i) {
          const double v = double(x_got[size_t(r) * c.dim + i]) * inv * w_h[i];
          ASSERT_NEAR(got[size_t(r) * c.dim + i], v, 1e-6 + std::fabs(v) * (1.0 / 128))
              << "out row " << r << " col " << i;
        }
      }
    }
  }
  EXPECT_GT(cluster_runs, 0) << "the cluster path never ran";
  EXPECT_GT(block_runs, 0) << "the one-block-a-row path never ran";
}

// The folded norm's first half (LaunchResidualScale): x + bf16 delta stored back bit for bit,
// bf16(v * g) exactly, each 128-column part's sum of squares near a double sum; dims with and
// without the vector path (a multiple of 4 or not, a last part short of 128 columns), row counts
// off the 8-row block; arguments it refuses.
TEST(ResidualScale, MatchesItsDefinition) {
  GPU_TEST_SETUP(rng);
  const struct {
    int rows, dim;
  } cases[] = {{2, 4096}, {7, 576}, {33, 4096}, {64, 2048}, {5, 130}, {9, 4100}, {1, 3}};
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> gain(0.5f, 1.5f);
  for (const auto& c : cases) {
    SCOPED_TRACE(absl::StrCat("rows ", c.rows, " dim ", c.dim));
    const int parts = cuda_model::ResidualScaleParts(c.dim);
    ASSERT_EQ(parts, (c.dim + 127) / 128);
    std::vector<float> x_h(size_t(c.rows) * c.dim), w_h(c.dim);
    std::vector<uint16_t> d_h(x_h.size());
    for (float& v : x_h) v = 4.f * normal(rng);
    for (uint16_t& v : d_h) v = ToBf16(normal(rng));
    for (float& v : w_h) v = gain(rng);
    DeviceArray<float> x(x_h), w(w_h), sums(size_t(c.rows) * parts + 1);
    DeviceArray<uint16_t> delta(d_h), scaled(x_h.size());
    cuda_model::ResidualScaleParams p;
    p.x = x.get();
    p.delta = delta.get();
    p.weight = w.get();
    p.scaled = scaled.get();
    p.sum_squares = sums.get();
    p.rows = c.rows;
    p.dim = c.dim;
    ASSERT_TRUE(cuda_model::LaunchResidualScale(p, nullptr).ok());
    ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<float> x_got = x.Download(), sums_got = sums.Download();
    const std::vector<uint16_t> scaled_got = scaled.Download();
    for (int r = 0; r < c.rows; ++r) {
      for (int b = 0; b < parts; ++b) {
        double ss = 0;
        for (int i = b * 128; i < std::min(c.dim, b * 128 + 128); ++i) {
          const size_t at = size_t(r) * c.dim + i;
          const float v = x_h[at] + FromBf16(d_h[at]);
          ASSERT_EQ(x_got[at], v) << "x row " << r << " col " << i;
          ASSERT_EQ(scaled_got[at], ToBf16(v * w_h[i])) << "scaled row " << r << " col " << i;
          ss += double(v) * v;
        }
        EXPECT_NEAR(sums_got[size_t(r) * parts + b], ss, 1e-5 * ss + 1e-6)
            << "row " << r << " part " << b;
      }
    }
    EXPECT_TRUE(std::isnan(sums_got.back())) << "wrote past the parts";
  }
  cuda_model::ResidualScaleParams bad;
  EXPECT_EQ(cuda_model::LaunchResidualScale(bad, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazyrag::kernels::testing
