#include "worker/peer/peer_store.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/document_id.h"
#include "common/grpc_auth.h"
#include "common/grpc_channel.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/tls.h"
#include "lazyrag/v1/peer.grpc.pb.h"
#include "worker/backend/backend.h"

namespace lazyrag {
namespace {

constexpr int kMaxMessageBytes = 16 << 20;
constexpr uint64_t kMaxValueBytes = uint64_t(4) << 30;  // refuse absurd headers up front
constexpr uint32_t kMaxChunkBytes = 4 << 20;

std::string ResultLabel(const absl::Status &s) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(s.code()));
}

std::chrono::system_clock::time_point DeadlineIn(double s) {
  return std::chrono::system_clock::now() + std::chrono::microseconds(int64_t(s * 1e6));
}

PeerPoolHandle FromProto(const v1::PeerPool &p) {
  PeerPoolHandle h;
  h.ipc_handle = p.ipc_handle();
  h.device_uuid = p.device_uuid();
  h.num_layers = int(p.num_layers());
  h.num_pages = int(p.num_pages());
  h.page_size = int(p.page_size());
  h.kv_dim = int(p.kv_dim());
  h.elem_bytes = int(p.elem_bytes());
  return h;
}

// Pages of `peer` copy into `local` page for page: same page shape; not this process's own pool.
absl::Status CheckLayout(const PeerPoolHandle &peer, const PeerPoolHandle &local) {
  if (peer.num_layers != local.num_layers || peer.page_size != local.page_size ||
      peer.kv_dim != local.kv_dim || peer.elem_bytes != local.elem_bytes || peer.num_pages <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer pool layout (", peer.num_layers, " layers, page ", peer.page_size,
                     ", kv_dim ", peer.kv_dim, ", ", peer.elem_bytes, " B) differs from ours (",
                     local.num_layers, " layers, page ", local.page_size, ", kv_dim ", local.kv_dim,
                     ", ", local.elem_bytes, " B)"));
  }
  if (peer.ipc_handle.empty() || peer.ipc_handle == local.ipc_handle) {
    return absl::FailedPreconditionError("peer pool handle is empty or our own");
  }
  return absl::OkStatus();
}

// One peer worker: its channel and when it may be asked again after a failure.
class Peer {
 public:
  // `token`: this worker's, sent on every call (null: none).
  Peer(std::string address, const std::shared_ptr<grpc::ChannelCredentials> &credentials,
       std::shared_ptr<BearerToken> token)
      : address_(std::move(address)), token_(std::move(token)) {
    // A peer that restarts is found again quickly.
    stub_ = v1::PeerDocuments::NewStub(
        grpc::CreateCustomChannel(address_, credentials, ServiceChannelArgs(kMaxMessageBytes)));
  }

  const std::string &address() const { return address_; }
  // The channel carries no token: every call on it passes its context through PrepareCall first.
  v1::PeerDocuments::Stub &stub() { return *stub_; }
  // Sets the deadline of a call on stub(), `timeout_s` from now, and adds this worker's token to
  // `ctx` (AddBearerToken). REQUIRES: the call has not started.
  void PrepareCall(grpc::ClientContext &ctx, double timeout_s) const {
    ctx.set_deadline(DeadlineIn(timeout_s));
    AddBearerToken(ctx, token_.get());
  }

  bool Down(absl::Time now) const {
    absl::MutexLock l(&mu_);
    return now < down_until_;
  }
  void MarkDown(absl::Time until) {
    absl::MutexLock l(&mu_);
    down_until_ = until;
  }

  // Fast path: whether the peer lends documents in device memory (its pool was asked and
  // matches ours), is to serve bytes until some time, or has not been asked yet.
  enum class Lending { kUnknown, kLends, kBytesOnly };
  Lending lending(absl::Time now) {
    absl::MutexLock l(&mu_);
    if (lending_ == Lending::kBytesOnly && now >= bytes_until_) lending_ = Lending::kUnknown;
    return lending_;
  }
  void SetLends() {
    absl::MutexLock l(&mu_);
    lending_ = Lending::kLends;
  }
  void SetBytesOnly(absl::Time until) {
    absl::MutexLock l(&mu_);
    lending_ = Lending::kBytesOnly;
    bytes_until_ = until;
  }

 private:
  const std::string address_;
  const std::shared_ptr<BearerToken> token_;
  std::unique_ptr<v1::PeerDocuments::Stub> stub_;
  mutable absl::Mutex mu_;
  absl::Time down_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Lending lending_ ABSL_GUARDED_BY(mu_) = Lending::kUnknown;
  absl::Time bytes_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// Gives leases back (ReleaseLease) on its own thread, so that finishing a lease never blocks the
// engine's scheduler thread on the network. Stop() sends what is queued, then ends; releases
// queued after Stop are dropped (the peer unpins at the lease's expiry).
class LeaseReleaser {
 public:
  explicit LeaseReleaser(double call_timeout_s) : timeout_s_(call_timeout_s) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~LeaseReleaser() { Stop(); }
  void Release(std::shared_ptr<Peer> peer, uint64_t lease_id) {
    absl::MutexLock l(&mu_);
    if (stop_) return;
    queue_.emplace_back(std::move(peer), lease_id);
  }
  void Stop() {
    {
      absl::MutexLock l(&mu_);
      if (stop_) return;
      stop_ = true;
    }
    thread_.join();
  }

 private:
  void Loop() {
    for (;;) {
      std::pair<std::shared_ptr<Peer>, uint64_t> item;
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(
            +[](LeaseReleaser *r)
                 ABSL_NO_THREAD_SAFETY_ANALYSIS { return r->stop_ || !r->queue_.empty(); },
            this));
        if (queue_.empty()) return;  // stopping with nothing left
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      grpc::ClientContext ctx;
      item.first->PrepareCall(ctx, timeout_s_);
      v1::PeerReleaseRequest req;
      req.set_lease_id(item.second);
      v1::PeerReleaseResponse resp;
      grpc::Status st = item.first->stub().ReleaseLease(&ctx, req, &resp);
      if (!st.ok() && st.error_code() != grpc::StatusCode::NOT_FOUND) {
        LOG_WARNING << "peer " << item.first->address() << ": release of lease " << item.second
                    << " failed (" << st.error_message() << "); it ends at its expiry";
      }
    }
  }

  const double timeout_s_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::pair<std::shared_ptr<Peer>, uint64_t>> queue_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Metrics of the fast path, shared by the store and its leases.
struct LeaseMetrics {
  metrics::Family<metrics::Counter> *copies = nullptr;
  metrics::Counter *copy_bytes = nullptr;
};

class PeerDeviceLease final : public DeviceLease {
 public:
  PeerDeviceLease(std::shared_ptr<Peer> peer, std::shared_ptr<LeaseReleaser> releaser,
                  std::shared_ptr<const LeaseMetrics> metrics, double bytes_only_s,
                  uint64_t lease_id, PeerPoolHandle pool, std::vector<int32_t> pages,
                  std::vector<int32_t> tokens, absl::Time valid_until)
      : peer_(std::move(peer)),
        releaser_(std::move(releaser)),
        metrics_(std::move(metrics)),
        bytes_only_s_(bytes_only_s),
        lease_id_(lease_id),
        pool_(std::move(pool)),
        pages_(std::move(pages)),
        tokens_(std::move(tokens)),
        valid_until_(valid_until) {}
  ~PeerDeviceLease() override { Finish(absl::CancelledError("lease dropped")); }

  const PeerPoolHandle &pool() const override { return pool_; }
  const std::vector<int32_t> &pages() const override { return pages_; }
  const std::vector<int32_t> &tokens() const override { return tokens_; }
  bool Valid() const override { return !finished_ && absl::Now() < valid_until_; }

