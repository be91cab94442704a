// Fetch or compute: whether a document missing from the KV pool is cheaper to fetch from the
// kvstore or to recompute (DESIGN section 3: the store tier is there to save time). On a CPU
// worker recomputing SmolLM2 costs ~3 ms a token while the kvstore moves a token's KV in
// ~0.1 ms, so fetching wins; on an H200 the 8B model prefills a 2,048-token document in ~75 ms
// while the kvstore (~0.5 GB/s, 131 KB of KV a token) takes ~0.5 s, so recomputing wins by 7x.
//
// Compute: a least-squares line through the forward steps seen so far, step seconds = a + b x
// tokens, with older steps fading (step_decay per step). A GPU step is mostly a fixed cost
// (the weights read once: ~5 ms for the 8B model at 1 to 48 tokens) plus a small cost per
// token, so dividing a small step's time by its tokens overstates what a token of a document
// costs by 5-10x; the line does not. A document of n tokens is predicted to take
// ceil(n / chunk_tokens) steps: ceil(n / chunk) x a + b x n. While every step seen had about
// the same size (no slope), or the slope came out negative (noise), the prediction falls back to
// n x (the steps' mean seconds per token), which overstates and so leans to fetching.
// Fetch: a moving average of seconds per token over kvstore hits (the whole Get: RPC,
// checksums, copies); documents already queued for the single fetch thread are waited for
// first, so they count too.
// Compute is preferred when the fetch is predicted to take more than `margin` times as long;
// every `probe_every`-th such decision fetches anyway, so a store that got faster is noticed.
// Until a fetch and a step have been seen it always fetches. A fetch that has run longer than
// HedgeAfterSeconds (hedge_factor x the predicted compute, at least hedge_floor_seconds) is
// given up for a compute by the scheduler (a hedge: the first fetches, probes and a store that
// slowed down, e.g. under write-backs, then cost a request at most that long).
// Host tier: a moving average of seconds per token over promotions (the copy from host memory
// into the pool, checksum included, with the copies queued before it); a document in the host
// tier is recomputed instead only when its promotion, behind the promotions in flight, is
// predicted to take more than `margin` times its compute (on an H200 a promotion is ~10x faster
// than recomputing, so in practice it never is), with the same probes. Thread-safe.
#pragma once

#include <cstdint>

#include "absl/synchronization/mutex.h"

namespace lazyrag {

struct FetchCostOptions {
  double margin = 1.25;              // prefer compute only when fetch > margin x compute
  int probe_every = 8;               // every n-th "compute" decision fetches anyway
  double smoothing = 0.2;            // weight of a new fetch observation in its moving average
  double step_decay = 0.99;          // weight an older step keeps in the line per newer step
  int64_t chunk_tokens = 2048;       // prefill chunk (EngineOptions::prefill_chunk)
  double hedge_factor = 2.0;         // compute a document whose fetch has run this many times
  double hedge_floor_seconds = 0.2;  // its predicted compute, and at least this long
};

class FetchCostModel {
 public:
  explicit FetchCostModel(FetchCostOptions options = {}) : options_(options) {}

  // A forward step of `tokens` tokens that took `seconds` (outputs on the host).
  void ObserveCompute(int64_t tokens, double seconds);
  // A kvstore hit for a document of `tokens` tokens that took `seconds`.
  void ObserveFetch(int64_t tokens, double seconds);
  // True: compute the document of `tokens` tokens instead of fetching it from the kvstore,
  // behind `fetch_backlog_tokens` tokens of documents already waiting for the fetch thread.
  bool PreferCompute(int64_t tokens, int64_t fetch_backlog_tokens = 0);
  // A promotion from the host tier of a document of `tokens` tokens that took `seconds`.
  void ObserveHostCopy(int64_t tokens, double seconds);
  // True: compute the document of `tokens` tokens instead of promoting it from the host tier,
  // behind `host_backlog_tokens` tokens of promotions in flight. False until a promotion and a
  // step have been seen.
  bool PreferComputeToHost(int64_t tokens, int64_t host_backlog_tokens = 0);
  double PredictHostSeconds(int64_t tokens) const;

  // Predicted seconds; 0 when nothing has been observed yet.
  double PredictComputeSeconds(int64_t tokens) const;
  double PredictFetchSeconds(int64_t tokens) const;
  // Seconds after which a running fetch of a `tokens`-token document should be given up for a
  // compute; 0 (never) while no step has been seen.
  double HedgeAfterSeconds(int64_t tokens) const;

 private:
  double ComputeLocked(int64_t tokens) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const FetchCostOptions options_;
  mutable absl::Mutex mu_;
  // Decayed sums over steps (x = tokens, y = seconds) for the line.
  double w_ ABSL_GUARDED_BY(mu_) = 0, sx_ ABSL_GUARDED_BY(mu_) = 0, sy_ ABSL_GUARDED_BY(mu_) = 0;
  double sxx_ ABSL_GUARDED_BY(mu_) = 0, sxy_ ABSL_GUARDED_BY(mu_) = 0;
  double fetch_ ABSL_GUARDED_BY(mu_) = 0;  // seconds per token
  double host_ ABSL_GUARDED_BY(mu_) = 0;   // seconds per token
  int skipped_in_a_row_ ABSL_GUARDED_BY(mu_) = 0;
  int host_skipped_in_a_row_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazyrag
