#include "worker/model/model_source.h"

#include <sys/stat.h>

#include <cmath>
#include <functional>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/parallel.h"
#include "common/sha256.h"
#include "common/status.h"
#include "worker/model/dequant.h"
#include "worker/model/gguf.h"
#include "worker/model/gguf_model.h"
#include "worker/model/safetensors.h"
#include "worker/model/synthetic_init.h"

namespace lazyrag {
namespace {

constexpr absl::string_view kSyntheticPrefix = "synthetic:";

// ---------------------------------------------------------------------------------------------
// Tokenizer metadata.

absl::StatusOr<int32_t> OptionalTokenId(const GgufFile& f, absl::string_view key,
                                        size_t num_tokens) {
  if (f.Find(key) == nullptr) return -1;
  ASSIGN_OR_RETURN(int64_t id, f.GetInt(key));
  if (id < 0 || uint64_t(id) >= num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF metadata '", key, "' = ", id,
                                                   " is not a token id (", num_tokens, " tokens)"));
  }
  return static_cast<int32_t>(id);
}

absl::StatusOr<TokenizerSpec> TokenizerSpecFromGgufImpl(const GgufFile& f) {
  TokenizerSpec spec;
  auto model = f.GetString("tokenizer.ggml.model");
  if (!model.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF file has no usable tokenizer: ", model.status().message()));
  }
  spec.model = *std::move(model);
  if (f.Find("tokenizer.ggml.pre") != nullptr) {
    ASSIGN_OR_RETURN(spec.pre, f.GetString("tokenizer.ggml.pre"));
  }
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->type != GgufValueType::kArray ||
      tokens->array_type != GgufValueType::kString || tokens->strings.empty()) {
    return absl::InvalidArgumentError(
        "GGUF metadata 'tokenizer.ggml.tokens' must be a non-empty array of strings");
  }
  spec.tokens = tokens->strings;
  const size_t n = spec.tokens.size();
  if (const GgufValue* types = f.Find("tokenizer.ggml.token_type")) {
    if (types->type != GgufValueType::kArray || !types->floats.empty() || !types->strings.empty() ||
        !types->arrays.empty() || types->ints.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF metadata 'tokenizer.ggml.token_type' must be an integer array of ", n,
                       " elements (one per token), found ", types->array_size()));
    }
    spec.token_types.reserve(n);
    for (int64_t t : types->ints) {
      if (t < 0 || t > 6) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF metadata 'tokenizer.ggml.token_type' has invalid type ", t));
      }
      spec.token_types.push_back(static_cast<int32_t>(t));
    }
  } else {
    spec.token_types.assign(n, 1);
  }
  if (const GgufValue* merges = f.Find("tokenizer.ggml.merges")) {
    if (merges->type != GgufValueType::kArray ||
        (merges->array_size() > 0 && merges->strings.size() != merges->array_size())) {
      return absl::InvalidArgumentError(
          "GGUF metadata 'tokenizer.ggml.merges' must be an array of strings");
    }
    spec.merges = merges->strings;
  }
  ASSIGN_OR_RETURN(spec.bos_id, OptionalTokenId(f, "tokenizer.ggml.bos_token_id", n));
  ASSIGN_OR_RETURN(spec.eos_id, OptionalTokenId(f, "tokenizer.ggml.eos_token_id", n));
  ASSIGN_OR_RETURN(spec.unk_id, OptionalTokenId(f, "tokenizer.ggml.unknown_token_id", n));
  ASSIGN_OR_RETURN(spec.pad_id, OptionalTokenId(f, "tokenizer.ggml.padding_token_id", n));
  if (f.Find("tokenizer.chat_template") != nullptr) {
    ASSIGN_OR_RETURN(spec.chat_template, f.GetString("tokenizer.chat_template"));
  }
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Synthetic models.

struct SyntheticName {
  std::string name;
  bool has_seed = false;
  uint64_t seed = 0;
};

