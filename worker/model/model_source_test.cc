#include "worker/model/model_source.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/json.h"
#include "gtest/gtest.h"
#include "worker/model/gguf.h"
#include "worker/model/synthetic_init.h"

namespace lazyrag {
namespace {

TEST(SyntheticConfigTest, KnownShapes) {
  auto tiny = SyntheticConfig("tiny");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->vocab_size, 259);
  EXPECT_EQ(tiny->hidden_size, 64);
  EXPECT_EQ(tiny->intermediate_size, 160);
  EXPECT_EQ(tiny->num_layers, 2);
  EXPECT_EQ(tiny->num_heads, 4);
  EXPECT_EQ(tiny->num_kv_heads, 2);
  EXPECT_EQ(tiny->head_dim, 16);
  EXPECT_TRUE(tiny->tie_word_embeddings);

  auto smol = SyntheticConfig("smollm2-135m");
  ASSERT_TRUE(smol.ok()) << smol.status();
  EXPECT_EQ(smol->num_layers, 30);
  EXPECT_EQ(smol->hidden_size, 576);
  EXPECT_EQ(smol->num_heads, 9);
  EXPECT_EQ(smol->num_kv_heads, 3);
  EXPECT_EQ(smol->vocab_size, 49152);
  EXPECT_FLOAT_EQ(smol->rope_theta, 100000.0f);
  EXPECT_EQ(smol->max_position, 8192);

  auto l3 = SyntheticConfig("llama3-8b");
  ASSERT_TRUE(l3.ok()) << l3.status();
  EXPECT_EQ(l3->vocab_size, 128256);
  EXPECT_EQ(l3->intermediate_size, 14336);
  EXPECT_EQ(l3->num_kv_heads, 8);
  EXPECT_EQ(l3->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(l3->rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(l3->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(l3->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(l3->rope_scaling.original_max_position, 8192);
  EXPECT_FALSE(l3->tie_word_embeddings);
  EXPECT_EQ(l3->max_position, 131072);
  // About 8.03 B parameters.
  EXPECT_NEAR(double(l3->NumParameters()), 8.03e9, 0.01e9);
}

TEST(SyntheticConfigTest, UnknownNameIsNotFound) {
  auto c = SyntheticConfig("gpt-17");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  auto m = LoadModel("synthetic:gpt-17");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("gpt-17"), std::string::npos);
}

TEST(SyntheticModelTest, TinyWeightsFollowSyntheticInit) {
  auto m = LoadModel("synthetic:tiny@7");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->synthetic);
  EXPECT_EQ(m->seed, 7u);
  ASSERT_NE(m->weights, nullptr);
  const ModelWeights& w = *m->weights;
  const ModelConfig& c = m->config;
  EXPECT_EQ(w.token_embedding.size(), size_t(259 * 64));
  ASSERT_EQ(w.layers.size(), 2u);
  EXPECT_EQ(w.layers[1].wq.size(), size_t(c.q_dim() * 64));
  EXPECT_EQ(w.layers[1].wk.size(), size_t(c.kv_dim() * 64));
  EXPECT_EQ(w.layers[1].w_down.size(), size_t(64 * 160));
  EXPECT_TRUE(w.lm_head.empty());
  EXPECT_EQ(&w.output_weight(), &w.token_embedding);

  EXPECT_EQ(w.token_embedding[100], SyntheticUniform(7, SyntheticTag(kSynEmbedding, 0), 100));
  EXPECT_EQ(w.layers[1].attn_norm[3], SyntheticNormWeight(7, SyntheticTag(kSynAttnNorm, 1), 3));
  EXPECT_EQ(w.layers[1].w_down[1234],
            SyntheticLinearWeight(7, SyntheticTag(kSynWDown, 1), 1234, std::sqrt(3.0f / 160)));
  EXPECT_EQ(w.layers[0].wq[77],
            SyntheticLinearWeight(7, SyntheticTag(kSynWq, 0), 77, std::sqrt(3.0f / 64)));
  EXPECT_EQ(w.final_norm[5], SyntheticNormWeight(7, SyntheticTag(kSynFinalNorm, 0), 5));
  for (float x : w.layers[0].ffn_norm) EXPECT_TRUE(x >= 0.9f && x <= 1.1f);
  for (float x : w.layers[0].w_gate) EXPECT_LE(std::fabs(x), std::sqrt(3.0f / 64));

  // Byte tokenizer.
  EXPECT_EQ(m->tokenizer.model, "bytes");
  ASSERT_EQ(m->tokenizer.tokens.size(), 259u);
  EXPECT_EQ(m->tokenizer.tokens[0], "<bos>");
  EXPECT_EQ(m->tokenizer.token_types[2], 3);
  EXPECT_EQ(m->tokenizer.tokens[3 + 'A'], "<0x41>");
  EXPECT_EQ(m->tokenizer.token_types[3 + 'A'], 6);
  EXPECT_EQ(m->tokenizer.bos_id, 0);
  EXPECT_EQ(m->tokenizer.eos_id, 1);
}

TEST(SyntheticModelTest, DeterministicAndSeeded) {
  auto a = LoadModel("synthetic:tiny@3");
  auto b = LoadModel("synthetic:tiny", LoadOptions{.seed = 3});
  auto c = LoadModel("synthetic:tiny@4");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->fingerprint, b->fingerprint);
  EXPECT_NE(a->fingerprint, c->fingerprint);
  EXPECT_EQ(a->weights->layers[1].w_up, b->weights->layers[1].w_up);
  EXPECT_NE(a->weights->layers[1].w_up, c->weights->layers[1].w_up);
  EXPECT_EQ(a->fingerprint.size(), 64u);
}

TEST(SyntheticModelTest, BadSeedIsInvalidArgument) {
  for (const char* name : {"synthetic:tiny@", "synthetic:tiny@x1", "synthetic:tiny@-1",
                           "synthetic:tiny@99999999999999999999999"}) {
    auto m = LoadModel(name);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << name;
  }
}

TEST(SyntheticModelTest, Llama3HostWeightsRefusedUnlessDeviceGenerated) {
  auto m = LoadModel("synthetic:llama3-8b");
  ASSERT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted) << m.status();
  EXPECT_NE(m.status().message().find("synthetic_host_weights"), std::string::npos);

