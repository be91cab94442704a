// The LazyAttention prefill kernels (worker/kernels/lazy_attention_prefill*.cu) against the CPU
// reference: batches of query blocks, chunked causal and FULL-mode prefill, and the wgmma kernels
// against the mma.sync kernel (KERNELS_TEST_WS_ONLY=1 runs the warp-specialized kernel alone).
// Part of kernels_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/kernels/kernels_test_support.h"
#include "worker/kernels/lazy_attention.h"

namespace lazyrag::kernels::testing {
namespace {

// The prefill problems of the tests below: a 32-row query block after five documents and 9
// earlier tokens of its own (b1), a RAG batch of 16, and chunked causal prefill (a 100-row
// chunk after 200 own tokens; a 37-row block after two documents and 7 own tokens).
struct PrefillProblems {
  Problem b1, b16, causal;
};
PrefillProblems MakePrefillProblems(const Sizes& s, KvPool& pool, const std::vector<Doc>& docs,
                                    std::mt19937& rng) {
  PrefillProblems p{EmptyProblem(s), Problem(), EmptyProblem(s)};
  AddRequest(p.b1, pool, docs, {5, 2, 7, 0, 3}, 9, 32, rng);
  AddRequest(p.causal, pool, docs, {}, 200, 100, rng);
  AddRequest(p.causal, pool, docs, {1, 6}, 7, 37, rng);
  p.b16 = MakeRagBatch(s, pool, docs, 16, 3, 40, 32, rng);
  return p;
}

TEST(LazyAttention, PrefillBatch16QueryBlocks) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.num_kv_heads = 2;
  s.group = 4;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(10 * 1000, 16) + 16 * 8, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 10, 500, 1000, rng);
  const Problem p = MakeRagBatch(s, pool, docs, 16, 3, 30, 32, rng);
  ExpectClose(RunGpu(p, pool, {false, KeyLayout::kRotatedLocal, 0}),
              RunCpu(p, pool, KeyLayout::kRotatedLocal), "prefill batch 16");
}

// Chunked causal prefill of a request's own tokens (the second chunk of 100 after 200
// earlier tokens) batched with a query block over documents: uneven rows per request.
TEST(LazyAttention, ChunkedCausalPrefill) {
  GPU_TEST_SETUP(rng);
  for (int group : {3, 4}) {
    Sizes s;
    s.group = group;
    s.page_size = 16;
    KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, 200, rng);
    const std::vector<Doc> docs = MakeDocs(pool, 3, 100, 500, rng);
    Problem p = EmptyProblem(s);
    AddRequest(p, pool, docs, {}, 200, 100, rng);
    AddRequest(p, pool, docs, {2, 0, 1}, 7, 37, rng);
    for (KeyLayout layout : {KeyLayout::kRotatedLocal, KeyLayout::kUnrotated}) {
      ExpectClose(RunGpu(p, pool, {false, layout, 0}), RunCpu(p, pool, layout),
                  absl::StrCat("chunked g=", group, " ", LayoutName(layout)));
    }
  }
}

// FULL-mode document encoding: one segment from position 0, every token a query row.
TEST(LazyAttention, FullCausalDocumentEncoding) {
  GPU_TEST_SETUP(rng);
  for (int d : {64, 128}) {
    Sizes s;
    s.head_dim = d;
    s.group = 3;
    s.page_size = 64;
    KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, 20, rng);
    Problem p = EmptyProblem(s);
    AddRequest(p, pool, {}, {}, 0, 777, rng);
    ExpectClose(RunGpu(p, pool, {false, KeyLayout::kRotatedLocal, 0}),
                RunCpu(p, pool, KeyLayout::kRotatedLocal), absl::StrCat("full d=", d));
  }
}

// ---------------------------------------------------------------------------------------
// The wgmma prefill kernels (head dim 128, LAZY) as the launcher chooses them, and the mma.sync
// kernel forced (PrefillKernel::kMmaSync) on the same inputs, each against the CPU reference
// and against each other. With num_pages known the launcher runs the warp-specialized kernel
// (TMA producer; its consumer warpgroups ping-pong when the KV is split), without it the
// all-warps cp.async kernel (64-key tiles when the KV is split, 128-key tiles otherwise); with
// one split both do the same arithmetic on the same 128-key tiles: bit for bit. Inputs: a
// batch-1 query block over odd-length documents, a batch of 16 query blocks, and chunked causal
// prefill of the requests' own tokens (several query blocks per request, uneven rows), page
// sizes 16 and 64, groups 4 and 8, automatic and forced splits.
TEST(LazyAttention, PrefillWgmmaMatchesCpuAndMmaSync) {
  GPU_TEST_SETUP(rng);
  // KERNELS_TEST_WS_ONLY=1: only the warp-specialized kernel against the CPU, both schedules
  // (a short run for compute-sanitizer's racecheck).
  const char* ws_env = std::getenv("KERNELS_TEST_WS_ONLY");
  const bool ws_only = ws_env != nullptr && std::string(ws_env) == "1";
  int major = 0, minor = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  ASSERT_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  ForPageSizesAndGroups(
      rng, {16, 64}, 1200, 40 * 16,
      [&](const Sizes& s, KvPool& pool, const std::vector<Doc>& docs) {
        const PrefillProblems pp = MakePrefillProblems(s, pool, docs, rng);
        LazyAttentionParams probe;
        probe.shape = pp.b1.shape;
        const bool wgmma = LazyAttentionPrefillUsesWgmma(probe);
        probe.num_pages = pool.pages;
        probe.view.page_size = s.page_size;
        probe.k_cache = probe.v_cache = reinterpret_cast<const uint16_t*>(uintptr_t(256));
        EXPECT_EQ(LazyAttentionPrefillUsesWs(probe), wgmma) << "ps " << s.page_size;
        probe.num_pages = 0;
        EXPECT_FALSE(LazyAttentionPrefillUsesWs(probe)) << "num_pages 0";
        if (major == 9 && minor == 0) {
          EXPECT_TRUE(wgmma) << "compute capability 9.0 device but no wgmma kernel";
        }
        if (!wgmma) std::printf("note: wgmma prefill kernels unavailable; mma.sync throughout\n");
        const std::pair<const char*, const Problem*> problems[] = {
            {"b1", &pp.b1}, {"b16", &pp.b16}, {"causal", &pp.causal}};
        for (const auto& [name, prob] : problems) {
          const std::vector<float> ref = RunCpu(*prob, pool, KeyLayout::kRotatedLocal);
          for (int splits : {0, 1, 3}) {
            const std::string what = absl::StrCat(name, " splits=", splits);
            GpuRun run{false, KeyLayout::kRotatedLocal, splits};
            const std::vector<float> ws = RunGpu(*prob, pool, run);
            ExpectClose(ws, ref, "warp-specialized " + what);
            if (ws_only) continue;  // the warp-specialized kernel alone (racecheck, ~4x faster)
            run.num_pages_known = false;
            const std::vector<float> cp_async = RunGpu(*prob, pool, run);
            ExpectClose(cp_async, ref, "cp.async wgmma " + what);
            if (wgmma && splits == 1) {
              EXPECT_EQ(ws, cp_async) << "warp-specialized vs cp.async 128-key tiles " << what;
            }
            run.num_pages_known = true;
            run.prefill_kernel = PrefillKernel::kMmaSync;
            const std::vector<float> old = RunGpu(*prob, pool, run);
            ExpectClose(old, ref, "mma.sync " + what);
            ExpectClose(ws, old, "warp-specialized vs mma.sync " + what, 2e-3f, 1e-2f);
            ExpectClose(cp_async, old, "cp.async wgmma vs mma.sync " + what, 2e-3f, 1e-2f);
          }
        }
      });
}

