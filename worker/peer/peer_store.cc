#include "worker/peer/peer_store.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "lazyrag/v1/peer.grpc.pb.h"

namespace lazyrag {
namespace {

constexpr int kMaxMessageBytes = 16 << 20;
constexpr uint64_t kMaxValueBytes = uint64_t(4) << 30;  // refuse absurd headers up front
constexpr uint32_t kMaxChunkBytes = 4 << 20;

std::string ResultLabel(const absl::Status &s) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(s.code()));
}

// One peer worker: its channel and when it may be asked again after a failure.
class Peer {
 public:
  explicit Peer(std::string address) : address_(std::move(address)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    // A peer that restarts is found again quickly.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stub_ = v1::PeerDocuments::NewStub(
        grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args));
  }

  const std::string &address() const { return address_; }
  v1::PeerDocuments::Stub &stub() { return *stub_; }

  bool Down(absl::Time now) const {
    absl::MutexLock l(&mu_);
    return now < down_until_;
  }
  void MarkDown(absl::Time until) {
    absl::MutexLock l(&mu_);
    down_until_ = until;
  }

 private:
  const std::string address_;
  std::unique_ptr<v1::PeerDocuments::Stub> stub_;
  mutable absl::Mutex mu_;
  absl::Time down_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

class PeerFirstStore : public DocumentStore {
 public:
  PeerFirstStore(const PeerStoreOptions &o, std::unique_ptr<DocumentStore> inner)
      : options_(o), inner_(std::move(inner)) {
    for (const std::string &a : o.peers) peers_.push_back(std::make_unique<Peer>(a));
    if (o.registry != nullptr) {
      fetches_ = &o.registry->AddCounter(
          "lazyrag_worker_peer_fetch_total",
          "Document requests to peer workers, by result (hit, miss, skipped = peer marked down "
          "after a failure, resource_exhausted = peer busy, or the status code).");
      for (const char *r : {"hit", "miss", "skipped"}) fetches_->Add({{"result", r}});
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

  absl::StatusOr<StoredDocument> GetWhileDown(const std::string &ns,
                                              const std::string &id) override {
    if (auto hit = FromPeers(ns, id); hit.ok()) return hit;
    return absl::UnavailableError("kvstore marked down and no peer holds the document");
  }

  absl::Status Put(const std::string &ns, const std::string &id,
                   const StoredDocument &doc) override {
    if (inner_ == nullptr) return absl::OkStatus();  // nothing keeps it; accepts_writes() is false
    return inner_->Put(ns, id, doc);
  }

  bool accepts_writes() const override { return inner_ != nullptr && inner_->accepts_writes(); }

 private:
  void Count(const std::string &result) {
    if (fetches_ != nullptr) fetches_->Add({{"result", result}}).Increment();
  }

  // The first peer that holds the document; NOT_FOUND when none does (or none answered).
  absl::StatusOr<StoredDocument> FromPeers(const std::string &ns, const std::string &id) {
    for (auto &peer : peers_) {
      const absl::Time now = absl::Now();
      if (peer->Down(now)) {
        Count("skipped");
        continue;
      }
      auto got = FetchFrom(*peer, ns, id);
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
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(int64_t(options_.call_timeout_s * 1e6)));
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
  std::vector<std::unique_ptr<Peer>> peers_;
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
  return std::unique_ptr<DocumentStore>(new PeerFirstStore(options, std::move(inner)));
}

}  // namespace lazyrag
