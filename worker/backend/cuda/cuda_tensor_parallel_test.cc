// Tensor parallelism on the CUDA backend (issue 9, must-show 1 and 2): the TP=1 wrapper against
// the plain backend on one GPU; on two GPUs, TP=2 (NCCL all-reduce) against TP=1 on the
// Llama-3.1-8B shape with 4 layers through the Engine in FULL, LAZY and MATERIALIZE with decode
// steps, LAZY against MATERIALIZE at TP=2, pages of 16 and 64 tokens, and document KV exported
// at TP=1 and imported at TP=2 (the transport form does not depend on the degree).
// Skips cleanly without a device, and the two-GPU tests with fewer than two.
//
// Tolerances: TP=2 sums the O and down projections' partials in another order (fp32) and,
// since the bf16 GEMM inputs are rounded from slightly different fp32 values, moves logits by
// bf16 rounding through every layer: max |diff| / max |ref| <= 3e-2, the bound the CUDA backend
// test uses for CUDA against the fp32 CPU reference; greedy tokens must agree unless the
// reference has a near tie. The TP=1 wrapper runs the plain backend's exact kernels: 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/forward_batch_test_util.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_util.h"
#include "worker/model/model_source.h"

namespace lazyrag {
namespace {

using engine_test::ExpectRunsMatch;
using engine_test::ModeRun;
using engine_test::RagPrompt;
using engine_test::RandomTokens;
using engine_test::RelError;
using engine_test::RunMode;

constexpr double kTpTolerance = 3e-2;

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
#define SKIP_WITH_FEWER_DEVICES(n) \
  if (DeviceCount() < (n))         \
  GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << DeviceCount()

// synthetic:llama3-8b (weights generated on the device) with `layers` layers.
LoadedModel Llama8BShape(int layers) {
  LoadOptions o;
  o.synthetic_host_weights = false;
  auto m = LoadModel("synthetic:llama3-8b@17", o);
  EXPECT_TRUE(m.ok()) << m.status();
  m->config.num_layers = layers;
  return std::move(*m);
}

std::unique_ptr<Engine> MakeEngine(absl::StatusOr<std::unique_ptr<Backend>> backend,
                                   int page_size = 16, int chunk = 256) {
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return nullptr;
  EngineOptions o;
  o.page_size = page_size;
  o.num_pages = 512;
  o.prefill_chunk = chunk;
  o.fingerprint = "cuda-tensor-parallel-test";
  auto e = Engine::Create(std::move(*backend), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}


// ---------------------------------------------------------------------------------------------

TEST(CudaTensorParallelTest, OneRankWrapperMatchesPlain) {
  SKIP_WITH_FEWER_DEVICES(1);
  LoadOptions lo;
  lo.synthetic_host_weights = false;
  auto m = LoadModel("synthetic:smollm2-135m@5", lo);
  ASSERT_TRUE(m.ok()) << m.status();
  auto tp = CreateCudaTensorParallelBackend(*m, 1);
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ((*tp)->name(), "cuda-tp1");
  auto got = MakeEngine(std::move(tp), 16, 128);
  auto ref = MakeEngine(CreateCudaBackend(*m), 16, 128);
  ASSERT_TRUE(got && ref);
  std::mt19937 rng(3);
  const int vocab = m->config.vocab_size;
  TokenPrompt full;
  full.suffix = RandomTokens(rng, 200, vocab);
  ExpectRunsMatch(RunMode(*got, full, AttentionMode::kFull, 4),
                  RunMode(*ref, full, AttentionMode::kFull, 4), 0.0, "TP=1 wrapper FULL");
  TokenPrompt rag = RagPrompt(rng, vocab, {37, 150, 60}, 21);
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kMaterialize}) {
    ExpectRunsMatch(RunMode(*got, rag, mode, 4), RunMode(*ref, rag, mode, 4), 0.0,
                    mode == AttentionMode::kLazy ? "TP=1 wrapper LAZY" : "TP=1 wrapper MAT");
  }
}

TEST(CudaTensorParallelTest, BadDegreesAreRejected) {
  SKIP_WITH_FEWER_DEVICES(1);
  LoadOptions lo;
  lo.synthetic_host_weights = false;
  auto m = LoadModel("synthetic:smollm2-135m@5", lo);
  ASSERT_TRUE(m.ok());
  auto two = CreateCudaTensorParallelBackend(*m, 2);  // 3 KV heads
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument) << two.status();
  LoadedModel big = Llama8BShape(2);
  auto many = CreateCudaTensorParallelBackend(big, 8);
  if (DeviceCount() < 8) {
    EXPECT_EQ(many.status().code(), absl::StatusCode::kFailedPrecondition) << many.status();
  }
}

