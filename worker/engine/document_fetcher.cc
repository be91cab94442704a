#include "worker/engine/document_fetcher.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/document_id.h"
#include "common/logging.h"

namespace lazyrag {
namespace {

std::string StatusLabel(const absl::Status &s) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(s.code()));
}

std::string PrefetchKey(const std::string &ns, const std::string &id) {
  return absl::StrCat(ns.size(), ":", ns, id);
}

}  // namespace

DocumentFetcher::DocumentFetcher(DocumentStore *store, const ModelConfig &config, KvDtype dtype,
                                 Clock *clock, EngineMetrics *metrics,
                                 const DocumentFetcherOptions &options, DeliverFn deliver)
    : store_(store),
      config_(config),
      dtype_(dtype),
      clock_(clock),
      metrics_(metrics),
      options_(options),
      deliver_(std::move(deliver)),
      cost_(FetchCostOptions{.chunk_tokens = std::max<int64_t>(1, options.chunk_tokens)}) {
  fetch_thread_ = std::thread([this] { FetchLoop(); });
  wb_thread_ = std::thread([this] { WriteBackLoop(); });
}

DocumentFetcher::~DocumentFetcher() {
  {
    absl::MutexLock l(&fetch_mu_);
    fetch_stop_ = true;
  }
  fetch_thread_.join();
  {
    absl::MutexLock l(&wb_mu_);
    wb_stop_ = true;
  }
  wb_thread_.join();
}

FetchTicket DocumentFetcher::Queue(const std::string &ns, const std::string &id, int64_t tokens) {
  FetchTicket ticket;
  ticket.cancelled = std::make_shared<std::atomic<bool>>(false);
  absl::MutexLock l(&fetch_mu_);
  int64_t backlog = 0;  // tokens the fetch thread will fetch from the store first
  for (const FetchItem &q : fetch_queue_) backlog += q.peers_only ? 0 : q.tokens;
  const bool peers_only = cost_.PreferCompute(tokens, backlog);
  // Only a kvstore fetch is hedged (peers-only asks are the cheap tier).
  if (const double after = peers_only ? 0 : cost_.HedgeAfterSeconds(tokens); after > 0) {
    ticket.hedge_at = clock_->Now() + absl::Seconds(after);
  }
  fetch_queue_.push_back({ns, id, tokens, peers_only, ticket.cancelled});
  return ticket;
}

bool DocumentFetcher::GiveUpIfDue(FetchTicket *ticket) {
  if (clock_->Now() < ticket->hedge_at) return false;
  ticket->hedge_at = absl::InfiniteFuture();
  if (ticket->cancelled != nullptr) ticket->cancelled->store(true);
  if (metrics_) metrics_->KvRequests("get", "hedged").Increment();
  return true;
}

void DocumentFetcher::ObserveCompute(int64_t tokens, double seconds) {
  cost_.ObserveCompute(tokens, seconds);
}

void DocumentFetcher::FetchLoop() {
  for (;;) {
    FetchItem item;
    bool down = false;
    {
      absl::MutexLock l(&fetch_mu_);
      fetch_mu_.Await(absl::Condition(
          +[](DocumentFetcher *f) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return f->fetch_stop_ || !f->fetch_queue_.empty();
          },
          this));
      if (fetch_stop_) return;
      item = std::move(fetch_queue_.front());
      fetch_queue_.pop_front();
      down = NowMs() < store_down_until_ms_;
    }
    FetchedDocument f;
    if (item.cancelled != nullptr && item.cancelled->load()) {
      // Given up (hedged) before it started: the document is being computed.
      f.id = item.id;
      f.doc = absl::CancelledError("fetch given up for a compute");
      if (metrics_) metrics_->KvRequests("get", "cancelled").Increment();
    } else if (down || item.peers_only) {
      // The store failed recently, or fetching from it is predicted to take
      // longer than recomputing: only its front tiers (peer workers) are asked.
      f = ReadFromFrontTiers(item.ns, item.id, down);
    } else {
      bool failed = false;
      f = ReadFromStore(item.ns, item.id, item.tokens, &failed);
      if (failed) {
        absl::MutexLock l(&fetch_mu_);
        store_down_until_ms_ = NowMs() + kStoreDownMs;
      }
    }
    deliver_(std::move(f));
  }
}

