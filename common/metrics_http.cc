#include "common/metrics_http.h"

#include <httplib.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace lazyrag::metrics {

MetricsHttpServer::MetricsHttpServer(const Registry* registry, MetricsHttpOptions options)
    : registry_(registry), options_(std::move(options)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::Status MetricsHttpServer::Start() {
  if (server_ != nullptr) return absl::FailedPreconditionError("metrics server already started");
  auto server = std::make_unique<httplib::Server>();
  // One request per connection: a scraper that keeps its connection open would otherwise hold
  // a handler thread, and so Stop(), for httplib's keep-alive timeout (5 s). Prometheus scrapes
  // every few seconds at most, so reusing connections saves nothing that matters.
  server->set_keep_alive_max_count(1);
  const Registry* registry = registry_;
  server->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    std::string body = registry->Serialize();
    AppendBuildInfo(&body);
    AppendProcessMetrics(&body);
    res.set_content(body, "text/plain; version=0.0.4; charset=utf-8");
  });
  int port = options_.port;
  if (port == 0) {
    port = server->bind_to_any_port(options_.host);
  } else if (!server->bind_to_port(options_.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot bind ", options_.host, ":", options_.port));
  }
  port_ = port;
  server_ = std::move(server);
  thread_ = std::thread([s = server_.get()] { s->listen_after_bind(); });
  // httplib's stop() is a no-op until the listen loop runs; wait for it so Stop() works.
  auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::OkStatus();
}

void MetricsHttpServer::Stop() {
  if (server_ == nullptr) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace lazyrag::metrics