// stable_history: the warp-specialized prefill copies its first tile before waiting for the
// kernel launched just before it where all the tile's keys sit below the request's first query
// position. Here that kernel writes the queries' own K/V rows (NaN until then) late, as the
// model's QKV scatter does: a query block over documents and an own prefix, a batch of 16, and
// chunked causal prefill (query blocks after the first start past keys this step writes),
// automatic and forced splits, against the CPU.
TEST(LazyAttention, PrefillStableHistoryWaitsForTheStepsRows) {
  GPU_TEST_SETUP(rng);
  for (int ps : {16, 64}) {
    SCOPED_TRACE(absl::StrCat("ps=", ps));
    const Sizes s{/*head_dim=*/128, /*group=*/4, /*num_kv_heads=*/2, ps};
    KvPool pool(ps, s.num_kv_heads, s.head_dim, PagesFor(8 * 1200, ps) + 40 * 24, rng);
    const std::vector<Doc> docs = MakeDocs(pool, 8, 300, 1200, rng);
    const PrefillProblems pp = MakePrefillProblems(s, pool, docs, rng);
    const std::pair<const char*, const Problem*> problems[] = {
        {"b1", &pp.b1}, {"b16", &pp.b16}, {"causal", &pp.causal}};
    for (const auto& [name, prob] : problems) {
      const std::vector<float> ref = RunCpu(*prob, pool, KeyLayout::kRotatedLocal);
      for (int splits : {0, 1, 3}) {
        GpuRun run{false, KeyLayout::kRotatedLocal, splits};
        run.stable_history = true;
        run.late_rows = GpuRun::LateRows::kStepRows;
        ExpectClose(RunGpu(*prob, pool, run), ref, absl::StrCat(name, " splits=", splits));
      }
    }
  }
}

// LazyAttentionParams::l2_prefetch and kv_evict_first are hints: the warp-specialized
// prefill's output with a range (one that divides evenly over the blocks and one that does not,
// larger than 64 KiB a block; asked after the last copy and at the start), with and without the
// evict-first copies, is bit-identical to the output without either, for the launcher's split
// and forced ones.
TEST(LazyAttention, PrefillL2PrefetchKeepsTheOutput) {
  GPU_TEST_SETUP(rng);
  const Sizes s{/*head_dim=*/128, /*group=*/4, /*num_kv_heads=*/2, /*page_size=*/16};
  KvPool pool(16, s.num_kv_heads, s.head_dim, PagesFor(8 * 1200, 16) + 40 * 24, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 8, 300, 1200, rng);
  const PrefillProblems pp = MakePrefillProblems(s, pool, docs, rng);
  const std::vector<float> ref = RunCpu(pp.b1, pool, KeyLayout::kRotatedLocal);
  for (int splits : {0, 1, 3}) {
    const GpuRun run{false, KeyLayout::kRotatedLocal, splits};
    ExpectClose(RunGpu(pp.b1, pool, run), ref, absl::StrCat("splits=", splits));
    ExpectL2HintsKeepTheOutput(pp.b1, pool, run, absl::StrCat("splits=", splits));
  }
}

