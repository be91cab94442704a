// Loading a model by path or by synthetic name.
//   LoadModel("/path/model.gguf")            GGUF (F32, F16, BF16, Q8_0, Q4_0, Q4_1 -> fp32)
//   LoadModel("/path/hf_dir")                safetensors + config.json (Hugging Face layout)
//   LoadModel("synthetic:tiny")              2 layers, seeded random weights, byte tokenizer
//   LoadModel("synthetic:smollm2-135m")      SmolLM2-135M shape
//   LoadModel("synthetic:llama3-8b")         Llama-3.1-8B shape (weights generated on the device;
//                                            host weights only when options ask for them)
//   LoadModel("synthetic:llama3-70b")        Llama-3.1-70B shape (the same; 141 GiB in bf16, so
//                                            on the GPU only with tensor parallelism)
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/config.h"
#include "worker/model/tokenizer_spec.h"
#include "worker/model/weights.h"

namespace lazyrag {

struct LoadOptions {
  // Seed for synthetic weights ("synthetic:NAME@SEED" in the name overrides it).
  uint64_t seed = 0;
  // For synthetic models: fill ModelWeights on the host. The CUDA backend sets this to false
  // and generates weights in device memory from (seed, tag, index) instead.
  bool synthetic_host_weights = true;
  // Refuse models whose fp32 host weights would exceed this many bytes (clear error, no OOM).
  int64_t max_host_bytes = int64_t(20) << 30;
};

struct LoadedModel {
  ModelConfig config;
  // Hex SHA-256 over config and weights bytes (synthetic: over name and seed). Part of every
  // KV key: KV from one model is never served to another.
  std::string fingerprint;
  std::unique_ptr<ModelWeights> weights;  // null for synthetic models without host weights
  bool synthetic = false;
  uint64_t seed = 0;
  TokenizerSpec tokenizer;
  // The model's own name: a GGUF's general.name, else the file's (or directory's) name without
  // its extension; synthetic models: "synthetic:NAME" as given. The worker's default
  // --served_model_name.
  std::string name;
};

absl::StatusOr<LoadedModel> LoadModel(const std::string& path_or_name,
                                      const LoadOptions& options = {});

// Synthetic configs by name ("tiny", "smollm2-135m", "wide", "llama3-8b", "llama3-70b"); NOT_FOUND
// otherwise.
absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& name);

// The tokenizer of a model without loading its weights: for a GGUF file, its tokenizer.ggml.*
// metadata and tokenizer.chat_template (only the header is read); for "synthetic:NAME[@SEED]",
// the "bytes" spec. NOT_FOUND for a missing file or unknown synthetic name, INVALID_ARGUMENT for
// a malformed file or inconsistent tokenizer metadata (e.g. token_type length != tokens length,
// special ids out of range). Hugging Face directories are not supported yet (UNIMPLEMENTED).
absl::StatusOr<TokenizerSpec> LoadTokenizerSpec(const std::string& path);

// The spec of the synthetic byte-level tokenizer: ids 0, 1, 2 = "<bos>", "<eos>", "<pad>"
// (token_type 3, control), then ids 3..258 = bytes 0x00..0xFF as "<0xHH>" (token_type 6, byte).
TokenizerSpec BytesTokenizerSpec();

}  // namespace lazyrag
