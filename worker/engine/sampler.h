// Token sampling: greedy (temperature 0), temperature, top-k, top-p, seeded.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "absl/status/status.h"

namespace lazyrag {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 = off
  uint64_t seed = 0;

  // INVALID_ARGUMENT for NaN/negative temperature, top_p outside (0, 1], negative top_k.
  absl::Status Validate() const;
};

// Not thread-safe: one per request.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  int32_t Sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

int32_t ArgMax(std::span<const float> logits);

}  // namespace lazyrag
