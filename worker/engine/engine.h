// The generation engine over one backend: document blocks cached once in the
// paged pool and referenced by any number of requests (LAZY), copied and
// re-rotated per request (MATERIALIZE), reused only on identical prefixes
// (PREFIX), or not at all (FULL). Knows nothing of gRPC (DESIGN section 9).
//
// Requests run under a continuous-batching scheduler
// (worker/engine/scheduler.h): every step packs the decode tokens of running
// requests and prefill chunks of new requests and of documents being computed
// into one ForwardBatch. Documents are looked up in the pool, then in the
// DocumentStore (when one is given), then computed, once however many requests
// want them (singleflight); computed documents are written back to the store in
// the background.
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"
#include "worker/cache/document_store.h"
#include "worker/cache/document_table.h"
#include "worker/cache/host_tier.h"
#include "worker/engine/clock.h"
#include "worker/engine/document_mac.h"
#include "worker/engine/request.h"

namespace lazyrag {

namespace metrics {
class Registry;
}

// EngineOptions::max_writeback_bytes unless set (also RuntimeOptions' and the worker flag's).
inline constexpr int64_t kDefaultMaxWritebackBytes = int64_t(4) << 30;

struct EngineOptions {
  int num_pages = 4096;           // KV pool pages
  int page_size = 16;             // tokens per page
  int prefill_chunk = 512;        // most query rows one sequence feeds in one step
  int max_batch_tokens = 2048;    // per-step token budget (decode + prefill rows)
  int max_running = 64;           // requests admitted at once
  int max_waiting = 256;          // queued beyond that: RESOURCE_EXHAUSTED
  std::string fingerprint;        // model fingerprint, part of every document id
  std::string model_name;         // `model` label of the metrics
  std::string pool_tier = "gpu";  // `tier` label of KV pool hits: "gpu" (cuda) or "cpu"
  // Optional, not owned, must outlive the engine: the store tier (pool -> store
  // -> compute).
  DocumentStore *store = nullptr;
  // Host bytes of computed documents' KV waiting for their write-back to the store (queued or
  // being sent: 268 MB a document for 2,048 tokens of an 8B model); a document that would go
  // past it is not written back (lazyrag_kvstore_writeback_dropped_total). One write-back is
  // always let through when none is pending.
  int64_t max_writeback_bytes = kDefaultMaxWritebackBytes;
  // The workers' key (document_mac.h): documents written to the store carry a MAC under it, and
  // a stored value without a valid one is a miss (counted in lazyrag_kvstore_mac_failures_total),
  // recomputed and written back over. Null (the default): no MACs, the store is trusted.
  std::shared_ptr<const DocumentMacKey> kv_mac_key;
  // Optional, not owned, must outlive the engine: where the engine's metrics
  // are exported.
  metrics::Registry *registry = nullptr;
  // Optional, not owned, must outlive the engine: the time source of deadlines, hedges, the
  // store's down windows, costs and timings (worker/engine/clock.h). Null: RealClock().
  Clock *clock = nullptr;
  // Bytes of host memory for the host tier (worker/cache/host_tier.h: documents evicted from
  // the pool, and every computed one, kept in memory the backend copies at bus speed; a GPU miss
  // looks there before the store). 0: no host tier. Allocated by Create (pinned for CUDA).
  int64_t host_cache_bytes = 0;
  // Without a host tier but with a store: bytes of host memory (pinned for CUDA) that store
  // fetches land in, chunk by chunk, before the copy into their pool pages; freed after it. 0:
  // fetched documents go through pageable memory (Get, ImportKv). With a host tier fetches land
  // in the tier and stay there.
  int64_t fetch_staging_bytes = 0;
  // Server defaults of the answer-quality settings (request.h: QualityOptions); a request's
  // own values override them. Default: none (plain block attention). Checked by Create.
  QualitySettings quality;
  // The shared prefix (attention sink, issue 25): tokens that open every prompt (the engine
  // puts them in TokenPrompt::sink) and after which every block (prefix and documents) is
  // encoded, at local positions: a block's keys are stored rotated at 0.. as without it, but
  // computed attending the shared prefix at positions 0 .. size - 1. Its KV is computed once at
  // Create and pinned for the engine's life. It is part of every block id (the cache namespace
  // is extended with its hash: Engine::BlockId), so documents encoded after another prefix, or
  // none, are never used. Empty (default): none, documents encoded alone.
  std::vector<int32_t> shared_prefix;
};

struct TokenRunOptions {
  AttentionMode mode = AttentionMode::kLazy;
  int max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;              // generate max_tokens whatever is sampled
  std::vector<int32_t> stop_token_ids;  // EOS and the template's end-of-turn tokens
  std::string cache_namespace;
  // Overrides of EngineOptions::quality (LAZY and MATERIALIZE); out of range: INVALID_ARGUMENT.
  QualityOptions quality;
  // DEADLINE_EXCEEDED once it passes (already past: at once, nothing runs).
  absl::Time deadline = absl::InfiniteFuture();
  // Polled while the request runs (about every 20 ms and at every token); true
  // cancels it (CANCELLED) and frees its pages at once. For a client that went
  // away.
  std::function<bool()> is_cancelled;
  // When set, receives the logits of every step: after the prompt, then after
  // each generated token ([max_tokens][vocab] at most). Written by the
  // scheduler thread, read by the caller after RunTokens returns. For tests and
  // fixtures.
  std::vector<std::vector<float>> *step_logits = nullptr;
};

// Called with each generated token, on the caller's thread; return false to
// stop (stop string): the request ends with what was delivered and its pages
// are freed.
using TokenCallback = std::function<bool(int32_t token)>;

// A document made resident by Engine::EncodeDocuments.
struct EncodedDocument {
  std::string id;
  int num_tokens = 0;
  bool computed = false;  // false: it was already resident (true: computed or fetched)
};

struct EngineStats {
  int running = 0;  // admitted requests (computing documents, prefilling or decoding)
  int waiting = 0;  // queued for admission
  int pages_total = 0;
  int pages_free = 0;
  int64_t pages_pinned = 0;  // document pages referenced by running requests
  int64_t evictions = 0;
  int64_t preemptions = 0;
  std::vector<std::string> resident_ids;  // documents (and PREFIX pages) in the pool
  HostTierStats host;                     // the host tier (all zero without one)
};

class Scheduler;
class EngineMetrics;

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<Backend> backend,
                                                        const EngineOptions &options);
  ~Engine();  // fails requests still queued or running (UNAVAILABLE) and joins
              // the threads

  // Runs one request to the end, streaming tokens to `on_token` on this thread.
  // Blocks.
  absl::StatusOr<TokenResult> RunTokens(const TokenPrompt &prompt, const TokenRunOptions &options,
                                        const TokenCallback &on_token = {});

  // Encodes documents without a request: each is made resident in the pool (fetched from the
  // store or computed once, singleflight with requests, and written back like any computed
  // document) and left unpinned. Blocks until all are done. INVALID_ARGUMENT for an empty
  // document or a token id out of the vocabulary; RESOURCE_EXHAUSTED for a document larger
  // than the pool or a full waiting queue; DEADLINE_EXCEEDED past `deadline`. `is_cancelled`
  // (optional) is polled about every 20 ms; true stops the work: documents not yet computed
  // are dropped from the queue and CANCELLED is returned (those done stay resident).
  absl::StatusOr<std::vector<EncodedDocument>> EncodeDocuments(
      const std::vector<std::vector<int32_t>> &documents, const std::string &cache_namespace,
      absl::Time deadline = absl::InfiniteFuture(), const std::function<bool()> &is_cancelled = {});

  // The id under which a block of tokens is cached (common/document_id.h; with a shared
  // prefix, its hash extends `cache_namespace`).
  std::string BlockId(const std::vector<int32_t> &tokens, const std::string &cache_namespace) const;

  // The tokens of a document known only by id, read from the store (a document
  // named by id after a restart). NOT_FOUND when there is no store or it does
  // not hold the id; UNAVAILABLE when the store cannot be reached. The document read is kept
  // for the request that names it next, which imports it instead of reading it again.
  absl::StatusOr<std::vector<int32_t>> FetchDocumentTokens(const std::string &cache_namespace,
                                                           const std::string &id);

  // A document resident in the pool, in its stored form (document_codec.h: the
  // same value the kvstore holds), for a peer worker (worker/peer). The entry is
  // pinned while its KV is copied out, so it cannot be evicted mid-copy, then
  // released. Never computes and never asks the store: NOT_FOUND when the id is
  // not resident (or is not a document: PREFIX-mode pages). The copy itself
  // runs on the scheduler thread between two steps (Scheduler::RunOnLoop).
  absl::StatusOr<StoredDocument> ExportResidentDocument(const std::string &id);

  // The peer tier's fast path, serving side. This engine's KV pool as it lends it to peer
  // workers (Backend::ExportPoolHandle, asked once at creation): UNIMPLEMENTED or
  // FAILED_PRECONDITION when the backend cannot share it (CPU, tensor parallelism).
  const absl::StatusOr<PeerPoolHandle> &PoolHandle() const { return pool_handle_; }
  // Pins a resident document for a peer to copy its pages: the pin holds until
  // UnpinDocument(id) (one call per successful PinResidentDocument). Never computes and never
  // asks the store: NOT_FOUND when the id is not resident or is not a document.
  struct PinnedDocument {
    std::vector<int32_t> pages;  // in document order
    int32_t num_tokens = 0;
    std::vector<int32_t> tokens;  // [num_tokens]
  };
  absl::StatusOr<PinnedDocument> PinResidentDocument(const std::string &id);
  void UnpinDocument(const std::string &id);

  // Drops an unreferenced document from the pool now, as pool pressure would (copied to the host
  // tier first when there is one and it lacks the document). For benchmarks and tests of the
  // tiers. NOT_FOUND when it is not resident, FAILED_PRECONDITION when a request uses it.
  absl::Status EvictDocument(const std::string &id);

  EngineStats Stats() const;

  Backend &backend() { return *backend_; }
  const ModelConfig &config() const { return backend_->config(); }
  DocumentTable &documents() { return *table_; }
  // The host tier; null without one (EngineOptions::host_cache_bytes 0).
  HostTier *host_tier() { return host_.get(); }
  const PageAllocator &pages() const { return *allocator_; }
  const EngineOptions &options() const { return options_; }

 private:
  Engine(std::unique_ptr<Backend> backend, const EngineOptions &options,
         std::unique_ptr<HostTier> host, std::unique_ptr<HostTier> staging);
  absl::Status Validate(const TokenPrompt &prompt, const TokenRunOptions &options) const;
  // The namespace block ids are computed under: the caller's, extended with the shared
  // prefix's hash when there is one.
  std::string IdNamespace(const std::string &cache_namespace) const;
  absl::Time Now() const { return options_.clock->Now(); }

  EngineOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<PageAllocator> allocator_;
  std::unique_ptr<DocumentTable> table_;
  std::unique_ptr<EngineMetrics> metrics_;
  std::unique_ptr<HostTier> host_;     // outlives the scheduler (its write-backs pin it)
  std::unique_ptr<HostTier> staging_;  // EngineOptions::fetch_staging_bytes; outlives it too
  std::unique_ptr<Scheduler> scheduler_;
  absl::StatusOr<PeerPoolHandle> pool_handle_;
};

}  // namespace lazyrag
