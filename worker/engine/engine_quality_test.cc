// Issue 25's quality settings in the engine: recompute_first_tokens (first-k).
//   * LAZY and MATERIALIZE compute the same function for every k;
//   * k at least every document's length recomputes every document at its true position:
//     LAZY then equals FULL (plain causal attention over the concatenation);
//   * zero-copy holds: k = 0 writes no KV for document tokens; k > 0 writes exactly
//     min(k, size) per document, into the request's own pages, never into a document's;
//   * bad values are INVALID_ARGUMENT, and a backend without segment skips refuses k > 0;
//   * drop_first_tokens: LAZY == MATERIALIZE, no KV written for document tokens, excluded
//     with recompute_first_tokens;
//   * the shared prefix (attention sink): opens every mode's prompt (FULL with it equals FULL
//     of a prompt that starts with its tokens), LAZY == MATERIALIZE after it, whole-document
//     recompute after it == FULL, block ids differ across prefixes, and a stored document
//     encoded after another prefix is never used.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <tuple>

#include "absl/algorithm/container.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/cache/memory_store_test_util.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_util.h"
#include "worker/engine/request_layout.h"
#include "worker/model/synthetic_init.h"

namespace lazyrag {
namespace {

using engine_test::ForwardingBackend;
using engine_test::ModeRun;
using engine_test::RunMode;

ModelConfig SmallConfig(int heads, int kv_heads) {
  ModelConfig c;
  c.vocab_size = 97;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_layers = 2;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = 16;
  c.rope_theta = 10000.0f;
  c.max_position = 4096;
  return c;
}

std::unique_ptr<ModelWeights> RandomWeights(const ModelConfig& c, uint64_t seed) {
  auto w = std::make_unique<ModelWeights>();
  w->config = c;
  auto fill = [&](std::vector<float>& v, int64_t n, uint32_t tag, int64_t fan_in, bool norm) {
    v.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      v[i] = norm ? SyntheticNormWeight(seed, tag, i)
                  : SyntheticLinearWeight(seed, tag, i, std::sqrt(3.0f / fan_in));
    }
  };
  const int64_t d = c.hidden_size;
  fill(w->token_embedding, c.vocab_size * d, kSynEmbedding, 3, false);
  fill(w->final_norm, d, kSynFinalNorm, 1, true);
  fill(w->lm_head, c.vocab_size * d, kSynLmHead, d, false);
  w->layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& lw = w->layers[l];
    fill(lw.attn_norm, d, SyntheticTag(kSynAttnNorm, l), 1, true);
    fill(lw.ffn_norm, d, SyntheticTag(kSynFfnNorm, l), 1, true);
    fill(lw.wq, c.q_dim() * d, SyntheticTag(kSynWq, l), d, false);
    fill(lw.wk, c.kv_dim() * d, SyntheticTag(kSynWk, l), d, false);
    fill(lw.wv, c.kv_dim() * d, SyntheticTag(kSynWv, l), d, false);
    fill(lw.wo, c.q_dim() * d, SyntheticTag(kSynWo, l), c.q_dim(), false);
    fill(lw.w_gate, c.intermediate_size * d, SyntheticTag(kSynWGate, l), d, false);
    fill(lw.w_up, c.intermediate_size * d, SyntheticTag(kSynWUp, l), d, false);
    fill(lw.w_down, c.intermediate_size * d, SyntheticTag(kSynWDown, l), c.intermediate_size,
         false);
  }
  return w;
}

// Records every batch the engine runs.
class RecordingBackend final : public ForwardingBackend {
 public:
  explicit RecordingBackend(std::unique_ptr<Backend> inner, bool skips = true)
      : ForwardingBackend(std::move(inner)), skips_(skips) {}
  bool SupportsQualityViews() const override { return skips_; }
  absl::Status Forward(const ForwardBatch& b, std::vector<float>* logits) override {
    batches.push_back(b);
    return ForwardingBackend::Forward(b, logits);
  }
  absl::Status ForwardArgmax(const ForwardBatch& b, std::vector<int32_t>* ids) override {
    batches.push_back(b);
    return ForwardingBackend::ForwardArgmax(b, ids);
  }
  std::vector<ForwardBatch> batches;

 private:
  const bool skips_;
};

struct TestEngine {
  std::unique_ptr<Engine> engine;
  RecordingBackend* backend = nullptr;
};