  void Finish(const absl::Status &copy_status) override {
    if (finished_) return;
    finished_ = true;
    releaser_->Release(peer_, lease_id_);
    if (absl::IsCancelled(copy_status)) return;  // not copied, not a failure
    if (metrics_->copies != nullptr) {
      metrics_->copies->Add({{"result", copy_status.ok() ? "ok" : ResultLabel(copy_status)}})
          .Increment();
    }
    if (copy_status.ok()) {
      if (metrics_->copy_bytes != nullptr) {
        metrics_->copy_bytes->Increment(2.0 * pool_.num_layers * pool_.page_size * pool_.kv_dim *
                                        pool_.elem_bytes * double(pages_.size()));
      }
      return;
    }
    LOG_WARNING << "device copy from peer " << peer_->address() << " failed (" << copy_status
                << "): bytes from it for " << bytes_only_s_ << " s";
    peer_->SetBytesOnly(absl::Now() + absl::Seconds(bytes_only_s_));
  }

 private:
  const std::shared_ptr<Peer> peer_;
  const std::shared_ptr<LeaseReleaser> releaser_;
  // Shared with the store; the metric objects live in the registry, which outlives both.
  const std::shared_ptr<const LeaseMetrics> metrics_;
  const double bytes_only_s_;
  const uint64_t lease_id_;
  const PeerPoolHandle pool_;
  const std::vector<int32_t> pages_;
  const std::vector<int32_t> tokens_;
  const absl::Time valid_until_;
  bool finished_ = false;
};

class PeerFirstStore : public DocumentStore {
 public:
  PeerFirstStore(const PeerStoreOptions &o, std::unique_ptr<DocumentStore> inner,
                 const std::shared_ptr<grpc::ChannelCredentials> &credentials)
      : options_(o),
        inner_(std::move(inner)),
        releaser_(std::make_shared<LeaseReleaser>(o.call_timeout_s)),
        lease_metrics_(std::make_shared<LeaseMetrics>()) {
    for (const std::string &a : o.peers)
      peers_.push_back(std::make_shared<Peer>(a, credentials, o.auth_token));
    if (o.registry != nullptr) {
      fetches_ = &o.registry->AddCounter(
          "lazyrag_worker_peer_fetch_total",
          "Document requests to peer workers, by result (hit, miss, skipped = peer marked down "
          "after a failure, resource_exhausted = peer busy, or the status code).");
      for (const char *r : {"hit", "lease", "miss", "skipped"}) fetches_->Add({{"result", r}});
      lease_metrics_->copies = &o.registry->AddCounter(
          "lazyrag_worker_peer_device_copy_total",
          "Documents copied from a peer worker's pool GPU to GPU (the fast path), by result (ok, "
          "or the status code of a failed copy, which falls back to bytes).");
      lease_metrics_->copies->Add({{"result", "ok"}});
      lease_metrics_->copy_bytes = &o.registry
                                        ->AddCounter("lazyrag_worker_peer_device_copy_bytes_total",
                                                     "KV bytes copied GPU to GPU from peer pools.")
                                        .Add();
      fetch_bytes_ = &o.registry
                          ->AddCounter("lazyrag_worker_peer_fetch_bytes_total",
                                       "Document bytes received from peer workers.")
                          .Add();
      fetch_seconds_ = &o.registry
                            ->AddHistogram("lazyrag_worker_peer_fetch_seconds",
                                           "Time to receive a document from a peer worker (hits).",
                                           metrics::ExponentialBuckets(0.0005, 2, 16))
                            .Add();
    }
  }

  std::string name() const override {
    std::vector<std::string> a;
    for (const auto &p : peers_) a.push_back(p->address());
    return absl::StrCat("peers:", absl::StrJoin(a, ","), " then ",
                        inner_ ? inner_->name() : "nothing");
  }

  absl::StatusOr<StoredDocument> Get(const std::string &ns, const std::string &id) override {
    if (auto hit = FromPeers(ns, id); hit.ok()) return hit;
    if (inner_ == nullptr) {
      return absl::NotFoundError(absl::StrCat("no peer holds document ", id));
    }
    return inner_->Get(ns, id);
  }

  absl::StatusOr<StoredDocument> GetFromFrontTiers(const std::string &ns,
                                                   const std::string &id) override {
    if (auto hit = FromPeers(ns, id); hit.ok()) return hit;
    return absl::UnavailableError("kvstore marked down and no peer holds the document");
  }

