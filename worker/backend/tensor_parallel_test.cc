// Tensor parallelism on the CPU backend (issue 9, must-show 1; runs in CI without a GPU):
// shard configs and weight slices, the in-process all-reduce, the TensorParallelBackend at
// TP = 1 (bit-identical to the plain backend), 2 and 4 (synthetic:tiny and a tiny shape with
// 4 KV heads) and 3 (SmolLM2-135M's 9 heads / 3 KV heads, fewer layers) against the plain
// backend through the Engine in FULL, LAZY and MATERIALIZE with decode steps, and document KV
// exported at one TP degree and imported at another.
//
// Tolerance: TP > 1 sums the O and down projections' partials in another order than one GEMM
// does (fp32 rounding only): logits within 1e-5 of max |logit|.
#include "worker/backend/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/tp_shard.h"
#include "worker/backend/forward_batch_test_util.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_util.h"
#include "worker/model/model_source.h"

namespace lazyrag {
namespace {

using engine_test::ModeRun;
using engine_test::RagPrompt;
using engine_test::RandomTokens;
using engine_test::RelError;
using engine_test::RunMode;

constexpr double kTpTolerance = 1e-5;

std::unique_ptr<ModelWeights> HostWeights(const std::string& name) {
  auto m = LoadModel(name);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m->weights) : nullptr;
}

// Random weights for a config no synthetic name has (uniform, unit-variance outputs).
std::unique_ptr<ModelWeights> RandomWeights(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, int64_t n, float scale, float offset = 0.0f) {
    v.resize(size_t(n));
    for (float& x : v) x = offset + scale * u(rng);
  };
  auto w = std::make_unique<ModelWeights>();
  w->config = c;
  const int64_t d = c.hidden_size, ff = c.intermediate_size;
  const float bd = std::sqrt(3.0f / float(d));
  fill(w->token_embedding, int64_t(c.vocab_size) * d, 1.0f);
  w->layers.resize(c.num_layers);
  for (LayerWeights& L : w->layers) {
    fill(L.attn_norm, d, 0.1f, 1.0f);
    fill(L.ffn_norm, d, 0.1f, 1.0f);
    fill(L.wq, c.q_dim() * d, bd);
    fill(L.wk, c.kv_dim() * d, bd);
    fill(L.wv, c.kv_dim() * d, bd);
    fill(L.wo, d * c.q_dim(), std::sqrt(3.0f / float(c.q_dim())));
    fill(L.w_gate, ff * d, bd);
    fill(L.w_up, ff * d, bd);
    fill(L.w_down, d * ff, std::sqrt(3.0f / float(ff)));
  }
  fill(w->final_norm, d, 0.1f, 1.0f);
  if (!c.tie_word_embeddings) fill(w->lm_head, int64_t(c.vocab_size) * d, bd);
  return w;
}

// synthetic:tiny with 8 heads / 4 KV heads (head dim 8): splits 4 ways.
ModelConfig TinyFourKvHeads() {
  ModelConfig c = *SyntheticConfig("tiny");
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 8;
  return c;
}

// SmolLM2-135M's attention shape (9 heads, 3 KV heads, head dim 64, hidden 576, ff 1536) with
// 4 layers and a smaller vocabulary, for time.
ModelConfig SmolLm2ShapeShort() {
  ModelConfig c = *SyntheticConfig("smollm2-135m");
  c.num_layers = 4;
  c.vocab_size = 4096;
  return c;
}

