// Hugging Face Llama checkpoints: a directory with config.json and model.safetensors (or shards
// listed in model.safetensors.index.json). Tensors in F32, F16 or BF16; converted to fp32.
// Hugging Face Q/K rows are already in the rotate-half layout, so no permutation is needed.
//
// safetensors file: u64 little-endian N, N bytes of JSON header
//   {"NAME": {"dtype": "F32"|"F16"|"BF16"|..., "shape": [..], "data_offsets": [begin, end]},
//    "__metadata__": {...}}
// then the data; offsets are relative to the byte after the header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/config.h"
#include "worker/model/weights.h"

namespace lazyrag {

// Parses a Hugging Face config.json (model_type "llama"/"mistral"-style decoder). Fields:
// vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads (default num_attention_heads), head_dim (default hidden/heads),
// rms_norm_eps, rope_theta (default 10000), max_position_embeddings, tie_word_embeddings
// (default false), bos_token_id, eos_token_id (first of a list), rope_scaling (type "llama3"
// only; others are INVALID_ARGUMENT). The result is validated.
absl::StatusOr<ModelConfig> ParseHfConfigJson(absl::string_view json_text);

struct HfCheckpoint {
  ModelConfig config;
  std::unique_ptr<ModelWeights> weights;
  std::string fingerprint;  // hex SHA-256 over config.json then the safetensors files' bytes
};

// Loads the checkpoint in directory `dir`. NOT_FOUND when config.json or the weights are
// missing, INVALID_ARGUMENT for malformed files, missing tensors or wrong shapes (naming the
// tensor), RESOURCE_EXHAUSTED when the fp32 weights would exceed `max_host_bytes`.
absl::StatusOr<HfCheckpoint> LoadHfCheckpoint(const std::string& dir, int64_t max_host_bytes);

}  // namespace lazyrag