absl::StatusOr<SyntheticName> ParseSyntheticName(absl::string_view full) {
  absl::string_view rest = full.substr(kSyntheticPrefix.size());
  SyntheticName out;
  const size_t at = rest.find('@');
  if (at != absl::string_view::npos) {
    absl::string_view seed = rest.substr(at + 1);
    if (seed.empty() || !absl::SimpleAtoi(seed, &out.seed) || seed[0] == '-' || seed[0] == '+') {
      return absl::InvalidArgumentError(
          absl::StrCat("bad seed in '", full, "': expected synthetic:NAME@SEED, SEED a uint64"));
    }
    out.has_seed = true;
    rest = rest.substr(0, at);
  }
  out.name = std::string(rest);
  return out;
}

// Fills dst[0, n) with fn(i) in parallel.
void ParallelFill(std::vector<float>& dst, int64_t n, const std::function<float(uint64_t)>& fn) {
  dst.resize(static_cast<size_t>(n));
  float* p = dst.data();
  ParallelFor(n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) p[i] = fn(uint64_t(i));
  });
}

void FillNorm(std::vector<float>& dst, int64_t n, uint64_t seed, uint32_t tag) {
  ParallelFill(dst, n, [&](uint64_t i) { return SyntheticNormWeight(seed, tag, i); });
}

void FillLinear(std::vector<float>& dst, int64_t out, int64_t in, uint64_t seed, uint32_t tag) {
  const float bound = SyntheticLinearBound(uint32_t(in));
  ParallelFill(dst, out * in,
               [&](uint64_t i) { return SyntheticLinearWeight(seed, tag, i, bound); });
}

std::unique_ptr<ModelWeights> MakeSyntheticWeights(const ModelConfig& c, uint64_t seed) {
  auto w = std::make_unique<ModelWeights>();
  w->config = c;
  const int64_t d = c.hidden_size, v = c.vocab_size, ff = c.intermediate_size;
  ParallelFill(w->token_embedding, v * d, [&](uint64_t i) {
    return SyntheticUniform(seed, SyntheticTag(kSynEmbedding, 0), i);
  });
  w->layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = w->layers[l];
    FillNorm(L.attn_norm, d, seed, SyntheticTag(kSynAttnNorm, l));
    FillLinear(L.wq, c.q_dim(), d, seed, SyntheticTag(kSynWq, l));
    FillLinear(L.wk, c.kv_dim(), d, seed, SyntheticTag(kSynWk, l));
    FillLinear(L.wv, c.kv_dim(), d, seed, SyntheticTag(kSynWv, l));
    FillLinear(L.wo, d, c.q_dim(), seed, SyntheticTag(kSynWo, l));
    FillNorm(L.ffn_norm, d, seed, SyntheticTag(kSynFfnNorm, l));
    FillLinear(L.w_gate, ff, d, seed, SyntheticTag(kSynWGate, l));
    FillLinear(L.w_up, ff, d, seed, SyntheticTag(kSynWUp, l));
    FillLinear(L.w_down, d, ff, seed, SyntheticTag(kSynWDown, l));
  }
  FillNorm(w->final_norm, d, seed, SyntheticTag(kSynFinalNorm, 0));
  if (!c.tie_word_embeddings) FillLinear(w->lm_head, v, d, seed, SyntheticTag(kSynLmHead, 0));
  return w;
}

absl::Status CheckHostBytes(const ModelConfig& c, int64_t max_host_bytes, absl::string_view what) {
  const int64_t bytes = c.NumParameters() * int64_t(sizeof(float));
  if (bytes > max_host_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: fp32 host weights need %.2f GiB (%d parameters), more than the %.2f GiB allowed "
        "by LoadOptions.max_host_bytes%s",
        what, bytes / double(1 << 30), c.NumParameters(), max_host_bytes / double(1 << 30),
        absl::StartsWith(what, kSyntheticPrefix)
            ? "; set synthetic_host_weights = false to generate them on the device"
            : ""));
  }
  return absl::OkStatus();
}

