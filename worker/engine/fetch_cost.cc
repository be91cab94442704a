#include "worker/engine/fetch_cost.h"

namespace lazyrag {
namespace {

void Blend(double* average, double sample, double weight) {
  *average = *average == 0 ? sample : (1 - weight) * *average + weight * sample;
}

}  // namespace

void FetchCostModel::ObserveCompute(int64_t tokens, double seconds) {
  if (tokens < options_.min_compute_tokens || seconds <= 0) return;
  absl::MutexLock l(&mu_);
  Blend(&compute_, seconds / double(tokens), options_.smoothing);
}

void FetchCostModel::ObserveFetch(int64_t tokens, double seconds) {
  if (tokens <= 0 || seconds <= 0) return;
  absl::MutexLock l(&mu_);
  Blend(&fetch_, seconds / double(tokens), options_.smoothing);
}

bool FetchCostModel::PreferCompute() {
  absl::MutexLock l(&mu_);
  if (compute_ == 0 || fetch_ == 0 || fetch_ <= options_.margin * compute_) {
    skipped_in_a_row_ = 0;
    return false;
  }
  if (++skipped_in_a_row_ >= options_.probe_every) {
    skipped_in_a_row_ = 0;
    return false;  // a probe: fetch this one to refresh the estimate
  }
  return true;
}

double FetchCostModel::compute_s_per_token() const {
  absl::MutexLock l(&mu_);
  return compute_;
}

double FetchCostModel::fetch_s_per_token() const {
  absl::MutexLock l(&mu_);
  return fetch_;
}

}  // namespace lazyrag
