#include "worker/backend/tp_shard.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace lazyrag {
namespace {

// Rows [row0, row0 + rows) of a row-major [*, cols] matrix.
std::vector<float> SliceRows(const std::vector<float>& m, int64_t cols, int64_t row0,
                             int64_t rows) {
  return std::vector<float>(m.begin() + row0 * cols, m.begin() + (row0 + rows) * cols);
}

// Columns [col0, col0 + n) of a row-major [rows, cols] matrix.
std::vector<float> SliceCols(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t col0,
                             int64_t n) {
  std::vector<float> out(size_t(rows * n));
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(&out[size_t(r * n)], &m[size_t(r * cols + col0)], sizeof(float) * size_t(n));
  }
  return out;
}

}  // namespace

absl::Status CheckShardable(const ModelConfig& global, TpShard shard) {
  if (shard.size < 1 || shard.size > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel: size ", shard.size, " out of range [1, 64]"));
  }
  if (shard.rank < 0 || shard.rank >= shard.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel: rank ", shard.rank, " out of range for size ", shard.size));
  }
  auto check = [&](const char* field, int v) -> absl::Status {
    if (v % shard.size != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor parallel: ", field, " = ", v,
                                                     " is not divisible by ", shard.size,
                                                     " ranks (every rank needs an equal share)"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check("num_kv_heads", global.num_kv_heads));
  RETURN_IF_ERROR(check("num_heads", global.num_heads));
  RETURN_IF_ERROR(check("intermediate_size", global.intermediate_size));
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ShardConfig(const ModelConfig& global, TpShard shard) {
  RETURN_IF_ERROR(global.Validate());
  RETURN_IF_ERROR(CheckShardable(global, shard));
  ModelConfig c = global;
  c.num_heads = global.num_heads / shard.size;
  c.num_kv_heads = global.num_kv_heads / shard.size;
  c.intermediate_size = global.intermediate_size / shard.size;
  return c;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ShardWeights(const ModelWeights& global,
                                                           TpShard shard) {
  ASSIGN_OR_RETURN(ModelConfig c, ShardConfig(global.config, shard));
  const ModelConfig& g = global.config;
  if (int(global.layers.size()) != g.num_layers) {
    return absl::InvalidArgumentError("tensor parallel: weights have the wrong layer count");
  }
  const int64_t d = g.hidden_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;  // per rank
  const int64_t r = shard.rank;
  auto w = std::make_unique<ModelWeights>();
  w->config = c;
  w->token_embedding = global.token_embedding;
  w->final_norm = global.final_norm;
  w->lm_head = global.lm_head;
  w->layers.resize(g.num_layers);
  for (int l = 0; l < g.num_layers; ++l) {
    const LayerWeights& G = global.layers[l];
    LayerWeights& L = w->layers[l];
    const auto check = [&](const std::vector<float>& v, int64_t n, const char* name) {
      return int64_t(v.size()) == n ? absl::OkStatus()
                                    : absl::InvalidArgumentError(absl::StrCat(
                                          "tensor parallel: layer ", l, " ", name, " has ",
                                          v.size(), " elements, expected ", n));
    };
    RETURN_IF_ERROR(check(G.wq, g.q_dim() * d, "wq"));
    RETURN_IF_ERROR(check(G.wk, g.kv_dim() * d, "wk"));
    RETURN_IF_ERROR(check(G.wv, g.kv_dim() * d, "wv"));
    RETURN_IF_ERROR(check(G.wo, d * g.q_dim(), "wo"));
    RETURN_IF_ERROR(check(G.w_gate, int64_t(g.intermediate_size) * d, "w_gate"));
    RETURN_IF_ERROR(check(G.w_up, int64_t(g.intermediate_size) * d, "w_up"));
    RETURN_IF_ERROR(check(G.w_down, d * g.intermediate_size, "w_down"));
    L.attn_norm = G.attn_norm;
    L.ffn_norm = G.ffn_norm;
    L.wq = SliceRows(G.wq, d, r * qd, qd);
    L.wk = SliceRows(G.wk, d, r * kvd, kvd);
    L.wv = SliceRows(G.wv, d, r * kvd, kvd);
    L.wo = SliceCols(G.wo, d, g.q_dim(), r * qd, qd);
    L.w_gate = SliceRows(G.w_gate, d, r * ff, ff);
    L.w_up = SliceRows(G.w_up, d, r * ff, ff);
    L.w_down = SliceCols(G.w_down, d, g.intermediate_size, r * ff, ff);
  }
  return w;
}

absl::StatusOr<std::vector<std::string>> SplitKvTransport(std::string_view global, int ranks,
                                                          int layers, int tokens, int kv_heads,
                                                          int head_dim, int elem_bytes) {
  const size_t head_bytes = size_t(head_dim) * elem_bytes;
  const size_t rank_row = head_bytes * (kv_heads / ranks);  // one token of one rank
  const size_t rows = size_t(2) * layers * tokens;          // (layer, K|V, token)
  if (global.size() != rows * rank_row * ranks) {
    return absl::InvalidArgumentError(absl::StrCat("kv import: payload is ", global.size(),
                                                   " bytes, expected ", rows * rank_row * ranks));
  }
  std::vector<std::string> parts(ranks, std::string(rows * rank_row, '\0'));
  for (size_t i = 0; i < rows; ++i) {
    const char* src = global.data() + i * rank_row * ranks;
    for (int r = 0; r < ranks; ++r) {
      std::memcpy(parts[r].data() + i * rank_row, src + r * rank_row, rank_row);
    }
  }
  return parts;
}

absl::Status MergeKvTransport(const std::vector<std::string>& parts, int layers, int tokens,
                              int kv_heads, int head_dim, int elem_bytes, std::string* global) {
  const int ranks = int(parts.size());
  const size_t head_bytes = size_t(head_dim) * elem_bytes;
  const size_t rank_row = head_bytes * (kv_heads / ranks);
  const size_t rows = size_t(2) * layers * tokens;
  for (int r = 0; r < ranks; ++r) {
    if (parts[r].size() != rows * rank_row) {
      return absl::InvalidArgumentError(absl::StrCat("kv export: rank ", r, " returned ",
                                                     parts[r].size(), " bytes, expected ",
                                                     rows * rank_row));
    }
  }
  global->resize(rows * rank_row * ranks);
  for (size_t i = 0; i < rows; ++i) {
    char* dst = global->data() + i * rank_row * ranks;
    for (int r = 0; r < ranks; ++r) {
      std::memcpy(dst + r * rank_row, parts[r].data() + i * rank_row, rank_row);
    }
  }
  return absl::OkStatus();
}

}  // namespace lazyrag