FetchedDocument DocumentFetcher::ReadFromFrontTiers(const std::string &ns, const std::string &id,
                                                    bool down) {
  FetchedDocument f{id,
                    down ? absl::UnavailableError("kvstore marked down")
                         : absl::UnavailableError("kvstore slower than recomputing"),
                    "", nullptr, nullptr};
  auto got = store_->GetFromFrontTiers(ns, id);
  if (got.ok() && got->lease != nullptr) {
    f.doc = DecodedDocument{{}, got->lease->tokens(), {}};
    f.origin = std::move(got->origin);
    f.lease = std::move(got->lease);
  } else if (got.ok()) {
    f.doc = DecodeDocument(*got, config_, dtype_);
    f.origin = std::move(got->origin);
  } else {
    if (metrics_) {
      metrics_->KvRequests("get", down ? "skipped" : "slower_than_compute").Increment();
    }
    // Computed instead of fetched: whether a write-back would repeat what the
    // store holds (an existence check, no bytes; a store that cannot tell gets
    // the write-back).
    if (!down) {
      auto has = store_->Contains(ns, id);
      f.in_store = has.ok() && *has;
    }
  }
  return f;
}

FetchedDocument DocumentFetcher::ReadFromStore(const std::string &ns, const std::string &id,
                                               int64_t tokens, bool *failed) {
  FetchedDocument f{id, absl::UnknownError("unset"), "", nullptr, nullptr};
  *failed = false;
  const absl::Time t0 = clock_->Now();
  absl::StatusOr<StoredDocument> got = absl::UnknownError("unset");
  if (tokens > 0 && options_.host_tier != nullptr) {
    // The front tiers (peers) first, as Get asks them; then the durable store, straight into
    // pinned memory where it can.
    got = store_->GetFromFrontTiers(ns, id);
    auto landed = got.ok() ? std::nullopt : ReadIntoHostTier(ns, id);
    if (landed.has_value()) {
      const double seconds = absl::ToDoubleSeconds(clock_->Now() - t0);
      if (landed->ok()) {
        cost_.ObserveFetch(tokens, seconds);
        if (metrics_) {
          metrics_->fetch_seconds->Observe(seconds);
          metrics_->fetch_bytes->Increment(double(landed->value().doc->header.payload_bytes));
          metrics_->KvRequests("get", "hit").Increment();
        }
        return *std::move(*landed);
      }
      f.doc = landed->status();
      CountFailedRead(landed->status(), failed);
      return f;
    }
  }
  if (!got.ok()) got = store_->Get(ns, id);
  if (got.ok() && got->lease != nullptr) {
    // Lent in a peer's device pool: the peer store counts it
    // (lazyrag_worker_peer_*).
    f.doc = DecodedDocument{{}, got->lease->tokens(), {}};
    f.origin = std::move(got->origin);
    f.lease = std::move(got->lease);
  } else if (got.ok() && !got->origin.empty()) {
    // From a peer worker: the peer store counts it
    // (lazyrag_worker_peer_fetch_*).
    f.doc = DecodeDocument(*got, config_, dtype_);
    f.origin = std::move(got->origin);
  } else if (got.ok()) {
    const double seconds = absl::ToDoubleSeconds(clock_->Now() - t0);
    f.doc = DecodeStored(*got, ns, id);
    // A read by id does not know the size beforehand: the decoded value tells.
    if (tokens <= 0 && f.doc.ok()) tokens = int64_t(f.doc->tokens.size());
    cost_.ObserveFetch(tokens, seconds);
    if (metrics_) {
      metrics_->fetch_seconds->Observe(seconds);
      metrics_->fetch_bytes->Increment(double(got->bytes.size()));
      metrics_->KvRequests("get", f.doc.ok() ? "hit" : StatusLabel(f.doc.status())).Increment();
    }
  } else {
    f.doc = got.status();
    CountFailedRead(got.status(), failed);
  }
  return f;
}

absl::StatusOr<DecodedDocument> DocumentFetcher::DecodeStored(const StoredDocument &stored,
                                                              const std::string &ns,
                                                              const std::string &id) {
  auto header = DecodeDocumentHeader(stored.metadata, config_, dtype_);
  if (!header.ok()) return header.status();
  if (absl::Status mac = VerifyDocumentMac(stored, *header, MacScope(ns, id)); !mac.ok()) {
    if (metrics_) metrics_->mac_failures->Increment();
    LOG_WARNING << "kvstore value of " << id << ": " << mac.message() << "; recomputing";
    return mac;
  }
  return DecodeDocument(stored, config_, dtype_);
}

void DocumentFetcher::CountFailedRead(const absl::Status &status, bool *failed) {
  const bool miss = absl::IsNotFound(status);
  if (metrics_) metrics_->KvRequests("get", miss ? "miss" : StatusLabel(status)).Increment();
  if (miss) return;
  LOG_WARNING << "kvstore get failed (" << status << "): recomputing";
  // One key's trouble (corrupt: the shard dropped it and the write-back of the recomputed
  // document replaces it; malformed; written for another shape) is not the store's.
  *failed = !(absl::IsDataLoss(status) || absl::IsInvalidArgument(status) ||
              absl::IsFailedPrecondition(status) || absl::IsOutOfRange(status));
}

