// Test-only: a tiny GGUF writer, so tests build their own files (valid ones and broken ones).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "worker/model/config.h"
#include "worker/model/gguf.h"

namespace lazyrag {
namespace testing_gguf {

// Appends raw little-endian values.
class ByteWriter {
 public:
  template <typename T>
  void Put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    out_ += s;
  }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

// Builds a GGUF file in memory. Metadata values are written exactly as given.
class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  void AddU32(const std::string& key, uint32_t v) { Key(key, GgufValueType::kUint32).Put(v); }
  void AddI32(const std::string& key, int32_t v) { Key(key, GgufValueType::kInt32).Put(v); }
  void AddU64(const std::string& key, uint64_t v) { Key(key, GgufValueType::kUint64).Put(v); }
  void AddF32(const std::string& key, float v) { Key(key, GgufValueType::kFloat32).Put(v); }
  void AddBool(const std::string& key, bool v) {
    Key(key, GgufValueType::kBool).Put<uint8_t>(v ? 1 : 0);
  }
  void AddString(const std::string& key, const std::string& v) {
    Key(key, GgufValueType::kString).PutString(v);
  }
  void AddStringArray(const std::string& key, const std::vector<std::string>& v) {
    ByteWriter& w = Key(key, GgufValueType::kArray);
    w.Put<uint32_t>(uint32_t(GgufValueType::kString));
    w.Put<uint64_t>(v.size());
    for (const auto& s : v) w.PutString(s);
  }
  void AddI32Array(const std::string& key, const std::vector<int32_t>& v) {
    ByteWriter& w = Key(key, GgufValueType::kArray);
    w.Put<uint32_t>(uint32_t(GgufValueType::kInt32));
    w.Put<uint64_t>(v.size());
    for (int32_t x : v) w.Put(x);
  }
  // Raw metadata entry: key, type and the value's bytes as given.
  void AddRaw(const std::string& key, uint32_t type, const std::string& value_bytes) {
    ++n_kv_;
    kv_.PutString(key);
    kv_.Put<uint32_t>(type);
    kv_.str() += value_bytes;
  }

  // `dims` fastest-first (ne). `data` is the tensor's bytes, placed at the next aligned offset.
  void AddTensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type,
                 const std::string& data) {
    Tensor t{name, std::move(dims), uint32_t(type), data};
    tensors_.push_back(std::move(t));
  }
  void set_alignment(uint64_t a) { alignment_ = a; }  // does not add general.alignment

  std::string Build() const {
    ByteWriter w;
    w.Put<uint32_t>(0x46554747);
    w.Put<uint32_t>(version_);
    w.Put<uint64_t>(tensors_.size());
    w.Put<uint64_t>(n_kv_);
    w.str() += const_cast<ByteWriter&>(kv_).str();
    std::string data;
    for (const Tensor& t : tensors_) {
      while (data.size() % alignment_ != 0) data.push_back('\0');
      w.PutString(t.name);
      w.Put<uint32_t>(t.dims.size());
      for (uint64_t d : t.dims) w.Put<uint64_t>(d);
      w.Put<uint32_t>(t.type);
      w.Put<uint64_t>(data.size());
      data += t.data;
    }
    while (w.str().size() % alignment_ != 0) w.str().push_back('\0');
    return w.str() + data;
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::string data;
  };
  ByteWriter& Key(const std::string& key, GgufValueType type) {
    ++n_kv_;
    kv_.PutString(key);
    kv_.Put<uint32_t>(uint32_t(type));
    return kv_;
  }

  uint32_t version_;
  uint64_t alignment_ = 32;
  uint64_t n_kv_ = 0;
  ByteWriter kv_;
  std::vector<Tensor> tensors_;
};

inline std::string F32Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A complete tiny llama GGUF (F32 weights). Element e of every tensor has the value
// `tag * 1000 + e` scaled by 1e-3, so tests can tell tensors and rows apart; tag is the tensor's
// position in the file. With `tied` false an output.weight tensor is written.
struct TinyLlamaOptions {
  bool tied = true;
  const ModelConfig* metadata = nullptr;  // config written to the metadata (default: same)
  std::string skip_tensor;                // leave this tensor out
  std::string q8_tensor;                  // write this tensor as Q8_0 (row length % 32 == 0)
  std::string bad_type_tensor;            // write this tensor as Q5_0 (valid GGUF, unsupported)
  std::string name;                       // general.name, when not empty
};

