// The LazyAttention decode kernels (worker/kernels/lazy_attention_decode.cu) against the CPU
// reference: many requests, the warp pipes with TMA and cp.async copies, the split merge's
// residency and workspace, and stable_history's early copies. Part of kernels_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/kernels/kernels_test_support.h"
#include "worker/kernels/lazy_attention.h"

namespace lazyrag::kernels::testing {
namespace {

// The decode warp pipes with TMA copies and with cp.async copies (num_pages unknown) against
// the CPU reference and bit for bit against each other, at each split count.
void ExpectWarpPipesMatch(const Problem& p, const KvPool& pool, const std::vector<int>& splits,
                          const std::string& name) {
  const std::vector<float> ref = RunCpu(p, pool, KeyLayout::kRotatedLocal);
  for (int n : splits) {
    const std::string what = absl::StrCat(name, " splits=", n);
    GpuRun run{true, KeyLayout::kRotatedLocal, n};
    const std::vector<float> tma = RunGpu(p, pool, run);
    run.num_pages_known = false;
    const std::vector<float> cp_async = RunGpu(p, pool, run);
    ExpectClose(tma, ref, "warp pipes, num_pages known " + what);
    ExpectClose(cp_async, ref, "cp.async warp pipes " + what);
    EXPECT_EQ(tma, cp_async) << "TMA vs cp.async warp pipes " << what;
  }
}

TEST(LazyAttention, Decode256Requests) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.num_kv_heads = 8;
  s.group = 4;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(20 * 400, 16) + 256 * 4, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 20, 1, 400, rng);
  const Problem p = MakeRagBatch(s, pool, docs, 256, 3, 40, 1, rng);
  const std::vector<float> ref = RunCpu(p, pool, KeyLayout::kRotatedLocal);
  ExpectClose(RunGpu(p, pool, {true, KeyLayout::kRotatedLocal, 0}), ref, "decode 256");
  ExpectClose(RunGpu(p, pool, {true, KeyLayout::kRotatedLocal, 2}), ref, "decode 256 split 2");
}

// The decode warp pipes (head dim 128, LAZY layout: each warp loads its own 16 keys of every
// tile, no block barrier in the loop) with TMA copies (the launcher's choice where page_size is
// a power of two >= 16 and num_pages is known) and with cp.async copies (num_pages unknown, or
// page size 24) against the CPU and, at one shape, bit for bit against each other (the same
// arithmetic in the same order; the TMA slices past a segment's end hold the pool's NaN and must
// be masked and zeroed): batch 1 over 5 long documents and a batch of 5 requests, groups 4 and
// 8, automatic and forced splits.
TEST(LazyAttention, DecodeTmaPipesMatchCpAsyncPipes) {
  GPU_TEST_SETUP(rng);
  ForPageSizesAndGroups(
      rng, {16, 64, 24}, 1500, 40 * 8,
      [&](const Sizes& s, KvPool& pool, const std::vector<Doc>& docs) {
        Problem b1 = EmptyProblem(s);
        AddRequest(b1, pool, docs, {5, 2, 7, 0, 3}, 41, 1, rng);
        const Problem b5 = MakeRagBatch(s, pool, docs, 5, 4, 40, 1, rng);
        const std::pair<const char*, const Problem*> problems[] = {{"b1", &b1}, {"b5", &b5}};
        for (const auto& [name, prob] : problems) {
          ExpectWarpPipesMatch(*prob, pool, {0, 1, 3, 16}, name);
        }
      });
}

