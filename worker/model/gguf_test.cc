#include "worker/model/gguf.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/dequant.h"
#include "worker/model/gguf_test_util.h"
#include "worker/model/model_source.h"

namespace lazyrag {
namespace {

using testing_gguf::ByteWriter;
using testing_gguf::F32Bytes;
using testing_gguf::GgufWriter;

std::string U16Bytes(const std::vector<uint16_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 2);
}

// Parses `bytes` and dequantises tensor `name`.
std::vector<float> Dequant(const std::string& bytes, const std::string& name) {
  auto f = GgufFile::FromBuffer(bytes);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return {};
  const GgufTensorInfo* t = (*f)->FindTensor(name);
  EXPECT_NE(t, nullptr);
  if (t == nullptr) return {};
  std::vector<float> out(t->num_elements, std::nanf(""));
  EXPECT_TRUE(DequantizeTensor(*t, out.data()).ok());
  return out;
}

TEST(Fp16Test, KnownValues) {
  EXPECT_EQ(Fp16ToFp32(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x3555), 0.333251953125f);
  EXPECT_EQ(Fp16ToFp32(0x7BFF), 65504.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(Fp16ToFp32(0x03FF), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFp32(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(Fp16ToFp32(0x8000)));
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7C00)));
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0x7E00)));
  EXPECT_EQ(Bf16ToFp32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToFp32(0xC0A0), -5.0f);
  EXPECT_EQ(Bf16ToFp32(0x4049), 3.140625f);
}

TEST(DequantTest, F32F16Bf16) {
  GgufWriter w;
  w.AddTensor("f32", {3}, GgmlType::kF32, F32Bytes({1.5f, -2.25f, 3e-8f}));
  w.AddTensor("f16", {4}, GgmlType::kF16, U16Bytes({0x3C00, 0xC000, 0x3555, 0x0001}));
  w.AddTensor("bf16", {2, 2}, GgmlType::kBF16, U16Bytes({0x3F80, 0xC0A0, 0x4049, 0x0000}));
  const std::string bytes = w.Build();
  EXPECT_EQ(Dequant(bytes, "f32"), (std::vector<float>{1.5f, -2.25f, 3e-8f}));
  EXPECT_EQ(Dequant(bytes, "f16"),
            (std::vector<float>{1.0f, -2.0f, 0.333251953125f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(Dequant(bytes, "bf16"), (std::vector<float>{1.0f, -5.0f, 3.140625f, 0.0f}));
}

TEST(DequantTest, Q8_0) {
  // Two blocks: d = 0.5 with q = i - 16; d = -3 with q = 127, -128, 0, ...
  std::string data;
  ByteWriter b;
  b.Put<uint16_t>(0x3800);  // 0.5
  for (int i = 0; i < 32; ++i) b.Put<int8_t>(int8_t(i - 16));
  b.Put<uint16_t>(0xC200);  // -3
  for (int i = 0; i < 32; ++i) b.Put<int8_t>(i == 0 ? 127 : i == 1 ? -128 : 0);
  GgufWriter w;
  w.AddTensor("q", {64}, GgmlType::kQ8_0, b.str());
  const std::vector<float> out = Dequant(w.Build(), "q");
  ASSERT_EQ(out.size(), 64u);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], (i - 16) * 0.5f) << i;
  EXPECT_EQ(out[32], -381.0f);
  EXPECT_EQ(out[33], 384.0f);
  for (int i = 34; i < 64; ++i) EXPECT_EQ(out[i], 0.0f);
}

TEST(DequantTest, Q4_0) {
  // d = 2; byte i holds i in the low nibble and 15 - i in the high nibble.
  ByteWriter b;
  b.Put<uint16_t>(0x4000);
  for (int i = 0; i < 16; ++i) b.Put<uint8_t>(uint8_t(i | ((15 - i) << 4)));
  GgufWriter w;
  w.AddTensor("q", {32}, GgmlType::kQ4_0, b.str());
  const std::vector<float> out = Dequant(w.Build(), "q");
  ASSERT_EQ(out.size(), 32u);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(out[i], (i - 8) * 2.0f) << i;              // low nibble of byte i
    EXPECT_EQ(out[i + 16], ((15 - i) - 8) * 2.0f) << i;  // high nibble of byte i
  }
}

TEST(DequantTest, Q4_1) {
  // Two rows of one block each: d = 0.25, m = -1; d = 1, m = 0.5.
  ByteWriter b;
  b.Put<uint16_t>(0x3400);  // 0.25
  b.Put<uint16_t>(0xBC00);  // -1
  for (int i = 0; i < 16; ++i) b.Put<uint8_t>(uint8_t(i | ((15 - i) << 4)));
  b.Put<uint16_t>(0x3C00);  // 1
  b.Put<uint16_t>(0x3800);  // 0.5
  for (int i = 0; i < 16; ++i) b.Put<uint8_t>(uint8_t(0xF3));
  GgufWriter w;
  w.AddTensor("q", {32, 2}, GgmlType::kQ4_1, b.str());
  const std::vector<float> out = Dequant(w.Build(), "q");
  ASSERT_EQ(out.size(), 64u);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(out[i], i * 0.25f - 1.0f) << i;
    EXPECT_EQ(out[i + 16], (15 - i) * 0.25f - 1.0f) << i;
    EXPECT_EQ(out[32 + i], 3.5f);
    EXPECT_EQ(out[48 + i], 15.5f);
  }
}