// "/models/SmolLM2-135M.Q4_1.gguf" -> "SmolLM2-135M.Q4_1"; "/models/llama3-8b/" -> "llama3-8b".
std::string ModelFileStem(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos) path = path.substr(slash + 1);
  const size_t dot = path.rfind('.');
  if (dot != std::string::npos && dot > 0) path = path.substr(0, dot);
  return path;
}

absl::StatusOr<LoadedModel> LoadSynthetic(const std::string& full, const LoadOptions& options) {
  ASSIGN_OR_RETURN(SyntheticName sn, ParseSyntheticName(full));
  ASSIGN_OR_RETURN(ModelConfig config, SyntheticConfig(sn.name));
  LoadedModel m;
  m.synthetic = true;
  m.seed = sn.has_seed ? sn.seed : options.seed;
  m.config = config;
  m.fingerprint = ToHex(Sha256Of(absl::StrCat(kSyntheticPrefix, sn.name, "@", m.seed)));
  m.tokenizer = BytesTokenizerSpec();
  m.name = full;
  if (options.synthetic_host_weights) {
    RETURN_IF_ERROR(CheckHostBytes(config, options.max_host_bytes, full));
    m.weights = MakeSyntheticWeights(config, m.seed);
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// GGUF llama models.

absl::StatusOr<int> GetIntIn(const GgufFile& f, absl::string_view key, int64_t lo, int64_t hi) {
  ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF metadata '", key, "' = ", v, " is out of range [", lo, ", ", hi, "]"));
  }
  return static_cast<int>(v);
}

absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& f, const TokenizerSpec& tok) {
  ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  if (arch != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF architecture '", arch, "' is not supported (only 'llama' family models)"));
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  ModelConfig c;
  c.architecture = arch;
  ASSIGN_OR_RETURN(c.num_layers, GetIntIn(f, "llama.block_count", 1, kMax));
  ASSIGN_OR_RETURN(c.hidden_size, GetIntIn(f, "llama.embedding_length", 1, kMax));
  ASSIGN_OR_RETURN(c.intermediate_size, GetIntIn(f, "llama.feed_forward_length", 1, kMax));
  ASSIGN_OR_RETURN(c.num_heads, GetIntIn(f, "llama.attention.head_count", 1, kMax));
  if (f.Find("llama.attention.head_count_kv") != nullptr) {
    ASSIGN_OR_RETURN(c.num_kv_heads, GetIntIn(f, "llama.attention.head_count_kv", 1, kMax));
  } else {
    c.num_kv_heads = c.num_heads;
  }
  if (f.Find("llama.attention.key_length") != nullptr) {
    ASSIGN_OR_RETURN(c.head_dim, GetIntIn(f, "llama.attention.key_length", 1, kMax));
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF: llama.embedding_length ", c.hidden_size,
                       " is not a multiple of llama.attention.head_count ", c.num_heads));
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (f.Find("llama.rope.dimension_count") != nullptr) {
    ASSIGN_OR_RETURN(int rot, GetIntIn(f, "llama.rope.dimension_count", 1, kMax));
    if (rot != c.head_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF: llama.rope.dimension_count ", rot, " != head_dim ", c.head_dim,
                       " (partial rotary embeddings are not supported)"));
    }
  }
  if (f.Find("llama.rope.freq_base") != nullptr) {
    ASSIGN_OR_RETURN(double theta, f.GetFloat("llama.rope.freq_base"));
    c.rope_theta = static_cast<float>(theta);
  }
  if (f.Find("llama.attention.layer_norm_rms_epsilon") != nullptr) {
    ASSIGN_OR_RETURN(double eps, f.GetFloat("llama.attention.layer_norm_rms_epsilon"));
    c.rms_norm_eps = static_cast<float>(eps);
  }
  if (f.Find("llama.context_length") != nullptr) {
    ASSIGN_OR_RETURN(c.max_position, GetIntIn(f, "llama.context_length", 1, kMax));
  }
  if (f.Find("llama.rope.scaling.type") != nullptr) {
    ASSIGN_OR_RETURN(std::string type, f.GetString("llama.rope.scaling.type"));
    if (type != "none") {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF: rope scaling type '", type, "' is not supported (load the HF checkpoint)"));
    }
  }
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    return absl::InvalidArgumentError(
        "GGUF: per-frequency rope factors (rope_freqs.weight, Llama 3.1 GGUF) are not supported; "
        "load the Hugging Face checkpoint, whose config.json carries rope_scaling");
  }
  if (f.Find("llama.vocab_size") != nullptr) {
    ASSIGN_OR_RETURN(c.vocab_size, GetIntIn(f, "llama.vocab_size", 1, kMax));
  } else {
    c.vocab_size = static_cast<int>(std::min<size_t>(tok.tokens.size(), kMax));
  }
  if (tok.tokens.size() > size_t(c.vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF: tokenizer has ", tok.tokens.size(),
                                                   " tokens but vocab_size is ", c.vocab_size));
  }
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  c.bos_token_id = tok.bos_id;
  c.eos_token_id = tok.eos_id;
  RETURN_IF_ERROR(c.Validate());
  return c;
}