// Segments that skip their first keys and transform their scores (SegmentView's quality
// fields: first-tokens recompute, document temperature and scale): the warp pipes with TMA and
// cp.async copies, bit for bit against each other, and both layouts of the block tiles (head
// dim 64; head dim 128 un-rotated), all against the CPU reference.
TEST(LazyAttention, DecodeQualityViewsMatchCpu) {
  GPU_TEST_SETUP(rng);
  ForPageSizesAndGroups(
      rng, {16, 64, 24}, 1500, 40 * 8,
      [&](const Sizes& s, KvPool& pool, const std::vector<Doc>& docs) {
        Problem b1 = EmptyProblem(s);
        AddRequest(b1, pool, docs, {5, 2, 7, 0, 3}, 41, 1, rng);
        Problem b5 = MakeRagBatch(s, pool, docs, 5, 4, 40, 1, rng);
        AddRandomQuality(b1, rng);
        AddRandomQuality(b5, rng);
        const std::pair<const char*, const Problem*> problems[] = {{"b1", &b1}, {"b5", &b5}};
        for (const auto& [name, prob] : problems) {
          ExpectWarpPipesMatch(*prob, pool, {0, 1, 3}, absl::StrCat("quality, ", name));
          ExpectClose(RunGpu(*prob, pool, {true, KeyLayout::kUnrotated, 0}),
                      RunCpu(*prob, pool, KeyLayout::kUnrotated),
                      absl::StrCat("quality, un-rotated block tiles ", name));
        }
      });
  const Sizes s64{/*head_dim=*/64, /*group=*/4, /*num_kv_heads=*/2, /*page_size=*/16};
  KvPool pool(s64.page_size, s64.num_kv_heads, s64.head_dim, PagesFor(8 * 600, 16) + 80, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 8, 1, 600, rng);
  Problem b4 = MakeRagBatch(s64, pool, docs, 4, 5, 40, 1, rng);
  AddRandomQuality(b4, rng);
  ExpectClose(RunGpu(b4, pool, {true, KeyLayout::kRotatedLocal, 0}),
              RunCpu(b4, pool, KeyLayout::kRotatedLocal), "quality, head dim 64 block tiles");
}

// The batch-1 split merge's blocks must fit beside two decode blocks on a multiprocessor, so
// that they are resident and waiting before the decode grid ends (each chained launch measured
// slower on the H200 when they were not; see bench/README.md): a guard against the decode
// kernel growing its registers or shared memory past the room it leaves.
TEST(LazyAttention, DecodeLeavesRoomForTheSplitMerge) {
  SKIP_WITHOUT_GPU();
  bool fits = false;
  std::string report;
  const absl::Status st = DecodeSplitMergeResidency(&fits, &report);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(fits) << report;
  std::printf("%s\n", report.c_str());
}

// stable_history: the decode kernel copies its first K/V tiles before waiting for the kernel
// launched just before it, except those holding the query's own key. Here that kernel writes
// the queries' own K/V rows (NaN until then) GpuRun::late_delay_ns after letting the decode
// start, as the model's QKV scatter does: the output must still match the CPU on the written
// rows, for the launcher's split and forced ones (the split holding the query's row waits, the
// others start early), with the TMA and with the cp.async warp pipes.
TEST(LazyAttention, DecodeStableHistoryWaitsForTheStepsRows) {
  GPU_TEST_SETUP(rng);
  for (int ps : {16, 64}) {
    SCOPED_TRACE(absl::StrCat("ps=", ps));
    const Sizes s{/*head_dim=*/128, /*group=*/4, /*num_kv_heads=*/2, ps};
    KvPool pool(ps, s.num_kv_heads, s.head_dim, PagesFor(6 * 1500, ps) + 40 * 6, rng);
    const std::vector<Doc> docs = MakeDocs(pool, 6, 1, 1500, rng);
    Problem b1 = EmptyProblem(s);
    AddRequest(b1, pool, docs, {4, 1, 5, 0}, 37, 1, rng);
    const Problem b6 = MakeRagBatch(s, pool, docs, 6, 4, 40, 1, rng);
    const std::pair<const char*, const Problem*> problems[] = {{"b1", &b1}, {"b6", &b6}};
    for (const auto& [name, prob] : problems) {
      const std::vector<float> ref = RunCpu(*prob, pool, KeyLayout::kRotatedLocal);
      for (int splits : {0, 1, 7, 40}) {
        // These pages run the TMA pipes with num_pages known, the cp.async ones without.
        for (bool num_pages_known : {true, false}) {
          GpuRun run{true, KeyLayout::kRotatedLocal, splits};
          run.stable_history = true;
          run.late_rows = GpuRun::LateRows::kStepRows;
          run.num_pages_known = num_pages_known;
          ExpectClose(RunGpu(*prob, pool, run), ref,
                      absl::StrCat(name, " splits=", splits, " cp.async=", !num_pages_known));
        }
      }
    }
  }
}