  LoadOptions opts;
  opts.synthetic_host_weights = false;
  auto d = LoadModel("synthetic:llama3-8b@9", opts);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->weights, nullptr);
  EXPECT_EQ(d->config.num_layers, 32);
  EXPECT_EQ(d->seed, 9u);
  EXPECT_EQ(d->tokenizer.model, "bytes");
}

TEST(SyntheticModelTest, MaxHostBytesApplies) {
  LoadOptions opts;
  opts.max_host_bytes = 1 << 20;  // 1 MiB < 135M * 4 bytes
  auto m = LoadModel("synthetic:smollm2-135m", opts);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(LoadModelTest, MissingPathIsNotFound) {
  auto m = LoadModel("/nonexistent/model.gguf");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  auto t = LoadTokenizerSpec("/nonexistent/model.gguf");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
}

TEST(LoadTokenizerSpecTest, Synthetic) {
  auto t = LoadTokenizerSpec("synthetic:smollm2-135m@5");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->model, "bytes");
  EXPECT_EQ(t->tokens.size(), 259u);
  EXPECT_EQ(LoadTokenizerSpec("synthetic:nope").status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------------------
// The real SmolLM2 GGUF, when LAZYRAG_MODEL points to it.

const char* RealModelPath() {
  const char* p = std::getenv("LAZYRAG_MODEL");
  return (p != nullptr && *p != '\0') ? p : nullptr;
}

std::string FixturePath(const std::string& name) {
  return std::string(LAZYRAG_FIXTURES_DIR) + "/" + name;
}

TEST(RealModelTest, SmolLM2TokenizerSpec) {
  const char* path = RealModelPath();
  if (path == nullptr) GTEST_SKIP() << "LAZYRAG_MODEL not set (path to SmolLM2-135M GGUF)";
  auto t = LoadTokenizerSpec(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->model, "gpt2");
  EXPECT_EQ(t->pre, "smollm");
  EXPECT_EQ(t->tokens.size(), 49152u);
  EXPECT_EQ(t->token_types.size(), 49152u);
  EXPECT_EQ(t->merges.size(), 48900u);
  EXPECT_EQ(t->bos_id, 1);
  EXPECT_EQ(t->eos_id, 2);
  EXPECT_EQ(t->unk_id, 0);
  EXPECT_EQ(t->pad_id, 2);
  EXPECT_NE(t->chat_template.find("im_start"), std::string::npos);
  EXPECT_EQ(t->tokens[1], "<|im_start|>");
}

TEST(RealModelTest, SmolLM2Loads) {
  const char* path = RealModelPath();
  if (path == nullptr) GTEST_SKIP() << "LAZYRAG_MODEL not set (path to SmolLM2-135M GGUF)";
  const auto start = std::chrono::steady_clock::now();
  auto m = LoadModel(path);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(m.ok()) << m.status();
  std::printf("SmolLM2 load: %.3f s\n", secs);
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.max_position, 8192);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(m->fingerprint.size(), 64u);
  EXPECT_EQ(m->tokenizer.tokens.size(), 49152u);
  EXPECT_FALSE(m->tokenizer.merges.empty());
  EXPECT_FALSE(m->tokenizer.chat_template.empty());
  ASSERT_NE(m->weights, nullptr);
  EXPECT_TRUE(m->weights->lm_head.empty());

  // Compare against values computed by python's gguf package (tests/fixtures/
  // gen_gguf_fixtures.py), with the Q/K rows mapped back to the rotate-half layout.
  std::ifstream in(FixturePath("smollm2_gguf_dequant.json"));
  ASSERT_TRUE(in.good()) << "missing fixture smollm2_gguf_dequant.json";
  std::stringstream ss;
  ss << in.rdbuf();
  auto doc = ParseJson(ss.str());
  ASSERT_TRUE(doc.ok()) << doc.status();
  const Json* tensors = JsonMember(*doc, "tensors");
  ASSERT_NE(tensors, nullptr);
  ASSERT_TRUE(tensors->is_array());
  int checked = 0;
  for (const Json& t : *tensors) {
    const std::string name = t.at("name").get<std::string>();
    const std::string field = t.at("field").get<std::string>();
    const int layer = t.at("layer").get<int>();
    const ModelWeights& w = *m->weights;
    const std::vector<float>* v = nullptr;
    if (field == "token_embedding")
      v = &w.token_embedding;
    else if (field == "final_norm")
      v = &w.final_norm;
    else if (field == "wq")
      v = &w.layers[layer].wq;
    else if (field == "wk")
      v = &w.layers[layer].wk;
    else if (field == "wv")
      v = &w.layers[layer].wv;
    else if (field == "w_down")
      v = &w.layers[layer].w_down;
    else if (field == "attn_norm")
      v = &w.layers[layer].attn_norm;
    ASSERT_NE(v, nullptr) << field;
    for (const Json& s : t.at("samples")) {
      const int64_t index = s.at(0).get<int64_t>();  // flat index in our (HF) layout
      const double expected = s.at(1).get<double>();
      ASSERT_LT(size_t(index), v->size()) << name;
      EXPECT_FLOAT_EQ((*v)[index], float(expected)) << name << "[" << index << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

}  // namespace
}  // namespace lazyrag
