// Model hyper-parameters of a Llama-family decoder (Llama 2/3, SmolLM2, Mistral-style GQA).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace lazyrag {

struct RopeScaling {
  enum class Type { kNone, kLlama3 };
  Type type = Type::kNone;
  float factor = 1.0f;                  // llama3: 8.0 for Llama-3.1
  float low_freq_factor = 1.0f;         // llama3: 1.0
  float high_freq_factor = 4.0f;        // llama3: 4.0
  int original_max_position = 8192;     // llama3: 8192
};

struct ModelConfig {
  std::string architecture = "llama";
  int vocab_size = 0;
  int hidden_size = 0;         // d_model
  int intermediate_size = 0;   // SwiGLU inner width
  int num_layers = 0;
  int num_heads = 0;           // query heads
  int num_kv_heads = 0;        // key/value heads (GQA); num_heads % num_kv_heads == 0
  int head_dim = 0;            // usually hidden_size / num_heads
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  int max_position = 2048;     // context length the model was trained for
  bool tie_word_embeddings = false;
  int32_t bos_token_id = -1;
  int32_t eos_token_id = -1;

  // INVALID_ARGUMENT naming the first field out of range (zero, negative, absurd or
  // inconsistent sizes). Loaders call it before allocating anything.
  absl::Status Validate() const;
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // Parameters, for reporting.
  int64_t NumParameters() const;
};

}  // namespace lazyrag