std::optional<absl::StatusOr<FetchedDocument>> DocumentFetcher::ReadIntoHostTier(
    const std::string &ns, const std::string &id) {
  HostTier *const tier = options_.host_tier;
  if (tier == nullptr) return std::nullopt;
  DocumentKvHeader header;
  std::vector<int32_t> tokens;
  std::shared_ptr<LandedInHost> landed;
  absl::Status no_room;  // the tier could not take it: not the store's failure
  const DocumentMacScope scope = MacScope(ns, id);
  std::string stored_metadata;
  std::vector<ByteSpan> spans;
  // The MAC is checked block by block as the store's reading threads check each chunk
  // (on_chunk below), the rest at the end: no second pass over the bytes.
  std::unique_ptr<DocumentMacCheck> mac;
  auto sink = [&](const std::string &metadata,
                  uint64_t bytes) -> absl::StatusOr<std::vector<ByteSpan>> {
    landed.reset();  // a replica that failed part-way: start over
    mac.reset();
    auto h = DecodeDocumentHeader(metadata, config_, dtype_);
    if (!h.ok()) return h.status();
    header = *h;
    if (scope.key != nullptr && !header.has_mac) {
      return absl::DataLossError(absl::StrCat(kMacFailure, " (none stored)"));
    }
    const uint64_t token_bytes = uint64_t(header.num_tokens) * sizeof(int32_t);
    if (bytes != token_bytes + header.payload_bytes) {
      return absl::DataLossError("stored document: value size does not match its header");
    }
    auto range =
        tier->BeginInsert(id, int64_t(header.payload_bytes), int32_t(header.num_tokens), {});
    if (!range.ok()) {
      no_room = range.status();
      return range.status();
    }
    landed = std::make_shared<LandedInHost>(tier, id, *range, options_.keep_landed);
    tokens.resize(header.num_tokens);
    stored_metadata = metadata;
    spans = {{reinterpret_cast<char *>(tokens.data()), token_bytes},
             {*range, header.payload_bytes}};
    if (scope.key != nullptr) {
      mac = std::make_unique<DocumentMacCheck>(scope.key, header.mac_nonce, bytes);
    }
    return spans;
  };
  ChunkObserver on_chunk;
  if (scope.key != nullptr) {
    on_chunk = [&mac](uint64_t offset, const char *data, uint64_t size) {
      if (mac != nullptr) mac->Observe(offset, data, size);
    };
  }
  absl::StatusOr<std::string> got = store_->GetInto(ns, id, sink, on_chunk);
  if (absl::IsUnimplemented(got.status()) || !no_room.ok()) return std::nullopt;
  if (!got.ok()) {
    if (absl::StrContains(got.status().message(), kMacFailure) && metrics_) {
      metrics_->mac_failures->Increment();
    }
    return got.status();
  }
  if (landed == nullptr) return absl::InternalError("fetch: nothing landed");
  if (mac != nullptr && !mac->Finish(spans, MacBindingOf(stored_metadata, scope), header.mac_tag)) {
    if (metrics_) metrics_->mac_failures->Increment();
    LOG_WARNING << "kvstore value of " << id << ": " << kMacFailure << "; recomputing";
    return absl::DataLossError(kMacFailure);  // `landed` gives its range back
  }
  FetchedDocument f;
  f.id = id;
  f.doc = DecodedDocument{header, std::move(tokens), {}};
  f.landed = std::move(landed);
  return f;
}

namespace {
int64_t PayloadBytes(const FetchedDocument &f) {
  return f.doc.ok() ? int64_t(f.doc->payload.size()) : 0;
}
}  // namespace

absl::StatusOr<std::vector<int32_t>> DocumentFetcher::FetchTokens(const std::string &ns,
                                                                  const std::string &id) {
  bool failed = false;  // a failed read by id fails its request; it does not
                        // mark the store
  FetchedDocument f = ReadFromStore(ns, id, /*tokens=*/0, &failed);
  if (!f.doc.ok()) return f.doc.status();
  if (DocumentId(options_.fingerprint, ns, f.doc->tokens) != id) {
    // Not this namespace's document (a peer answers by id alone) or a forged value: as absent.
    return absl::NotFoundError("no document with this id in this namespace");
  }
  std::vector<int32_t> tokens = f.doc->tokens;
  absl::MutexLock l(&prefetched_mu_);
  const std::string key = PrefetchKey(ns, id);
  if (auto old = prefetched_.find(key); old != prefetched_.end()) {
    prefetched_bytes_ -= PayloadBytes(old->second);
    prefetched_.erase(old);
    prefetched_order_.erase(std::find(prefetched_order_.begin(), prefetched_order_.end(), key));
  }
  prefetched_bytes_ += PayloadBytes(f);
  prefetched_.emplace(key, std::move(f));
  prefetched_order_.push_back(key);
  while (prefetched_order_.size() > 1 &&
         (prefetched_order_.size() > kMaxPrefetched || prefetched_bytes_ > kMaxPrefetchedBytes)) {
    auto oldest = prefetched_.find(prefetched_order_.front());
    prefetched_bytes_ -= PayloadBytes(oldest->second);
    prefetched_.erase(oldest);  // a lease in it is released
    prefetched_order_.pop_front();
  }
  return tokens;
}

