// The router process as one lifecycle object: routing policy + worker connections + the
// Inference service (with health and reflection) + the optional OpenAI-compatible HTTP API +
// /metrics. router/main.cc is a thin shell.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/auth_flags.h"
#include "common/metrics.h"
#include "common/tls.h"
#include "http/openai_http_server.h"
#include "router/request_router.h"
#include "router/router_http_backend.h"
#include "router/router_service.h"
#include "router/routing_policy.h"
#include "router/worker_pool.h"
#include "router/worker_source.h"

namespace lazyrag {
class GrpcServer;
namespace metrics {
class MetricsHttpServer;
}
}  // namespace lazyrag

namespace lazyrag::router {

struct RouterServerOptions {
  // gRPC address, HOST:PORT; port 0 picks one (see port()). Default loopback, picked port.
  std::string listen = "127.0.0.1:0";
  // Workers: "HOST:PORT,..." or "dns:///NAME:PORT" (see worker_source.h). Required.
  std::string workers;
  // /metrics port; 0 picks one, -1 disables the endpoint. Default 0.
  int metrics_port = 0;
  // Address /metrics binds. Default loopback: exposing it is a deployment choice (the chart
  // sets its listen address so Prometheus can scrape).
  std::string metrics_host = "127.0.0.1";
  RoutingPolicyOptions policy;
  WorkerPoolOptions pool;
  RequestRouterOptions requests;
  // The OpenAI-compatible HTTP API (http/openai_http_server.h): http.listen HOST:PORT serves it
  // (port 0 picks one, see http_port()); empty (the default) leaves it off.
  http::OpenAiHttpOptions http;
  // gRPC over TLS (common/tls.h) for this server and, through pool.tls, to the workers; empty:
  // plaintext.
  TlsFiles tls;
  // Authentication (common/auth.h): auth.tokens_file checks clients on the gRPC and HTTP ports;
  // auth.token_file is the router's own worker token, sent to the workers; auth.namespaces the
  // public cache namespaces. All empty: no authentication.
  AuthFiles auth;
};

// Start() once, Shutdown(deadline) once (the destructor does it too). Not thread-safe.
class RouterServer {
 public:
  explicit RouterServer(RouterServerOptions options);
  ~RouterServer();
  RouterServer(const RouterServer&) = delete;
  RouterServer& operator=(const RouterServer&) = delete;

  // INVALID_ARGUMENT for a malformed worker list; UNAVAILABLE when a port cannot be bound.
  absl::Status Start();
  // Stops taking calls, lets running ones finish until `deadline`, then stops polling workers.
  void Shutdown(absl::Time deadline);

  // Valid after Start().
  int port() const;
  std::string address() const;
  int metrics_port() const;
  // The HTTP API's port; 0 when it is off.
  int http_port() const;
  metrics::Registry& registry() { return registry_; }
  RoutingPolicy& policy() { return *policy_; }

 private:
  const RouterServerOptions options_;
  metrics::Registry registry_;
  AuthMetrics auth_metrics_{&registry_};  // before tokens_, which counts into it
  std::unique_ptr<TokenStore> tokens_;
  std::unique_ptr<http::CallerAuthenticator> authenticator_;
  std::unique_ptr<RouterMetrics> metrics_;
  std::unique_ptr<RoutingPolicy> policy_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<RequestRouter> requests_;
  std::unique_ptr<RouterService> service_;
  std::unique_ptr<RouterHttpBackend> http_backend_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<http::OpenAiHttpServer> openai_;
  std::unique_ptr<metrics::MetricsHttpServer> http_;
};

}  // namespace lazyrag::router
