#include "worker/model/config.h"

#include "absl/strings/str_cat.h"

namespace lazyrag {

absl::Status ModelConfig::Validate() const {
  auto bad = [](const char* field, int64_t v) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", field, " = ", v, " is out of range"));
  };
  if (vocab_size <= 0 || vocab_size > (1 << 22)) return bad("vocab_size", vocab_size);
  if (hidden_size <= 0 || hidden_size > 65536) return bad("hidden_size", hidden_size);
  if (intermediate_size <= 0 || intermediate_size > 262144) return bad("intermediate_size", intermediate_size);
  if (num_layers <= 0 || num_layers > 1024) return bad("num_layers", num_layers);
  if (num_heads <= 0 || num_heads > 1024) return bad("num_heads", num_heads);
  if (num_kv_heads <= 0 || num_kv_heads > num_heads || num_heads % num_kv_heads != 0)
    return bad("num_kv_heads", num_kv_heads);
  if (head_dim <= 0 || head_dim > 512 || head_dim % 2 != 0) return bad("head_dim", head_dim);
  if (!(rms_norm_eps > 0.0f) || rms_norm_eps > 1.0f) return absl::InvalidArgumentError("model config: rms_norm_eps out of range");
  if (!(rope_theta > 0.0f)) return absl::InvalidArgumentError("model config: rope_theta must be positive");
  if (max_position <= 0 || max_position > (1 << 24)) return bad("max_position", max_position);
  if (bos_token_id >= vocab_size) return bad("bos_token_id", bos_token_id);
  if (eos_token_id >= vocab_size) return bad("eos_token_id", eos_token_id);
  return absl::OkStatus();
}

int64_t ModelConfig::NumParameters() const {
  int64_t d = hidden_size;
  int64_t per_layer = 2 * d + d * q_dim() + 2 * d * kv_dim() + int64_t(q_dim()) * d +
                      3 * d * int64_t(intermediate_size);
  int64_t total = int64_t(vocab_size) * d + num_layers * per_layer + d;
  if (!tie_word_embeddings) total += int64_t(vocab_size) * d;
  return total;
}

}  // namespace lazyrag
