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
