// The CUDA model's RMSNorm (worker/kernels/model_kernels.h) against a CPU reference on both of
// its paths (one block a row, and a row over a cluster of blocks for few rows). Part of
// kernels_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace lazyrag::kernels::testing