TEST(CudaTensorParallelTest, TwoRanksMatchOneRankOn8BShapeAllModes) {
  SKIP_WITH_FEWER_DEVICES(2);
  ASSERT_TRUE(CudaBackendHasNccl()) << "built without NCCL";
  LoadedModel m = Llama8BShape(4);
  std::unique_ptr<Engine> tp2 = MakeEngine(CreateCudaTensorParallelBackend(m, 2));
  std::unique_ptr<Engine> tp1 = MakeEngine(CreateCudaBackend(m));
  ASSERT_TRUE(tp1 && tp2);
  EXPECT_EQ(tp2->backend().name(), "cuda-tp2");
  std::mt19937 rng(8);
  const int vocab = m.config.vocab_size;
  TokenPrompt full;
  full.suffix = RandomTokens(rng, 300, vocab);
  ExpectRunsMatch(RunMode(*tp2, full, AttentionMode::kFull, 5),
                  RunMode(*tp1, full, AttentionMode::kFull, 5), kTpTolerance, "8B TP=2 FULL");
  TokenPrompt rag = RagPrompt(rng, vocab, {37, 250, 100}, 21);
  const ModeRun lazy2 = RunMode(*tp2, rag, AttentionMode::kLazy, 4);
  ExpectRunsMatch(lazy2, RunMode(*tp1, rag, AttentionMode::kLazy, 4), kTpTolerance, "8B TP=2 LAZY");
  const ModeRun mat2 = RunMode(*tp2, rag, AttentionMode::kMaterialize, 4);
  ExpectRunsMatch(mat2, RunMode(*tp1, rag, AttentionMode::kMaterialize, 4), kTpTolerance,
                  "8B TP=2 MATERIALIZE");
  ExpectRunsMatch(lazy2, mat2, kTpTolerance, "8B TP=2 LAZY vs MATERIALIZE");
  std::shuffle(rag.documents.begin(), rag.documents.end(), rng);
  rag.suffix = RandomTokens(rng, 9, vocab);
  ExpectRunsMatch(RunMode(*tp2, rag, AttentionMode::kLazy, 3),
                  RunMode(*tp1, rag, AttentionMode::kLazy, 3), kTpTolerance,
                  "8B TP=2 LAZY reordered");
}

// Pages of 64 tokens (the other tests use 16): documents end mid-page at another offset.
TEST(CudaTensorParallelTest, TwoRanksMatchOneRankWithPageSize64) {
  SKIP_WITH_FEWER_DEVICES(2);
  LoadedModel m = Llama8BShape(2);
  std::unique_ptr<Engine> tp2 = MakeEngine(CreateCudaTensorParallelBackend(m, 2), 64);
  std::unique_ptr<Engine> tp1 = MakeEngine(CreateCudaBackend(m), 64);
  ASSERT_TRUE(tp1 && tp2);
  std::mt19937 rng(9);
  TokenPrompt rag = RagPrompt(rng, m.config.vocab_size, {100, 70}, 17);
  ExpectRunsMatch(RunMode(*tp2, rag, AttentionMode::kLazy, 4),
                  RunMode(*tp1, rag, AttentionMode::kLazy, 4), kTpTolerance,
                  "8B TP=2 page size 64 LAZY");
}

