// Host-side fp32 weights of a Llama-family model, the form every loader produces and every
// backend consumes (the CUDA backend converts to bf16 on upload).
//
// Conventions (one layout inside the runtime, converted at load):
// * Linear weights are row-major [out_features, in_features]; y = x * W^T (Hugging Face).
// * Q and K projection rows are in the ROTATE-HALF RoPE layout (Hugging Face): within a head,
//   feature i pairs with feature i + head_dim/2. GGUF llama files store the interleaved
//   (adjacent-pair) layout; the GGUF loader permutes the rows back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/config.h"

namespace lazyrag {

struct LayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> wq;         // [num_heads*head_dim, hidden]
  std::vector<float> wk;         // [num_kv_heads*head_dim, hidden]
  std::vector<float> wv;         // [num_kv_heads*head_dim, hidden]
  std::vector<float> wo;         // [hidden, num_heads*head_dim]
  std::vector<float> ffn_norm;   // [hidden]
  std::vector<float> w_gate;     // [intermediate, hidden]
  std::vector<float> w_up;       // [intermediate, hidden]
  std::vector<float> w_down;     // [hidden, intermediate]
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> token_embedding;  // [vocab, hidden]
  std::vector<LayerWeights> layers;    // [num_layers]
  std::vector<float> final_norm;       // [hidden]
  std::vector<float> lm_head;          // [vocab, hidden]; empty when tie_word_embeddings

  const std::vector<float>& output_weight() const {
    return config.tie_word_embeddings ? token_embedding : lm_head;
  }
};

}  // namespace lazyrag
