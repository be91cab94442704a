// lazyrag-router: the front door. Serves the Inference API and sends each request to the worker
// that holds its documents, against load (DESIGN.md section 3).
//   lazyrag-router --listen HOST:PORT --workers HOST:PORT,...|dns:///NAME:PORT --metrics_port N
//                  [--load_weight W] [--imbalance_threshold N]
//                  [--http_listen HOST:PORT]
// Prints one line "lazyrag-router ready grpc=HOST:PORT metrics=PORT [http=PORT]" on stdout once
// serving (ports resolved when 0 was asked), then runs until SIGINT or SIGTERM.
#include <cstdio>
#include <iostream>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "common/auth_flags.h"
#include "common/binary_flags.h"
#include "common/logging.h"
#include "common/server_main.h"
#include "common/tls_flags.h"
#include "router/router_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, workers, "",
          "workers: HOST:PORT,HOST:PORT,... or dns:///NAME:PORT (every address of NAME, "
          "re-resolved every --resolve_interval_s); required");
ABSL_FLAG(std::string, http_listen, "",
          "address HOST:PORT of the OpenAI-compatible HTTP API (/v1/chat/completions, "
          "/v1/completions, /v1/models, /health); port 0 picks one; empty: off");
ABSL_FLAG(int, metrics_port, 0, "port of the /metrics endpoint; 0 picks one, -1 disables");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "address the /metrics endpoint binds (loopback by default; 0.0.0.0 or :: to be scraped)");
ABSL_FLAG(double, load_weight, 128,
          "document tokens one request of load is worth: cost = missing document tokens + "
          "load_weight x (running + waiting)");
ABSL_FLAG(int, imbalance_threshold, 8,
          "when max - min worker load (requests) exceeds this, the least-loaded worker wins "
          "over document affinity");
ABSL_FLAG(int64_t, default_document_tokens, 512,
          "size assumed for a document id whose size the router has not learned");
ABSL_FLAG(int, max_attempts, 3, "workers a request is tried on before its first token");
ABSL_FLAG(double, poll_interval_s, 1, "seconds between health checks and Stats polls");
ABSL_FLAG(double, poll_timeout_s, 0.8, "deadline of each health check and Stats poll");
ABSL_FLAG(double, resolve_interval_s, 5, "seconds between DNS resolutions of --workers");
ABSL_FLAG(double, shutdown_grace_s, 10, "seconds running calls get to finish at shutdown");

int main(int argc, char** argv) {
  const lazyrag::BinaryCommandLine command_line = lazyrag::ParseBinaryCommandLine(
      argc, argv, "lazyrag-router",
      "lazyrag-router --listen HOST:PORT --workers HOST:PORT,...|dns:///NAME:PORT "
      "--metrics_port N [--http_listen HOST:PORT] [--load_weight W] [--imbalance_threshold N]");
  if (command_line.exit_code >= 0) return command_line.exit_code;

  lazyrag::router::RouterServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.workers = absl::GetFlag(FLAGS_workers);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.tls = lazyrag::TlsFilesFromFlags();
  options.auth = lazyrag::AuthFilesFromFlags();
  options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  options.policy.load_weight = absl::GetFlag(FLAGS_load_weight);
  options.policy.imbalance_threshold = absl::GetFlag(FLAGS_imbalance_threshold);
  options.policy.default_document_tokens = absl::GetFlag(FLAGS_default_document_tokens);
  options.requests.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  options.http.listen = absl::GetFlag(FLAGS_http_listen);
  options.pool.poll_interval = absl::Seconds(absl::GetFlag(FLAGS_poll_interval_s));
  options.pool.poll_timeout = absl::Seconds(absl::GetFlag(FLAGS_poll_timeout_s));
  options.pool.resolve_interval = absl::Seconds(absl::GetFlag(FLAGS_resolve_interval_s));
  if (options.workers.empty()) {
    std::cerr << "lazyrag-router: --workers is required\n";
    return 2;
  }
  if (options.policy.load_weight < 0 || options.policy.imbalance_threshold < 0 ||
      options.requests.max_attempts < 1 || options.pool.poll_interval <= absl::ZeroDuration() ||
      options.pool.poll_timeout <= absl::ZeroDuration()) {
    std::cerr << "lazyrag-router: --load_weight and --imbalance_threshold must be >= 0, "
                 "--max_attempts >= 1, the intervals > 0\n";
    return 2;
  }

  return lazyrag::RunServerUntilSignal(
      "lazyrag-router", [&] { return std::make_unique<lazyrag::router::RouterServer>(options); },
      absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_s)));
}
