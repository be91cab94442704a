// The kvstore shard process as one lifecycle object: engine + gRPC service (with health and
// reflection) + /metrics endpoint. kvstore/main.cc is a thin shell around it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/metrics.h"
#include "common/tls.h"
#include "kvstore/kv_engine.h"

namespace lazyrag {
class GrpcServer;
class TokenStore;
namespace metrics {
class MetricsHttpServer;
}
}  // namespace lazyrag

namespace lazyrag::kvstore {

class KvStoreHandler;
class KvStoreMetrics;
class KvStoreService;

struct KvStoreServerOptions {
  // gRPC address, HOST:PORT; port 0 picks one (see port()). Default loopback, picked port.
  std::string listen = "127.0.0.1:0";
  // RocksDB directory. Required unless an engine factory is given.
  std::string data_dir;
  // Byte capacity of stored values. Default 64 GiB.
  uint64_t capacity_bytes = 64ull << 30;
  // fsync the WAL on each commit. Default true.
  bool sync_commits = true;
  // RocksDB memtable size of the index (RocksEngineOptions). Default 16 MiB.
  uint64_t index_write_buffer_bytes = 16 << 20;
  // /metrics port; 0 picks one, -1 disables the endpoint. Default 0.
  int metrics_port = 0;
  // Address /metrics binds. Default loopback: exposing it is a deployment choice (the chart
  // sets its listen address so Prometheus can scrape).
  std::string metrics_host = "127.0.0.1";
  // gRPC over TLS (common/tls.h); empty: plaintext.
  TlsFiles tls;
  // Token file (common/auth.h); every call then needs a worker token. "": no authentication.
  std::string auth_tokens_file;
  // Serve same-host clients (kvstore.proto, DescribeRequest): they read value files in
  // data_dir and hand over files they wrote there, so they need the filesystem access of this
  // process (same user). Default true.
  bool local_clients = true;
};

// Makes the engine; receives the server's metrics so the engine can update them.
using EngineFactory =
    std::function<absl::StatusOr<std::unique_ptr<KvEngine>>(KvStoreMetrics* metrics)>;

// Start() once, Shutdown(deadline) once (the destructor does it too). Not thread-safe.
class KvStoreServer {
 public:
  // `engine_factory` empty: a RocksDB engine on options.data_dir.
  explicit KvStoreServer(KvStoreServerOptions options, EngineFactory engine_factory = {});
  ~KvStoreServer();
  KvStoreServer(const KvStoreServer&) = delete;
  KvStoreServer& operator=(const KvStoreServer&) = delete;

  // Opens the engine, then serves gRPC and /metrics.
  absl::Status Start();
  // Stops taking calls, lets running ones finish until `deadline`, then closes the engine.
  void Shutdown(absl::Time deadline);

  // Valid after Start().
  int port() const;
  std::string address() const;
  int metrics_port() const;
  metrics::Registry& registry() { return registry_; }

 private:
  const KvStoreServerOptions options_;
  EngineFactory engine_factory_;
  metrics::Registry registry_;
  std::unique_ptr<KvStoreMetrics> metrics_;
  AuthMetrics auth_metrics_{&registry_};  // before tokens_, which counts into it
  std::unique_ptr<KvEngine> engine_;
  std::unique_ptr<KvStoreHandler> handler_;
  std::unique_ptr<TokenStore> tokens_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<metrics::MetricsHttpServer> http_;
};

}  // namespace lazyrag::kvstore
