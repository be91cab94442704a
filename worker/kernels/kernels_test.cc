// Every CUDA kernel of worker/kernels against the CPU reference (attention_cpu.h) on fresh
// random bf16 inputs: document lengths that are not page multiples, page sizes 16 and 64 (and
// 24, a page size the decode's TMA copies do not take), shuffled page order, NaN in every unused
// pool slot, GQA groups 1/3/4/8, head dims 64/128, 1 to 256 requests, contexts up to 32k, forced
// and automatic KV splits, both key layouts. Outputs and workspaces are poisoned (NaN) before each
// run. Tests that need a GPU skip when there is none; the argument checks run everywhere.
// This file: the launcher's argument checks, the shape sweeps, and the tests that run both a
// prefill and a decode; the decode, prefill and materialize kernels have their own files
// (lazy_attention_decode_test.cc, lazy_attention_prefill_test.cc, materialize_test.cc), the
// shared helpers are in kernels_test_support.h. All link into the one binary kernels_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/kernels/kernels_test_support.h"
#include "worker/kernels/lazy_attention.h"

namespace lazyrag::kernels::testing {
namespace {

// ---------------------------------------------------------------------------------------
// Argument checks: no device needed.

LazyAttentionParams ValidParams() {
  LazyAttentionParams p;
  p.shape.num_heads = 32;
  p.shape.num_kv_heads = 8;
  p.shape.head_dim = 128;
  p.shape.scale = 0.088f;
  return p;  // zero requests: a no-op
}

TEST(LazyAttentionArgs, RejectsBadShapes) {
  EXPECT_TRUE(ValidateLazyAttentionParams(ValidParams(), false).ok());
  EXPECT_TRUE(LazyAttentionPrefill(ValidParams(), nullptr).ok());  // empty batch, no launch
  auto code = [](LazyAttentionParams p, bool decode) {
    return (decode ? LazyAttentionDecode(p, nullptr) : LazyAttentionPrefill(p, nullptr)).code();
  };
  LazyAttentionParams p = ValidParams();
  p.shape.head_dim = 96;
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(p, true), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.shape.num_kv_heads = 5;
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.shape.num_heads = 64;
  p.shape.num_kv_heads = 2;  // group 32
  EXPECT_EQ(code(p, true), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.view.page_size = 0;
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.view.num_requests = 2;
  p.view.num_q = 3;  // decode needs one row per request
  EXPECT_EQ(code(p, true), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.view.num_requests = 1;
  p.view.num_q = 1;  // null pointers
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.num_splits = -1;
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.max_q_len = 0;
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  // The L2 prefetch range: a 16-byte aligned pointer, a non-negative multiple of 16 bytes.
  alignas(16) static const char range[64] = {};
  for (const auto& [ptr, bytes] : std::vector<std::pair<const void*, int64_t>>{
           {nullptr, 16}, {range + 8, 16}, {range, 24}, {range, -16}}) {
    p = ValidParams();
    p.l2_prefetch = ptr;
    p.l2_prefetch_bytes = bytes;
    EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument) << bytes;
    EXPECT_EQ(code(p, true), absl::StatusCode::kInvalidArgument) << bytes;
  }
  p = ValidParams();
  p.l2_prefetch = range;
  p.l2_prefetch_bytes = 64;
  EXPECT_TRUE(ValidateLazyAttentionParams(p, true).ok());
  p.l2_prefetch = nullptr;
  p.l2_prefetch_bytes = 0;
  EXPECT_TRUE(ValidateLazyAttentionParams(p, false).ok());
  // The kernels fold the scale into the softmax exponent after taking the row maximum of the
  // raw scores, which needs scale > 0.
  for (float scale : {0.f, -0.088f, std::nanf("")}) {
    p = ValidParams();
    p.shape.scale = scale;
    EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument) << scale;
    EXPECT_EQ(code(p, true), absl::StatusCode::kInvalidArgument) << scale;
  }
}

// ---------------------------------------------------------------------------------------
// Sweeps: head dim x group x page size x key layout.

using SweepParam = std::tuple<int, int, int, KeyLayout>;

class AttentionSweep : public ::testing::TestWithParam<SweepParam> {
 protected:
  Sizes GetSizes() const {
    Sizes s;
    s.head_dim = std::get<0>(GetParam());
    s.group = std::get<1>(GetParam());
    s.page_size = std::get<2>(GetParam());
    s.num_kv_heads = 2;
    return s;
  }
  KeyLayout Layout() const { return std::get<3>(GetParam()); }
};

TEST_P(AttentionSweep, DecodeMatchesCpu) {
  GPU_TEST_SETUP(rng);
  const Sizes s = GetSizes();
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(8 * 700, s.page_size) + 64 * 8,
              rng);
  const std::vector<Doc> docs = MakeDocs(pool, 6, 1, 700, rng);
  const Problem p = MakeRagBatch(s, pool, docs, 5, 4, 40, 1, rng);
  const std::vector<float> ref = RunCpu(p, pool, Layout());
  for (int splits : {0, 1, 3, 16}) {
    ExpectClose(RunGpu(p, pool, {true, Layout(), splits}), ref,
                absl::StrCat("decode splits=", splits));
  }
}

TEST_P(AttentionSweep, PrefillQueryBlockMatchesCpu) {
  GPU_TEST_SETUP(rng);
  const Sizes s = GetSizes();
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(8 * 600, s.page_size) + 64 * 8,
              rng);
  const std::vector<Doc> docs = MakeDocs(pool, 6, 1, 600, rng);
  const Problem p = MakeRagBatch(s, pool, docs, 3, 4, 50, 32, rng);
  const std::vector<float> ref = RunCpu(p, pool, Layout());
  for (int splits : {0, 1, 4}) {
    ExpectClose(RunGpu(p, pool, {false, Layout(), splits}), ref,
                absl::StrCat("prefill splits=", splits));
  }
  // Decode is prefill with one row: the last query row of each request as a decode batch.
  // (Covered by DecodeMatchesCpu on its own inputs.)
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionSweep,
    ::testing::Combine(::testing::Values(64, 128), ::testing::Values(1, 3, 4, 8),
                       ::testing::Values(16, 64),
                       ::testing::Values(KeyLayout::kRotatedLocal, KeyLayout::kUnrotated)),
    [](const ::testing::TestParamInfo<SweepParam>& info) {
      return absl::StrCat("d", std::get<0>(info.param), "_g", std::get<1>(info.param), "_ps",
                          std::get<2>(info.param), "_", LayoutName(std::get<3>(info.param)));
    });