// One tensor to convert: GGUF tensor -> fp32 destination, rows optionally un-permuted from the
// interleaved RoPE layout to rotate-half.
struct TensorJob {
  const GgufTensorInfo* tensor;
  std::vector<float>* dst;
  int rope_heads = 0;  // > 0: Q or K projection with this many heads
};

absl::Status ExpectTensor(const GgufFile& f, const std::string& name, std::vector<int64_t> dims,
                          std::vector<float>* dst, int rope_heads, std::vector<TensorJob>* jobs) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF: tensor '", name, "' is missing"));
  }
  if (t->dims != dims) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF: tensor '", name, "' has shape [", absl::StrJoin(t->dims, ", "),
                     "] (ne, fastest first), expected [", absl::StrJoin(dims, ", "), "]"));
  }
  if (!IsDequantizable(t->type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF: tensor '", name, "' has type ", GgmlTypeName(t->type),
                     " which is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"));
  }
  jobs->push_back({t, dst, rope_heads});
  return absl::OkStatus();
}

void RunJob(const TensorJob& job) {
  const GgufTensorInfo& t = *job.tensor;
  job.dst->resize(static_cast<size_t>(t.num_elements));
  if (job.rope_heads == 0) {
    (void)DequantizeTensor(t, job.dst->data());  // type and shape checked by ExpectTensor
    return;
  }
  const GgmlTypeTraits* traits = GetGgmlTypeTraits(static_cast<uint32_t>(t.type));
  const int64_t in = t.dims[0];
  const int64_t rows = t.dims[1];
  const int64_t head_dim = rows / job.rope_heads;
  const int64_t half = head_dim / 2;
  const int64_t row_bytes = in / traits->block_size * traits->type_size;
  float* dst = job.dst->data();
  ParallelFor(rows, std::max<int64_t>(1, 16384 / in), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      // GGUF row 2*j + i of a head holds Hugging Face row i*half + j.
      const int64_t head = r / head_dim, local = r % head_dim;
      const int64_t hf = head * head_dim + (local % 2) * half + local / 2;
      (void)DequantizeRow(t.type, t.data + r * row_bytes, in, dst + hf * in);
    }
  });
}