TestEngine MakeEngine(const ModelConfig& c, int page_size, uint64_t seed, int default_k = 0,
                      bool skips = true, std::vector<int32_t> shared_prefix = {},
                      DocumentStore* store = nullptr) {
  auto cpu = CreateCpuBackend(RandomWeights(c, seed), {});
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  auto rec = std::make_unique<RecordingBackend>(std::move(*cpu), skips);
  TestEngine t;
  t.backend = rec.get();
  EngineOptions o;
  o.page_size = page_size;
  o.num_pages = 8192 / page_size + 64;
  o.prefill_chunk = 7;  // odd chunks: the recomputed tokens straddle steps
  o.fingerprint = "test-model";
  o.quality.recompute_first_tokens = default_k;
  o.shared_prefix = std::move(shared_prefix);
  o.store = store;
  auto e = Engine::Create(std::move(rec), o);
  EXPECT_TRUE(e.ok()) << e.status();
  if (e.ok()) t.engine = std::move(*e);
  return t;
}

TokenPrompt RandomPrompt(std::mt19937& rng, int num_docs, int vocab) {
  std::uniform_int_distribution<int> len(1, 60), tok(0, vocab - 1);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = tok(rng);
    return t;
  };
  TokenPrompt p;
  p.prefix = tokens(4 + rng() % 9);
  for (int i = 0; i < num_docs; ++i) p.documents.push_back(tokens(len(rng)));
  p.suffix = tokens(3 + rng() % 8);
  return p;
}

double MaxRelError(const std::vector<std::vector<float>>& a,
                   const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double max_diff = 0, max_ref = 0;
  for (size_t s = 0; s < std::min(a.size(), b.size()); ++s) {
    for (size_t i = 0; i < a[s].size(); ++i) {
      max_diff = std::max(max_diff, double(std::fabs(a[s][i] - b[s][i])));
      max_ref = std::max(max_ref, double(std::fabs(b[s][i])));
    }
  }
  return max_diff / std::max(max_ref, 1e-30);
}

// A run with the quality options `q` (RunMode sets only k).
ModeRun RunWith(Engine& e, const TokenPrompt& p, AttentionMode mode, int steps,
                const QualityOptions& q) {
  ModeRun r;
  TokenRunOptions o;
  o.mode = mode;
  o.max_tokens = steps;
  o.ignore_eos = true;
  o.step_logits = &r.logits;
  o.quality = q;
  auto res = e.RunTokens(p, o);
  EXPECT_TRUE(res.ok()) << res.status();
  if (res.ok()) r.result = *res;
  return r;
}

TEST(EngineQualityTest, FirstKLazyEqualsMaterialize) {
  std::mt19937 rng(25);
  for (int page_size : {1, 16, 64}) {
    for (auto [heads, kv] : {std::pair{4, 4}, {6, 2}}) {
      ModelConfig c = SmallConfig(heads, kv);
      TestEngine lazy = MakeEngine(c, page_size, 7), mat = MakeEngine(c, page_size, 7);
      for (int k : {0, 1, 5, 16, 33}) {
        SCOPED_TRACE(testing::Message() << "page " << page_size << " heads " << heads << "/" << kv
                                        << " k " << k);
        TokenPrompt p = RandomPrompt(rng, 1 + rng() % 6, c.vocab_size);
        ModeRun a = RunMode(*lazy.engine, p, AttentionMode::kLazy, 3, k);
        ModeRun b = RunMode(*mat.engine, p, AttentionMode::kMaterialize, 3, k);
        ASSERT_EQ(a.logits.size(), 3u);
        EXPECT_LE(MaxRelError(a.logits, b.logits), 1e-4);
        EXPECT_EQ(a.result.token_ids, b.result.token_ids);
        int64_t recomputed = 0;
        for (const auto& d : p.documents) recomputed += std::min<int64_t>(k, d.size());
        EXPECT_EQ(a.result.usage.recompute_first_tokens, k);
        EXPECT_EQ(a.result.usage.recomputed_document_tokens, recomputed);
        EXPECT_EQ(b.result.usage.recomputed_document_tokens, recomputed);
        // Plus the blocks this request computed (first sight of them).
        EXPECT_GE(a.result.usage.computed_tokens, int64_t(p.suffix.size()) + recomputed);
      }
    }
  }
}

