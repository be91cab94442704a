#include "worker/engine/fetch_cost.h"

#include <algorithm>

namespace lazyrag {

void FetchCostModel::ObserveCompute(int64_t tokens, double seconds) {
  if (tokens <= 0 || seconds <= 0) return;
  const double x = double(tokens), d = options_.step_decay;
  absl::MutexLock l(&mu_);
  w_ = d * w_ + 1;
  sx_ = d * sx_ + x;
  sy_ = d * sy_ + seconds;
  sxx_ = d * sxx_ + x * x;
  sxy_ = d * sxy_ + x * seconds;
}

void FetchCostModel::ObserveFetch(int64_t tokens, double seconds) {
  if (tokens <= 0 || seconds <= 0) return;
  absl::MutexLock l(&mu_);
  const double sample = seconds / double(tokens);
  fetch_ = fetch_ == 0 ? sample : (1 - options_.smoothing) * fetch_ + options_.smoothing * sample;
}

void FetchCostModel::ObserveHostCopy(int64_t tokens, double seconds) {
  if (tokens <= 0 || seconds <= 0) return;
  absl::MutexLock l(&mu_);
  const double sample = seconds / double(tokens);
  host_ = host_ == 0 ? sample : (1 - options_.smoothing) * host_ + options_.smoothing * sample;
}

double FetchCostModel::PredictHostSeconds(int64_t tokens) const {
  absl::ReaderMutexLock l(&mu_);
  return host_ * double(std::max<int64_t>(0, tokens));
}

bool FetchCostModel::PreferComputeToHost(int64_t tokens, int64_t host_backlog_tokens) {
  absl::MutexLock l(&mu_);
  const double compute = ComputeLocked(tokens);
  const double host = host_ * double(tokens + std::max<int64_t>(0, host_backlog_tokens));
  if (compute == 0 || host == 0 || host <= options_.margin * compute) {
    host_skipped_in_a_row_ = 0;
    return false;
  }
  if (++host_skipped_in_a_row_ >= options_.probe_every) {
    host_skipped_in_a_row_ = 0;
    return false;  // a probe: promote this one to refresh the estimate
  }
  return true;
}

double FetchCostModel::ComputeLocked(int64_t tokens) const {
  if (w_ == 0 || tokens <= 0) return 0;
  const double n = double(tokens);
  const double mean_x = sx_ / w_, mean_y = sy_ / w_;
  const double var_x = sxx_ / w_ - mean_x * mean_x;
  // A slope needs steps of different sizes: a spread of at least one token (standard
  // deviation) and relative to the mean, else the line is noise.
  if (var_x >= std::max(1.0, 1e-4 * mean_x * mean_x)) {
    const double b = (sxy_ / w_ - mean_x * mean_y) / var_x;
    const double a = std::max(0.0, mean_y - b * mean_x);
    if (b > 0) {
      const int64_t chunk = std::max<int64_t>(1, options_.chunk_tokens);
      return double((tokens + chunk - 1) / chunk) * a + b * n;
    }
  }
  return n * mean_y / mean_x;
}

double FetchCostModel::PredictComputeSeconds(int64_t tokens) const {
  absl::ReaderMutexLock l(&mu_);
  return ComputeLocked(tokens);
}

double FetchCostModel::PredictFetchSeconds(int64_t tokens) const {
  absl::ReaderMutexLock l(&mu_);
  return fetch_ * double(std::max<int64_t>(0, tokens));
}

double FetchCostModel::HedgeAfterSeconds(int64_t tokens) const {
  absl::ReaderMutexLock l(&mu_);
  const double compute = ComputeLocked(tokens);
  if (compute == 0) return 0;
  return std::max(options_.hedge_floor_seconds, options_.hedge_factor * compute);
}

bool FetchCostModel::PreferCompute(int64_t tokens, int64_t fetch_backlog_tokens) {
  absl::MutexLock l(&mu_);
  const double compute = ComputeLocked(tokens);
  const double fetch = fetch_ * double(tokens + std::max<int64_t>(0, fetch_backlog_tokens));
  if (compute == 0 || fetch == 0 || fetch <= options_.margin * compute) {
    skipped_in_a_row_ = 0;
    return false;
  }
  if (++skipped_in_a_row_ >= options_.probe_every) {
    skipped_in_a_row_ = 0;
    return false;  // a probe: fetch this one to refresh the estimate
  }
  return true;
}

}  // namespace lazyrag
