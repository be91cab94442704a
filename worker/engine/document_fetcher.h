// The store tier as the scheduler uses it (DESIGN sections 3 and 6): a fetch thread that reads
// missing documents from the DocumentStore and a write-back thread that writes computed ones to
// it, so that neither blocks a scheduler step. The policy of when to read and write lives here,
// not in the store:
//  * fetch or compute (fetch_cost.h): a document predicted cheaper to recompute than to read
//    from the kvstore is asked of the store's front tiers only (peer workers);
//  * hedging: a kvstore read running past its hedge time is given up for a compute;
//  * a circuit breaker: after a failed read the store is skipped (front tiers only) for
//    kStoreDownMs; after a failed write-back only write-backs pause that long;
//  * a bound on the host bytes of write-backs waiting for the store;
//  * a document fetched for its tokens on a caller's thread (named by id) is kept for the
//    scheduler, so that it is read from the store once.
// Time comes only from the injected clock.
//
// Thread safety: Queue, GiveUpIfDue, ObserveCompute, AcceptWriteBack, QueueWriteBack and
// TakePrefetched are called from the scheduler thread; FetchTokens from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"
#include "worker/cache/document_store.h"
#include "worker/cache/host_tier.h"
#include "worker/engine/clock.h"
#include "worker/engine/document_codec.h"
#include "worker/engine/document_mac.h"
#include "worker/engine/engine_metrics.h"
#include "worker/engine/fetch_cost.h"

namespace lazyrag {

// A fetched document's KV read straight into the host tier (pinned memory) as a pending entry
// under the document's id: its owner copies it into pool pages and commits the entry with the
// checksum that copy computed (the bytes were checked chunk by chunk on their way in).
// Destroying it before Commit aborts the entry. Not thread-safe; the tier must outlive it.
class LandedInHost {
 public:
  // `keep`: the entry is to stay in the tier (committed) once copied; else it is dropped then.
  LandedInHost(HostTier *tier, std::string key, const char *data, bool keep)
      : tier_(tier), key_(std::move(key)), data_(data), keep_(keep) {}
  ~LandedInHost() { Abort(); }
  LandedInHost(const LandedInHost &) = delete;
  LandedInHost &operator=(const LandedInHost &) = delete;
  const char *data() const { return data_; }
  bool keep() const { return keep_; }
  // The entry becomes ready (visible to Acquire) with `checksum` (KvChecksum of its bytes).
  absl::Status Commit(uint64_t checksum) {
    done_ = true;
    return tier_->CommitInsert(key_, checksum);
  }
  void Abort() {
    if (!done_) tier_->AbortInsert(key_);
    done_ = true;
  }

 private:
  HostTier *const tier_;
  const std::string key_;
  const char *const data_;
  const bool keep_;
  bool done_ = false;
};

// What a fetch found, handed to the scheduler.
struct FetchedDocument {
  std::string id;
  // Tokens only (no payload) when `lease` or `landed` is set.
  absl::StatusOr<DecodedDocument> doc;
  std::string origin;  // StoredDocument::origin on a hit
  std::shared_ptr<DeviceLease> lease;
  // Instead of a payload: the KV in the host tier, waiting to be copied into pages.
  std::shared_ptr<LandedInHost> landed;
  // Not read (computing was predicted cheaper) but the store holds it: no
  // write-back.
  bool in_store = false;
};

// A fetch in flight as the scheduler tracks it.
struct FetchTicket {
  absl::Time hedge_at = absl::InfiniteFuture();  // given up for a compute from then
  std::shared_ptr<std::atomic<bool>> cancelled;  // tells the fetch thread so
};

struct DocumentFetcherOptions {
  std::string fingerprint;          // model fingerprint: ids of documents fetched by id
                                    // are checked
  int64_t chunk_tokens = 2048;      // prefill chunk (FetchCostOptions::chunk_tokens)
  int64_t max_writeback_bytes = 0;  // EngineOptions::max_writeback_bytes
  // Not owned; may be null. Store reads land in it (pinned memory, no intermediate copy)
  // where the store can (DocumentStore::GetInto): the host tier, or fetch staging memory.
  HostTier *host_tier = nullptr;
  // Whether a landed document stays in `host_tier` once copied into its pages (the host tier)
  // or leaves it (staging memory).
  bool keep_landed = true;
  // Documents written back carry a MAC under this key and store reads must verify (a failure is
  // a miss: DATA_LOSS, lazyrag_kvstore_mac_failures_total). Null: no MACs.
  std::shared_ptr<const DocumentMacKey> mac_key;
};

class DocumentFetcher {
 public:
  // After a failed store call, reads (or write-backs) skip the store this long.
  static constexpr int64_t kStoreDownMs = 2000;
  // Write-backs queued at most.
  static constexpr size_t kMaxWriteBacks = 64;
  // Documents fetched by FetchTokens kept for the scheduler at most (oldest
  // dropped).
  static constexpr size_t kMaxPrefetched = 64;
  // ... and at most this many payload bytes of them (the oldest go first): a request follows its
  // read within milliseconds, so a few documents of a large model are enough.
  static constexpr int64_t kMaxPrefetchedBytes = int64_t(2) << 30;

  // Called on the fetch thread with every finished fetch.
  using DeliverFn = std::function<void(FetchedDocument)>;

  // `store`, `clock` and `metrics` are not owned and must outlive the fetcher;
  // `metrics` may be null. `config` and `dtype` are the backend's (the stored
  // form's shape). Starts the fetch and write-back threads.
  DocumentFetcher(DocumentStore *store, const ModelConfig &config, KvDtype dtype, Clock *clock,
                  EngineMetrics *metrics, const DocumentFetcherOptions &options, DeliverFn deliver);
  // Drops fetches not started, sends the write-backs queued, joins both
  // threads.
  ~DocumentFetcher();

  // Queues a read of document `id` (`tokens` tokens): from the kvstore with a
  // hedge time, or from the front tiers only when the cost model prefers
  // computing. Its result is delivered.
  FetchTicket Queue(const std::string &cache_namespace, const std::string &id, int64_t tokens);
  // True when `ticket`'s hedge time has passed: the fetch is cancelled (not
  // started, or its result to be dropped) and counted as hedged; the ticket no
  // longer hedges.
  bool GiveUpIfDue(FetchTicket *ticket);
  // A forward step of `tokens` tokens took `seconds` (for the cost model).
  void ObserveCompute(int64_t tokens, double seconds);
  // The host tier in the cost model (fetch_cost.h): a promotion took `seconds`; whether to
  // recompute a host-tier document instead of promoting it.
  void ObserveHostCopy(int64_t tokens, double seconds) { cost_.ObserveHostCopy(tokens, seconds); }
  bool PreferComputeToHost(int64_t tokens, int64_t backlog_tokens) {
    return cost_.PreferComputeToHost(tokens, backlog_tokens);
  }

  // Whether to export a computed document of `bytes` payload bytes for a
  // write-back: false when the store keeps nothing, write-backs are paused
  // (counted as skipped) or the queue is at its bound (counted as dropped).
  // Only the scheduler thread queues, so a true answer holds until its
  // QueueWriteBack.
  bool AcceptWriteBack(int64_t bytes);
  void QueueWriteBack(std::string cache_namespace, std::string id, std::vector<int32_t> tokens,
                      std::string payload);
  // The same for a payload the caller keeps: `payload` stays valid while `hold` (not null) lives;
  // the write-back drops it once sent or skipped, on the write-back thread. `check` runs there
  // first; false skips the put (counted as result "corrupt"). For a document's copy in the host
  // tier, pinned there, whose checksum `check` verifies.
  void QueueWriteBack(std::string cache_namespace, std::string id, std::vector<int32_t> tokens,
                      std::string_view payload, std::shared_ptr<const void> hold,
                      std::function<bool()> check);

  // The tokens of a document known only by id, read from the store on the
  // caller's thread (checked to hash to `id`); the document itself is kept for
  // TakePrefetched. NOT_FOUND when the store lacks it, UNAVAILABLE when it
  // cannot be reached, DATA_LOSS when the value is corrupt or does not hash to
  // `id`.
  absl::StatusOr<std::vector<int32_t>> FetchTokens(const std::string &cache_namespace,
                                                   const std::string &id);
  // The document FetchTokens read for (namespace, id), once; nullopt when none
  // is kept.
  std::optional<FetchedDocument> TakePrefetched(const std::string &cache_namespace,
                                                const std::string &id);

