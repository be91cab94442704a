#include "worker/engine/request.h"

#include "absl/strings/str_cat.h"

namespace lazyrag {

absl::StatusOr<AttentionMode> ParseAttentionMode(std::string_view name) {
  if (name == "lazy" || name == "LAZY" || name.empty()) return AttentionMode::kLazy;
  if (name == "materialize" || name == "MATERIALIZE") return AttentionMode::kMaterialize;
  if (name == "prefix" || name == "PREFIX") return AttentionMode::kPrefix;
  if (name == "full" || name == "FULL") return AttentionMode::kFull;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mode '", std::string(name), "' (lazy, materialize, prefix, full)"));
}

absl::StatusOr<QualitySettings> ResolveQuality(const QualityOptions &request,
                                               const QualitySettings &defaults) {
  QualitySettings q = defaults;
  if (request.recompute_first_tokens) q.recompute_first_tokens = *request.recompute_first_tokens;
  if (request.document_temperature) q.document_temperature = *request.document_temperature;
  if (request.document_scale) q.document_scale = *request.document_scale;
  if (request.drop_first_tokens) q.drop_first_tokens = *request.drop_first_tokens;
  // The two first-token settings exclude each other; a request's choice of one clears the
  // server's default of the other.
  if (request.drop_first_tokens && !request.recompute_first_tokens && q.drop_first_tokens > 0) {
    q.recompute_first_tokens = 0;
  }
  if (request.recompute_first_tokens && !request.drop_first_tokens &&
      q.recompute_first_tokens > 0) {
    q.drop_first_tokens = 0;
  }
  if (q.recompute_first_tokens < 0 || q.recompute_first_tokens > kMaxRecomputeFirstTokens) {
    return absl::InvalidArgumentError(absl::StrCat("recompute_first_tokens must be in 0 .. ",
                                                   kMaxRecomputeFirstTokens, ", got ",
                                                   q.recompute_first_tokens));
  }
  if (q.drop_first_tokens < 0 || q.drop_first_tokens > kMaxDropFirstTokens) {
    return absl::InvalidArgumentError(absl::StrCat("drop_first_tokens must be in 0 .. ",
                                                   kMaxDropFirstTokens, ", got ",
                                                   q.drop_first_tokens));
  }
  if (q.drop_first_tokens > 0 && q.recompute_first_tokens > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drop_first_tokens (", q.drop_first_tokens, ") and recompute_first_tokens (",
        q.recompute_first_tokens, ") exclude each other: set one of them to 0"));
  }
  // Written so that NaN fails too.
  if (!(q.document_temperature >= 0.05f && q.document_temperature <= 20.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("document_temperature must be in [0.05, 20], got ", q.document_temperature));
  }
  if (!(q.document_scale >= 0.01f && q.document_scale <= 100.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("document_scale must be in [0.01, 100], got ", q.document_scale));
  }
  return q;
}

std::string_view AttentionModeName(AttentionMode mode) {
  switch (mode) {
    case AttentionMode::kLazy: return "lazy";
    case AttentionMode::kMaterialize: return "materialize";
    case AttentionMode::kPrefix: return "prefix";
    case AttentionMode::kFull: return "full";
  }
  return "?";
}

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kEos: return "eos";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "?";
}

}  // namespace lazyrag