std::unique_ptr<Engine> MakeEngine(std::unique_ptr<Backend> backend, int page_size = 16,
                                   int chunk = 64) {
  EngineOptions o;
  o.page_size = page_size;
  o.num_pages = 256;
  o.prefill_chunk = chunk;
  o.fingerprint = "tensor-parallel-test";
  auto e = Engine::Create(std::move(backend), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

std::unique_ptr<Backend> Plain(const ModelWeights& w) {
  auto b = CreateCpuBackend(std::make_unique<ModelWeights>(w));
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

std::unique_ptr<Backend> Tp(const ModelWeights& w, int n) {
  auto b = CreateCpuTensorParallelBackend(std::make_unique<ModelWeights>(w), n);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// Logits within `tolerance` at every step and every greedy token equal.
void ExpectRunsEqual(const ModeRun& got, const ModeRun& ref, double tolerance,
                     const std::string& what) {
  ASSERT_EQ(got.logits.size(), ref.logits.size()) << what;
  EXPECT_EQ(got.tokens, ref.tokens) << what;
  double worst = 0;
  for (size_t s = 0; s < ref.logits.size(); ++s) {
    const double err = RelError(got.logits[s], ref.logits[s]);
    EXPECT_LE(err, tolerance) << what << " step " << s;
    worst = std::max(worst, err);
  }
  std::printf("[ %s ] %zu steps, max|diff|/max|ref| = %.3g\n", what.c_str(), ref.logits.size(),
              worst);
}

// FULL, LAZY and MATERIALIZE with decode steps on `got` and `ref` (same weights); LAZY again
// with the documents reordered (reused from the pool).
void ExpectEnginesMatch(Engine& got, Engine& ref, double tolerance, const std::string& what,
                        uint32_t seed) {
  std::mt19937 rng(seed);
  const int vocab = ref.config().vocab_size;
  TokenPrompt full;
  full.suffix = RandomTokens(rng, 90, vocab);
  ExpectRunsEqual(RunMode(got, full, AttentionMode::kFull, 4),
                  RunMode(ref, full, AttentionMode::kFull, 4), tolerance, what + " FULL");
  TokenPrompt rag = RagPrompt(rng, vocab, {37, 70, 5}, 13);
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kMaterialize}) {
    ExpectRunsEqual(RunMode(got, rag, mode, 4), RunMode(ref, rag, mode, 4), tolerance,
                    what + (mode == AttentionMode::kLazy ? " LAZY" : " MATERIALIZE"));
  }
  std::shuffle(rag.documents.begin(), rag.documents.end(), rng);
  rag.suffix = RandomTokens(rng, 9, vocab);
  ExpectRunsEqual(RunMode(got, rag, AttentionMode::kLazy, 3),
                  RunMode(ref, rag, AttentionMode::kLazy, 3), tolerance, what + " LAZY reordered");
}

// ---------------------------------------------------------------------------------------------
// Shards.

TEST(TpShardTest, ShardConfigDividesHeadsKvHeadsAndIntermediate) {
  const ModelConfig g = *SyntheticConfig("llama3-8b");
  auto c = ShardConfig(g, {2, 1});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_heads, 16);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->intermediate_size, 7168);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->num_layers, 32);
  EXPECT_TRUE(c->Validate().ok());
  auto one = ShardConfig(g, {1, 0});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->num_heads, g.num_heads);
}