 private:
  struct FetchItem {
    std::string ns, id;
    int64_t tokens = 0;
    bool peers_only = false;
    std::shared_ptr<std::atomic<bool>> cancelled;
  };
  struct WriteBack {
    std::string ns, id;
    std::vector<int32_t> tokens;
    std::string owned;         // the payload, or empty when `hold` keeps it
    std::string_view payload;  // what `hold` keeps (set from `owned` when dequeued)
    std::shared_ptr<const void> hold;
    std::function<bool()> check;
  };

  void FetchLoop();
  void WriteBackLoop();
  // A read from the whole store (kvstore included), timed and counted. Sets
  // *failed when the store could not serve it (an error other than NOT_FOUND).
  FetchedDocument ReadFromStore(const std::string &ns, const std::string &id, int64_t tokens,
                                bool *failed);
  // Counts a read that found nothing usable; sets *failed (the store is marked down) only for
  // the store's own trouble (transport, server), never for one key's (absent, corrupt,
  // malformed, another shape).
  void CountFailedRead(const absl::Status &status, bool *failed);
  // The MAC scope of the value stored under (ns, id): options_.mac_key (null: no MACs).
  DocumentMacScope MacScope(const std::string &ns, const std::string &id) const {
    return DocumentMacScope{options_.mac_key.get(), options_.fingerprint, ns, id};
  }
  // DecodeDocument of a value read from the store itself, its MAC checked (a failure counted).
  absl::StatusOr<DecodedDocument> DecodeStored(const StoredDocument &stored, const std::string &ns,
                                               const std::string &id);
  // The kvstore's bytes straight into a host-tier entry and the token vector. nullopt when
  // that path is not taken (no tier, a store without GetInto, no room in the tier): the caller
  // reads through Get instead. Else the store's answer (a hit has `landed` set).
  std::optional<absl::StatusOr<FetchedDocument>> ReadIntoHostTier(const std::string &ns,
                                                                  const std::string &id);
  // A read from the store's front tiers only; `down`: the store is marked down
  // (else the cost model chose this).
  FetchedDocument ReadFromFrontTiers(const std::string &ns, const std::string &id, bool down);
  bool WritesPaused();
  int64_t NowMs() const { return absl::ToUnixMillis(clock_->Now()); }

  DocumentStore *const store_;
  const ModelConfig config_;
  const KvDtype dtype_;
  Clock *const clock_;
  EngineMetrics *const metrics_;
  const DocumentFetcherOptions options_;
  const DeliverFn deliver_;
  FetchCostModel cost_;

  absl::Mutex fetch_mu_;
  bool fetch_stop_ ABSL_GUARDED_BY(fetch_mu_) = false;
  std::deque<FetchItem> fetch_queue_ ABSL_GUARDED_BY(fetch_mu_);
  int64_t store_down_until_ms_ ABSL_GUARDED_BY(fetch_mu_) = 0;
  // After a failed write-back only write-backs pause: a store too slow for a
  // large Put (past its deadline) still answers Gets, which are hedged anyway.
  int64_t writes_down_until_ms_ ABSL_GUARDED_BY(fetch_mu_) = 0;

  absl::Mutex wb_mu_;
  bool wb_stop_ ABSL_GUARDED_BY(wb_mu_) = false;
  std::deque<WriteBack> wb_queue_ ABSL_GUARDED_BY(wb_mu_);
  // Payload bytes queued or being sent (EngineOptions::max_writeback_bytes).
  int64_t wb_pending_bytes_ ABSL_GUARDED_BY(wb_mu_) = 0;

  absl::Mutex prefetched_mu_;
  std::map<std::string, FetchedDocument> prefetched_ ABSL_GUARDED_BY(prefetched_mu_);
  std::deque<std::string> prefetched_order_ ABSL_GUARDED_BY(prefetched_mu_);
  int64_t prefetched_bytes_ ABSL_GUARDED_BY(prefetched_mu_) = 0;

  std::thread fetch_thread_;
  std::thread wb_thread_;
};

}  // namespace lazyrag
