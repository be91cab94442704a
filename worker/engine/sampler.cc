#include "worker/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace lazyrag {

absl::Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f || temperature > 100.0f) {
    return absl::InvalidArgumentError("temperature must be a finite number in [0, 100]");
  }
  if (!std::isfinite(top_p) || !(top_p > 0.0f) || top_p > 1.0f) {
    return absl::InvalidArgumentError("top_p must be in (0, 1]");
  }
  if (top_k < 0) return absl::InvalidArgumentError("top_k must be >= 0");
  return absl::OkStatus();
}

int32_t ArgMax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f) return ArgMax(logits);
  const int n = int(logits.size());
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  int k = (params_.top_k > 0 && params_.top_k < n) ? params_.top_k : n;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  idx.resize(k);
  std::vector<double> p(k);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += p[i] = std::exp((logits[idx[i]] - mx) / params_.temperature);
  // Top-p: smallest prefix of the sorted distribution with mass >= top_p.
  double cum = 0;
  int keep = k;
  for (int i = 0; i < k; ++i) {
    cum += p[i] / sum;
    if (cum >= params_.top_p) {
      keep = i + 1;
      break;
    }
  }
  double total = 0;
  for (int i = 0; i < keep; ++i) total += p[i];
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (int i = 0; i < keep; ++i) {
    r -= p[i];
    if (r <= 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace lazyrag
