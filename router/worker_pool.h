// The router's connections to its workers: one channel per worker, and a background thread
// that re-resolves the worker set, health-checks every worker (grpc.health.v1.Health/Check)
// and polls its Stats, feeding the answers to the RoutingPolicy.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/tls.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_source.h"

namespace lazyrag::router {

struct WorkerPoolOptions {
  // How often every worker is health-checked and asked for Stats. Default 1 s.
  absl::Duration poll_interval = absl::Seconds(1);
  // Deadline of each health check and Stats call. Default 800 ms.
  absl::Duration poll_timeout = absl::Milliseconds(800);
  // How often the worker set is resolved again (DNS). Default 5 s.
  absl::Duration resolve_interval = absl::Seconds(5);
  // Largest message to and from workers, bytes. Default 16 MiB.
  int max_message_bytes = 16 << 20;
  // gRPC over TLS to the workers (common/tls.h); empty: plaintext.
  TlsFiles tls;
  // The router's worker token, sent on every worker call (common/auth.h); null: none.
  std::shared_ptr<BearerToken> auth_token;
};

// A failed health check (or a check answering anything but SERVING) ejects a worker; one
// SERVING answer readmits it. Thread safety: Stub() and Workers() from any thread; Start()
// and Stop() from one thread.
class WorkerPool {
 public:
  // `policy` and `metrics` are not owned and must outlive this object.
  WorkerPool(WorkerPoolOptions options, WorkerResolver resolver, RoutingPolicy* policy,
             RouterMetrics* metrics);
  ~WorkerPool();  // Stop()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Resolves the workers once, then starts the background thread. A name that does not
  // resolve yet is not an error (it is tried again every resolve_interval).
  absl::Status Start();
  // Stops the background thread (waits for its calls, bounded by poll_timeout). Idempotent.
  void Stop();

  // The stub of a known worker; null when the worker is no longer in the set. Its channel carries
  // no token: every call on it passes its context through AddAuthToken first.
  std::shared_ptr<lazyrag::v1::Inference::Stub> Stub(const std::string& worker) const;
  // Adds the router's worker token (options.auth_token; null: nothing) to `context`
  // (common/grpc_auth.h, AddBearerToken). REQUIRES: the call has not started.
  void AddAuthToken(grpc::ClientContext& context) const;
  std::vector<std::string> Workers() const;

  // Runs one round of health checks and Stats polls now and waits for it (tests, start-up).
  void PollOnce();

 private:
  struct Connection {
    std::shared_ptr<grpc::Channel> channel;
    std::shared_ptr<lazyrag::v1::Inference::Stub> stub;
  };

  void Run();
  void Resolve();

  const WorkerPoolOptions options_;
  const WorkerResolver resolver_;
  RoutingPolicy* const policy_;
  RouterMetrics* const metrics_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;  // set by Start()

  mutable absl::Mutex mu_;
  std::map<std::string, Connection> connections_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace lazyrag::router