absl::StatusOr<LoadedModel> LoadGgufImpl(const GgufFile& f, const LoadOptions& options) {
  LoadedModel m;
  ASSIGN_OR_RETURN(m.tokenizer, TokenizerSpecFromGgufImpl(f));
  ASSIGN_OR_RETURN(m.config, ConfigFromGguf(f, m.tokenizer));
  const ModelConfig& c = m.config;
  RETURN_IF_ERROR(CheckHostBytes(c, options.max_host_bytes, "GGUF model"));

  // Check every tensor before allocating anything.
  auto w = std::make_unique<ModelWeights>();
  w->config = c;
  w->layers.resize(c.num_layers);
  const int64_t d = c.hidden_size, v = c.vocab_size, ff = c.intermediate_size;
  std::vector<TensorJob> jobs;
  absl::Status st = [&]() -> absl::Status {
    RETURN_IF_ERROR(ExpectTensor(f, "token_embd.weight", {d, v}, &w->token_embedding, 0, &jobs));
    for (int l = 0; l < c.num_layers; ++l) {
      LayerWeights& L = w->layers[l];
      const std::string p = absl::StrCat("blk.", l, ".");
      RETURN_IF_ERROR(ExpectTensor(f, p + "attn_norm.weight", {d}, &L.attn_norm, 0, &jobs));
      RETURN_IF_ERROR(
          ExpectTensor(f, p + "attn_q.weight", {d, c.q_dim()}, &L.wq, c.num_heads, &jobs));
      RETURN_IF_ERROR(
          ExpectTensor(f, p + "attn_k.weight", {d, c.kv_dim()}, &L.wk, c.num_kv_heads, &jobs));
      RETURN_IF_ERROR(ExpectTensor(f, p + "attn_v.weight", {d, c.kv_dim()}, &L.wv, 0, &jobs));
      RETURN_IF_ERROR(ExpectTensor(f, p + "attn_output.weight", {c.q_dim(), d}, &L.wo, 0, &jobs));
      RETURN_IF_ERROR(ExpectTensor(f, p + "ffn_norm.weight", {d}, &L.ffn_norm, 0, &jobs));
      RETURN_IF_ERROR(ExpectTensor(f, p + "ffn_gate.weight", {d, ff}, &L.w_gate, 0, &jobs));
      RETURN_IF_ERROR(ExpectTensor(f, p + "ffn_up.weight", {d, ff}, &L.w_up, 0, &jobs));
      RETURN_IF_ERROR(ExpectTensor(f, p + "ffn_down.weight", {ff, d}, &L.w_down, 0, &jobs));
    }
    RETURN_IF_ERROR(ExpectTensor(f, "output_norm.weight", {d}, &w->final_norm, 0, &jobs));
    if (!c.tie_word_embeddings) {
      RETURN_IF_ERROR(ExpectTensor(f, "output.weight", {d, v}, &w->lm_head, 0, &jobs));
    }
    return absl::OkStatus();
  }();
  RETURN_IF_ERROR(st);

  // Hash the file on a separate thread while the pool dequantises.
  std::string fingerprint;
  std::thread hasher([&] {
    Sha256 h;
    constexpr size_t kChunk = size_t(1) << 22;
    for (size_t off = 0; off < f.size(); off += kChunk) {
      h.Update(f.bytes() + off, std::min(kChunk, f.size() - off));
    }
    fingerprint = ToHex(h.Finish());
  });
  for (const TensorJob& job : jobs) RunJob(job);
  hasher.join();

  m.fingerprint = std::move(fingerprint);
  m.weights = std::move(w);
  return m;
}

absl::StatusOr<LoadedModel> LoadGguf(const std::string& path, const LoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  absl::StatusOr<LoadedModel> m = LoadGgufImpl(*file, options);
  if (!m.ok())
    return absl::Status(m.status().code(), absl::StrCat(path, ": ", m.status().message()));
  absl::StatusOr<std::string> name = file->GetString("general.name");
  m->name = name.ok() && !name->empty() ? *name : ModelFileStem(path);
  return m;
}

absl::StatusOr<LoadedModel> LoadHf(const std::string& dir, const LoadOptions& options) {
  ASSIGN_OR_RETURN(HfCheckpoint ckpt, LoadHfCheckpoint(dir, options.max_host_bytes));
  LoadedModel m;
  m.config = ckpt.config;
  m.weights = std::move(ckpt.weights);
  m.fingerprint = std::move(ckpt.fingerprint);
  // TODO(model): read tokenizer.json of Hugging Face checkpoints. Until then the byte-level spec.
  m.tokenizer = BytesTokenizerSpec();
  m.name = ModelFileStem(dir);
  return m;
}

}  // namespace

absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& file) {
  return TokenizerSpecFromGgufImpl(file);
}

absl::StatusOr<LoadedModel> LoadModelFromGguf(const GgufFile& file, const LoadOptions& options) {
  return LoadGgufImpl(file, options);
}

