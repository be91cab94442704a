#include "worker/service/worker_server.h"

#include <thread>

#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/native_blas.h"
#include "common/status.h"
#include "common/tls.h"
#include "worker/peer/peer_service.h"
#include "worker/peer/peer_store.h"
#include "worker/service/inference_service.h"
#include "worker/service/worker_http_backend.h"

namespace lazyrag {

WorkerServer::WorkerServer(WorkerServerOptions options) : options_(std::move(options)) {}

WorkerServer::~WorkerServer() { Shutdown(absl::Now()); }

absl::Status WorkerServer::Start() {
  // TLS first: a bad --tls_* flag stops the worker before it loads a model.
  auto credentials_or = ServerCredentialsFor(options_.tls);
  if (!credentials_or.ok()) return credentials_or.status();
  std::shared_ptr<grpc::ServerCredentials> credentials = std::move(*credentials_or);
  RETURN_IF_ERROR(ValidateNamespacePolicy(options_.auth.namespaces));
  ASSIGN_OR_RETURN(tokens_, OpenTokenStore(options_.auth.tokens_file, &auth_metrics_));
  ASSIGN_OR_RETURN(std::shared_ptr<BearerToken> own_token,
                   OpenBearerToken(options_.auth.token_file));
  RuntimeOptions ro = options_.runtime;
  ro.registry = &registry_;
  if (!options_.kv_mac_key_file.empty()) {
    ASSIGN_OR_RETURN(ro.kv_mac_key, DocumentMacKey::FromFile(options_.kv_mac_key_file));
  }
  if (!options_.kvstore.empty() || !options_.peers.empty()) {
    ro.store_factory =
        [this, own_token](
            const std::string &fingerprint) -> absl::StatusOr<std::unique_ptr<DocumentStore>> {
      std::unique_ptr<DocumentStore> store;
      if (!options_.kvstore.empty()) {
        DocumentStoreOptions so;
        so.spec = options_.kvstore;
        so.model_fingerprint = fingerprint;
        so.replication = options_.kvstore_replication;
        so.call_timeout_s = options_.kvstore_timeout_s;
        so.put_timeout_s = options_.kvstore_put_timeout_s;
        so.tls = options_.tls;
        so.auth_token = own_token;
        auto opened = OpenDocumentStore(so);
        if (!opened.ok()) return opened.status();
        store = std::move(*opened);
      }
      if (options_.peers.empty()) return store;
      // Peers first, then the kvstore (pool -> peers -> kvstore -> compute).
      PeerStoreOptions po;
      po.peers = options_.peers;
      po.tls = options_.tls;
      po.auth_token = own_token;
      po.model_fingerprint = fingerprint;
      po.call_timeout_s = options_.peer_timeout_s;
      po.lease_s = options_.peer_lease_s;
      po.device_leases = options_.peer_device_copy;
      po.registry = &registry_;
      return OpenPeerFirstStore(po, std::move(store));
    };
  }
  auto rt = CreateRuntime(ro);
  if (!rt.ok()) return rt.status();
  runtime_ = std::move(*rt);
  if (runtime_->store) {
    LOG_INFO << "lazyrag-worker: document store " << runtime_->store->name();
  }

  InferenceServiceOptions so;
  so.model_name = runtime_->model_name;
  so.max_tokens_limit = options_.max_tokens_limit;
  so.max_prepare_texts = options_.max_prepare_texts;
  so.max_prepare_bytes = options_.max_prepare_bytes;
  so.tokens = tokens_.get();
  so.namespaces = options_.auth.namespaces;
  service_ = std::make_unique<InferenceService>(runtime_->generator.get(), so);
  GrpcServerOptions go;
  go.listen = options_.listen;
  go.credentials = credentials;
  grpc_ = std::make_unique<GrpcServer>(go);
  grpc_->AddService(service_.get());
  // Every worker lends the documents of its pool to its peers.
  PeerServiceOptions po;
  po.model_fingerprint = runtime_->fingerprint;
  po.registry = &registry_;
  po.tokens = tokens_.get();
  Engine *engine = runtime_->engine.get();
  // Fast path: the pool itself, lent by device leases, when the backend can share it.
  DocumentLender lender;
  lender.pool = [engine]() { return engine->PoolHandle(); };
  lender.pin = [engine](const std::string &id) -> absl::StatusOr<LentDocument> {
    ASSIGN_OR_RETURN(Engine::PinnedDocument d, engine->PinResidentDocument(id));
    return LentDocument{std::move(d.pages), d.num_tokens, std::move(d.tokens)};
  };
  lender.unpin = [engine](const std::string &id) { engine->UnpinDocument(id); };
  if (engine->PoolHandle().ok()) {
    LOG_INFO << "lazyrag-worker: lends its KV pool to peer workers (device leases)";
  }
  peer_service_ = std::make_unique<PeerDocumentsService>(
      [engine](const std::string &id) { return engine->ExportResidentDocument(id); }, po,
      std::move(lender));
  grpc_->AddService(peer_service_.get());
  if (!options_.http.listen.empty() && options_.tls.enabled()) {
    return absl::InvalidArgumentError(
        "--http_listen serves plain HTTP only; it cannot be combined with --tls_cert");
  }
  if (auto st = grpc_->Start(); !st.ok()) return st;
  if (!options_.http.listen.empty()) {
    http_backend_ = std::make_unique<WorkerHttpBackend>(service_.get());
    if (tokens_ != nullptr) {
      authenticator_ = std::make_unique<http::TokenStoreAuthenticator>(tokens_.get());
    }
    openai_ = std::make_unique<http::OpenAiHttpServer>(http_backend_.get(), options_.http,
                                                       authenticator_.get());
    if (auto st = openai_->Start(); !st.ok()) return st;
  }
  if (options_.metrics_port >= 0) {
    metrics::MetricsHttpOptions mo;
    mo.host = options_.metrics_host;
    mo.port = options_.metrics_port;
    http_ = std::make_unique<metrics::MetricsHttpServer>(&registry_, mo);
    if (auto st = http_->Start(); !st.ok()) return st;
  }
  const EngineStats stats = engine->Stats();
  const EngineOptions &eo = engine->options();
  LOG_INFO.With("grpc", grpc_->address())
          .With("metrics_port", metrics_port())
          .With("http_port", http_port())
          .With("model", options_.runtime.model)
          .With("model_name", runtime_->model_name)
          .With("device", options_.runtime.device)
          .With("cuda_device", options_.runtime.cuda_device)
          .With("tp", options_.runtime.tensor_parallel)
          .With("blas_kernels", BlasCoreName())
          .With("pool_pages", stats.pages_total)
          .With("pool_bytes", int64_t{stats.pages_total} * runtime_->page_bytes)
          .With("page_size", eo.page_size)
          .With("host_cache_bytes", stats.host.capacity_bytes)
          .With("kvstore", options_.kvstore.empty() ? "none" : options_.kvstore)
          .With("peers", options_.peers.size())
          .With("max_batch_tokens", options_.runtime.max_batch_tokens)
          .With("max_running", options_.runtime.max_running)
          .With("tls", options_.tls.enabled())
      << "lazyrag-worker: serving";
  return absl::OkStatus();
}

void WorkerServer::Shutdown(absl::Time deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  // Both front doors drain at once: HTTP on its own thread while gRPC waits.
  std::thread openai_drain;
  if (openai_) openai_drain = std::thread([this, deadline] { openai_->Shutdown(deadline); });
  if (grpc_) grpc_->Shutdown(deadline);
  if (openai_drain.joinable()) openai_drain.join();
  if (http_) http_->Stop();
  if (peer_service_) peer_service_->StopLeases();  // unpins leases while the engine lives
  runtime_.reset();  // engine (fails what still runs, drains write-backs), then
                     // the store
}

std::string WorkerServer::address() const { return grpc_ ? grpc_->address() : ""; }
int WorkerServer::metrics_port() const { return http_ ? http_->port() : -1; }
int WorkerServer::http_port() const { return openai_ ? openai_->port() : 0; }

}  // namespace lazyrag
