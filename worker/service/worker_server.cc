#include "worker/service/worker_server.h"

#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "worker/service/inference_service.h"

namespace lazyrag {

WorkerServer::WorkerServer(WorkerServerOptions options) : options_(std::move(options)) {}

WorkerServer::~WorkerServer() { Shutdown(absl::Now()); }

absl::Status WorkerServer::Start() {
  RuntimeOptions ro = options_.runtime;
  ro.registry = &registry_;
  if (!options_.kvstore.empty()) {
    const std::string spec = options_.kvstore;
    ro.store_factory = [spec](const std::string &fingerprint) {
      DocumentStoreOptions so;
      so.spec = spec;
      so.model_fingerprint = fingerprint;
      return OpenDocumentStore(so);
    };
  }
  auto rt = CreateRuntime(ro);
  if (!rt.ok()) return rt.status();
  runtime_ = std::move(*rt);
  if (runtime_->store) {
    LOG_INFO << "lazyrag-worker: document store " << runtime_->store->name();
  }

  InferenceServiceOptions so;
  so.model_name = options_.runtime.model;
  so.max_tokens_limit = options_.max_tokens_limit;
  service_ = std::make_unique<InferenceService>(runtime_->generator.get(), so);
  GrpcServerOptions go;
  go.listen = options_.listen;
  grpc_ = std::make_unique<GrpcServer>(go);
  grpc_->AddService(service_.get());
  if (auto st = grpc_->Start(); !st.ok()) return st;
  if (options_.metrics_port >= 0) {
    metrics::MetricsHttpOptions mo;
    mo.host = options_.metrics_host;
    mo.port = options_.metrics_port;
    http_ = std::make_unique<metrics::MetricsHttpServer>(&registry_, mo);
    if (auto st = http_->Start(); !st.ok()) return st;
  }
  return absl::OkStatus();
}

void WorkerServer::Shutdown(absl::Time deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  if (grpc_) grpc_->Shutdown(deadline);
  if (http_) http_->Stop();
  runtime_.reset();  // engine (fails what still runs, drains write-backs), then
                     // the store
}

std::string WorkerServer::address() const { return grpc_ ? grpc_->address() : ""; }
int WorkerServer::metrics_port() const { return http_ ? http_->port() : -1; }

}  // namespace lazyrag