TEST(DequantTest, UnsupportedTypeIsInvalidArgument) {
  std::vector<float> out(256);
  std::string block(210, '\0');
  auto st = DequantizeRow(GgmlType::kQ6_K, reinterpret_cast<const uint8_t*>(block.data()), 256,
                          out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("Q6_K"), std::string::npos);
}

TEST(GgufTest, MetadataOfEveryType) {
  GgufWriter w(2);  // version 2 has the same layout
  w.AddU32("u32", 4000000000u);
  w.AddI32("i32", -7);
  w.AddU64("u64", uint64_t(1) << 63);
  w.AddF32("f32", 0.5f);
  w.AddBool("b", true);
  w.AddString("s", "h\xC3\xA9llo");
  w.AddStringArray("sa", {"a", "", "ccc"});
  w.AddI32Array("ia", {1, -2, 3});
  {
    ByteWriter v;
    v.Put<uint8_t>(200);
    w.AddRaw("u8", uint32_t(GgufValueType::kUint8), v.str());
  }
  {
    ByteWriter v;
    v.Put<int8_t>(-100);
    w.AddRaw("i8", uint32_t(GgufValueType::kInt8), v.str());
  }
  {
    ByteWriter v;
    v.Put<uint16_t>(65535);
    w.AddRaw("u16", uint32_t(GgufValueType::kUint16), v.str());
  }
  {
    ByteWriter v;
    v.Put<int16_t>(-32768);
    w.AddRaw("i16", uint32_t(GgufValueType::kInt16), v.str());
  }
  {
    ByteWriter v;
    v.Put<int64_t>(-(int64_t(1) << 40));
    w.AddRaw("i64", uint32_t(GgufValueType::kInt64), v.str());
  }
  {
    ByteWriter v;
    v.Put<double>(2.5e100);
    w.AddRaw("f64", uint32_t(GgufValueType::kFloat64), v.str());
  }
  {  // float64 array
    ByteWriter v;
    v.Put<uint32_t>(uint32_t(GgufValueType::kFloat64));
    v.Put<uint64_t>(2);
    v.Put<double>(1.25);
    v.Put<double>(-0.5);
    w.AddRaw("fa", uint32_t(GgufValueType::kArray), v.str());
  }
  {  // array of two arrays of u16
    ByteWriter v;
    v.Put<uint32_t>(uint32_t(GgufValueType::kArray));
    v.Put<uint64_t>(2);
    for (int k = 0; k < 2; ++k) {
      v.Put<uint32_t>(uint32_t(GgufValueType::kUint16));
      v.Put<uint64_t>(k + 1);
      for (int j = 0; j <= k; ++j) v.Put<uint16_t>(uint16_t(10 * k + j));
    }
    w.AddRaw("nested", uint32_t(GgufValueType::kArray), v.str());
  }
  auto f = GgufFile::FromBuffer(w.Build());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 2u);
  EXPECT_EQ(g.metadata().size(), 16u);
  EXPECT_EQ(*g.GetInt("u32"), 4000000000);
  EXPECT_EQ(*g.GetInt("i32"), -7);
  EXPECT_EQ(g.GetInt("u64").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.Find("u64")->uint_value, uint64_t(1) << 63);
  EXPECT_EQ(*g.GetFloat("f32"), 0.5);
  EXPECT_EQ(*g.GetBool("b"), true);
  EXPECT_EQ(*g.GetString("s"), "h\xC3\xA9llo");
  EXPECT_EQ(g.GetString("i32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetString("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(g.Find("sa")->strings, (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(g.Find("ia")->ints, (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*g.GetInt("u8"), 200);
  EXPECT_EQ(*g.GetInt("i8"), -100);
  EXPECT_EQ(*g.GetInt("u16"), 65535);
  EXPECT_EQ(*g.GetInt("i16"), -32768);
  EXPECT_EQ(*g.GetInt("i64"), -(int64_t(1) << 40));
  EXPECT_EQ(*g.GetFloat("f64"), 2.5e100);
  EXPECT_EQ(g.Find("fa")->floats, (std::vector<double>{1.25, -0.5}));
  const GgufValue* nested = g.Find("nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->arrays.size(), 2u);
  EXPECT_EQ(nested->arrays[1].ints, (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(nested->array_size(), 2u);
}

TEST(GgufTest, CustomAlignment) {
  GgufWriter w;
  w.AddU32("general.alignment", 64);
  w.set_alignment(64);
  w.AddTensor("a", {3}, GgmlType::kF32, F32Bytes({1, 2, 3}));
  w.AddTensor("b", {2}, GgmlType::kF32, F32Bytes({4, 5}));
  const std::string bytes = w.Build();
  auto f = GgufFile::FromBuffer(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  EXPECT_EQ((*f)->FindTensor("b")->offset, 64u);
  EXPECT_EQ(Dequant(bytes, "b"), (std::vector<float>{4, 5}));
}

TEST(GgufTest, OpenFromDisk) {
  const std::string path = ::testing::TempDir() + "/gguf_test_open.gguf";
  {
    GgufWriter w;
    w.AddString("general.name", "x");
    w.AddTensor("t", {4}, GgmlType::kF32, F32Bytes({1, 2, 3, 4}));
    std::ofstream(path, std::ios::binary) << w.Build();
  }
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->GetString("general.name"), "x");
  EXPECT_EQ(GgufFile::Open(path + ".missing").status().code(), absl::StatusCode::kNotFound);
  std::remove(path.c_str());
}

// ---------------------------------------------------------------------------------------------
// Loading a llama model from a GGUF file.

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// The served model's default name (issue 27): general.name when the GGUF has one.
TEST(GgufModelTest, NameIsGeneralName) {
  testing_gguf::TinyLlamaOptions o;
  o.name = "Tiny Llama 2L";
  const std::string path = WriteTemp(
      "tiny_llama_named.Q8_0.gguf", testing_gguf::TinyLlamaGguf(testing_gguf::TinyGgufConfig(), o));
  auto m = LoadModel(path);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "Tiny Llama 2L");
  EXPECT_EQ(LoadModel("synthetic:tiny@3")->name, "synthetic:tiny@3");
}

TEST(GgufModelTest, LoadsTinyLlamaAndUnpermutesQK) {
  const ModelConfig c = testing_gguf::TinyGgufConfig();
  const std::string path = WriteTemp("tiny_llama.gguf", testing_gguf::TinyLlamaGguf(c));
  auto m = LoadModel(path);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.num_layers, 2);
  EXPECT_EQ(m->config.head_dim, 8);
  EXPECT_EQ(m->config.vocab_size, 40);
  EXPECT_TRUE(m->config.tie_word_embeddings);
  EXPECT_EQ(m->tokenizer.model, "gpt2");
  EXPECT_EQ(m->tokenizer.merges.size(), 2u);
  EXPECT_EQ(m->tokenizer.chat_template, "{{ messages }}");
  EXPECT_FALSE(m->synthetic);
  EXPECT_EQ(m->fingerprint.size(), 64u);
  EXPECT_EQ(m->name, "tiny_llama");  // no general.name: the file name without extension
  const LayerWeights& L = m->weights->layers[1];
  // Tensor tags in file order: embd 0, then per layer 9 tensors; layer 1 attn_q is tag 11.
  const int64_t in = c.hidden_size, hd = c.head_dim, half = hd / 2;
  auto gguf_row_of = [&](const std::vector<float>& w, int64_t hf_row, int tag) {
    // Element 0 of GGUF row r has value tag + (r * in % 1000) * 1e-3.
    const float v = w[hf_row * in];
    return int64_t(std::lround((v - tag) * 1000.0f)) / in;
  };
  for (int64_t head = 0; head < c.num_heads; ++head) {
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < half; ++j) {
        const int64_t hf_row = head * hd + i * half + j;
        EXPECT_EQ(gguf_row_of(L.wq, hf_row, 11), head * hd + 2 * j + i) << hf_row;
      }
    }
  }
  for (int64_t head = 0; head < c.num_kv_heads; ++head) {
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < half; ++j) {
        const int64_t hf_row = head * hd + i * half + j;
        EXPECT_EQ(gguf_row_of(L.wk, hf_row, 12), head * hd + 2 * j + i) << hf_row;
      }
    }
  }
  // V is not permuted.
  for (int64_t r = 0; r < c.kv_dim(); ++r) EXPECT_EQ(gguf_row_of(L.wv, r, 13), r);
  std::remove(path.c_str());
}

TEST(GgufModelTest, UntiedHasLmHead) {
  const ModelConfig c = testing_gguf::TinyGgufConfig();
  const std::string path =
      WriteTemp("tiny_llama_untied.gguf", testing_gguf::TinyLlamaGguf(c, false));
  auto m = LoadModel(path);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->config.tie_word_embeddings);
  EXPECT_EQ(m->weights->lm_head.size(), size_t(c.vocab_size * c.hidden_size));
  auto t = LoadTokenizerSpec(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tokens.size(), 40u);
  std::remove(path.c_str());
}

TEST(GgufModelTest, MaxHostBytes) {
  const std::string path =
      WriteTemp("tiny_llama_big.gguf", testing_gguf::TinyLlamaGguf(testing_gguf::TinyGgufConfig()));
  LoadOptions o;
  o.max_host_bytes = 1000;
  EXPECT_EQ(LoadModel(path, o).status().code(), absl::StatusCode::kResourceExhausted);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace lazyrag
