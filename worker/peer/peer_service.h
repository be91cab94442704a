// The serving side of the peer tier: lazyrag.v1.PeerDocuments (proto/lazyrag/v1/peer.proto),
// served by every worker. A thin gRPC adapter over a DocumentExporter (in the worker:
// Engine::ExportResidentDocument), which answers from the KV pool only, and, for the fast path,
// a DocumentLender (Engine::PoolHandle / PinResidentDocument / UnpinDocument) behind a table of
// leases that expire.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "lazyrag/v1/peer.grpc.pb.h"
#include "worker/backend/backend.h"
#include "worker/cache/document_store.h"

namespace lazyrag {

// A resident document in stored form, by id; NOT_FOUND when it is not resident. Must not
// compute or fetch. Called from gRPC threads, concurrently.
using DocumentExporter = std::function<absl::StatusOr<StoredDocument>(const std::string &id)>;

// A resident document pinned for a peer to copy its pages (the fast path).
struct LentDocument {
  std::vector<int32_t> pages;  // in the pool, document order
  int32_t num_tokens = 0;
  std::vector<int32_t> tokens;  // [num_tokens]
};

// The pool side of the fast path; every member callable from gRPC threads, concurrently. A
// default-constructed lender (no functions) lends nothing: GetPool and LeaseDocument answer
// UNIMPLEMENTED.
struct DocumentLender {
  // The pool as lent (Engine::PoolHandle); UNIMPLEMENTED / FAILED_PRECONDITION when it cannot be.
  std::function<absl::StatusOr<PeerPoolHandle>()> pool;
  // Pins a resident document; NOT_FOUND when it is not resident. Must not compute or fetch.
  std::function<absl::StatusOr<LentDocument>(const std::string &id)> pin;
  // Drops one pin taken by `pin`.
  std::function<void(const std::string &id)> unpin;
};

class TokenStore;

struct PeerServiceOptions {
  // The worker's model fingerprint; requests for another model: FAILED_PRECONDITION. Required.
  std::string model_fingerprint;
  // Exports at once (each holds a copy of the document in host memory: 256 MiB for a
  // 2048-token 8B document); beyond it RESOURCE_EXHAUSTED (the requester tries elsewhere).
  // Default 4.
  int max_concurrent = 4;
  // Chunk size when the request asks none. Default 2 MiB.
  uint32_t default_chunk_size = 2 << 20;
  // Lease length when the request asks none. Default 10 s. A request may ask up to 60 s.
  double default_lease_s = 10;
  // Leases outstanding at once; beyond it RESOURCE_EXHAUSTED. Default 1024.
  int max_leases = 1024;
  // Not owned, must outlive the service; null: no authentication. With tokens every call needs
  // a worker identity (common/auth.h): UNAUTHENTICATED without a known token, PERMISSION_DENIED
  // for a client's.
  TokenStore *tokens = nullptr;
  // Optional, not owned, must outlive the service: lazyrag_worker_peer_serve_total{result},
  // lazyrag_worker_peer_serve_bytes_total, lazyrag_worker_peer_leases_total{result},
  // lazyrag_worker_peer_leases_outstanding.
  metrics::Registry *registry = nullptr;
};

// Thread-safe. `exporter` and `lender` must stay callable until the service is destroyed (the
// destructor unpins the leases still outstanding). A thread unpins expired leases.
class PeerDocumentsService final : public v1::PeerDocuments::Service {
 public:
  PeerDocumentsService(DocumentExporter exporter, PeerServiceOptions options,
                       DocumentLender lender = {});
  ~PeerDocumentsService() override;

  grpc::Status GetDocument(grpc::ServerContext *context, const v1::PeerGetRequest *request,
                           grpc::ServerWriter<v1::PeerGetResponse> *writer) override;
  grpc::Status GetPool(grpc::ServerContext *context, const v1::PeerPoolRequest *request,
                       v1::PeerPool *response) override;
  grpc::Status LeaseDocument(grpc::ServerContext *context, const v1::PeerLeaseRequest *request,
                             v1::PeerLease *response) override;
  grpc::Status ReleaseLease(grpc::ServerContext *context, const v1::PeerReleaseRequest *request,
                            v1::PeerReleaseResponse *response) override;

  // The handlers behind the RPCs, without gRPC (statuses as documented in peer.proto).
  absl::StatusOr<v1::PeerPool> Pool(const v1::PeerPoolRequest &request);
  absl::StatusOr<v1::PeerLease> Lease(const v1::PeerLeaseRequest &request);
  absl::Status Release(uint64_t lease_id);
  // Leases outstanding (not released, not expired yet).
  int leases() const;
  // Unpins every lease still outstanding and refuses new ones (UNAVAILABLE). For the worker's
  // shutdown, before the engine goes. Also done by the destructor.
  void StopLeases();

 private:
  grpc::Status CheckCaller(const grpc::ServerContext &context) const;

  struct LeaseEntry {
    std::string document_id;
    absl::Time expiry;
  };
  // Unpins leases past their expiry; returns the next expiry (InfiniteFuture when none).
  absl::Time ExpireLeases(absl::Time now);
  void ExpiryLoop();
  void CountLease(const std::string &result);

  // The request checked and the document exported; INVALID_ARGUMENT, FAILED_PRECONDITION,
  // RESOURCE_EXHAUSTED or the exporter's status otherwise.
  absl::StatusOr<StoredDocument> Lookup(const v1::PeerGetRequest &request);
  void Count(const absl::Status &status);

  const DocumentExporter exporter_;
  const PeerServiceOptions options_;
  absl::Mutex mu_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  metrics::Family<metrics::Counter> *served_ = nullptr;
  metrics::Counter *served_bytes_ = nullptr;

  const DocumentLender lender_;
  mutable absl::Mutex lease_mu_;
  uint64_t next_lease_ ABSL_GUARDED_BY(lease_mu_) = 1;
  std::map<uint64_t, LeaseEntry> leases_ ABSL_GUARDED_BY(lease_mu_);
  bool stop_ ABSL_GUARDED_BY(lease_mu_) = false;
  bool leases_changed_ ABSL_GUARDED_BY(lease_mu_) = false;
  metrics::Family<metrics::Counter> *lease_results_ = nullptr;
  metrics::Gauge *leases_outstanding_ = nullptr;
  std::thread expiry_thread_;
};

}  // namespace lazyrag
