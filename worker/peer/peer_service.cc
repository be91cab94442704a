#include "worker/peer/peer_service.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "common/metrics.h"
#include "common/status.h"

namespace lazyrag {
namespace {

constexpr uint32_t kMaxChunkBytes = 4 << 20;
constexpr size_t kMaxIdBytes = 256;
constexpr uint32_t kMaxLeaseMs = 60000;

absl::Status CheckModel(const std::string &asked, const std::string &ours) {
  if (asked.empty()) return absl::InvalidArgumentError("model_fingerprint is empty");
  if (asked != ours) {
    return absl::FailedPreconditionError(
        absl::StrCat("this worker serves model ", ours, ", not ", asked));
  }
  return absl::OkStatus();
}

absl::Status CheckId(const std::string &id) {
  if (id.empty()) return absl::InvalidArgumentError("document_id is empty");
  if (id.size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("document_id is longer than ", kMaxIdBytes, " bytes"));
  }
  return absl::OkStatus();
}

void ToProto(const PeerPoolHandle &h, v1::PeerPool *p) {
  p->set_ipc_handle(h.ipc_handle);
  p->set_device_uuid(h.device_uuid);
  p->set_num_layers(uint32_t(h.num_layers));
  p->set_num_pages(uint32_t(h.num_pages));
  p->set_page_size(uint32_t(h.page_size));
  p->set_kv_dim(uint32_t(h.kv_dim));
  p->set_elem_bytes(uint32_t(h.elem_bytes));
}

std::string ResultOf(const absl::Status &st) {
  return st.ok() ? "ok" : absl::AsciiStrToLower(absl::StatusCodeToString(st.code()));
}

}  // namespace

PeerDocumentsService::PeerDocumentsService(DocumentExporter exporter, PeerServiceOptions options,
                                           DocumentLender lender)
    : exporter_(std::move(exporter)), options_(std::move(options)), lender_(std::move(lender)) {
  if (options_.registry != nullptr) {
    lease_results_ = &options_.registry->AddCounter(
        "lazyrag_worker_peer_leases_total",
        "Device leases of resident documents asked by peer workers (the fast path), by result "
        "(granted, released, expired, or the status code of a refused one).");
    for (const char *r : {"granted", "released", "expired"}) lease_results_->Add({{"result", r}});
    leases_outstanding_ = &options_.registry
                               ->AddGauge("lazyrag_worker_peer_leases_outstanding",
                                          "Documents pinned for peer workers by device leases.")
                               .Add();
  }
  expiry_thread_ = std::thread([this] { ExpiryLoop(); });
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
  RETURN_IF_ERROR(CheckId(r.document_id()));
  if (r.chunk_size() > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_size ", r.chunk_size(), " is above 4 MiB"));
  }
  RETURN_IF_ERROR(CheckModel(r.model_fingerprint(), options_.model_fingerprint));
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

grpc::Status PeerDocumentsService::CheckCaller(const grpc::ServerContext &context) const {
  // Only the cluster's workers read another worker's pool.
  auto caller = AuthenticateCall(options_.tokens, context, Role::kWorker);
  return caller.ok() ? grpc::Status::OK : ToGrpcStatus(caller.status());
}

grpc::Status PeerDocumentsService::GetDocument(grpc::ServerContext *context,
                                               const v1::PeerGetRequest *request,
                                               grpc::ServerWriter<v1::PeerGetResponse> *writer) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
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

PeerDocumentsService::~PeerDocumentsService() { StopLeases(); }

void PeerDocumentsService::StopLeases() {
  std::map<uint64_t, LeaseEntry> left;
  {
    absl::MutexLock l(&lease_mu_);
    stop_ = true;
    left.swap(leases_);
  }
  if (expiry_thread_.joinable()) expiry_thread_.join();
  if (lender_.unpin) {
    for (const auto &[id, e] : left) lender_.unpin(e.document_id);
  }
}

void PeerDocumentsService::CountLease(const std::string &result) {
  if (lease_results_ != nullptr) lease_results_->Add({{"result", result}}).Increment();
}

int PeerDocumentsService::leases() const {
  absl::MutexLock l(&lease_mu_);
  return int(leases_.size());
}

absl::StatusOr<v1::PeerPool> PeerDocumentsService::Pool(const v1::PeerPoolRequest &r) {
  RETURN_IF_ERROR(CheckModel(r.model_fingerprint(), options_.model_fingerprint));
  if (!lender_.pool) return absl::UnimplementedError("this worker does not lend its KV pool");
  ASSIGN_OR_RETURN(PeerPoolHandle h, lender_.pool());
  v1::PeerPool p;
  ToProto(h, &p);
  return p;
}

absl::StatusOr<v1::PeerLease> PeerDocumentsService::Lease(const v1::PeerLeaseRequest &r) {
  RETURN_IF_ERROR(CheckModel(r.model_fingerprint(), options_.model_fingerprint));
  RETURN_IF_ERROR(CheckId(r.document_id()));
  if (r.lease_ms() > kMaxLeaseMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease_ms ", r.lease_ms(), " is above ", kMaxLeaseMs));
  }
  if (!lender_.pool || !lender_.pin || !lender_.unpin) {
    return absl::UnimplementedError("this worker does not lend its KV pool");
  }
  ASSIGN_OR_RETURN(PeerPoolHandle h, lender_.pool());
  {
    absl::MutexLock l(&lease_mu_);
    if (stop_) return absl::UnavailableError("peer is shutting down");
    if (int(leases_.size()) >= options_.max_leases) {
      return absl::ResourceExhaustedError(
          absl::StrCat("peer is busy: ", options_.max_leases, " leases outstanding"));
    }
  }
  ASSIGN_OR_RETURN(LentDocument doc, lender_.pin(r.document_id()));
  const uint32_t ms =
      r.lease_ms() != 0
          ? r.lease_ms()
          : uint32_t(std::clamp(options_.default_lease_s * 1000, 1.0, double(kMaxLeaseMs)));
  v1::PeerLease out;
  {
    absl::MutexLock l(&lease_mu_);
    if (stop_) {
      lender_.unpin(r.document_id());
      return absl::UnavailableError("peer is shutting down");
    }
    const uint64_t id = next_lease_++;
    leases_[id] = LeaseEntry{r.document_id(), absl::Now() + absl::Milliseconds(ms)};
    leases_changed_ = true;
    out.set_lease_id(id);
  }
  if (leases_outstanding_ != nullptr) leases_outstanding_->Increment();
  out.set_expires_in_ms(ms);
  out.set_num_tokens(uint32_t(doc.num_tokens));
  *out.mutable_token_ids() = {doc.tokens.begin(), doc.tokens.end()};
  *out.mutable_pages() = {doc.pages.begin(), doc.pages.end()};
  ToProto(h, out.mutable_pool());
  return out;
}

absl::Status PeerDocumentsService::Release(uint64_t lease_id) {
  if (lease_id == 0) return absl::InvalidArgumentError("lease_id is 0");
  std::string doc;
  {
    absl::MutexLock l(&lease_mu_);
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no lease ", lease_id, ": never granted, released already, or expired"));
    }
    doc = std::move(it->second.document_id);
    leases_.erase(it);
  }
  lender_.unpin(doc);
  if (leases_outstanding_ != nullptr) leases_outstanding_->Decrement();
  return absl::OkStatus();
}