TokenizerSpec BytesTokenizerSpec() {
  TokenizerSpec spec;
  spec.model = "bytes";
  spec.tokens = {"<bos>", "<eos>", "<pad>"};
  spec.token_types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    spec.tokens.push_back(absl::StrFormat("<0x%02X>", b));
    spec.token_types.push_back(6);
  }
  spec.bos_id = 0;
  spec.eos_id = 1;
  spec.pad_id = 2;
  return spec;
}

absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& name) {
  ModelConfig c;
  c.architecture = "llama";
  c.bos_token_id = 0;  // the "bytes" tokenizer's <bos> / <eos>
  c.eos_token_id = 1;
  if (name == "tiny") {
    c.vocab_size = 259;
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.rope_theta = 10000.0f;
    c.rms_norm_eps = 1e-5f;
    c.max_position = 2048;
    c.tie_word_embeddings = true;
  } else if (name == "smollm2-135m") {
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_layers = 30;
    c.num_heads = 9;
    c.num_kv_heads = 3;
    c.head_dim = 64;
    c.rope_theta = 100000.0f;
    c.rms_norm_eps = 1e-5f;
    c.max_position = 8192;
    c.tie_word_embeddings = true;
  } else if (name == "wide") {
    // Small enough for the CPU reference, wide enough (k >= 2048) that a one-token CUDA step
    // takes the GEMV and its fused epilogues on every projection (worker/kernels/gemv.h).
    c.vocab_size = 259;
    c.hidden_size = 2048;
    c.intermediate_size = 5632;
    c.num_layers = 2;
    c.num_heads = 16;
    c.num_kv_heads = 4;
    c.head_dim = 128;
    c.rope_theta = 500000.0f;
    c.rms_norm_eps = 1e-5f;
    c.max_position = 8192;
    c.tie_word_embeddings = true;
  } else if (name == "llama3-8b" || name == "llama3-70b") {
    // Llama-3.1 shapes. The 70B's bf16 weights (141 GB = 131 GiB) fit one H200 but leave no
    // room for a useful KV pool: tensor parallelism over 2 GPUs serves it.
    const bool big = name == "llama3-70b";
    c.vocab_size = 128256;
    c.hidden_size = big ? 8192 : 4096;
    c.intermediate_size = big ? 28672 : 14336;
    c.num_layers = big ? 80 : 32;
    c.num_heads = big ? 64 : 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.rope_theta = 500000.0f;
    c.rms_norm_eps = 1e-5f;
    c.rope_scaling.type = RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = 8.0f;
    c.rope_scaling.low_freq_factor = 1.0f;
    c.rope_scaling.high_freq_factor = 4.0f;
    c.rope_scaling.original_max_position = 8192;
    c.max_position = 131072;
    c.tie_word_embeddings = false;
  } else {
    return absl::NotFoundError(
        absl::StrCat("unknown synthetic model '", name,
                     "' (known: tiny, smollm2-135m, wide, llama3-8b, llama3-70b)"));
  }
  RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& path_or_name, const LoadOptions& options) {
  if (absl::StartsWith(path_or_name, kSyntheticPrefix)) {
    return LoadSynthetic(path_or_name, options);
  }
  struct stat st;
  if (::stat(path_or_name.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "model '", path_or_name,
        "' not found (expected a GGUF file, a Hugging Face directory or synthetic:NAME)"));
  }
  if (S_ISDIR(st.st_mode)) return LoadHf(path_or_name, options);
  return LoadGguf(path_or_name, options);
}

absl::StatusOr<TokenizerSpec> LoadTokenizerSpec(const std::string& path) {
  if (absl::StartsWith(path, kSyntheticPrefix)) {
    ASSIGN_OR_RETURN(SyntheticName sn, ParseSyntheticName(path));
    RETURN_IF_ERROR(SyntheticConfig(sn.name).status());
    return BytesTokenizerSpec();
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model '", path, "' not found"));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": tokenizers of Hugging Face directories are not supported yet (use the GGUF)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  absl::StatusOr<TokenizerSpec> spec = TokenizerSpecFromGgufImpl(*file);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace lazyrag
