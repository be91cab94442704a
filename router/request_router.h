// The router's one implementation of the Inference calls, shared by its front doors (the gRPC
// RouterService and the OpenAI-compatible HTTP API): turns a request into the documents the
// RoutingPolicy ranks workers by, calls the chosen worker, relays the stream, and retries on
// another worker when the chosen one fails before its first message. Knows nothing of the front
// doors' servers: the caller says how a worker call's context is made (deadline, cancellation) and
// where streamed messages go.
#pragma once

#include <grpcpp/client_context.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/cancellation.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_pool.h"

namespace lazyrag::router {

struct RequestRouterOptions {
  // Workers one request is tried on at most (a failure before the first message moves it to the
  // next). Default 3.
  int max_attempts = 3;
  // Deadline of each worker's Stats call when the caller's is later. Default 2 s.
  absl::Duration stats_timeout = absl::Seconds(2);
  // Public cache namespaces (common/auth.h); a client's other namespaces live in its tenant's.
  NamespacePolicy namespaces;
};

// How one call reaches the workers, given by the front door.
struct WorkerCallOptions {
  // Makes the context of each worker call (one per attempt): its deadline and, for the gRPC front
  // door, the propagation of the client's cancellation (grpc::ClientContext::FromServerContext).
  // The router's own token is added to it afterwards (WorkerPool::AddAuthToken). Required.
  std::function<std::unique_ptr<grpc::ClientContext>()> new_context;
  // Raised when the client goes away; cancels the running worker call. Not owned; may be null.
  Cancellation* cancellation = nullptr;
  // Whether the client has gone (polled when a worker call ends); may be null.
  std::function<bool()> client_gone;
  // Who called (Identity{} without authentication): a client's request is sent to the worker in
  // the namespace EffectiveNamespace derives from its tenant, under the router's own token.
  Identity caller;
};

// Errors: the worker's status is passed through unchanged (INVALID_ARGUMENT, NOT_FOUND,
// RESOURCE_EXHAUSTED when every worker tried was full, DEADLINE_EXCEEDED, CANCELLED), except
//   INVALID_ARGUMENT  a document with neither text nor id (checked here, the router needs a key);
//   UNAVAILABLE       no healthy worker, every worker tried failed before its first message,
//                     or the worker failed after the stream had started (never retried: the
//                     client has seen part of the answer);
//   CANCELLED         the client went away.
// Thread safety: called concurrently; the dependencies are thread-safe and not owned.
class RequestRouter {
 public:
  // Receives each streamed message in order, on the calling thread; returns false when the client
  // cannot take it (the worker call is then cancelled and the call ends CANCELLED).
  using MessageSink = std::function<bool(const lazyrag::v1::GenerateResponse&)>;

  RequestRouter(RequestRouterOptions options, RoutingPolicy* policy, WorkerPool* pool,
                RouterMetrics* metrics);

  absl::Status Generate(const lazyrag::v1::GenerateRequest& request, const WorkerCallOptions& call,
                        const MessageSink& on_message);
  absl::Status PrepareDocuments(const lazyrag::v1::PrepareDocumentsRequest& request,
                                const WorkerCallOptions& call,
                                lazyrag::v1::PrepareDocumentsResponse* response);
  // Asks every healthy worker at once (each until min(deadline, now + stats_timeout)) and sums the
  // answers; UNAVAILABLE when none answers. An authenticated client's call lists only its own
  // documents (the workers are asked for_tenant its tenant).
  absl::Status Stats(const lazyrag::v1::StatsRequest& request, absl::Time deadline,
                     lazyrag::v1::StatsResponse* response, const Identity& caller = {});
  // OK when at least one worker is healthy, else UNAVAILABLE.
  absl::Status Health() const;

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
  // policy's view of the workers (Finish, ejection) and the request counters up to date. `what`
  // names the call in the debug log.
  absl::Status WithRetries(const std::string& what, const std::vector<DocumentRef>& documents,
                           const AttemptFn& attempt);

  const RequestRouterOptions options_;
  RoutingPolicy* const policy_;
  WorkerPool* const pool_;
  RouterMetrics* const metrics_;
};

}  // namespace lazyrag::router