// LazyAttentionParams::l2_prefetch and kv_evict_first are hints: the decode's output with a
// range (asked after the last copy and at the start) and with evict-first copies is
// bit-identical to the output without, TMA and cp.async pipes, launcher and forced splits.
TEST(LazyAttention, DecodeL2PrefetchKeepsTheOutput) {
  GPU_TEST_SETUP(rng);
  const Sizes s{/*head_dim=*/128, /*group=*/4, /*num_kv_heads=*/2, /*page_size=*/16};
  KvPool pool(16, s.num_kv_heads, s.head_dim, PagesFor(6 * 1500, 16) + 40 * 6, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 6, 1, 1500, rng);
  const Problem b6 = MakeRagBatch(s, pool, docs, 6, 4, 40, 1, rng);
  const std::vector<float> ref = RunCpu(b6, pool, KeyLayout::kRotatedLocal);
  for (int splits : {0, 1, 7}) {
    for (bool num_pages_known : {true, false}) {
      GpuRun run{true, KeyLayout::kRotatedLocal, splits};
      run.num_pages_known = num_pages_known;
      const std::string what = absl::StrCat("splits=", splits, " cp.async=", !num_pages_known);
      ExpectClose(RunGpu(b6, pool, run), ref, what);
      ExpectL2HintsKeepTheOutput(b6, pool, run, what);
    }
  }
}

// The probe that the test above can fail (ExpectEarlyCopiesSeeLateRows; only on request).
TEST(LazyAttention, DecodeStableHistoryProbeEarlyReads) {
  GPU_TEST_SETUP(rng);
  ExpectEarlyCopiesSeeLateRows(/*decode=*/true, /*query_len=*/1, rng);
}

// Decode split merge against the workspace size: room for all forced splits,
// for 2, for 3 (the launcher clamps the split count to what fits), on a
// workspace that is poisoned once and then reused as the previous call left it.
TEST(LazyAttention, DecodeSplitMergeWorkspace) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.group = 4;
  s.num_kv_heads = 4;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(6 * 900, 16) + 40 * 4, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 6, 300, 900, rng);
  const Problem p = MakeRagBatch(s, pool, docs, 37, 4, 40, 1, rng);
  const std::vector<float> ref = RunCpu(p, pool, KeyLayout::kRotatedLocal);
  const size_t per_split = LazyAttentionWorkspaceBytes(37, s.num_kv_heads * s.group, s.head_dim, 1);
  for (int repeats : {1, 3}) {
    for (int splits : {2, 7, 64}) {
      const std::string what = absl::StrCat("splits=", splits, " repeats=", repeats);
      ExpectClose(RunGpu(p, pool, {true, KeyLayout::kRotatedLocal, splits, 0, repeats}), ref,
                  "all splits " + what);
      ExpectClose(
          RunGpu(p, pool, {true, KeyLayout::kRotatedLocal, splits, 2 * per_split + 100, repeats}),
          ref, "2 splits " + what);
      ExpectClose(RunGpu(p, pool, {true, KeyLayout::kRotatedLocal, splits, 3 * per_split, repeats}),
                  ref, "3 splits " + what);
    }
  }
}

}  // namespace
}  // namespace lazyrag::kernels::testing
