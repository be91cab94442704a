#include "router/router_server.h"

#include <thread>

#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/status.h"
#include "common/tls.h"

namespace lazyrag::router {

RouterServer::RouterServer(RouterServerOptions options) : options_(std::move(options)) {}

RouterServer::~RouterServer() { Shutdown(absl::Now()); }

absl::Status RouterServer::Start() {
  if (grpc_ != nullptr) return absl::FailedPreconditionError("router already started");
  absl::StatusOr<WorkerSpec> spec = ParseWorkerSpec(options_.workers);
  if (!spec.ok()) return spec.status();
  auto credentials = ServerCredentialsFor(options_.tls);
  if (!credentials.ok()) return credentials.status();
  WorkerPoolOptions pool_options = options_.pool;
  pool_options.tls = options_.tls;
  RETURN_IF_ERROR(ValidateNamespacePolicy(options_.auth.namespaces));
  ASSIGN_OR_RETURN(tokens_, OpenTokenStore(options_.auth.tokens_file, &auth_metrics_));
  ASSIGN_OR_RETURN(pool_options.auth_token, OpenBearerToken(options_.auth.token_file));
  RequestRouterOptions request_options = options_.requests;
  request_options.namespaces = options_.auth.namespaces;

  metrics_ = std::make_unique<RouterMetrics>(&registry_);
  policy_ = std::make_unique<RoutingPolicy>(options_.policy);
  pool_ = std::make_unique<WorkerPool>(pool_options, MakeWorkerResolver(*spec), policy_.get(),
                                       metrics_.get());
  requests_ =
      std::make_unique<RequestRouter>(request_options, policy_.get(), pool_.get(), metrics_.get());
  service_ = std::make_unique<RouterService>(requests_.get(), tokens_.get());
  if (tokens_ != nullptr) {
    authenticator_ = std::make_unique<http::TokenStoreAuthenticator>(tokens_.get());
  }
  http_backend_ = std::make_unique<RouterHttpBackend>(requests_.get());
  if (!options_.http.listen.empty() && options_.tls.enabled()) {
    return absl::InvalidArgumentError(
        "--http_listen serves plain HTTP only; it cannot be combined with --tls_cert (put a "
        "TLS-terminating proxy in front of it)");
  }
  if (absl::Status s = pool_->Start(); !s.ok()) return s;

  GrpcServerOptions grpc_options;
  grpc_options.listen = options_.listen;
  grpc_options.max_receive_message_bytes = options_.pool.max_message_bytes;
  grpc_options.max_send_message_bytes = options_.pool.max_message_bytes;
  grpc_options.credentials = std::move(*credentials);
  grpc_ = std::make_unique<GrpcServer>(grpc_options);
  grpc_->AddService(service_.get());
  if (absl::Status s = grpc_->Start(); !s.ok()) {
    pool_->Stop();
    return s;
  }
  if (!options_.http.listen.empty()) {
    openai_ = std::make_unique<http::OpenAiHttpServer>(http_backend_.get(), options_.http,
                                                       authenticator_.get());
    if (absl::Status s = openai_->Start(); !s.ok()) {
      grpc_->Shutdown(absl::Now());
      pool_->Stop();
      return s;
    }
  }
  if (options_.metrics_port >= 0) {
    metrics::MetricsHttpOptions http_options;
    http_options.host = options_.metrics_host;
    http_options.port = options_.metrics_port;
    http_ = std::make_unique<metrics::MetricsHttpServer>(&registry_, http_options);
    if (absl::Status s = http_->Start(); !s.ok()) {
      if (openai_ != nullptr) openai_->Shutdown(absl::Now());
      grpc_->Shutdown(absl::Now());
      pool_->Stop();
      return s;
    }
  }
  LOG_INFO.With("grpc", grpc_->address())
          .With("metrics_port", metrics_port())
          .With("http_port", http_port())
          .With("discovery", spec->is_dns() ? "dns" : "static")
          .With("workers", options_.workers)
          .With("static_workers", spec->addresses.size())
          .With("resolve_interval_s", absl::ToDoubleSeconds(options_.pool.resolve_interval))
          .With("poll_interval_s", absl::ToDoubleSeconds(options_.pool.poll_interval))
          .With("max_attempts", options_.requests.max_attempts)
          .With("tls", options_.tls.enabled())
      << "lazyrag-router: serving";
  return absl::OkStatus();
}

void RouterServer::Shutdown(absl::Time deadline) {
  // Both front doors drain at once: HTTP on its own thread while gRPC waits.
  std::thread openai_drain;
  if (openai_ != nullptr) {
    openai_drain = std::thread([this, deadline] { openai_->Shutdown(deadline); });
  }
  if (grpc_ != nullptr) grpc_->Shutdown(deadline);
  if (openai_drain.joinable()) openai_drain.join();
  if (http_ != nullptr) http_->Stop();
  if (pool_ != nullptr) pool_->Stop();
}

int RouterServer::port() const { return grpc_ != nullptr ? grpc_->port() : 0; }
std::string RouterServer::address() const { return grpc_ != nullptr ? grpc_->address() : ""; }
int RouterServer::http_port() const { return openai_ != nullptr ? openai_->port() : 0; }
int RouterServer::metrics_port() const { return http_ != nullptr ? http_->port() : -1; }

}  // namespace lazyrag::router