TEST(TpShardTest, BadSizesAreRejectedWithTheField) {
  const ModelConfig smol = *SyntheticConfig("smollm2-135m");  // 9 heads, 3 KV heads
  auto two = ShardConfig(smol, {2, 0});
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("num_kv_heads = 3 is not divisible by 2"),
            std::string::npos)
      << two.status();
  EXPECT_TRUE(ShardConfig(smol, {3, 2}).ok());
  ModelConfig odd_ff = *SyntheticConfig("tiny");
  odd_ff.intermediate_size = 161;
  auto ff = ShardConfig(odd_ff, {2, 0});
  EXPECT_EQ(ff.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ff.status().message().find("intermediate_size"), std::string::npos) << ff.status();
  for (TpShard bad : {TpShard{0, 0}, TpShard{2, 2}, TpShard{2, -1}, TpShard{1000, 0}}) {
    EXPECT_EQ(ShardConfig(smol, bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad.size << "/" << bad.rank;
  }
  auto w = HostWeights("synthetic:smollm2-135m");
  ASSERT_TRUE(w);
  auto tp = CreateCpuTensorParallelBackend(std::move(w), 2);
  EXPECT_EQ(tp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tp.status().message().find("num_kv_heads"), std::string::npos) << tp.status();
}

TEST(TpShardTest, ShardWeightsSliceRowsAndColumns) {
  const ModelConfig c = TinyFourKvHeads();  // hidden 64, 8 heads x 8, 4 KV heads, ff 160
  auto g = RandomWeights(c, 1);
  const int64_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;
  for (int r = 0; r < 4; ++r) {
    auto s = ShardWeights(*g, {4, r});
    ASSERT_TRUE(s.ok()) << s.status();
    const ModelWeights& w = **s;
    EXPECT_EQ(w.config.num_heads, 2);
    const int64_t qr = qd / 4, kvr = kvd / 4, fr = ff / 4;
    for (int l = 0; l < c.num_layers; ++l) {
      const LayerWeights &G = g->layers[l], &L = w.layers[l];
      ASSERT_EQ(int64_t(L.wq.size()), qr * d);
      ASSERT_EQ(int64_t(L.wo.size()), d * qr);
      ASSERT_EQ(int64_t(L.w_down.size()), d * fr);
      for (int64_t i = 0; i < qr; ++i) {
        for (int64_t k = 0; k < d; ++k) {
          ASSERT_EQ(L.wq[i * d + k], G.wq[(r * qr + i) * d + k]);
          ASSERT_EQ(L.wo[k * qr + i], G.wo[k * qd + r * qr + i]);  // columns of its heads
        }
      }
      for (int64_t i = 0; i < kvr; ++i) {
        for (int64_t k = 0; k < d; ++k) {
          ASSERT_EQ(L.wk[i * d + k], G.wk[(r * kvr + i) * d + k]);
          ASSERT_EQ(L.wv[i * d + k], G.wv[(r * kvr + i) * d + k]);
        }
      }
      for (int64_t i = 0; i < fr; ++i) {
        for (int64_t k = 0; k < d; ++k) {
          ASSERT_EQ(L.w_gate[i * d + k], G.w_gate[(r * fr + i) * d + k]);
          ASSERT_EQ(L.w_up[i * d + k], G.w_up[(r * fr + i) * d + k]);
          ASSERT_EQ(L.w_down[k * fr + i], G.w_down[k * ff + r * fr + i]);
        }
      }
      EXPECT_EQ(L.attn_norm, G.attn_norm);
      EXPECT_EQ(L.ffn_norm, G.ffn_norm);
    }
    EXPECT_EQ(w.token_embedding, g->token_embedding);
    EXPECT_EQ(w.final_norm, g->final_norm);
  }
  ModelWeights broken = *g;
  broken.layers[1].wo.pop_back();
  EXPECT_EQ(ShardWeights(broken, {2, 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TpShardTest, KvTransportSplitMergeRoundTrip) {
  const int layers = 3, tokens = 5, kv_heads = 6, head_dim = 4;
  for (int elem : {2, 4}) {
    for (int ranks : {1, 2, 3}) {
      std::string global(size_t(2) * layers * tokens * kv_heads * head_dim * elem, '\0');
      for (size_t i = 0; i < global.size(); ++i) global[i] = char(i * 7 + 3);
      auto parts = SplitKvTransport(global, ranks, layers, tokens, kv_heads, head_dim, elem);
      ASSERT_TRUE(parts.ok()) << parts.status();
      ASSERT_EQ(int(parts->size()), ranks);
      // Rank r's first bytes: layer 0, K, token 0, its first head.
      const size_t head_bytes = size_t(head_dim) * elem;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_EQ(std::memcmp((*parts)[r].data(),
                              global.data() + r * (kv_heads / ranks) * head_bytes, head_bytes),
                  0);
      }
      std::string back;
      ASSERT_TRUE(MergeKvTransport(*parts, layers, tokens, kv_heads, head_dim, elem, &back).ok());
      EXPECT_EQ(back, global);
      EXPECT_EQ(SplitKvTransport(global.substr(1), ranks, layers, tokens, kv_heads, head_dim, elem)
                    .status()
                    .code(),
                absl::StatusCode::kInvalidArgument);
      (*parts)[0].push_back('x');
      EXPECT_EQ(MergeKvTransport(*parts, layers, tokens, kv_heads, head_dim, elem, &back).code(),
                absl::StatusCode::kInvalidArgument);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The in-process all-reduce.

TEST(HostAllReduceTest, SumsInRankOrderOnEveryRank) {
  const int n = 3;
  HostAllReduce ar(n);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  for (int64_t len : {0, 1, 2, 7, 1000}) {
    std::vector<std::vector<float>> bufs(n, std::vector<float>(size_t(len)));
    for (auto& b : bufs) {
      for (float& x : b) x = u(rng);
    }
    std::vector<float> want(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) want[i] = (bufs[0][i] + bufs[1][i]) + bufs[2][i];
    std::vector<std::thread> threads;
    std::vector<absl::Status> st(n);
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        // Several rounds in a row: the barriers must keep rounds apart.
        for (int round = 0; round < 3 && st[r].ok(); ++round) {
          std::vector<float> tmp = bufs[r];
          st[r] = ar.AllReduceSum(r, tmp.data(), len);
          if (round == 2) bufs[r] = tmp;
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r];
      ASSERT_EQ(std::memcmp(bufs[r].data(), want.data(), sizeof(float) * len), 0)
          << "rank " << r << " length " << len;
    }
  }
}

TEST(HostAllReduceTest, AbortReleasesWaitingRanks) {
  HostAllReduce ar(3);
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  absl::Status sa, sb;
  std::thread ta([&] { sa = ar.AllReduceSum(0, a.data(), 4); });
  std::thread tb([&] { sb = ar.AllReduceSum(1, b.data(), 4); });
  // Rank 2 never arrives (it failed); the wrapper aborts.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ar.Abort();
  ta.join();
  tb.join();
  EXPECT_EQ(sa.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(sb.code(), absl::StatusCode::kAborted);
  ar.Reset();
  std::vector<std::vector<float>> bufs(3, std::vector<float>(4, 1.0f));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { EXPECT_TRUE(ar.AllReduceSum(r, bufs[r].data(), 4).ok()); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bufs[2][3], 3.0f);
}

// ---------------------------------------------------------------------------------------------
// The tensor-parallel backend against the plain backend.

TEST(TensorParallelCpuTest, OneRankWrapperIsBitIdenticalToPlain) {
  auto w = HostWeights("synthetic:tiny@3");
  ASSERT_TRUE(w);
  auto tp = Tp(*w, 1);
  ASSERT_TRUE(tp);
  EXPECT_EQ(tp->name(), "cpu-tp1");
  auto got = MakeEngine(std::move(tp));
  auto ref = MakeEngine(Plain(*w));
  ASSERT_TRUE(got && ref);
  ExpectEnginesMatch(*got, *ref, 0.0, "tiny TP=1 wrapper", 1);
}

TEST(TensorParallelCpuTest, TinyTwoRanksMatchPlain) {
  auto w = HostWeights("synthetic:tiny@3");
  ASSERT_TRUE(w);
  auto got = MakeEngine(Tp(*w, 2));
  auto ref = MakeEngine(Plain(*w));
  ASSERT_TRUE(got && ref);
  ExpectEnginesMatch(*got, *ref, kTpTolerance, "tiny TP=2", 2);
}

TEST(TensorParallelCpuTest, FourKvHeadsFourRanksMatchPlain) {
  auto w = RandomWeights(TinyFourKvHeads(), 4);
  auto got = MakeEngine(Tp(*w, 4), 8, 32);
  auto ref = MakeEngine(Plain(*w), 8, 32);
  ASSERT_TRUE(got && ref);
  ExpectEnginesMatch(*got, *ref, kTpTolerance, "tiny-4kv TP=4", 4);
}

TEST(TensorParallelCpuTest, SmolLm2ShapeThreeRanksMatchPlain) {
  auto w = RandomWeights(SmolLm2ShapeShort(), 3);
  auto got = MakeEngine(Tp(*w, 3));
  auto ref = MakeEngine(Plain(*w));
  ASSERT_TRUE(got && ref);
  ExpectEnginesMatch(*got, *ref, kTpTolerance, "smollm2-shape TP=3", 3);
}

// ---------------------------------------------------------------------------------------------
// Backend-level batches: a document prefilled into pages, then a query over it.

using backend_test::DocumentBatch;
using backend_test::QueryBatch;

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> f(bytes.size() / sizeof(float));
  std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
  return f;
}

TEST(TensorParallelCpuTest, KvExportedAtOneDegreeImportsAtAnother) {
  const int ps = 16, doc_len = 40;
  auto w = RandomWeights(TinyFourKvHeads(), 9);
  auto plain = Plain(*w);
  auto tp2 = Tp(*w, 2);
  auto tp4 = Tp(*w, 4);
  ASSERT_TRUE(plain && tp2 && tp4);
  for (Backend* b : {plain.get(), tp2.get(), tp4.get()}) ASSERT_TRUE(b->InitPool(64, ps).ok());
  std::mt19937 rng(21);
  const std::vector<int32_t> doc = RandomTokens(rng, doc_len, w->config.vocab_size);
  const std::vector<int32_t> query = RandomTokens(rng, 11, w->config.vocab_size);
  const std::vector<int32_t> doc_pages = {0, 1, 2};
  std::vector<float> logits;
  std::string kv_plain, kv_tp2;
  ASSERT_TRUE(plain->Forward(DocumentBatch(doc, doc_pages, ps), &logits).ok());
  ASSERT_TRUE(plain->ExportKv(doc_pages, doc_len, &kv_plain).ok());
  ASSERT_TRUE(tp2->Forward(DocumentBatch(doc, doc_pages, ps), &logits).ok());
  ASSERT_TRUE(tp2->ExportKv(doc_pages, doc_len, &kv_tp2).ok());
  // The global transport form, whatever the degree.
  ASSERT_EQ(kv_tp2.size(), kv_plain.size());
  EXPECT_LE(RelError(Floats(kv_tp2), Floats(kv_plain)), kTpTolerance);

  // Reference: the plain backend's own document.
  std::vector<float> ref;
  ASSERT_TRUE(plain->Forward(QueryBatch(doc_pages, doc_len, query, {20}, ps), &ref).ok());
  // TP=2's export into the plain backend, the plain backend's into TP=2 and TP=4.
  const std::vector<int32_t> other_pages = {10, 11, 12};
  ASSERT_TRUE(plain->ImportKv(other_pages, doc_len, kv_tp2).ok());
  ASSERT_TRUE(tp2->ImportKv(other_pages, doc_len, kv_plain).ok());
  ASSERT_TRUE(tp4->ImportKv(other_pages, doc_len, kv_tp2).ok());
  for (Backend* b : {plain.get(), tp2.get(), tp4.get()}) {
    std::vector<float> got;
    ASSERT_TRUE(b->Forward(QueryBatch(other_pages, doc_len, query, {21}, ps), &got).ok());
    const double err = RelError(got, ref);
    EXPECT_LE(err, kTpTolerance) << b->name();
    std::printf("[ imported KV on %s ] max|diff|/max|ref| = %.3g\n", b->name().c_str(), err);
  }
  // Round trip through TP=4: what it imported comes back unchanged.
  std::string again;
  ASSERT_TRUE(tp4->ExportKv(other_pages, doc_len, &again).ok());
  EXPECT_EQ(again, kv_tp2);
  // A payload of the wrong size.
  EXPECT_EQ(tp2->ImportKv(other_pages, doc_len, kv_tp2.substr(4)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorParallelCpuTest, RankErrorsPropagateAndTheBackendStaysUsable) {
  auto w = HostWeights("synthetic:tiny@3");
  ASSERT_TRUE(w);
  auto tp = Tp(*w, 2);
  ASSERT_TRUE(tp);
  std::vector<float> logits;
  ForwardBatch b = DocumentBatch({5, 6, 7}, {0}, 16);
  EXPECT_EQ(tp->Forward(b, &logits).code(), absl::StatusCode::kFailedPrecondition);  // no pool
  ASSERT_TRUE(tp->InitPool(8, 16).ok());
  EXPECT_EQ(tp->InitPool(0, 16).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(tp->InitPool(8, 16).ok());
  ForwardBatch bad = b;
  bad.tokens[1] = 100000;
  const absl::Status st = tp->Forward(bad, &logits);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("token id"), std::string::npos) << st;
  EXPECT_EQ(tp->ExportKv({99}, 3, nullptr).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(tp->Forward(b, &logits).ok());
  EXPECT_EQ(logits.size(), size_t(w->config.vocab_size));
  auto ref = Plain(*w);
  ASSERT_TRUE(ref->InitPool(8, 16).ok());
  std::vector<float> want;
  ASSERT_TRUE(ref->Forward(b, &want).ok());
  EXPECT_LE(RelError(logits, want), kTpTolerance);
}

}  // namespace
}  // namespace lazyrag
