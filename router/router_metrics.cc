#include "router/router_metrics.h"

#include <string>

namespace lazyrag::router {

RouterMetrics::RouterMetrics(metrics::Registry* registry)
    : requests_(registry->AddCounter("lazyrag_router_requests_total",
                                     "Calls the router made to workers, by worker and outcome.")),
      affinity_hits_(registry
                         ->AddCounter("lazyrag_router_affinity_hits_total",
                                      "Requests routed to a worker holding some of their "
                                      "documents.")
                         .Add()),
      ttft_(registry
                ->AddHistogram("lazyrag_router_time_to_first_token_seconds",
                               "Seconds from a request's arrival at the router to its first "
                               "streamed message.",
                               metrics::ExponentialBuckets(0.001, 2, 16))
                .Add()),
      healthy_(registry->AddGauge("lazyrag_router_workers", "Workers known to the router.")
                   .Add({{"state", "healthy"}})),
      ejected_(registry->AddGauge("lazyrag_router_workers", "Workers known to the router.")
                   .Add({{"state", "ejected"}})) {
  requests_.Add({{"worker", "none"}, {"outcome", "failed"}});
}

namespace {
constexpr const char* kOutcomes[] = {"ok",    "retried",   "failed",
                                     "error", "cancelled", "deadline_exceeded"};
}  // namespace

void RouterMetrics::CountRequest(std::string_view worker, std::string_view outcome,
                                 bool affinity_hit) {
  requests_.Add({{"worker", std::string(worker)}, {"outcome", std::string(outcome)}}).Increment();
  if (affinity_hit) affinity_hits_.Increment();
}

void RouterMetrics::AddWorker(std::string_view worker) {
  for (const char* outcome : kOutcomes) {
    requests_.Add({{"worker", std::string(worker)}, {"outcome", outcome}});
  }
}

void RouterMetrics::SetWorkers(int healthy, int ejected) {
  healthy_.Set(healthy);
  ejected_.Set(ejected);
}

}  // namespace lazyrag::router