// ---------------------------------------------------------------------------------------
// Large shapes.

TEST(LazyAttention, Long32kContext) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.num_kv_heads = 1;
  s.group = 8;
  s.page_size = 64;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(16 * 2048, 64) + 64, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 16, 1900, 2040, rng);  // ~31.5k tokens
  Problem dec = EmptyProblem(s);
  std::vector<int> all(16);
  std::iota(all.begin(), all.end(), 0);
  Problem pre = dec;
  AddRequest(dec, pool, docs, all, 20, 1, rng);
  std::reverse(all.begin(), all.end());
  AddRequest(dec, pool, docs, all, 0, 1, rng);
  AddRequest(pre, pool, docs, all, 10, 32, rng);
  for (KeyLayout layout : {KeyLayout::kRotatedLocal, KeyLayout::kUnrotated}) {
    ExpectClose(RunGpu(dec, pool, {true, layout, 0}), RunCpu(dec, pool, layout),
                "decode 32k " + LayoutName(layout));
    ExpectClose(RunGpu(pre, pool, {false, layout, 0}), RunCpu(pre, pool, layout),
                "prefill 32k " + LayoutName(layout));
  }
}

// The benchmark's shape at batch 1 (Llama-3-8B attention: 8 KV heads, groups of
// 4, 5 documents of ~2k tokens, odd lengths), automatic splits: a 32-token
// query block (128 packed rows per block, split over the KV) and decode (split,
// merged by the last split block), both head dims, page sizes 16 and 64; plus
// group 8 and a 64-token block (two query blocks).
TEST(LazyAttention, Batch1LongContextAutoSplits) {
  GPU_TEST_SETUP(rng);
  for (int d : {64, 128}) {
    for (int ps : {16, 64}) {
      for (int group : {4, 8}) {
        SCOPED_TRACE(absl::StrCat("d=", d, " ps=", ps, " group=", group));
        Sizes s;
        s.head_dim = d;
        s.group = group;
        s.page_size = ps;
        s.num_kv_heads = 8;
        KvPool pool(ps, s.num_kv_heads, d, PagesFor(5 * 2047, ps) + 5 + 2 * PagesFor(200, ps), rng);
        const std::vector<Doc> docs = MakeDocs(pool, 5, 1990, 2047, rng);
        Problem pre = EmptyProblem(s);
        Problem dec = pre;
        AddRequest(pre, pool, docs, {3, 0, 4, 1, 2}, 9, group == 4 ? 32 : 64, rng);
        AddRequest(dec, pool, docs, {1, 4, 2, 0, 3}, 41, 1, rng);
        for (KeyLayout layout : {KeyLayout::kRotatedLocal, KeyLayout::kUnrotated}) {
          if (layout == KeyLayout::kUnrotated && (ps != 16 || group != 4)) continue;
          ExpectClose(RunGpu(pre, pool, {false, layout, 0}), RunCpu(pre, pool, layout),
                      "prefill " + LayoutName(layout));
          ExpectClose(RunGpu(dec, pool, {true, layout, 0}), RunCpu(dec, pool, layout),
                      "decode " + LayoutName(layout));
        }
      }
    }
  }
}

// Requests with many segments (more than the 32 whose metadata a block caches in shared
// memory, and more than one 32-lane planning round), some of them empty or a single key,
// against forced split counts: splits that start past the cache, splits with no tiles, tile
// ranges that straddle many segment boundaries.
TEST(LazyAttention, ManySegments) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.group = 4;
  s.page_size = 16;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, 70 * 6 + 6 * 4 + 16, rng);
  std::vector<Doc> docs = MakeDocs(pool, 70, 1, 90, rng);
  docs[3].len = 0;  // empty segments (no pages needed)
  docs[40].len = 0;
  std::vector<int> order(docs.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<int> rev(order.rbegin(), order.rend());
  std::vector<int> few(order.begin(), order.begin() + 5);
  for (int q_len : {1, 32}) {
    Problem p = EmptyProblem(s);
    AddRequest(p, pool, docs, order, 30, q_len, rng);  // 71 segments
    AddRequest(p, pool, docs, few, 3, q_len, rng);
    AddRequest(p, pool, docs, rev, 0, q_len, rng);
    const std::vector<float> ref = RunCpu(p, pool, KeyLayout::kRotatedLocal);
    for (int splits : {0, 1, 5, 37, 128}) {
      ExpectClose(RunGpu(p, pool, {q_len == 1, KeyLayout::kRotatedLocal, splits}), ref,
                  absl::StrCat(q_len == 1 ? "decode" : "prefill", " splits=", splits));
    }
  }
}

// ---------------------------------------------------------------------------------------
// LAZY with all deltas zero (every segment at logical 0) equals attention over the same
// keys concatenated into one contiguous segment, when the query sees every key.
TEST(LazyAttention, ZeroDeltasMatchContiguous) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.page_size = 16;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, 400, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 4, 100, 700, rng);
  Problem lazy = EmptyProblem(s), contiguous = EmptyProblem(s);
  int total = 0;
  for (const Doc& d : docs) {
    lazy.view.AddSegment(0, d.len, d.pages);
    total += d.len;
  }
  std::vector<int32_t> run = pool.Alloc(total);
  int t = 0;
  for (const Doc& d : docs) {
    for (int j = 0; j < d.len; ++j, ++t) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        std::copy_n(pool.k.begin() + pool.Offset(d.pages, j, h), s.head_dim,
                    pool.k.begin() + pool.Offset(run, t, h));
        std::copy_n(pool.v.begin() + pool.Offset(d.pages, j, h), s.head_dim,
                    pool.v.begin() + pool.Offset(run, t, h));
      }
    }
  }
  contiguous.view.AddSegment(0, total, run);
  std::vector<int32_t> pos(8);
  for (int i = 0; i < 8; ++i) pos[i] = total + 5 * i;  // sees every key in both views
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (Problem* p : {&lazy, &contiguous}) {
    p->view.EndRequest(pos);
    p->max_q_len = 8;
    p->max_kv_len = total;
  }
  for (size_t i = 0; i < 8u * lazy.shape.num_heads * s.head_dim; ++i)
    lazy.q.push_back(ToBf16(u(rng)));
  contiguous.q = lazy.q;
  const std::vector<float> a = RunGpu(lazy, pool, {false, KeyLayout::kRotatedLocal, 0});
  const std::vector<float> b = RunGpu(contiguous, pool, {false, KeyLayout::kRotatedLocal, 0});
  ExpectClose(a, b, "zero deltas vs contiguous", 2e-3f, 1e-2f);
  ExpectClose(a, RunCpu(lazy, pool, KeyLayout::kRotatedLocal), "zero deltas vs cpu");
}

}  // namespace
}  // namespace lazyrag::kernels::testing