std::optional<FetchedDocument> DocumentFetcher::TakePrefetched(const std::string &ns,
                                                               const std::string &id) {
  absl::MutexLock l(&prefetched_mu_);
  if (prefetched_.empty()) return std::nullopt;
  const std::string key = PrefetchKey(ns, id);
  auto it = prefetched_.find(key);
  if (it == prefetched_.end()) return std::nullopt;
  FetchedDocument f = std::move(it->second);
  prefetched_bytes_ -= PayloadBytes(f);
  prefetched_.erase(it);
  prefetched_order_.erase(std::find(prefetched_order_.begin(), prefetched_order_.end(), key));
  return f;
}

bool DocumentFetcher::WritesPaused() {
  absl::MutexLock l(&fetch_mu_);
  return NowMs() < std::max(store_down_until_ms_, writes_down_until_ms_);
}

bool DocumentFetcher::AcceptWriteBack(int64_t bytes) {
  if (!store_->durable()) return false;
  const bool paused = WritesPaused();
  bool full = false;
  {
    absl::MutexLock l(&wb_mu_);
    full = wb_queue_.size() >= kMaxWriteBacks ||
           (wb_pending_bytes_ > 0 && wb_pending_bytes_ + bytes > options_.max_writeback_bytes);
  }
  if (paused) {
    if (metrics_) metrics_->KvRequests("put", "skipped").Increment();
    return false;
  }
  if (full) {
    if (metrics_) metrics_->writeback_dropped->Increment();
    return false;
  }
  return true;
}

void DocumentFetcher::QueueWriteBack(std::string ns, std::string id, std::vector<int32_t> tokens,
                                     std::string payload) {
  absl::MutexLock l(&wb_mu_);
  wb_pending_bytes_ += int64_t(payload.size());
  wb_queue_.push_back(WriteBack{
      std::move(ns), std::move(id), std::move(tokens), std::move(payload), {}, nullptr, {}});
}

void DocumentFetcher::QueueWriteBack(std::string ns, std::string id, std::vector<int32_t> tokens,
                                     std::string_view payload, std::shared_ptr<const void> hold,
                                     std::function<bool()> check) {
  absl::MutexLock l(&wb_mu_);
  wb_pending_bytes_ += int64_t(payload.size());
  wb_queue_.push_back(WriteBack{std::move(ns), std::move(id), std::move(tokens), std::string(),
                                payload, std::move(hold), std::move(check)});
}

void DocumentFetcher::WriteBackLoop() {
  for (;;) {
    WriteBack wb;
    {
      absl::MutexLock l(&wb_mu_);
      wb_mu_.Await(absl::Condition(
          +[](DocumentFetcher *f)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return f->wb_stop_ || !f->wb_queue_.empty(); },
          this));
      if (wb_queue_.empty()) return;  // stopping with nothing left: done
      wb = std::move(wb_queue_.front());
      wb_queue_.pop_front();
    }
    if (wb.hold == nullptr) wb.payload = wb.owned;  // a view into a string is not moved with it
    // Pending until sent (or skipped): the payload and its encoded copy live
    // until then.
    const int64_t bytes = int64_t(wb.payload.size());
    absl::Cleanup sent = [this, bytes] {
      absl::MutexLock l(&wb_mu_);
      wb_pending_bytes_ -= bytes;
    };
    if (WritesPaused()) {
      if (metrics_) metrics_->KvRequests("put", "skipped").Increment();
      continue;
    }
    if (wb.check && !wb.check()) {
      LOG_WARNING << "write-back of " << wb.id << " skipped: its host copy is corrupt";
      if (metrics_) metrics_->KvRequests("put", "corrupt").Increment();
      continue;
    }
    // Encoded here (a copy and a checksum of the whole payload: ~0.27 GB for a
    // 2,048-token document of the 8B model), not on the scheduler thread.
    absl::Status st =
        store_->Put(wb.ns, wb.id,
                    EncodeDocument(config_, dtype_, wb.tokens, wb.payload, MacScope(wb.ns, wb.id)));
    if (metrics_) metrics_->KvRequests("put", st.ok() ? "ok" : StatusLabel(st)).Increment();
    if (!st.ok()) {
      LOG_WARNING << "kvstore write-back of " << wb.id << " failed: " << st;
      if (absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) {
        absl::MutexLock l(&fetch_mu_);
        writes_down_until_ms_ = NowMs() + kStoreDownMs;
      }
    }
  }
}

}  // namespace lazyrag
