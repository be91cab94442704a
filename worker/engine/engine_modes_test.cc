// Must-show 1 and 2 of the foundation: LAZY == MATERIALIZE, position invariance against an
// independent dense block-attention forward, PREFIX == FULL, document reuse at any position.
#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/attention/rope.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_util.h"
#include "worker/model/synthetic_init.h"

namespace lazyrag {
namespace {

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
  c.tie_word_embeddings = (heads % 2) == 0;
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
  if (!c.tie_word_embeddings) fill(w->lm_head, c.vocab_size * d, kSynLmHead, d, false);
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
    fill(lw.w_down, c.intermediate_size * d, SyntheticTag(kSynWDown, l), c.intermediate_size, false);
  }
  return w;
}

std::unique_ptr<Engine> MakeEngine(const ModelConfig& c, int page_size, uint64_t seed,
                                   bool reference_attention = false) {
  auto backend = CreateCpuBackend(RandomWeights(c, seed), {reference_attention});
  EXPECT_TRUE(backend.ok()) << backend.status();
  EngineOptions o;
  o.page_size = page_size;
  o.num_pages = 8192 / page_size + 64;
  o.prefill_chunk = 7;  // odd chunks exercise chunked prefill
  o.fingerprint = "test-model";
  auto e = Engine::Create(std::move(*backend), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

TokenPrompt RandomPrompt(std::mt19937& rng, int num_docs, int vocab) {
  std::uniform_int_distribution<int> len(3, 70);
  TokenPrompt p;
  p.prefix = RandomTokens(rng, 5 + rng() % 9, vocab);
  for (int i = 0; i < num_docs; ++i) p.documents.push_back(RandomTokens(rng, len(rng), vocab));
  p.suffix = RandomTokens(rng, 4 + rng() % 8, vocab);
  return p;
}

// Max |a - b| over max |b|, over every step's logits.
double MaxRelError(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
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

using engine_test::ModeRun;
using engine_test::RunMode;

TEST(EngineModesTest, LazyEqualsMaterializeAcrossShapes) {
  std::mt19937 rng(1234);
  for (int page_size : {1, 16, 64}) {
    for (auto [heads, kv] : {std::pair{4, 4}, {6, 2}, {8, 2}}) {  // GQA 1, 3, 4
      SCOPED_TRACE(testing::Message() << "page " << page_size << " heads " << heads << "/" << kv);
      ModelConfig c = SmallConfig(heads, kv);
      auto lazy = MakeEngine(c, page_size, 99);
      auto mat = MakeEngine(c, page_size, 99);
      for (int trial = 0; trial < 3; ++trial) {
        TokenPrompt p = RandomPrompt(rng, 1 + rng() % 8, c.vocab_size);
        for (int order = 0; order < 2; ++order) {
          std::shuffle(p.documents.begin(), p.documents.end(), rng);
          ModeRun a = RunMode(*lazy, p, AttentionMode::kLazy, 4);
          ModeRun b = RunMode(*mat, p, AttentionMode::kMaterialize, 4);
          ASSERT_EQ(a.logits.size(), 4u);
          EXPECT_LE(MaxRelError(a.logits, b.logits), 1e-4);
          EXPECT_EQ(a.result.token_ids, b.result.token_ids);
        }
      }
    }
  }
}

// Independent dense forward with an explicit mask and absolute positions: block attention
// (each block sees itself causally, the last block sees everything before it) or causal.
std::vector<std::vector<float>> DenseForward(const ModelWeights& w, const TokenPrompt& p,
                                             const std::vector<int32_t>& generated, bool block) {
  const ModelConfig& c = w.config;
  std::vector<int32_t> tokens(p.prefix), block_id(p.prefix.size(), 0);
  int bid = 1;
  for (const auto& d : p.documents) {
    tokens.insert(tokens.end(), d.begin(), d.end());
    block_id.insert(block_id.end(), d.size(), bid++);
  }
  tokens.insert(tokens.end(), p.suffix.begin(), p.suffix.end());
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  block_id.resize(tokens.size(), bid);  // the last block: suffix and generated tokens
  const int N = tokens.size(), d = c.hidden_size, D = c.head_dim, H = c.num_heads;
  const int group = c.num_heads / c.num_kv_heads;
  auto inv = RopeInvFreq(c);
  std::vector<float> x(N * d);
  for (int i = 0; i < N; ++i) std::copy_n(&w.token_embedding[tokens[i] * d], d, &x[i * d]);
  auto rms = [&](const std::vector<float>& in, const std::vector<float>& g) {
    std::vector<float> out(in.size());
    for (int i = 0; i < N; ++i) {
      double ss = 0;
      for (int j = 0; j < d; ++j) ss += double(in[i * d + j]) * in[i * d + j];
      float r = 1.0f / std::sqrt(float(ss / d) + c.rms_norm_eps);
      for (int j = 0; j < d; ++j) out[i * d + j] = in[i * d + j] * r * g[j];
    }
    return out;
  };
  auto matmul = [&](const std::vector<float>& in, const std::vector<float>& W, int out_dim, int in_dim) {
    std::vector<float> out(size_t(N) * out_dim);
    for (int i = 0; i < N; ++i)
      for (int o = 0; o < out_dim; ++o) {
        double s = 0;
        for (int k = 0; k < in_dim; ++k) s += double(in[i * in_dim + k]) * W[size_t(o) * in_dim + k];
        out[size_t(i) * out_dim + o] = s;
      }
    return out;
  };
  for (const LayerWeights& lw : w.layers) {
    auto h = rms(x, lw.attn_norm);
    auto q = matmul(h, lw.wq, c.q_dim(), d), k = matmul(h, lw.wk, c.kv_dim(), d),
         v = matmul(h, lw.wv, c.kv_dim(), d);
    for (int i = 0; i < N; ++i) {
      for (int hh = 0; hh < H; ++hh) RopeRotate(&q[(i * H + hh) * D], D, inv.data(), i);
      for (int hh = 0; hh < c.num_kv_heads; ++hh) RopeRotate(&k[(i * c.num_kv_heads + hh) * D], D, inv.data(), i);
    }
    std::vector<float> attn(size_t(N) * c.q_dim());
    for (int i = 0; i < N; ++i)
      for (int hh = 0; hh < H; ++hh) {
        std::vector<double> s(N, -1e300);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          bool visible = !block || block_id[j] == block_id[i] || block_id[i] == bid;
          if (!visible) continue;
          double dot = 0;
          for (int t = 0; t < D; ++t) dot += double(q[(i * H + hh) * D + t]) * k[(j * c.num_kv_heads + hh / group) * D + t];
          s[j] = dot / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        double den = 0;
        std::vector<double> acc(D, 0);
        for (int j = 0; j <= i; ++j) {
          if (s[j] <= -1e299) continue;
          double e = std::exp(s[j] - mx);
          den += e;
          for (int t = 0; t < D; ++t) acc[t] += e * v[(j * c.num_kv_heads + hh / group) * D + t];
        }
        for (int t = 0; t < D; ++t) attn[(i * H + hh) * D + t] = acc[t] / den;
      }
    auto o = matmul(attn, lw.wo, d, c.q_dim());
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    h = rms(x, lw.ffn_norm);
    auto g = matmul(h, lw.w_gate, c.intermediate_size, d), u = matmul(h, lw.w_up, c.intermediate_size, d);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    auto dn = matmul(g, lw.w_down, d, c.intermediate_size);
    for (size_t i = 0; i < x.size(); ++i) x[i] += dn[i];
  }
  auto xn = rms(x, w.final_norm);
  // Logits of the last prompt token and of each generated token but the last.
  std::vector<std::vector<float>> out;
  const int first = N - int(generated.size()) - 1;
  for (int i = first; i < N; ++i) {
    std::vector<float> l(c.vocab_size);
    for (int t = 0; t < c.vocab_size; ++t) {
      double s = 0;
      for (int j = 0; j < d; ++j) s += double(xn[i * d + j]) * w.output_weight()[size_t(t) * d + j];
      l[t] = s;
    }
    out.push_back(l);
  }
  return out;
}

TEST(EngineModesTest, CachedDocumentsAtNewOffsetsMatchBlockAttentionInPlace) {
  std::mt19937 rng(77);
  ModelConfig c = SmallConfig(6, 2);
  auto weights = RandomWeights(c, 5);
  auto engine = MakeEngine(c, 16, 5);
  TokenPrompt p = RandomPrompt(rng, 4, c.vocab_size);
  RunMode(*engine, p, AttentionMode::kLazy, 2);  // caches every document at some offset
  for (int trial = 0; trial < 3; ++trial) {
    std::shuffle(p.documents.begin(), p.documents.end(), rng);
    p.suffix = RandomTokens(rng, 6, c.vocab_size);
    ModeRun r = RunMode(*engine, p, AttentionMode::kLazy, 3);
    EXPECT_EQ(r.result.usage.cached_document_tokens, r.result.usage.document_tokens);
    EXPECT_EQ(r.result.usage.computed_tokens, int64_t(p.suffix.size()));
    std::vector<int32_t> gen(r.result.token_ids.begin(), r.result.token_ids.end() - 1);
    auto ref = DenseForward(*weights, p, gen, /*block=*/true);
    EXPECT_LE(MaxRelError(r.logits, ref), 1e-4);
  }
}

TEST(EngineModesTest, FullAndPrefixMatchDenseCausal) {
  std::mt19937 rng(3);
  ModelConfig c = SmallConfig(8, 2);
  auto weights = RandomWeights(c, 8);
  auto engine = MakeEngine(c, 16, 8);
  TokenPrompt p = RandomPrompt(rng, 3, c.vocab_size);
  ModeRun full = RunMode(*engine, p, AttentionMode::kFull, 3);
  std::vector<int32_t> gen(full.result.token_ids.begin(), full.result.token_ids.end() - 1);
  EXPECT_LE(MaxRelError(full.logits, DenseForward(*weights, p, gen, false)), 1e-4);
  ModeRun prefix1 = RunMode(*engine, p, AttentionMode::kPrefix, 3);
  ModeRun prefix2 = RunMode(*engine, p, AttentionMode::kPrefix, 3);
  EXPECT_LE(MaxRelError(prefix1.logits, full.logits), 1e-4);
  EXPECT_LE(MaxRelError(prefix2.logits, full.logits), 1e-4);
  EXPECT_EQ(prefix1.result.usage.computed_tokens, p.total_tokens());
  EXPECT_LT(prefix2.result.usage.computed_tokens, 16 + 1);  // all but the last partial page
  // A different document order shares only the prefix block: PREFIX misses after it.
  std::reverse(p.documents.begin(), p.documents.end());
  ModeRun prefix3 = RunMode(*engine, p, AttentionMode::kPrefix, 1);
  EXPECT_GT(prefix3.result.usage.computed_tokens, p.total_tokens() - int64_t(p.prefix.size()) - 16);
}

TEST(EngineModesTest, ReferenceAndBlasAttentionAgree) {
  std::mt19937 rng(9);
  ModelConfig c = SmallConfig(6, 2);
  auto fast = MakeEngine(c, 16, 1, false);
  auto ref = MakeEngine(c, 16, 1, true);
  TokenPrompt p = RandomPrompt(rng, 3, c.vocab_size);
  EXPECT_LE(MaxRelError(RunMode(*fast, p, AttentionMode::kLazy, 3).logits,
                        RunMode(*ref, p, AttentionMode::kLazy, 3).logits), 1e-4);
}

TEST(EngineModesTest, PoolReturnsToBaselineAndBadInputIsRejected) {
  ModelConfig c = SmallConfig(4, 2);
  auto e = MakeEngine(c, 16, 2);
  std::mt19937 rng(4);
  TokenPrompt p = RandomPrompt(rng, 2, c.vocab_size);
  const int free_before = e->pages().num_free();
  RunMode(*e, p, AttentionMode::kMaterialize, 2);
  auto stats = e->documents().Stats();
  EXPECT_EQ(stats.pinned_entries, 0);
  EXPECT_EQ(e->pages().num_free() + stats.cached_pages, free_before);
  TokenRunOptions o;
  o.max_tokens = 0;
  EXPECT_EQ(e->RunTokens(p, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.max_tokens = 5000;
  EXPECT_EQ(e->RunTokens(p, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.max_tokens = 2;
  o.sampling.temperature = NAN;
  EXPECT_EQ(e->RunTokens(p, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.sampling.temperature = 0;
  TokenPrompt bad = p;
  bad.suffix.push_back(c.vocab_size);
  EXPECT_EQ(e->RunTokens(bad, o).status().code(), absl::StatusCode::kInvalidArgument);
  bad.suffix.clear();
  EXPECT_EQ(e->RunTokens(bad, o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazyrag
