// The router's Prometheus metrics (DESIGN.md section 7), registered on one Registry.
#pragma once

#include <string_view>

#include "common/metrics.h"

namespace lazyrag::router {

// Thread-safe; references into `registry`, which must outlive this object.
class RouterMetrics {
 public:
  explicit RouterMetrics(metrics::Registry* registry);

  // lazyrag_router_requests_total{worker, outcome}: one per call the router made to a worker.
  // Outcomes: "ok"; "retried" (failed before its first token, tried on another worker);
  // "failed" (a worker failure after the stream started, or with no worker left to try);
  // "error" (the worker's answer, passed to the client: invalid argument, not found, ...);
  // "cancelled", "deadline_exceeded" (by the client). worker="none": no healthy worker.
  // `affinity_hit`: the call went to a worker that held at least one of the request's
  // documents; lazyrag_router_affinity_hits_total counts those calls, at the same moment, so
  //   affinity_hits_total / router_requests_total{worker!="none"}
  // is a ratio in [0, 1] over any window.
  void CountRequest(std::string_view worker, std::string_view outcome, bool affinity_hit = false);
  // Creates every outcome's series of `worker` at zero (a worker the router learnt of):
  // rate() misses the first increment of a series that appears on first use.
  void AddWorker(std::string_view worker);
  metrics::Counter& affinity_hits() { return affinity_hits_; }
  // lazyrag_router_time_to_first_token_seconds: from the request's arrival at the router to
  // the first streamed message (includes routing, retries and the worker's TTFT).
  metrics::Histogram& time_to_first_token() { return ttft_; }
  // lazyrag_router_workers{state="healthy|ejected"}.
  void SetWorkers(int healthy, int ejected);

 private:
  metrics::Family<metrics::Counter>& requests_;
  metrics::Counter& affinity_hits_;
  metrics::Histogram& ttft_;
  metrics::Gauge& healthy_;
  metrics::Gauge& ejected_;
};

}  // namespace lazyrag::router
