// Serves a metrics::Registry as GET /metrics (Prometheus text format 0.0.4) over HTTP.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace lazyrag::metrics {

struct MetricsHttpOptions {
  // Address to bind. Default loopback; a server that should be scraped from another pod binds
  // its listen address (the Helm chart passes --metrics_host).
  std::string host = "127.0.0.1";
  // 0 picks a free port (read it back with port()).
  int port = 0;
};

// Lifecycle: Start() once, then Stop() (also run by the destructor). Thread-safe to scrape
// while the registry is updated. `registry` is not owned and must outlive this object.
class MetricsHttpServer {
 public:
  MetricsHttpServer(const Registry* registry, MetricsHttpOptions options);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds and starts serving on a background thread. UNAVAILABLE when the port is taken.
  absl::Status Start();
  // The bound port; valid after a successful Start().
  int port() const { return port_; }
  // Stops serving and joins the thread. Idempotent.
  void Stop();

 private:
  const Registry* registry_;
  const MetricsHttpOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace lazyrag::metrics