  // The durable store only (the engine asks the peers first, through GetFromFrontTiers).
  absl::StatusOr<std::string> GetInto(const std::string &ns, const std::string &id,
                                      const DocumentSink &sink,
                                      const ChunkObserver &on_chunk) override {
    if (inner_ == nullptr) return absl::NotFoundError(absl::StrCat("no store behind the peers"));
    return inner_->GetInto(ns, id, sink, on_chunk);
  }

  absl::Status Put(const std::string &ns, const std::string &id,
                   const StoredDocument &doc) override {
    if (inner_ == nullptr) return absl::OkStatus();  // nothing keeps it; durable() is false
    return inner_->Put(ns, id, doc);
  }

  absl::StatusOr<bool> Contains(const std::string &ns, const std::string &id) override {
    if (inner_ == nullptr) return false;  // peers keep nothing for good
    return inner_->Contains(ns, id);
  }

  bool durable() const override { return inner_ != nullptr && inner_->durable(); }

  void EnableDeviceLeases(const PeerPoolHandle &local) override {
    if (!options_.device_leases) return;
    absl::MutexLock l(&local_mu_);
    local_ = local;
    leases_enabled_ = true;
  }

  ~PeerFirstStore() override { releaser_->Stop(); }

 private:
  // This worker's pool when the engine can take leases, else nullopt.
  std::optional<PeerPoolHandle> Local() {
    absl::MutexLock l(&local_mu_);
    if (!leases_enabled_) return std::nullopt;
    return local_;
  }

  // Whether to ask `peer` for a lease: asks its pool the first time (and again after
  // bytes_only_s). A transport failure of GetPool is the peer's failure (returned).
  absl::StatusOr<bool> Lends(Peer &peer, const PeerPoolHandle &local) {
    const absl::Time now = absl::Now();
    switch (peer.lending(now)) {
      case Peer::Lending::kLends:
        return true;
      case Peer::Lending::kBytesOnly:
        return false;
      case Peer::Lending::kUnknown:
        break;
    }
    grpc::ClientContext ctx;
    peer.PrepareCall(ctx, options_.call_timeout_s);
    v1::PeerPoolRequest req;
    req.set_model_fingerprint(options_.model_fingerprint);
    v1::PeerPool pool;
    absl::Status st = FromGrpcStatus(peer.stub().GetPool(&ctx, req, &pool));
    if (st.ok()) st = CheckLayout(FromProto(pool), local);
    if (st.ok()) {
      peer.SetLends();
      return true;
    }
    if (absl::IsUnimplemented(st) || absl::IsFailedPrecondition(st)) {
      LOG_INFO << "peer " << peer.address() << " does not lend its pool (" << st
               << "): document bytes from it";
      peer.SetBytesOnly(now + absl::Seconds(options_.bytes_only_s));
      return false;
    }
    return st;
  }

  // A lease from `peer`; NOT_FOUND when not resident; UNIMPLEMENTED / FAILED_PRECONDITION when
  // it cannot lend after all (the caller asks bytes instead).
  absl::StatusOr<StoredDocument> LeaseFrom(const std::shared_ptr<Peer> &peer,
                                           const PeerPoolHandle &local, const std::string &ns,
                                           const std::string &id) {
    const absl::Time sent = absl::Now();
    grpc::ClientContext ctx;
    peer->PrepareCall(ctx, options_.call_timeout_s);
    v1::PeerLeaseRequest req;
    req.set_model_fingerprint(options_.model_fingerprint);
    req.set_cache_namespace(ns);
    req.set_document_id(id);
    req.set_lease_ms(uint32_t(std::clamp(options_.lease_s * 1000, 1.0, 60000.0)));
    v1::PeerLease lease;
    RETURN_IF_ERROR(FromGrpcStatus(peer->stub().LeaseDocument(&ctx, req, &lease)));
    const PeerPoolHandle pool = FromProto(lease.pool());
    std::vector<int32_t> tokens(lease.token_ids().begin(), lease.token_ids().end());
    std::vector<int32_t> pages(lease.pages().begin(), lease.pages().end());
    // Valid to 80% of the lease as the peer granted it, counted from before we asked.
    const absl::Time valid_until = sent + absl::Milliseconds(lease.expires_in_ms()) * 0.8;
    auto lent = std::make_shared<PeerDeviceLease>(peer, releaser_, lease_metrics_,
                                                  options_.bytes_only_s, lease.lease_id(), pool,
                                                  std::move(pages), std::move(tokens), valid_until);
    if (absl::Status st = CheckLayout(pool, local); !st.ok()) {
      lent->Finish(absl::CancelledError("not used"));
      return st;  // FAILED_PRECONDITION: bytes instead
    }
    const int64_t n = int64_t(lent->tokens().size());
    if (lease.lease_id() == 0 || n != int64_t(lease.num_tokens()) ||
        int64_t(lent->pages().size()) != (n + pool.page_size - 1) / pool.page_size ||
        DocumentId(options_.model_fingerprint, ns, lent->tokens()) != id) {
      lent->Finish(absl::CancelledError("not used"));
      return absl::DataLossError(absl::StrCat("peer ", peer->address(), ": lease of ", id,
                                              " does not describe that document"));
    }
    StoredDocument doc;
    doc.origin = "peer";
    doc.lease = std::move(lent);
    return doc;
  }

