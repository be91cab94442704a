#include "worker/peer/peer_service.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_status.h"
#include "common/metrics.h"

namespace lazyrag {
namespace {

constexpr uint32_t kMaxChunkBytes = 4 << 20;
constexpr size_t kMaxIdBytes = 256;

}  // namespace

PeerDocumentsService::PeerDocumentsService(DocumentExporter exporter, PeerServiceOptions options)
    : exporter_(std::move(exporter)), options_(std::move(options)) {
  if (options_.registry != nullptr) {
    served_ = &options_.registry->AddCounter(
        "lazyrag_worker_peer_serve_total",
        "Documents asked of this worker by peer workers, by result (hit, miss, or the status "
        "code).");
    for (const char *r : {"hit", "miss"}) served_->Add({{"result", r}});
    served_bytes_ = &options_.registry
                         ->AddCounter("lazyrag_worker_peer_serve_bytes_total",
                                      "Document bytes sent to peer workers.")
                         .Add();
  }
}

void PeerDocumentsService::Count(const absl::Status &st) {
  if (served_ == nullptr) return;
  const std::string result = st.ok() ? "hit"
                             : absl::IsNotFound(st)
                                 ? "miss"
                                 : absl::AsciiStrToLower(absl::StatusCodeToString(st.code()));
  served_->Add({{"result", result}}).Increment();
}

absl::StatusOr<StoredDocument> PeerDocumentsService::Lookup(const v1::PeerGetRequest &r) {
  if (r.model_fingerprint().empty()) {
    return absl::InvalidArgumentError("model_fingerprint is empty");
  }
  if (r.document_id().empty()) return absl::InvalidArgumentError("document_id is empty");
  if (r.document_id().size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("document_id is longer than ", kMaxIdBytes, " bytes"));
  }
  if (r.chunk_size() > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_size ", r.chunk_size(), " is above 4 MiB"));
  }
  if (r.model_fingerprint() != options_.model_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker serves model ", options_.model_fingerprint, ", not ", r.model_fingerprint()));
  }
  {
    absl::MutexLock l(&mu_);
    if (active_ >= options_.max_concurrent) {
      return absl::ResourceExhaustedError(
          absl::StrCat("peer is busy: ", options_.max_concurrent, " document transfers in flight"));
    }
    ++active_;
  }
  auto doc = exporter_(r.document_id());
  absl::MutexLock l(&mu_);
  --active_;
  return doc;
}

grpc::Status PeerDocumentsService::GetDocument(grpc::ServerContext *context,
                                               const v1::PeerGetRequest *request,
                                               grpc::ServerWriter<v1::PeerGetResponse> *writer) {
  auto doc = Lookup(*request);
  Count(doc.status());
  if (!doc.ok()) return ToGrpcStatus(doc.status());
  const uint32_t chunk = request->chunk_size() != 0
                             ? request->chunk_size()
                             : std::clamp<uint32_t>(options_.default_chunk_size, 1, kMaxChunkBytes);
  const uint64_t total = doc->bytes.size();
  v1::PeerGetResponse msg;
  v1::PeerDocumentHeader *h = msg.mutable_header();
  h->set_total_size(total);
  h->set_chunk_size(chunk);
  h->set_num_chunks(uint32_t((total + chunk - 1) / chunk));
  h->set_metadata(std::move(doc->metadata));
  if (!writer->Write(msg)) return grpc::Status(grpc::StatusCode::CANCELLED, "requester went away");
  const std::string_view bytes = doc->bytes;
  for (uint64_t off = 0, i = 0; off < total; off += chunk, ++i) {
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "requester went away");
    }
    const std::string_view data = bytes.substr(off, chunk);
    msg.Clear();
    v1::Chunk *c = msg.mutable_chunk();
    c->set_index(uint32_t(i));
    c->set_data(data.data(), data.size());
    c->set_crc32c(Crc32c(data));
    if (!writer->Write(msg)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "requester went away");
    }
  }
  if (served_bytes_ != nullptr) served_bytes_->Increment(double(total));
  return grpc::Status::OK;
}

}  // namespace lazyrag
