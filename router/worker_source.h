// Where the router's workers come from: a fixed list, or a DNS name (a Kubernetes headless
// Service) whose addresses are the workers, re-resolved periodically. No gRPC here.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lazyrag::router {

struct WorkerSpec {
  // A fixed list of "HOST:PORT" (used as given; the channel resolves HOST).
  std::vector<std::string> addresses;
  // Set for "dns:///NAME:PORT": every address NAME resolves to is a worker on PORT.
  std::string dns_name;
  int dns_port = 0;
  bool is_dns() const { return !dns_name.empty(); }
};

// Parses --workers: "HOST:PORT,HOST:PORT,..." or "dns:///NAME:PORT" (also "dns:NAME:PORT").
// INVALID_ARGUMENT when empty or malformed.
absl::StatusOr<WorkerSpec> ParseWorkerSpec(const std::string& text);

// The current worker addresses ("IP:PORT", "[IPv6]:PORT" or the fixed list), sorted and
// without duplicates. For DNS: UNAVAILABLE when the name does not resolve (the caller keeps
// the previous set).
using WorkerResolver = std::function<absl::StatusOr<std::vector<std::string>>()>;

// A resolver for `spec` using the system resolver (getaddrinfo).
WorkerResolver MakeWorkerResolver(WorkerSpec spec);

}  // namespace lazyrag::router
