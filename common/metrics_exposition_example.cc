// Prints a registry with every metric kind, awkward label values and help text, for
// `promtool check metrics` (ctest metrics_promtool_check).
#include <iostream>

#include "common/metrics.h"

int main() {
  lazyrag::metrics::Registry registry;
  auto& requests = registry.AddCounter("lazyrag_example_requests_total",
                                       "Requests by op and result.\nSecond line \\ backslash.");
  requests.Add({{"op", "put"}, {"result", "ok"}}).Increment(3);
  requests.Add({{"op", "get"}, {"result", "quote\"back\\slash\nnewline"}}).Increment();
  registry.AddGauge("lazyrag_example_bytes", "Bytes held.").Add().Set(268435456);
  auto& latency = registry.AddHistogram("lazyrag_example_fetch_seconds", "Fetch latency.");
  auto& h = latency.Add({{"tier", "store"}});
  for (double v : {0.001, 0.02, 0.3, 7.0, 42.0}) h.Observe(v);
  latency.Add({{"tier", "host"}});
  std::cout << registry.Serialize();
  return 0;
}