inline std::string TinyLlamaGguf(const ModelConfig& c, const TinyLlamaOptions& o) {
  const ModelConfig& mc = o.metadata ? *o.metadata : c;
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  if (!o.name.empty()) w.AddString("general.name", o.name);
  w.AddU32("llama.block_count", mc.num_layers);
  w.AddU32("llama.embedding_length", mc.hidden_size);
  w.AddU32("llama.feed_forward_length", mc.intermediate_size);
  w.AddU32("llama.attention.head_count", mc.num_heads);
  w.AddU32("llama.attention.head_count_kv", mc.num_kv_heads);
  w.AddF32("llama.rope.freq_base", mc.rope_theta);
  w.AddF32("llama.attention.layer_norm_rms_epsilon", mc.rms_norm_eps);
  w.AddU32("llama.context_length", mc.max_position);
  w.AddU32("llama.rope.dimension_count", mc.head_dim);
  const bool tied = o.tied;
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "test");
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int i = 0; i < c.vocab_size; ++i) {
    tokens.push_back("t" + std::to_string(i));
    types.push_back(i < 2 ? 3 : 1);
  }
  w.AddStringArray("tokenizer.ggml.tokens", tokens);
  w.AddI32Array("tokenizer.ggml.token_type", types);
  w.AddStringArray("tokenizer.ggml.merges", {"t 2", "t2 t3"});
  w.AddU32("tokenizer.ggml.bos_token_id", 0);
  w.AddU32("tokenizer.ggml.eos_token_id", 1);
  w.AddString("tokenizer.chat_template", "{{ messages }}");
  int tag = 0;
  auto tensor = [&](const std::string& name, std::vector<uint64_t> dims) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    std::vector<float> v(n);
    for (uint64_t e = 0; e < n; ++e) v[e] = float(tag * 1000 + int64_t(e % 1000)) * 1e-3f;
    ++tag;
    if (name == o.skip_tensor) return;
    if (name == o.q8_tensor) {
      std::string q;
      for (uint64_t b = 0; b < n / 32; ++b) {
        const uint16_t d = 0x3C00;  // 1.0
        q.append(reinterpret_cast<const char*>(&d), 2);
        for (int i = 0; i < 32; ++i) q.push_back(char(int8_t((b + i) % 100 - 50)));
      }
      w.AddTensor(name, std::move(dims), GgmlType::kQ8_0, q);
      return;
    }
    if (name == o.bad_type_tensor) {
      w.AddTensor(name, std::move(dims), GgmlType::kQ5_0, std::string(n / 32 * 22, '\0'));
      return;
    }
    w.AddTensor(name, std::move(dims), GgmlType::kF32, F32Bytes(v));
  };
  const uint64_t d = c.hidden_size, v = c.vocab_size, ff = c.intermediate_size;
  tensor("token_embd.weight", {d, v});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    tensor(p + "attn_norm.weight", {d});
    tensor(p + "attn_q.weight", {d, uint64_t(c.q_dim())});
    tensor(p + "attn_k.weight", {d, uint64_t(c.kv_dim())});
    tensor(p + "attn_v.weight", {d, uint64_t(c.kv_dim())});
    tensor(p + "attn_output.weight", {uint64_t(c.q_dim()), d});
    tensor(p + "ffn_norm.weight", {d});
    tensor(p + "ffn_gate.weight", {d, ff});
    tensor(p + "ffn_up.weight", {d, ff});
    tensor(p + "ffn_down.weight", {ff, d});
  }
  tensor("output_norm.weight", {d});
  if (!tied) tensor("output.weight", {d, v});
  return w.Build();
}

inline std::string TinyLlamaGguf(const ModelConfig& c, bool tied = true) {
  TinyLlamaOptions o;
  o.tied = tied;
  return TinyLlamaGguf(c, o);
}

// A small valid config for the tiny GGUF files.
inline ModelConfig TinyGgufConfig() {
  ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position = 128;
  return c;
}

}  // namespace testing_gguf
}  // namespace lazyrag
