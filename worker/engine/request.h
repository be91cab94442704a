// Request and result types of generation, independent of gRPC (the service maps them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/sampler.h"

namespace lazyrag {

// DESIGN section 5.
enum class AttentionMode { kLazy, kMaterialize, kPrefix, kFull };
absl::StatusOr<AttentionMode> ParseAttentionMode(std::string_view name);  // "lazy", ...
std::string_view AttentionModeName(AttentionMode mode);

// A prompt already cut into blocks of token ids. Each block is tokenized alone, so a
// document's tokens (and its id) do not depend on its neighbours. FULL and PREFIX run the
// concatenation prefix + documents... + suffix with plain causal attention; LAZY and
// MATERIALIZE run block attention over the same tokens.
struct TokenPrompt {
  // The engine's shared prefix (EngineOptions::shared_prefix; the engine sets it): opens the
  // prompt in every mode; documents are encoded after it. Empty without one.
  std::vector<int32_t> sink;
  std::vector<int32_t> prefix;                  // chat header + system prompt (a shared block)
  std::vector<std::vector<int32_t>> documents;  // one block each
  std::vector<int32_t> suffix;                  // query + assistant header (the request's own)
  int64_t total_tokens() const {
    int64_t n = int64_t(sink.size()) + int64_t(prefix.size()) + int64_t(suffix.size());
    for (const auto& d : documents) n += int64_t(d.size());
    return n;
  }
};

// Answer-quality settings of LAZY and MATERIALIZE requests (issue 25), which keep document KV
// shared and position-agnostic. A request sets the fields it overrides; the engine fills the
// rest from EngineOptions::quality (ResolveQuality) and echoes what ran in Usage. FULL and
// PREFIX ignore them.
struct QualityOptions {
  // k: the first k tokens of every document are recomputed for the request at their true
  // positions (attending the prefix and the documents before them), in the request's own
  // pages; the rest of each document stays shared and zero-copy (EPIC-style). A document
  // shorter than k is recomputed whole. 0 .. kMaxRecomputeFirstTokens.
  std::optional<int> recompute_first_tokens;
  // APE-style (arXiv 2502.05431) scaling of the attention to the documents: a key of a
  // document (its shared part and its recomputed first tokens) scores
  // (q . k) / (sqrt(head_dim) * document_temperature) + ln(document_scale); the sink, the
  // prefix and the request's own tokens score as usual. Applies to every query row of the
  // request (with first-k, the recomputed tokens' attention to earlier documents too).
  // Temperature in [0.05, 20], scale in [0.01, 100]; 1 and 1: off.
  std::optional<float> document_temperature;
  std::optional<float> document_scale;
  // m: the first m tokens of every document are left out of the request's attention. A
  // document encoded alone opens with its own attention sink (tokens that take a large share
  // of every query's attention), which the concatenated prompt does not have; masking it
  // costs nothing and keeps the whole document shared. The document's other tokens keep the
  // KV they were computed with. 0 .. kMaxDropFirstTokens. Excludes recompute_first_tokens > 0
  // (which replaces those tokens instead): a request that sets only one of the two clears the
  // server's default of the other; both > 0 in one place is INVALID_ARGUMENT.
  std::optional<int> drop_first_tokens;
};
inline constexpr int kMaxRecomputeFirstTokens = 512;
inline constexpr int kMaxDropFirstTokens = 64;

// QualityOptions with every field set.
struct QualitySettings {
  int recompute_first_tokens = 0;
  float document_temperature = 1.0f;
  float document_scale = 1.0f;
  int drop_first_tokens = 0;
  // True when the settings need Backend::SupportsQualityViews.
  bool NeedsQualityViews() const {
    return recompute_first_tokens > 0 || drop_first_tokens > 0 || document_temperature != 1.0f ||
           document_scale != 1.0f;
  }
};
// `request`'s fields over `defaults`. INVALID_ARGUMENT for a value out of range (the message
// names the field and its range).
absl::StatusOr<QualitySettings> ResolveQuality(const QualityOptions &request,
                                               const QualitySettings &defaults);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t document_tokens = 0;         // tokens of the documents
  int64_t cached_document_tokens = 0;  // document tokens not computed for this request
  int64_t pool_document_tokens = 0;    // ... of which found in the KV pool
  int64_t store_document_tokens = 0;   // ... of which fetched from the kvstore (or a peer)
  int64_t host_document_tokens = 0;    // ... of which copied from the host-memory tier
  int64_t computed_tokens = 0;         // prompt tokens run through the model for this request
  int64_t completion_tokens = 0;
  // The quality settings that ran (LAZY and MATERIALIZE; zero for FULL and PREFIX) and the
  // document tokens recomputed for them (part of computed_tokens, not of
  // cached_document_tokens).
  int32_t recompute_first_tokens = 0;
  float document_temperature = 1.0f;
  float document_scale = 1.0f;
  int32_t drop_first_tokens = 0;
  int64_t recomputed_document_tokens = 0;
};

struct Timings {
  double queue_ms = 0;
  double ttft_ms = 0;   // arrival to first generated token
  double total_ms = 0;
};

enum class FinishReason { kLength, kStop, kEos, kCancelled };
std::string_view FinishReasonName(FinishReason r);

struct TokenResult {
  std::vector<int32_t> token_ids;  // generated tokens (stop token excluded)
  FinishReason finish_reason = FinishReason::kLength;
  Usage usage;
  Timings timings;
};

}  // namespace lazyrag