TEST(EngineQualityTest, RecomputingWholeDocumentsEqualsFull) {
  std::mt19937 rng(26);
  ModelConfig c = SmallConfig(6, 2);
  TestEngine e = MakeEngine(c, 16, 3);
  for (int trial = 0; trial < 3; ++trial) {
    TokenPrompt p = RandomPrompt(rng, 2 + trial, c.vocab_size);
    int longest = 0;
    for (const auto& d : p.documents) longest = std::max<int>(longest, d.size());
    ModeRun full = RunMode(*e.engine, p, AttentionMode::kFull, 3);
    // Every document recomputed at its true position after the prefix and the documents
    // before it: plain causal attention over the concatenation.
    ModeRun lazy = RunMode(*e.engine, p, AttentionMode::kLazy, 3, longest);
    ModeRun mat = RunMode(*e.engine, p, AttentionMode::kMaterialize, 3, longest + 9);
    EXPECT_LE(MaxRelError(lazy.logits, full.logits), 1e-4);
    EXPECT_LE(MaxRelError(mat.logits, full.logits), 1e-4);
    // Not so with k short of the longest document (the test can fail).
    ModeRun partial = RunMode(*e.engine, p, AttentionMode::kLazy, 3, 1);
    EXPECT_GT(MaxRelError(partial.logits, full.logits), 1e-3);
  }
}

// Zero-copy: document pages are never written by a LAZY request; k > 0 writes exactly
// min(k, size) tokens per document, at the document's logical positions, into own pages;
// drop_first_tokens = m writes none and its view skips exactly min(m, size) keys of each
// document (the one dropped whole has no segment).
TEST(EngineQualityTest, LazyWritesOnlyTheRecomputedTokensIntoOwnPages) {
  std::mt19937 rng(27);
  ModelConfig c = SmallConfig(4, 2);
  const int ps = 16;
  TestEngine e = MakeEngine(c, ps, 5);
  TokenPrompt p = RandomPrompt(rng, 4, c.vocab_size);
  p.documents[0].resize(3);  // shorter than k: recomputed whole
  while (p.documents[1].size() < 40) p.documents[1].push_back(5);
  auto encoded = e.engine->EncodeDocuments(p.documents, "");
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  ASSERT_TRUE(e.engine->RunTokens(p, [] {
                TokenRunOptions o;
                o.max_tokens = 1;
                return o;
              }()).ok());  // the prefix block resident too
  // The pages of every resident block.
  std::set<int32_t> shared_pages;
  std::vector<std::string> ids;
  for (const auto& d : p.documents) ids.push_back(e.engine->BlockId(d, ""));
  ids.push_back(e.engine->BlockId(p.prefix, ""));
  for (const std::string& id : ids) {
    auto run = e.engine->documents().Acquire(id);
    ASSERT_TRUE(run.ok()) << run.status();
    shared_pages.insert(run->pages.begin(), run->pages.end());
    e.engine->documents().Release(id);
  }
  // Logical spans of the documents.
  std::vector<std::pair<int, int>> spans;
  int pos = int(p.prefix.size());
  for (const auto& d : p.documents) {
    spans.push_back({pos, pos + int(d.size())});
    pos += int(d.size());
  }
  const int gen = 3;
  for (auto [k, m] : {std::pair{0, 0}, {8, 0}, {0, 4}}) {
    SCOPED_TRACE(testing::Message() << "k " << k << " m " << m);
    e.backend->batches.clear();
    const int free_before = e.engine->pages().num_free();
    QualityOptions q;
    q.recompute_first_tokens = k;
    q.drop_first_tokens = m;
    ModeRun r = RunWith(*e.engine, p, AttentionMode::kLazy, gen, q);
    EXPECT_EQ(e.engine->pages().num_free(), free_before);
    EXPECT_EQ(r.result.usage.cached_document_tokens, r.result.usage.document_tokens);
    std::vector<int> per_doc(spans.size(), 0);
    std::set<int32_t> own_pages;
    int rows = 0;
    for (const ForwardBatch& b : e.backend->batches) {
      for (size_t t = 0; t < b.tokens.size(); ++t, ++rows) {
        const int32_t page = int32_t(b.kv_slot[t] / ps);
        EXPECT_EQ(shared_pages.count(page), 0u) << "a LAZY request wrote a document's page";
        own_pages.insert(page);
        for (size_t d = 0; d < spans.size(); ++d) {
          if (b.view.q_pos[t] >= spans[d].first && b.view.q_pos[t] < spans[d].second) {
            ++per_doc[d];
            EXPECT_LT(b.view.q_pos[t] - spans[d].first, k) << "not a first token";
          }
        }
      }
      if (m > 0) {
        // Segments: the prefix, the documents skipping their first tokens, the own run.
        std::vector<int32_t> want = {0};
        for (const auto& d : p.documents) {
          if (int(d.size()) > m) want.push_back(m);
        }
        want.push_back(0);
        EXPECT_EQ(b.view.seg_skip, want);
      }
    }
    int64_t recomputed = 0;
    for (size_t d = 0; d < spans.size(); ++d) {
      EXPECT_EQ(per_doc[d], std::min<int>(k, int(p.documents[d].size()))) << "document " << d;
      recomputed += per_doc[d];
    }
    // Rows: the recomputed tokens, the query, then one per generated token but the last.
    EXPECT_EQ(rows, recomputed + int64_t(p.suffix.size()) + gen - 1);
    EXPECT_EQ(int64_t(own_pages.size()),
              PagesFor(recomputed + int64_t(p.suffix.size()) + gen - 1, ps));
  }
}