using backend_test::DocumentBatch;
using backend_test::QueryBatch;

float Bf16ToFloat(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<float> Bf16s(const std::string& bytes) {
  std::vector<float> f(bytes.size() / 2);
  for (size_t i = 0; i < f.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    f[i] = Bf16ToFloat(h);
  }
  return f;
}

TEST(CudaTensorParallelTest, KvExchangedBetweenOneAndTwoRanks) {
  SKIP_WITH_FEWER_DEVICES(2);
  const int ps = 16, doc_len = 100;
  LoadedModel m = Llama8BShape(2);
  auto tp1 = CreateCudaBackend(m);
  auto tp2 = CreateCudaTensorParallelBackend(m, 2);
  ASSERT_TRUE(tp1.ok() && tp2.ok()) << tp1.status() << tp2.status();
  Backend& one = **tp1;
  Backend& two = **tp2;
  ASSERT_TRUE(one.InitPool(64, ps).ok());
  ASSERT_TRUE(two.InitPool(64, ps).ok());
  std::mt19937 rng(4);
  const auto doc = RandomTokens(rng, doc_len, m.config.vocab_size);
  const auto query = RandomTokens(rng, 13, m.config.vocab_size);
  const std::vector<int32_t> pages = {0, 1, 2, 3, 4, 5, 6};
  std::vector<float> logits;
  std::string kv1, kv2;
  ASSERT_TRUE(one.Forward(DocumentBatch(doc, pages, ps), &logits).ok());
  ASSERT_TRUE(one.ExportKv(pages, doc_len, &kv1).ok());
  ASSERT_TRUE(two.Forward(DocumentBatch(doc, pages, ps), &logits).ok());
  ASSERT_TRUE(two.ExportKv(pages, doc_len, &kv2).ok());
  ASSERT_EQ(kv1.size(), kv2.size());
  const double kv_err = RelError(Bf16s(kv2), Bf16s(kv1));
  std::printf("[ KV export TP=2 vs TP=1 ] max|diff|/max|ref| = %.3g\n", kv_err);
  EXPECT_LE(kv_err, kTpTolerance);
  // TP=1's document imported into TP=2 (other pages) and TP=2's into TP=1.
  const std::vector<int32_t> other = {20, 21, 22, 23, 24, 25, 26};
  ASSERT_TRUE(two.ImportKv(other, doc_len, kv1).ok());
  ASSERT_TRUE(one.ImportKv(other, doc_len, kv2).ok());
  std::vector<float> ref, a, b;
  ASSERT_TRUE(one.Forward(QueryBatch(pages, doc_len, query, {40}, ps), &ref).ok());
  ASSERT_TRUE(two.Forward(QueryBatch(other, doc_len, query, {40}, ps), &a).ok());
  ASSERT_TRUE(one.Forward(QueryBatch(other, doc_len, query, {41}, ps), &b).ok());
  const double ea = RelError(a, ref), eb = RelError(b, ref);
  std::printf("[ TP=1 KV on TP=2 ] %.3g   [ TP=2 KV on TP=1 ] %.3g\n", ea, eb);
  EXPECT_LE(ea, kTpTolerance);
  EXPECT_LE(eb, kTpTolerance);
  // What TP=2 imported comes back bit for bit.
  std::string again;
  ASSERT_TRUE(two.ExportKv(other, doc_len, &again).ok());
  EXPECT_EQ(again, kv1);
}

TEST(CudaTensorParallelTest, SkipsCleanlyWithoutTwoDevices) {
  if (DeviceCount() >= 2) GTEST_SKIP() << "two CUDA devices are present";
  LoadedModel m = Llama8BShape(2);
  auto tp = CreateCudaTensorParallelBackend(m, 2);
  EXPECT_FALSE(tp.ok());
}

}  // namespace
}  // namespace lazyrag
