// The serving side of the peer tier: lazyrag.v1.PeerDocuments (proto/lazyrag/v1/peer.proto),
// served by every worker. A thin gRPC adapter over a DocumentExporter (in the worker:
// Engine::ExportResidentDocument), which answers from the KV pool only.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "lazyrag/v1/peer.grpc.pb.h"
#include "worker/cache/document_store.h"

namespace lazyrag {

// A resident document in stored form, by id; NOT_FOUND when it is not resident. Must not
// compute or fetch. Called from gRPC threads, concurrently.
using DocumentExporter = std::function<absl::StatusOr<StoredDocument>(const std::string &id)>;

struct PeerServiceOptions {
  // The worker's model fingerprint; requests for another model: FAILED_PRECONDITION. Required.
  std::string model_fingerprint;
  // Exports at once (each holds a copy of the document in host memory: 256 MiB for a
  // 2048-token 8B document); beyond it RESOURCE_EXHAUSTED (the requester tries elsewhere).
  // Default 4.
  int max_concurrent = 4;
  // Chunk size when the request asks none. Default 2 MiB.
  uint32_t default_chunk_size = 2 << 20;
  // Optional, not owned, must outlive the service: lazyrag_worker_peer_serve_total{result},
  // lazyrag_worker_peer_serve_bytes_total.
  metrics::Registry *registry = nullptr;
};

// Thread-safe. `exporter` must stay callable until the gRPC server has shut down.
class PeerDocumentsService final : public v1::PeerDocuments::Service {
 public:
  PeerDocumentsService(DocumentExporter exporter, PeerServiceOptions options);

  grpc::Status GetDocument(grpc::ServerContext *context, const v1::PeerGetRequest *request,
                           grpc::ServerWriter<v1::PeerGetResponse> *writer) override;

 private:
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
};

}  // namespace lazyrag
