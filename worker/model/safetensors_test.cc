// Hugging Face checkpoints written by the test itself (safetensors is a JSON header plus raw
// little-endian data), single file and sharded.
#include "worker/model/safetensors.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/model/model_source.h"

namespace lazyrag {
namespace {

// Values: element e of the tensor with tag k is k + 0.25 * (e % 8), exact in F32, F16 and BF16.
float Value(int tag, int64_t e) { return float(tag) + 0.25f * float(e % 8); }

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;  // F32, F16, BF16
  int tag;
};

uint16_t ToHalf(float f) {  // exact for the small values used here
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if (f == 0.0f) return uint16_t(b >> 16);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const int exp = int((b >> 23) & 0xff) - 127 + 15;
  return uint16_t(sign | (uint32_t(exp) << 10) | ((b >> 13) & 0x3ffu));
}

std::string SafetensorsFile(const std::vector<TensorSpec>& specs) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::string data;
  for (const TensorSpec& t : specs) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const size_t begin = data.size();
    for (int64_t e = 0; e < n; ++e) {
      const float v = Value(t.tag, e);
      if (t.dtype == "F32") {
        data.append(reinterpret_cast<const char*>(&v), 4);
      } else if (t.dtype == "F16") {
        const uint16_t h = ToHalf(v);
        data.append(reinterpret_cast<const char*>(&h), 2);
      } else {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        const uint16_t h = uint16_t(b >> 16);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    std::string shape;
    for (size_t i = 0; i < t.shape.size(); ++i) {
      shape += (i ? "," : "") + std::to_string(t.shape[i]);
    }
    absl::StrAppend(&header, ",\"", t.name, "\":{\"dtype\":\"", t.dtype, "\",\"shape\":[", shape,
                    "],\"data_offsets\":[", begin, ",", data.size(), "]}");
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  const uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

constexpr char kConfig[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": TIE,
  "bos_token_id": 1, "eos_token_id": [2, 3], "torch_dtype": "bfloat16",
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}
})";

std::string Config(bool tied) {
  std::string s = kConfig;
  s.replace(s.find("TIE"), 3, tied ? "true" : "false");
  return s;
}

std::vector<TensorSpec> Specs(bool tied) {
  std::vector<TensorSpec> s;
  int tag = 0;
  const char* dtypes[] = {"F32", "F16", "BF16"};
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    s.push_back({name, std::move(shape), dtypes[tag % 3], tag});
    ++tag;
  };
  add("model.embed_tokens.weight", {32, 16});
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {16});
    add(p + "self_attn.q_proj.weight", {16, 16});
    add(p + "self_attn.k_proj.weight", {8, 16});
    add(p + "self_attn.v_proj.weight", {8, 16});
    add(p + "self_attn.o_proj.weight", {16, 16});
    add(p + "post_attention_layernorm.weight", {16});
    add(p + "mlp.gate_proj.weight", {24, 16});
    add(p + "mlp.up_proj.weight", {24, 16});
    add(p + "mlp.down_proj.weight", {16, 24});
  }
  add("model.norm.weight", {16});
  if (!tied) add("lm_head.weight", {32, 16});
  return s;
}

class HfCheckpointTest : public ::testing::Test {
 protected:
  std::string MakeDir(const std::string& name) {
    const std::string dir = ::testing::TempDir() + "/hf_" + name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    dirs_.push_back(dir);
    return dir;
  }
  static void Write(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  void TearDown() override {
    for (const auto& d : dirs_) std::filesystem::remove_all(d);
  }
  std::vector<std::string> dirs_;
};

void CheckWeights(const ModelWeights& w, bool tied) {
  // Tags in Specs() order: embd 0; layer l tensor i -> 1 + 9l + i; norm 19; lm_head 20.
  EXPECT_EQ(w.token_embedding[0], Value(0, 0));
  EXPECT_EQ(w.token_embedding[13], Value(0, 13));
  EXPECT_EQ(w.layers[0].wq[5], Value(2, 5));      // F16
  EXPECT_EQ(w.layers[0].wk[127], Value(3, 127));  // BF16
  EXPECT_EQ(w.layers[1].w_down[300], Value(18, 300));
  EXPECT_EQ(w.layers[1].ffn_norm[7], Value(15, 7));
  EXPECT_EQ(w.final_norm[3], Value(19, 3));
  if (tied) {
    EXPECT_TRUE(w.lm_head.empty());
  } else {
    ASSERT_EQ(w.lm_head.size(), 512u);
    EXPECT_EQ(w.lm_head[9], Value(20, 9));
  }
}

TEST(HfConfigTest, Llama3Config) {
  auto c = ParseHfConfigJson(Config(false));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 32);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position, 8192);
  EXPECT_EQ(c->max_position, 131072);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_id, 2);
  EXPECT_FALSE(c->tie_word_embeddings);
}