  void Count(const std::string &result) {
    if (fetches_ != nullptr) fetches_->Add({{"result", result}}).Increment();
  }

  // The first peer that holds the document; NOT_FOUND when none does (or none answered).
  absl::StatusOr<StoredDocument> FromPeers(const std::string &ns, const std::string &id) {
    const std::optional<PeerPoolHandle> local = Local();
    for (auto &peer : peers_) {
      const absl::Time now = absl::Now();
      if (peer->Down(now)) {
        Count("skipped");
        continue;
      }
      absl::StatusOr<StoredDocument> got = absl::UnknownError("not asked");
      bool asked = false;
      if (local.has_value()) {
        absl::StatusOr<bool> lends = Lends(*peer, *local);
        if (!lends.ok()) {
          got = lends.status();
          asked = true;
        } else if (*lends) {
          got = LeaseFrom(peer, *local, ns, id);
          asked = true;
          if (got.ok()) {
            Count("lease");
            return got;
          }
          if (absl::IsUnimplemented(got.status()) || absl::IsFailedPrecondition(got.status())) {
            // Cannot lend after all (another pool now, a restart onto the CPU...): bytes.
            peer->SetBytesOnly(absl::Now() + absl::Seconds(options_.bytes_only_s));
            asked = false;
          }
        }
      }
      if (!asked) got = FetchFrom(*peer, ns, id);
      if (got.ok()) {
        Count("hit");
        if (fetch_bytes_ != nullptr) fetch_bytes_->Increment(double(got->bytes.size()));
        if (fetch_seconds_ != nullptr)
          fetch_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - now));
        got->origin = "peer";
        return got;
      }
      const absl::Status &st = got.status();
      if (absl::IsNotFound(st)) {
        Count("miss");
        continue;
      }
      Count(ResultLabel(st));
      if (absl::IsResourceExhausted(st)) continue;  // busy, not broken: ask it next time
      LOG_WARNING << "peer " << peer->address() << " failed (" << st << "): skipped for "
                  << options_.down_s << " s";
      peer->MarkDown(absl::Now() + absl::Seconds(options_.down_s));
    }
    return absl::NotFoundError(absl::StrCat("no peer holds document ", id));
  }

  absl::StatusOr<StoredDocument> FetchFrom(Peer &peer, const std::string &ns,
                                           const std::string &id) {
    grpc::ClientContext ctx;
    peer.PrepareCall(ctx, options_.call_timeout_s);
    v1::PeerGetRequest req;
    req.set_model_fingerprint(options_.model_fingerprint);
    req.set_cache_namespace(ns);
    req.set_document_id(id);
    req.set_chunk_size(options_.chunk_size);
    auto reader = peer.stub().GetDocument(&ctx, req);
    v1::PeerGetResponse msg;
    // A malformed stream: cancel it (Finish would otherwise wait for the rest) and report.
    auto corrupt = [&](const std::string &why) -> absl::Status {
      ctx.TryCancel();
      reader->Finish();
      return absl::DataLossError(absl::StrCat("peer ", peer.address(), ": ", why));
    };
    if (!reader->Read(&msg)) return FromGrpcStatus(reader->Finish());
    if (!msg.has_header()) return corrupt("stream does not start with a header");
    const v1::PeerDocumentHeader h = msg.header();
    if (h.chunk_size() == 0 || h.chunk_size() > kMaxChunkBytes || h.total_size() > kMaxValueBytes ||
        h.num_chunks() != (h.total_size() + h.chunk_size() - 1) / h.chunk_size()) {
      return corrupt(absl::StrCat("bad header (", h.total_size(), " bytes, ", h.num_chunks(),
                                  " chunks of ", h.chunk_size(), ")"));
    }
    StoredDocument doc;
    doc.metadata = h.metadata();
    doc.bytes.reserve(h.total_size());
    for (uint32_t i = 0; i < h.num_chunks(); ++i) {
      if (!reader->Read(&msg)) {
        absl::Status st = FromGrpcStatus(reader->Finish());
        return st.ok() ? absl::DataLossError(absl::StrCat("peer ", peer.address(),
                                                          ": stream ended at chunk ", i, " of ",
                                                          h.num_chunks()))
                       : st;
      }
      if (!msg.has_chunk() || msg.chunk().index() != i) return corrupt("chunk out of order");
      const std::string &data = msg.chunk().data();
      const uint64_t expect = std::min<uint64_t>(h.chunk_size(), h.total_size() - doc.bytes.size());
      if (data.size() != expect) return corrupt(absl::StrCat("chunk ", i, " has the wrong size"));
      if (Crc32c(data) != msg.chunk().crc32c()) {
        return corrupt(absl::StrCat("chunk ", i, " fails its CRC-32C"));
      }
      doc.bytes += data;
    }
    if (reader->Read(&msg)) return corrupt("more chunks than the header said");
    if (absl::Status st = FromGrpcStatus(reader->Finish()); !st.ok()) return st;
    return doc;
  }

  const PeerStoreOptions options_;
  std::unique_ptr<DocumentStore> inner_;
  std::vector<std::shared_ptr<Peer>> peers_;
  const std::shared_ptr<LeaseReleaser> releaser_;
  // Shared with the leases, which may outlive the store.
  const std::shared_ptr<LeaseMetrics> lease_metrics_;
  absl::Mutex local_mu_;
  bool leases_enabled_ ABSL_GUARDED_BY(local_mu_) = false;
  PeerPoolHandle local_ ABSL_GUARDED_BY(local_mu_);
  metrics::Family<metrics::Counter> *fetches_ = nullptr;
  metrics::Counter *fetch_bytes_ = nullptr;
  metrics::Histogram *fetch_seconds_ = nullptr;
};

}  // namespace