absl::Time PeerDocumentsService::ExpireLeases(absl::Time now) {
  std::vector<std::string> expired;
  absl::Time next = absl::InfiniteFuture();
  {
    absl::MutexLock l(&lease_mu_);
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.expiry <= now) {
        expired.push_back(std::move(it->second.document_id));
        it = leases_.erase(it);
      } else {
        next = std::min(next, it->second.expiry);
        ++it;
      }
    }
  }
  for (const std::string &id : expired) {
    lender_.unpin(id);
    CountLease("expired");
    if (leases_outstanding_ != nullptr) leases_outstanding_->Decrement();
  }
  return next;
}

void PeerDocumentsService::ExpiryLoop() {
  absl::Time next = absl::InfiniteFuture();
  for (;;) {
    {
      absl::MutexLock l(&lease_mu_);
      auto wake = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || leases_changed_; };
      // At most a second between sweeps, whatever the expiries say.
      const absl::Time until = std::min(next, absl::Now() + absl::Seconds(1));
      lease_mu_.AwaitWithDeadline(absl::Condition(&wake), until);
      if (stop_) return;
      leases_changed_ = false;
    }
    next = ExpireLeases(absl::Now());
  }
}

grpc::Status PeerDocumentsService::GetPool(grpc::ServerContext *context,
                                           const v1::PeerPoolRequest *request,
                                           v1::PeerPool *response) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
  auto p = Pool(*request);
  if (!p.ok()) return ToGrpcStatus(p.status());
  *response = std::move(*p);
  return grpc::Status::OK;
}

grpc::Status PeerDocumentsService::LeaseDocument(grpc::ServerContext *context,
                                                 const v1::PeerLeaseRequest *request,
                                                 v1::PeerLease *response) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
  auto lease = Lease(*request);
  CountLease(lease.ok() ? "granted" : ResultOf(lease.status()));
  if (!lease.ok()) return ToGrpcStatus(lease.status());
  *response = std::move(*lease);
  return grpc::Status::OK;
}

grpc::Status PeerDocumentsService::ReleaseLease(grpc::ServerContext *context,
                                                const v1::PeerReleaseRequest *request,
                                                v1::PeerReleaseResponse *) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
  absl::Status st = Release(request->lease_id());
  if (st.ok()) CountLease("released");
  return ToGrpcStatus(st);
}

}  // namespace lazyrag