TEST(HfConfigTest, BadConfigs) {
  EXPECT_EQ(ParseHfConfigJson("{").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHfConfigJson("[]").status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = ParseHfConfigJson(R"({"vocab_size": 10})");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("hidden_size"), std::string::npos);
  std::string yarn = Config(true);
  yarn.replace(yarn.find("\"llama3\""), 8, "\"yarn\"");
  auto y = ParseHfConfigJson(yarn);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(y.status().message().find("yarn"), std::string::npos);
  std::string heads = Config(true);
  heads.replace(heads.find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 3");
  EXPECT_EQ(ParseHfConfigJson(heads).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(HfCheckpointTest, SingleFileTiedAndUntied) {
  for (bool tied : {true, false}) {
    const std::string dir = MakeDir(tied ? "tied" : "untied");
    Write(dir + "/config.json", Config(tied));
    Write(dir + "/model.safetensors", SafetensorsFile(Specs(tied)));
    auto m = LoadModel(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->config.tie_word_embeddings, tied);
    EXPECT_EQ(m->fingerprint.size(), 64u);
    ASSERT_NE(m->weights, nullptr);
    CheckWeights(*m->weights, tied);
  }
}

TEST_F(HfCheckpointTest, Sharded) {
  const std::string dir = MakeDir("sharded");
  Write(dir + "/config.json", Config(false));
  const std::vector<TensorSpec> all = Specs(false);
  std::vector<TensorSpec> a(all.begin(), all.begin() + 10), b(all.begin() + 10, all.end());
  Write(dir + "/model-00001-of-00002.safetensors", SafetensorsFile(a));
  Write(dir + "/model-00002-of-00002.safetensors", SafetensorsFile(b));
  std::string index = "{\"metadata\": {}, \"weight_map\": {";
  for (size_t i = 0; i < all.size(); ++i) {
    absl::StrAppend(&index, i ? "," : "", "\"", all[i].name, "\": \"model-0000", i < 10 ? 1 : 2,
                    "-of-00002.safetensors\"");
  }
  index += "}}";
  Write(dir + "/model.safetensors.index.json", index);
  auto m = LoadModel(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  CheckWeights(*m->weights, false);
}

TEST_F(HfCheckpointTest, FingerprintCoversWeights) {
  const std::string d1 = MakeDir("fp1"), d2 = MakeDir("fp2");
  Write(d1 + "/config.json", Config(true));
  Write(d2 + "/config.json", Config(true));
  std::string st = SafetensorsFile(Specs(true));
  Write(d1 + "/model.safetensors", st);
  st[st.size() - 1] ^= 1;
  Write(d2 + "/model.safetensors", st);
  auto a = LoadModel(d1), b = LoadModel(d2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->fingerprint, b->fingerprint);
}

TEST_F(HfCheckpointTest, Errors) {
  {
    const std::string dir = MakeDir("empty");
    EXPECT_EQ(LoadModel(dir).status().code(), absl::StatusCode::kNotFound);
    Write(dir + "/config.json", Config(true));
    auto m = LoadModel(dir);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
  }
  {
    const std::string dir = MakeDir("missing_tensor");
    Write(dir + "/config.json", Config(false));
    Write(dir + "/model.safetensors", SafetensorsFile(Specs(true)));  // no lm_head
    auto m = LoadModel(dir);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("'lm_head.weight' is missing"), std::string::npos)
        << m.status();
  }
  {
    const std::string dir = MakeDir("wrong_shape");
    Write(dir + "/config.json", Config(true));
    std::vector<TensorSpec> s = Specs(true);
    s[3].shape = {16, 8};  // layer 0 k_proj
    Write(dir + "/model.safetensors", SafetensorsFile(s));
    auto m = LoadModel(dir);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("model.layers.0.self_attn.k_proj.weight"),
              std::string::npos)
        << m.status();
  }
  {
    const std::string dir = MakeDir("bad_header");
    Write(dir + "/config.json", Config(true));
    std::string st = SafetensorsFile(Specs(true));
    const uint64_t huge = uint64_t(1) << 60;
    std::memcpy(&st[0], &huge, 8);
    Write(dir + "/model.safetensors", st);
    auto m = LoadModel(dir);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("header length"), std::string::npos) << m.status();
  }
  {
    const std::string dir = MakeDir("truncated");
    Write(dir + "/config.json", Config(true));
    std::string st = SafetensorsFile(Specs(true));
    for (size_t len : {size_t(0), size_t(7), size_t(20), st.size() / 2, st.size() - 1}) {
      Write(dir + "/model.safetensors", st.substr(0, len));
      auto m = LoadModel(dir);
      EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << len << m.status();
    }
  }
  {
    const std::string dir = MakeDir("big");
    Write(dir + "/config.json", Config(true));
    Write(dir + "/model.safetensors", SafetensorsFile(Specs(true)));
    LoadOptions o;
    o.max_host_bytes = 100;
    EXPECT_EQ(LoadModel(dir, o).status().code(), absl::StatusCode::kResourceExhausted);
  }
}

}  // namespace
}  // namespace lazyrag