std::vector<std::string> SplitPeerList(const std::string &spec) {
  std::vector<std::string> out;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(item));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<DocumentStore>> OpenPeerFirstStore(
    const PeerStoreOptions &options, std::unique_ptr<DocumentStore> inner) {
  if (options.peers.empty()) return absl::InvalidArgumentError("peer store: no peers");
  if (options.model_fingerprint.empty()) {
    return absl::InvalidArgumentError("peer store: model fingerprint is empty");
  }
  if (!(options.call_timeout_s > 0) || options.down_s < 0) {
    return absl::InvalidArgumentError("peer store: call_timeout_s must be > 0, down_s >= 0");
  }
  if (!(options.lease_s > 0) || options.lease_s > 60 || options.bytes_only_s < 0) {
    return absl::InvalidArgumentError("peer store: lease_s must be in (0, 60], bytes_only_s >= 0");
  }
  if (options.chunk_size > kMaxChunkBytes) {
    return absl::InvalidArgumentError("peer store: chunk_size is above 4 MiB");
  }
  for (const std::string &p : options.peers) {
    auto hp = ParseHostPort(p);
    if (!hp.ok() || hp->host.empty() || hp->port <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers '", p, "': expected HOST:PORT with a port above 0"));
    }
  }
  auto credentials = ChannelCredentialsFor(options.tls);
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<DocumentStore>(
      new PeerFirstStore(options, std::move(inner), *credentials));
}

}  // namespace lazyrag
