// Fetch or compute: whether a document missing from the KV pool is cheaper to fetch from the
// kvstore or to recompute (DESIGN section 3: the store tier is there to save time). On a CPU
// worker recomputing SmolLM2 costs ~3 ms a token while the kvstore moves a token's KV in
// ~0.1 ms, so fetching wins; on an H200 the 8B model prefills ~30,000 tokens/s while the
// kvstore (~0.5 GB/s, 131 KB of KV a token) moves ~4,000, so recomputing wins by 7x.
//
// The model keeps two moving averages in seconds per token: compute, from forward steps that
// returned logits (the backend has synchronised, so their wall time is the device's), and
// fetch, from kvstore hits (the whole Get: RPC, checksums, copies). It prefers compute when
// fetching is predicted to take more than `margin` times as long; every `probe_every`-th such
// decision fetches anyway, so a store that got faster is noticed. Until both averages exist
// it always fetches. Thread-safe.
#pragma once

#include <cstdint>

#include "absl/synchronization/mutex.h"

namespace lazyrag {

struct FetchCostOptions {
  double margin = 1.25;          // prefer compute only when fetch > margin x compute
  int probe_every = 8;           // every n-th "compute" decision fetches anyway
  double smoothing = 0.2;        // weight of a new observation in the moving averages
  int64_t min_compute_tokens = 32;  // smaller steps are launch-bound, not throughput
};

class FetchCostModel {
 public:
  explicit FetchCostModel(FetchCostOptions options = {}) : options_(options) {}

  // A forward step of `tokens` tokens that took `seconds` (logits on the host).
  void ObserveCompute(int64_t tokens, double seconds);
  // A kvstore hit for a document of `tokens` tokens that took `seconds`.
  void ObserveFetch(int64_t tokens, double seconds);
  // True: compute the document instead of fetching it from the kvstore.
  bool PreferCompute();

  // Seconds per token; 0 when not observed yet.
  double compute_s_per_token() const;
  double fetch_s_per_token() const;

 private:
  const FetchCostOptions options_;
  mutable absl::Mutex mu_;
  double compute_ ABSL_GUARDED_BY(mu_) = 0;
  double fetch_ ABSL_GUARDED_BY(mu_) = 0;
  int skipped_in_a_row_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazyrag
