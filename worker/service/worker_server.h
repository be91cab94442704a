// The worker process as one lifecycle object: runtime (model, backend, engine,
// optional store) + Inference gRPC service (with health and reflection) +
// /metrics endpoint. worker/main.cc is a thin shell around it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/auth_flags.h"
#include "common/metrics.h"
#include "common/tls.h"
#include "http/openai_http_server.h"
#include "worker/runtime/runtime.h"

namespace lazyrag {

class GrpcServer;
class TokenStore;
class InferenceService;
class PeerDocumentsService;
class WorkerHttpBackend;
namespace metrics {
class MetricsHttpServer;
}

struct WorkerServerOptions {
  // gRPC address HOST:PORT; port 0 picks one. Default loopback, picked port.
  std::string listen = "127.0.0.1:0";
  // Model, device, pool and scheduler settings (runtime.h documents their
  // defaults).
  RuntimeOptions runtime;
  // "" (no store: pool -> compute), "embedded:DIR" or
  // "HOST:PORT[,HOST:PORT...]".
  std::string kvstore;
  // Copies of every document over the kvstore shards (DocumentStoreOptions::replication);
  // 0: the client's default.
  int kvstore_replication = 0;
  // Deadlines of one kvstore Get and one Put (DocumentStoreOptions::call_timeout_s,
  // put_timeout_s). Defaults 10 s and 60 s.
  double kvstore_timeout_s = 10;
  double kvstore_put_timeout_s = 60;
  // The workers' key for MACs on stored document KV (worker/engine/document_mac.h), a file of
  // at least 32 bytes; "": no MACs.
  std::string kv_mac_key_file;
  // gRPC over TLS (common/tls.h) for this server, the kvstore shards and the peers; empty:
  // plaintext.
  TlsFiles tls;
  // Authentication (common/auth.h): auth.tokens_file checks callers on the gRPC and HTTP ports
  // (Inference: client or worker tokens; PeerDocuments: worker tokens only); auth.token_file is
  // this worker's own token, sent to the kvstore shards and peers; auth.namespaces lists the
  // public cache namespaces. All empty: no authentication.
  AuthFiles auth;
  // Peer workers of the same host (HOST:PORT of their gRPC address), asked for a
  // document before the kvstore (worker/peer/peer_store.h). Empty: none. Every
  // worker serves lazyrag.v1.PeerDocuments whatever this says.
  std::vector<std::string> peers;
  // Deadline of one document transfer from a peer. Default 5 s.
  double peer_timeout_s = 5;
  // Fast path (CUDA backends on GPUs of one host): how long a peer keeps a document pinned for
  // this worker's GPU-to-GPU copy without a release. Default 10 s.
  double peer_lease_s = 10;
  // false: documents from peers always travel as bytes (path 1), even GPU to GPU. Default true.
  bool peer_device_copy = true;
  // /metrics port; 0 picks one, -1 disables. Default 0.
  int metrics_port = 0;
  // Address /metrics binds. Default loopback: exposing it is a deployment choice (the chart
  // sets its listen address so Prometheus can scrape).
  std::string metrics_host = "127.0.0.1";
  // Largest max_tokens accepted. Default 4096.
  int max_tokens_limit = 4096;
  // PrepareDocuments caps per call (InferenceServiceOptions). Defaults 256 texts, 16 MiB.
  int max_prepare_texts = 256;
  int64_t max_prepare_bytes = 16 << 20;
  // The OpenAI-compatible HTTP API (http/openai_http_server.h): http.listen HOST:PORT serves it
  // (port 0 picks one, see http_port()); empty (the default) leaves it off.
  http::OpenAiHttpOptions http;
};

// Start() once, Shutdown(deadline) once (the destructor does it too). Not
// thread-safe.
class WorkerServer {
 public:
  explicit WorkerServer(WorkerServerOptions options);
  ~WorkerServer();
  WorkerServer(const WorkerServer &) = delete;
  WorkerServer &operator=(const WorkerServer &) = delete;

  // Loads the model, opens the store, then serves gRPC and /metrics.
  absl::Status Start();
  // Stops taking calls, lets running ones finish until `deadline`, then stops
  // the engine.
  void Shutdown(absl::Time deadline);

  // Valid after Start().
  std::string address() const;
  int metrics_port() const;
  // The HTTP API's port; 0 when it is off.
  int http_port() const;
  metrics::Registry &registry() { return registry_; }

 private:
  const WorkerServerOptions options_;
  metrics::Registry registry_;
  AuthMetrics auth_metrics_{&registry_};  // before tokens_, which counts into it
  std::unique_ptr<TokenStore> tokens_;
  std::unique_ptr<http::CallerAuthenticator> authenticator_;
  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<PeerDocumentsService> peer_service_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<WorkerHttpBackend> http_backend_;
  std::unique_ptr<http::OpenAiHttpServer> openai_;
  std::unique_ptr<metrics::MetricsHttpServer> http_;
  bool shut_down_ = false;
};

}  // namespace lazyrag
