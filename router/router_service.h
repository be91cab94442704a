// The router's Inference service: the same API as a worker. A thin adapter: it turns a request
// into the documents the RoutingPolicy ranks workers by, calls the chosen worker with the
// client's deadline and cancellation, relays the stream, and retries on another worker when
// the chosen one fails before its first message.
#pragma once

#include <grpcpp/server_context.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_pool.h"

namespace lazyrag::router {

struct RouterServiceOptions {
  // Workers one request is tried on at most (a failure before the first message moves it to
  // the next). Default 3.
  int max_attempts = 3;
  // Deadline of each worker's Stats call when the client sets none. Default 2 s.
  absl::Duration stats_timeout = absl::Seconds(2);
};

// Errors: the worker's status is passed through unchanged (INVALID_ARGUMENT, NOT_FOUND,
// RESOURCE_EXHAUSTED when every worker tried was full, DEADLINE_EXCEEDED, CANCELLED), except
//   INVALID_ARGUMENT  a document with neither text nor id (checked here, the router needs a key);
//   UNAVAILABLE       no healthy worker, every worker tried failed before its first message,
//                     or the worker failed after the stream had started (never retried: the
//                     client has seen part of the answer).
// Thread safety: called concurrently by gRPC; the dependencies are thread-safe and not owned.
class RouterService final : public lazyrag::v1::Inference::Service {
 public:
  RouterService(RouterServiceOptions options, RoutingPolicy* policy, WorkerPool* pool,
                RouterMetrics* metrics);

  grpc::Status Generate(grpc::ServerContext* context, const lazyrag::v1::GenerateRequest* request,
                        grpc::ServerWriter<lazyrag::v1::GenerateResponse>* writer) override;
  grpc::Status PrepareDocuments(grpc::ServerContext* context,
                                const lazyrag::v1::PrepareDocumentsRequest* request,
                                lazyrag::v1::PrepareDocumentsResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const lazyrag::v1::StatsRequest* request,
                     lazyrag::v1::StatsResponse* response) override;

 private:
  // What one worker call came to (AttemptFn's answer).
  struct Attempt {
    absl::Status status;
    bool streamed = false;  // messages already reached the client: no retry
    bool client_cancelled = false;
    std::vector<std::string> document_ids;  // on success: what the worker now holds
  };
  using AttemptFn = std::function<Attempt(lazyrag::v1::Inference::Stub& stub)>;
  // Routes `documents` and calls `attempt` on the chosen worker, then on the next one while a
  // worker fails before its first message (up to options_.max_attempts workers), keeping the
  // policy's view of the workers (Finish, ejection) and the request counters up to date.
  // `what` names the call in the debug log.
  grpc::Status WithRetries(const std::string& what, const std::vector<DocumentRef>& documents,
                           const AttemptFn& attempt);

  const RouterServiceOptions options_;
  RoutingPolicy* const policy_;
  WorkerPool* const pool_;
  RouterMetrics* const metrics_;
};

}  // namespace lazyrag::router
