// Malformed and hostile GGUF files: each must give a clear INVALID_ARGUMENT, never a crash or
// an absurd allocation.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "worker/model/gguf.h"
#include "worker/model/gguf_model.h"
#include "worker/model/gguf_test_util.h"
#include "worker/model/model_source.h"

namespace lazyrag {
namespace {

using testing_gguf::ByteWriter;
using testing_gguf::F32Bytes;
using testing_gguf::GgufWriter;

constexpr uint64_t kHuge = uint64_t(1) << 60;

// Expects FromBuffer to fail with INVALID_ARGUMENT mentioning `needle`.
void ExpectMalformed(const std::string& bytes, const std::string& needle) {
  auto f = GgufFile::FromBuffer(bytes);
  ASSERT_FALSE(f.ok()) << "parsed a bad file; wanted an error about: " << needle;
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_NE(f.status().message().find(needle), std::string::npos)
      << "message: " << f.status().message() << "\nwanted: " << needle;
}

// Header with the given counts, followed by `rest`.
std::string Header(uint32_t version, uint64_t n_tensors, uint64_t n_kv, const std::string& rest,
                   uint32_t magic = 0x46554747) {
  ByteWriter w;
  w.Put<uint32_t>(magic);
  w.Put<uint32_t>(version);
  w.Put<uint64_t>(n_tensors);
  w.Put<uint64_t>(n_kv);
  return w.str() + rest + std::string(64, '\0');
}

// One tensor info entry.
std::string TensorInfo(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                       uint64_t offset) {
  ByteWriter w;
  w.PutString(name);
  w.Put<uint32_t>(dims.size());
  for (uint64_t d : dims) w.Put<uint64_t>(d);
  w.Put<uint32_t>(type);
  w.Put<uint64_t>(offset);
  return w.str();
}

TEST(GgufBadFileTest, EmptyAndTinyFiles) {
  ExpectMalformed("", "file ends inside the magic");
  ExpectMalformed("GG", "file ends inside the magic");
  ExpectMalformed("GGUF", "file ends inside the version");
}

TEST(GgufBadFileTest, BadMagicAndVersion) {
  ExpectMalformed(Header(3, 0, 0, "", 0x58554747), "bad magic");
  ExpectMalformed(Header(1, 0, 0, ""), "unsupported version 1");
  ExpectMalformed(Header(4, 0, 0, ""), "unsupported version 4");
  ExpectMalformed(Header(0x03000000, 0, 0, ""), "big-endian");
  EXPECT_TRUE(GgufFile::FromBuffer(Header(3, 0, 0, "")).ok());
  EXPECT_TRUE(GgufFile::FromBuffer(Header(2, 0, 0, "")).ok());
}

TEST(GgufBadFileTest, AbsurdCounts) {
  ExpectMalformed(Header(3, kHuge, 0, ""), "tensor count");
  ExpectMalformed(Header(3, 0, kHuge, ""), "metadata count");
  ExpectMalformed(Header(3, ~uint64_t(0), ~uint64_t(0), ""), "count");
}

TEST(GgufBadFileTest, AbsurdStringLengths) {
  {  // key length 2^60
    ByteWriter w;
    w.Put<uint64_t>(kHuge);
    ExpectMalformed(Header(3, 0, 1, w.str()), "string length 1152921504606846976");
  }
  {  // string value length 2^60
    ByteWriter w;
    w.PutString("k");
    w.Put<uint32_t>(uint32_t(GgufValueType::kString));
    w.Put<uint64_t>(kHuge);
    ExpectMalformed(Header(3, 0, 1, w.str()), "metadata 'k'");
  }
  {  // tensor name length 2^60
    ByteWriter w;
    w.Put<uint64_t>(kHuge);
    ExpectMalformed(Header(3, 1, 0, w.str()), "tensor name #0");
  }
}

TEST(GgufBadFileTest, AbsurdArrays) {
  {
    ByteWriter w;
    w.PutString("a");
    w.Put<uint32_t>(uint32_t(GgufValueType::kArray));
    w.Put<uint32_t>(uint32_t(GgufValueType::kUint8));
    w.Put<uint64_t>(kHuge);
    ExpectMalformed(Header(3, 0, 1, w.str()), "array of 1152921504606846976 elements");
  }
  {  // arrays nested too deep
    ByteWriter w;
    w.PutString("a");
    w.Put<uint32_t>(uint32_t(GgufValueType::kArray));
    for (int i = 0; i < 8; ++i) {
      w.Put<uint32_t>(uint32_t(GgufValueType::kArray));
      w.Put<uint64_t>(1);
    }
    ExpectMalformed(Header(3, 0, 1, w.str()), "nested deeper");
  }
  {  // array of unknown element type
    ByteWriter w;
    w.PutString("a");
    w.Put<uint32_t>(uint32_t(GgufValueType::kArray));
    w.Put<uint32_t>(99);
    w.Put<uint64_t>(1);
    ExpectMalformed(Header(3, 0, 1, w.str()), "unknown value type 99");
  }
}

TEST(GgufBadFileTest, BadMetadataValues) {
  {
    ByteWriter w;
    w.PutString("k");
    w.Put<uint32_t>(13);
    ExpectMalformed(Header(3, 0, 1, w.str()), "unknown value type 13");
  }
  {
    ByteWriter w;
    w.PutString("k");
    w.Put<uint32_t>(uint32_t(GgufValueType::kBool));
    w.Put<uint8_t>(2);
    ExpectMalformed(Header(3, 0, 1, w.str()), "bool value 2");
  }
  {
    GgufWriter w;
    w.AddU32("k", 1);
    w.AddU32("k", 2);
    ExpectMalformed(w.Build(), "duplicate metadata key 'k'");
  }
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufWriter w;
    w.AddU32("general.alignment", a);
    ExpectMalformed(w.Build(), "general.alignment");
  }
  {
    GgufWriter w;
    w.AddString("general.alignment", "32");
    ExpectMalformed(w.Build(), "general.alignment");
  }
}

TEST(GgufBadFileTest, BadTensorInfos) {
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {1, 1, 1, 1, 1}, 0, 0)), "5 dimensions");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {}, 0, 0)), "0 dimensions");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {4, 0}, 0, 0)), "dimension 1 = 0");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {kHuge, kHuge}, 0, 0)),
                  "element count overflows");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {~uint64_t(0)}, 0, 0)), "out of range");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {uint64_t(1) << 62}, 0, 0)),
                  "byte size overflows");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {kHuge}, 0, 0)), "runs past the end");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {4}, 99, 0)), "unknown tensor type 99");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {4}, 4, 0)), "unknown tensor type 4");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {33}, uint32_t(GgmlType::kQ4_0), 0)),
                  "not a multiple of the block size 32");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {4}, 0, 7)), "not a multiple of the 32");
  ExpectMalformed(Header(3, 1, 0, TensorInfo("t", {4}, 0, kHuge)), "runs past the end");
  ExpectMalformed(Header(3, 2, 0, TensorInfo("t", {4}, 0, 0) + TensorInfo("t", {4}, 0, 32)),
                  "duplicate tensor name 't'");
}

TEST(GgufBadFileTest, TensorDataPastEof) {
  GgufWriter w;
  w.AddTensor("a", {8}, GgmlType::kF32, F32Bytes(std::vector<float>(8, 1.0f)));
  std::string bytes = w.Build();
  bytes.resize(bytes.size() - 1);
  ExpectMalformed(bytes, "tensor 'a' data");
}

TEST(GgufBadFileTest, TruncatedAtManyOffsets) {
  const std::string good = testing_gguf::TinyLlamaGguf(testing_gguf::TinyGgufConfig());
  auto full = GgufFile::FromBuffer(good);
  ASSERT_TRUE(full.ok()) << full.status();
  const size_t header = (*full)->data_offset();
  int checked = 0;
  for (size_t len = 0; len < good.size(); len += (len < header + 64 ? 1 : 97)) {
    auto f = GgufFile::FromBuffer(absl::string_view(good).substr(0, len));
    ASSERT_FALSE(f.ok()) << "truncated at " << len << " of " << good.size();
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    ++checked;
  }
  EXPECT_GT(checked, 1000);
}

// Model-level checks: a well-formed GGUF whose tensors do not match its config.

std::string Write(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

void ExpectModelError(const std::string& bytes, absl::StatusCode code, const std::string& needle) {
  auto f = GgufFile::FromBuffer(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  auto m = LoadModelFromGguf(**f, LoadOptions{});
  ASSERT_FALSE(m.ok()) << "wanted: " << needle;
  EXPECT_EQ(m.status().code(), code) << m.status();
  EXPECT_NE(m.status().message().find(needle), std::string::npos)
      << "message: " << m.status().message() << "\nwanted: " << needle;
}

TEST(GgufBadModelTest, WrongShapesNameTheTensor) {
  const ModelConfig c = testing_gguf::TinyGgufConfig();
  ModelConfig meta = c;
  meta.intermediate_size = 96;
  testing_gguf::TinyLlamaOptions o;
  o.metadata = &meta;
  ExpectModelError(testing_gguf::TinyLlamaGguf(c, o), absl::StatusCode::kInvalidArgument,
                   "'blk.0.ffn_gate.weight' has shape [32, 64]");
  meta = c;
  meta.num_kv_heads = 4;
  ExpectModelError(testing_gguf::TinyLlamaGguf(c, o), absl::StatusCode::kInvalidArgument,
                   "'blk.0.attn_k.weight'");
}

TEST(GgufBadModelTest, MissingTensorAndBadType) {
  const ModelConfig c = testing_gguf::TinyGgufConfig();
  testing_gguf::TinyLlamaOptions o;
  o.skip_tensor = "blk.1.ffn_up.weight";
  ExpectModelError(testing_gguf::TinyLlamaGguf(c, o), absl::StatusCode::kInvalidArgument,
                   "'blk.1.ffn_up.weight' is missing");
  o = {};
  o.bad_type_tensor = "blk.0.attn_v.weight";
  ExpectModelError(testing_gguf::TinyLlamaGguf(c, o), absl::StatusCode::kInvalidArgument,
                   "'blk.0.attn_v.weight' has type Q5_0");
}

TEST(GgufBadModelTest, BadConfigValues) {
  ModelConfig c = testing_gguf::TinyGgufConfig();
  ModelConfig meta = c;
  meta.num_heads = 3;  // 32 % 3 != 0
  testing_gguf::TinyLlamaOptions o;
  o.metadata = &meta;
  ExpectModelError(testing_gguf::TinyLlamaGguf(c, o), absl::StatusCode::kInvalidArgument,
                   "head_count");
  meta = c;
  meta.num_layers = 0;
  ExpectModelError(testing_gguf::TinyLlamaGguf(c, o), absl::StatusCode::kInvalidArgument,
                   "llama.block_count");
  meta = c;
  meta.head_dim = 4;  // rope.dimension_count != head_dim
  ExpectModelError(testing_gguf::TinyLlamaGguf(c, o), absl::StatusCode::kInvalidArgument,
                   "rope.dimension_count");
}

TEST(GgufBadModelTest, Q8TensorLoads) {
  const ModelConfig c = testing_gguf::TinyGgufConfig();
  testing_gguf::TinyLlamaOptions o;
  o.q8_tensor = "blk.0.ffn_down.weight";  // [hidden, intermediate], rows of 64
  auto f = GgufFile::FromBuffer(testing_gguf::TinyLlamaGguf(c, o));
  ASSERT_TRUE(f.ok()) << f.status();
  auto m = LoadModelFromGguf(**f, LoadOptions{});
  ASSERT_TRUE(m.ok()) << m.status();
  const auto& wd = m->weights->layers[0].w_down;
  EXPECT_EQ(wd[0], -50.0f);
  EXPECT_EQ(wd[33], -48.0f);  // block 1, element 1: (1 + 1) % 100 - 50
}

TEST(GgufBadModelTest, ArchitectureAndTokenizerRequired) {
  {
    GgufWriter w;
    w.AddString("general.architecture", "gpt2");
    auto f = GgufFile::FromBuffer(w.Build());
    ASSERT_TRUE(f.ok());
    auto m = LoadModelFromGguf(**f, LoadOptions{});
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
    w.AddI32Array("tokenizer.ggml.token_type", {1});
    auto f = GgufFile::FromBuffer(w.Build());
    ASSERT_TRUE(f.ok());
    auto t = TokenizerSpecFromGguf(**f);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("token_type"), std::string::npos);
  }
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
    w.AddU32("tokenizer.ggml.eos_token_id", 2);
    auto f = GgufFile::FromBuffer(w.Build());
    ASSERT_TRUE(f.ok());
    auto t = TokenizerSpecFromGguf(**f);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("eos_token_id"), std::string::npos);
  }
}

TEST(GgufBadModelTest, TruncatedFileOnDisk) {
  const std::string good = testing_gguf::TinyLlamaGguf(testing_gguf::TinyGgufConfig());
  for (size_t len : {size_t(0), size_t(3), size_t(100), good.size() / 2, good.size() - 4}) {
    const std::string path = Write("trunc.gguf", good.substr(0, len));
    auto m = LoadModel(path);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << len << " " << m.status();
    EXPECT_NE(m.status().message().find(path), std::string::npos);
    auto t = LoadTokenizerSpec(path);
    EXPECT_FALSE(t.ok());
    std::remove(path.c_str());
  }
}

}  // namespace
}  // namespace lazyrag