// LazyAttentionParams::narrow_tail_tiles: tiles of 1-64 valid keys computed at a wgmma width of
// 32 or 64 give the whole-tile output bit for bit, near the CPU: documents ending in tails of
// 1, 31, 32, 33, 64, 65 and 127 keys and requests' own segments of 20 and 83 keys, a RAG batch
// and chunked causal prefill; page sizes 16 and 64 (a page longer than the tail: rows past it
// are loaded and never read), GQA groups 4 and 8, the launcher's and forced splits.
TEST(LazyAttention, PrefillNarrowTailTilesKeepTheOutput) {
  GPU_TEST_SETUP(rng);
  const auto body = [&](const Sizes& s, KvPool& pool, const std::vector<Doc>& docs) {
    std::vector<Doc> tails;
    for (int len : {129, 287, 32, 161, 64, 193, 127, 1}) {
      tails.push_back(MakeDocs(pool, 1, len, len, rng)[0]);
    }
    Problem tailed = EmptyProblem(s);
    AddRequest(tailed, pool, tails, {0, 1, 2, 3, 4, 5, 6, 7}, 0, 20, rng);
    AddRequest(tailed, pool, tails, {7, 2, 4}, 50, 33, rng);
    const PrefillProblems pp = MakePrefillProblems(s, pool, docs, rng);
    const std::pair<const char*, const Problem*> problems[] = {
        {"tails", &tailed}, {"b16", &pp.b16}, {"causal", &pp.causal}};
    for (const auto& [name, prob] : problems) {
      const std::vector<float> ref = RunCpu(*prob, pool, KeyLayout::kRotatedLocal);
      for (int splits : {0, 1, 3}) {
        const std::string what = absl::StrCat(name, " splits=", splits);
        GpuRun run{false, KeyLayout::kRotatedLocal, splits};
        const std::vector<float> whole = RunGpu(*prob, pool, run);
        run.narrow_tail_tiles = true;
        const std::vector<float> narrow = RunGpu(*prob, pool, run);
        EXPECT_TRUE(narrow == whole) << what;
        ExpectClose(narrow, ref, what);
      }
    }
  };
  ForPageSizesAndGroups(rng, {16, 64}, 1200, 40 * 24 + 200, body);
}

// The probe that the test above can fail (ExpectEarlyCopiesSeeLateRows; only on request).
TEST(LazyAttention, PrefillStableHistoryProbeEarlyReads) {
  GPU_TEST_SETUP(rng);
  ExpectEarlyCopiesSeeLateRows(/*decode=*/false, /*query_len=*/32, rng);
}

// Segments that skip their first keys and transform their scores (SegmentView's quality
// fields) in every prefill kernel: warp-specialized, cp.async wgmma and mma.sync (both
// layouts), against the CPU reference.
TEST(LazyAttention, PrefillQualityViewsMatchCpu) {
  GPU_TEST_SETUP(rng);
  ForPageSizesAndGroups(
      rng, {16, 64}, 1200, 40 * 16,
      [&](const Sizes& s, KvPool& pool, const std::vector<Doc>& docs) {
        Problem b1 = EmptyProblem(s);
        AddRequest(b1, pool, docs, {5, 2, 7, 0, 3}, 9, 32, rng);
        Problem b8 = MakeRagBatch(s, pool, docs, 8, 4, 40, 48, rng);
        AddRandomQuality(b1, rng);
        AddRandomQuality(b8, rng);
        const std::pair<const char*, const Problem*> problems[] = {{"b1", &b1}, {"b8", &b8}};
        for (const auto& [name, prob] : problems) {
          const std::vector<float> ref = RunCpu(*prob, pool, KeyLayout::kRotatedLocal);
          for (int splits : {0, 1, 3}) {
            const std::string what = absl::StrCat(name, " splits=", splits);
            GpuRun run{false, KeyLayout::kRotatedLocal, splits};
            ExpectClose(RunGpu(*prob, pool, run), ref, "quality, warp-specialized " + what);
            run.num_pages_known = false;
            ExpectClose(RunGpu(*prob, pool, run), ref, "quality, cp.async wgmma " + what);
            run.num_pages_known = true;
            run.prefill_kernel = PrefillKernel::kMmaSync;
            ExpectClose(RunGpu(*prob, pool, run), ref, "quality, mma.sync " + what);
          }
          ExpectClose(RunGpu(*prob, pool, {false, KeyLayout::kUnrotated, 0}),
                      RunCpu(*prob, pool, KeyLayout::kUnrotated),
                      absl::StrCat("quality, un-rotated ", name));
        }
      });
}

}  // namespace
}  // namespace lazyrag::kernels::testing