TEST(EngineQualityTest, BadSettingsAreRejected) {
  ModelConfig c = SmallConfig(4, 2);
  TestEngine e = MakeEngine(c, 16, 2);
  std::mt19937 rng(28);
  TokenPrompt p = RandomPrompt(rng, 2, c.vocab_size);
  TokenRunOptions o;
  o.max_tokens = 2;
  for (int k : {-1, kMaxRecomputeFirstTokens + 1, 1 << 30}) {
    o.quality.recompute_first_tokens = k;
    auto r = e.engine->RunTokens(p, o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << k;
    EXPECT_NE(r.status().message().find("recompute_first_tokens"), std::string::npos);
  }
  // A server default out of range, and k > 0 on a backend that cannot skip segment keys.
  auto cpu = CreateCpuBackend(RandomWeights(c, 2), {});
  ASSERT_TRUE(cpu.ok());
  EngineOptions bad;
  bad.quality.recompute_first_tokens = -3;
  EXPECT_EQ(Engine::Create(std::move(*cpu), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto cpu2 = CreateCpuBackend(RandomWeights(c, 2), {});
  ASSERT_TRUE(cpu2.ok());
  bad.quality.recompute_first_tokens = 4;
  EXPECT_EQ(Engine::Create(std::make_unique<RecordingBackend>(std::move(*cpu2), false), bad)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  TestEngine no_skip = MakeEngine(c, 16, 2, 0, /*skips=*/false);
  o.quality.recompute_first_tokens = 4;
  EXPECT_EQ(no_skip.engine->RunTokens(p, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.mode = AttentionMode::kFull;  // FULL ignores it
  EXPECT_TRUE(no_skip.engine->RunTokens(p, o).ok());
}

TEST(EngineQualityTest, ServerDefaultAppliesAndRequestOverrides) {
  ModelConfig c = SmallConfig(4, 2);
  TestEngine e = MakeEngine(c, 16, 2, /*default_k=*/6);
  std::mt19937 rng(29);
  TokenPrompt p = RandomPrompt(rng, 3, c.vocab_size);
  ModeRun def = RunMode(*e.engine, p, AttentionMode::kLazy, 2);
  EXPECT_EQ(def.result.usage.recompute_first_tokens, 6);
  ModeRun off = RunMode(*e.engine, p, AttentionMode::kLazy, 2, 0);
  EXPECT_EQ(off.result.usage.recompute_first_tokens, 0);
  EXPECT_EQ(off.result.usage.recomputed_document_tokens, 0);
  ModeRun full = RunMode(*e.engine, p, AttentionMode::kFull, 2);
  EXPECT_EQ(full.result.usage.recompute_first_tokens, 0);
}

std::vector<int32_t> Sink(int seed, int n, int vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % vocab);
  return t;
}

TEST(EngineQualityTest, SharedPrefixMatchesADirectComputation) {
  std::mt19937 rng(30);
  ModelConfig c = SmallConfig(6, 2);
  const std::vector<int32_t> sink = Sink(1, 11, c.vocab_size);
  for (int page_size : {1, 16}) {
    SCOPED_TRACE(testing::Message() << "page " << page_size);
    TestEngine with = MakeEngine(c, page_size, 4, 0, true, sink);
    TestEngine plain = MakeEngine(c, page_size, 4);
    ASSERT_NE(with.engine, nullptr);
    for (int trial = 0; trial < 2; ++trial) {
      TokenPrompt p = RandomPrompt(rng, 2 + trial, c.vocab_size);
      int longest = 0;
      for (const auto& d : p.documents) longest = std::max<int>(longest, d.size());
      // FULL with the shared prefix == FULL of a prompt whose prefix starts with its tokens,
      // computed by an engine that has none.
      TokenPrompt direct = p;
      direct.prefix.insert(direct.prefix.begin(), sink.begin(), sink.end());
      ModeRun full = RunMode(*with.engine, p, AttentionMode::kFull, 3);
      ModeRun full_direct = RunMode(*plain.engine, direct, AttentionMode::kFull, 3);
      EXPECT_LE(MaxRelError(full.logits, full_direct.logits), 1e-5);
      EXPECT_EQ(full.result.usage.prompt_tokens, direct.total_tokens());
      // Every document recomputed after the shared prefix and its predecessors: FULL again.
      ModeRun lazy_all = RunMode(*with.engine, p, AttentionMode::kLazy, 3, longest);
      EXPECT_LE(MaxRelError(lazy_all.logits, full_direct.logits), 1e-4);
      // LAZY == MATERIALIZE after the shared prefix, with and without first-k.
      for (int k : {0, 5}) {
        ModeRun a = RunMode(*with.engine, p, AttentionMode::kLazy, 3, k);
        ModeRun b = RunMode(*with.engine, p, AttentionMode::kMaterialize, 3, k);
        EXPECT_LE(MaxRelError(a.logits, b.logits), 1e-4) << "k " << k;
        // And it is not plain block attention (documents encoded alone): the test can fail.
        if (k == 0) {
          TokenPrompt sinkless = direct;  // the same tokens, the sink as a plain prefix block
          ModeRun block = RunMode(*plain.engine, sinkless, AttentionMode::kLazy, 3, 0);
          EXPECT_GT(MaxRelError(a.logits, block.logits), 1e-3);
        }
      }
    }
  }
}

TEST(EngineQualityTest, BlockIdsDependOnTheSharedPrefix) {
  ModelConfig c = SmallConfig(4, 2);
  TestEngine none = MakeEngine(c, 16, 2);
  TestEngine a = MakeEngine(c, 16, 2, 0, true, Sink(1, 6, c.vocab_size));
  TestEngine a2 = MakeEngine(c, 16, 2, 0, true, Sink(1, 6, c.vocab_size));
  TestEngine b = MakeEngine(c, 16, 2, 0, true, Sink(2, 6, c.vocab_size));
  const std::vector<int32_t> doc = Sink(9, 20, c.vocab_size);
  for (const std::string ns : {"", "tenant"}) {
    const std::string id_none = none.engine->BlockId(doc, ns), id_a = a.engine->BlockId(doc, ns),
                      id_b = b.engine->BlockId(doc, ns);
    EXPECT_NE(id_none, id_a);
    EXPECT_NE(id_a, id_b);
    EXPECT_NE(id_none, id_b);
    EXPECT_EQ(id_a, a2.engine->BlockId(doc, ns));
  }
  EXPECT_NE(a.engine->BlockId(doc, ""), a.engine->BlockId(doc, "tenant"));
  // Bad shared prefixes.
  auto cpu = CreateCpuBackend(RandomWeights(c, 2), {});
  ASSERT_TRUE(cpu.ok());
  EngineOptions bad;
  bad.shared_prefix = {c.vocab_size};
  EXPECT_EQ(Engine::Create(std::move(*cpu), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EngineQualityTest, StoredDocumentOfAnotherPrefixIsNeverUsed) {
  ModelConfig c = SmallConfig(4, 2);
  MemoryDocumentStore store;
  std::mt19937 rng(31);
  TokenPrompt p = RandomPrompt(rng, 1, c.vocab_size);
  p.documents[0].resize(std::max<size_t>(p.documents[0].size(), 20), 3);
  const int64_t doc_tokens = int64_t(p.documents[0].size());
  {
    TestEngine writer = MakeEngine(c, 16, 2, 0, true, Sink(1, 6, c.vocab_size), &store);
    ASSERT_TRUE(writer.engine->EncodeDocuments(p.documents, "").ok());
    const std::string id = writer.engine->BlockId(p.documents[0], "");
    absl::MutexLock l(&store.mu);
    auto put = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(store.mu) {
      for (const auto& [key, doc] : store.docs) {
        if (key.size() >= id.size() && key.compare(key.size() - id.size(), id.size(), id) == 0) {
          return true;
        }
      }
      return false;
    };
    ASSERT_TRUE(store.mu.AwaitWithTimeout(absl::Condition(&put), absl::Seconds(10)));
  }
  // Another prefix, and none: computed, not fetched.
  for (std::vector<int32_t> other : {Sink(2, 6, c.vocab_size), std::vector<int32_t>{}}) {
    TestEngine reader = MakeEngine(c, 16, 2, 0, true, other, &store);
    ModeRun r = RunMode(*reader.engine, p, AttentionMode::kLazy, 2);
    EXPECT_EQ(r.result.usage.store_document_tokens, 0);
    EXPECT_EQ(r.result.usage.cached_document_tokens, 0);
  }
  // The same prefix: fetched.
  TestEngine same = MakeEngine(c, 16, 2, 0, true, Sink(1, 6, c.vocab_size), &store);
  ModeRun r = RunMode(*same.engine, p, AttentionMode::kLazy, 2);
  EXPECT_EQ(r.result.usage.store_document_tokens, doc_tokens);
}

TEST(EngineQualityTest, DocumentTemperatureAndScaleKeepLazyEqualToMaterialize) {
  std::mt19937 rng(32);
  ModelConfig c = SmallConfig(6, 2);
  for (bool sink : {false, true}) {
    TestEngine e = MakeEngine(c, 16, 6, 0, true,
                              sink ? Sink(3, 9, c.vocab_size) : std::vector<int32_t>{});
    for (auto [t, scale, k] : {std::tuple{0.7f, 1.0f, 0}, {1.0f, 2.5f, 0}, {1.3f, 0.6f, 5}}) {
      SCOPED_TRACE(testing::Message() << "sink " << sink << " T " << t << " S " << scale << " k "
                                      << k);
      TokenPrompt p = RandomPrompt(rng, 3, c.vocab_size);
      QualityOptions q;
      q.document_temperature = t;
      q.document_scale = scale;
      q.recompute_first_tokens = k;
      ModeRun a = RunWith(*e.engine, p, AttentionMode::kLazy, 3, q);
      ModeRun b = RunWith(*e.engine, p, AttentionMode::kMaterialize, 3, q);
      EXPECT_LE(MaxRelError(a.logits, b.logits), 1e-4);
      EXPECT_FLOAT_EQ(a.result.usage.document_temperature, t);
      EXPECT_FLOAT_EQ(b.result.usage.document_scale, scale);
      // The setting changes the function (the test can fail).
      ModeRun plain = RunMode(*e.engine, p, AttentionMode::kLazy, 3, k);
      EXPECT_GT(MaxRelError(a.logits, plain.logits), 1e-4);
    }
  }
}

TEST(EngineQualityTest, BadTemperatureAndScaleAreRejected) {
  ModelConfig c = SmallConfig(4, 2);
  TestEngine e = MakeEngine(c, 16, 2);
  std::mt19937 rng(33);
  TokenPrompt p = RandomPrompt(rng, 2, c.vocab_size);
  TokenRunOptions o;
  o.max_tokens = 2;
  for (float t : {0.0f, -1.0f, 21.0f, float(NAN)}) {
    o.quality = {};
    o.quality.document_temperature = t;
    auto r = e.engine->RunTokens(p, o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << t;
    EXPECT_NE(r.status().message().find("document_temperature"), std::string::npos);
  }
  for (float s : {0.0f, 101.0f, float(INFINITY), float(NAN)}) {
    o.quality = {};
    o.quality.document_scale = s;
    EXPECT_EQ(e.engine->RunTokens(p, o).status().code(), absl::StatusCode::kInvalidArgument) << s;
  }
  TestEngine no_views = MakeEngine(c, 16, 2, 0, /*skips=*/false);
  o.quality = {};
  o.quality.document_temperature = 0.9f;
  EXPECT_EQ(no_views.engine->RunTokens(p, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

QualityOptions Drop(int m) {
  QualityOptions q;
  q.drop_first_tokens = m;
  return q;
}

TEST(EngineQualityTest, DropFirstTokensKeepsLazyEqualToMaterialize) {
  std::mt19937 rng(34);
  ModelConfig c = SmallConfig(6, 2);
  for (bool sink : {false, true}) {
    for (int page_size : {1, 16}) {
      TestEngine e = MakeEngine(c, page_size, 8, 0, true,
                                sink ? Sink(4, 7, c.vocab_size) : std::vector<int32_t>{});
      for (auto [m, t] : {std::pair{1, 1.0f}, {3, 1.0f}, {40, 1.0f}, {2, 0.8f}}) {
        SCOPED_TRACE(testing::Message() << "sink " << sink << " page " << page_size << " m " << m
                                        << " T " << t);
        TokenPrompt p = RandomPrompt(rng, 1 + rng() % 5, c.vocab_size);
        p.documents[0].resize(std::min<size_t>(p.documents[0].size(), 2));  // dropped whole for m >= 2
        QualityOptions q = Drop(m);
        if (t != 1.0f) q.document_temperature = t;
        ModeRun a = RunWith(*e.engine, p, AttentionMode::kLazy, 3, q);
        ModeRun b = RunWith(*e.engine, p, AttentionMode::kMaterialize, 3, q);
        ASSERT_EQ(a.logits.size(), 3u);
        EXPECT_LE(MaxRelError(a.logits, b.logits), 1e-4);
        EXPECT_EQ(a.result.token_ids, b.result.token_ids);
        EXPECT_EQ(a.result.usage.drop_first_tokens, m);
        EXPECT_EQ(b.result.usage.drop_first_tokens, m);
        EXPECT_EQ(a.result.usage.recomputed_document_tokens, 0);
        // The setting changes the function (the test can fail).
        QualityOptions plain;
        if (t != 1.0f) plain.document_temperature = t;
        ModeRun c0 = RunWith(*e.engine, p, AttentionMode::kLazy, 3, plain);
        EXPECT_GT(MaxRelError(a.logits, c0.logits), 1e-4);
        // And each m is its own function (when some document is longer than m).
        if (absl::c_any_of(p.documents, [&](const auto& d) { return int(d.size()) > m; })) {
          QualityOptions other = q;
          other.drop_first_tokens = m + 1;
          ModeRun c1 = RunWith(*e.engine, p, AttentionMode::kLazy, 3, other);
          EXPECT_GT(MaxRelError(a.logits, c1.logits), 1e-4);
        }
      }
    }
  }
}

TEST(EngineQualityTest, DropFirstTokensSettingsAreChecked) {
  ModelConfig c = SmallConfig(4, 2);
  std::mt19937 rng(36);
  TokenPrompt p = RandomPrompt(rng, 2, c.vocab_size);
  TestEngine e = MakeEngine(c, 16, 2, /*default_k=*/6);
  TokenRunOptions o;
  o.max_tokens = 2;
  for (int m : {-1, kMaxDropFirstTokens + 1}) {
    o.quality = Drop(m);
    auto r = e.engine->RunTokens(p, o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << m;
    EXPECT_NE(r.status().message().find("drop_first_tokens"), std::string::npos);
  }
  // Both in one request: refused, naming both.
  o.quality = Drop(2);
  o.quality.recompute_first_tokens = 4;
  auto both = e.engine->RunTokens(p, o);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(both.status().message().find("recompute_first_tokens"), std::string::npos);
  // A request's drop clears the server's default k, and a request's k a default drop.
  ModeRun drop = RunWith(*e.engine, p, AttentionMode::kLazy, 2, Drop(2));
  EXPECT_EQ(drop.result.usage.drop_first_tokens, 2);
  EXPECT_EQ(drop.result.usage.recompute_first_tokens, 0);
  EXPECT_EQ(drop.result.usage.recomputed_document_tokens, 0);
  ModeRun def = RunMode(*e.engine, p, AttentionMode::kLazy, 2);
  EXPECT_EQ(def.result.usage.recompute_first_tokens, 6);
  EXPECT_EQ(def.result.usage.drop_first_tokens, 0);
  // Both as server defaults: refused at Create.
  auto cpu = CreateCpuBackend(RandomWeights(c, 2), {});
  ASSERT_TRUE(cpu.ok());
  EngineOptions bad;
  bad.quality.recompute_first_tokens = 4;
  bad.quality.drop_first_tokens = 1;
  EXPECT_EQ(Engine::Create(std::move(*cpu), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A backend without segment skips refuses it.
  TestEngine no_views = MakeEngine(c, 16, 2, 0, /*skips=*/false);
  o.quality = Drop(1);
  EXPECT_EQ(no_views.engine->RunTokens(p, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazyrag
