// Tensor parallelism (Megatron-style) over N ranks: which part of the model rank r holds.
//
// * Attention: query heads [r * H/N, (r+1) * H/N) and KV heads [r * Hkv/N, (r+1) * Hkv/N)
//   (contiguous blocks, so every rank's query heads use only its own KV heads). wq, wk, wv are
//   column-parallel (rank r holds the rows of its heads); wo is row-parallel (the columns of its
//   heads): each rank's O projection is a partial sum over its heads.
// * MLP: w_gate and w_up rows [r * F/N, (r+1) * F/N) (column-parallel), w_down the same columns
//   (row-parallel): a partial sum again.
// * Embedding, norms and lm_head are replicated. The partial sums are all-reduced after the O
//   and the down projection, so every rank holds the same residual stream.
// * KV: each rank's pool holds its KV heads only. The transport form (the kvstore payload) stays
//   the global one, [layer][K, V][tokens, kv_heads, head_dim]; SplitKvTransport and
//   MergeKvTransport convert between it and the ranks' [layer][K, V][tokens, kv_heads/N, head_dim].
//
// Pure host code; no threads, no device.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/config.h"
#include "worker/model/weights.h"

namespace lazyrag {

struct TpShard {
  int size = 1;  // ranks (N)
  int rank = 0;  // 0 <= rank < size
};

// OK when `shard` is well formed and `global` divides into shard.size ranks; INVALID_ARGUMENT
// naming the field (num_heads, num_kv_heads, intermediate_size) that does not.
absl::Status CheckShardable(const ModelConfig& global, TpShard shard);

// The config rank shard.rank runs: num_heads / N, num_kv_heads / N, intermediate_size / N;
// hidden size, head dim, vocabulary, layers and RoPE unchanged.
absl::StatusOr<ModelConfig> ShardConfig(const ModelConfig& global, TpShard shard);

// The rank's slice of host weights (config = ShardConfig(global.config, shard)). The slices are
// copies; `global` is not modified.
absl::StatusOr<std::unique_ptr<ModelWeights>> ShardWeights(const ModelWeights& global,
                                                           TpShard shard);

// Document KV transport between the global form and the ranks' forms. `elem_bytes` is the
// size of one KV element (4 fp32, 2 bf16); `kv_heads` is the global KV head count.
// REQUIRES: kv_heads % ranks == 0.
// Split: global [layers][2][tokens][kv_heads][head_dim] -> ranks' [layers][2][tokens][kv_heads/N]
// [head_dim]; INVALID_ARGUMENT when `global` has the wrong size.
absl::StatusOr<std::vector<std::string>> SplitKvTransport(std::string_view global, int ranks,
                                                          int layers, int tokens, int kv_heads,
                                                          int head_dim, int elem_bytes);
// Merge: the inverse; INVALID_ARGUMENT when a part has the wrong size.
absl::Status MergeKvTransport(const std::vector<std::string>& parts, int layers, int tokens,
                              int kv_heads, int head_dim, int elem_bytes, std::string* global);

}  // namespace lazyrag
