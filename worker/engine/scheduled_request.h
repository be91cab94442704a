// The scheduler's state for one request and for one missing document, shared by
// the scheduler (worker/engine/scheduler.h) and its step planner
// (step_planner.h). Internal to worker/engine. Only the scheduler thread
// touches it, except RequestChannel (its own lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/cache/document_store.h"
#include "worker/cache/document_table.h"
#include "worker/cache/host_tier.h"
#include "worker/engine/document_fetcher.h"
#include "worker/engine/engine.h"
#include "worker/engine/request_layout.h"
#include "worker/engine/sampler.h"

namespace lazyrag {

// What the scheduler reports to the thread waiting on a request.
struct RequestChannel {
  absl::Mutex mu;
  std::vector<int32_t> tokens ABSL_GUARDED_BY(mu);  // generated so far
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  FinishReason finish ABSL_GUARDED_BY(mu) = FinishReason::kLength;
  Usage usage ABSL_GUARDED_BY(mu);
  Timings timings ABSL_GUARDED_BY(mu);
  // Set by the caller: 1 = stopped (ends OK), 2 = cancelled (ends CANCELLED).
  std::atomic<int> cancel{0};
};

// A prefix or document block of a LAZY / MATERIALIZE request (or of an encode).
struct Block {
  std::string id;
  const std::vector<int32_t> *tokens = nullptr;  // points into the request's prompt
  bool is_doc = false;
  bool resolved = false;
  DocumentRun run;
};

struct ScheduledRequest {
  uint64_t order = 0;  // larger = younger (submitted later)
  TokenPrompt prompt;
  TokenRunOptions opts;
  QualitySettings quality;  // opts.quality over the engine's defaults
  // Not a generation: makes the prompt's documents resident (and written back),
  // then ends OK without running a token (Scheduler::SubmitEncode).
  bool encode_only = false;
  std::shared_ptr<RequestChannel> ch;
  absl::Time arrival, admitted, last_token;
  bool admitted_once = false;
  bool usage_done = false;  // usage and lookup metrics counted (first admission)
  bool started = false;     // first token produced
  bool finished = false;
  enum Phase { kWaiting, kDocs, kRun } phase = kWaiting;
  int epoch = 0;  // bumped at each admission; stale job waiters are skipped

  std::vector<Block> blocks;
  int pending = 0;                  // blocks not yet resolved
  std::vector<std::string> pinned;  // table ids this request holds a reference on
  std::vector<int32_t> own_pages;   // pages it owns outright
  std::vector<Segment> fixed;       // LAZY: prefix and document blocks
  std::vector<Segment> own_pieces;  // LAZY first-k: segments over own.pages (RequestLayout)
  Segment own;                      // the segment receiving fed tokens
  std::vector<int32_t> feed;        // tokens of the own segment: prompt part + generated
  std::vector<int32_t> fill_slot;   // feed[i < fill_slot.size()] goes to own-run slot
  std::vector<int32_t> fill_pos;    // fill_slot[i] at logical fill_pos[i] (RequestLayout)
  size_t fed = 0;                   // how many of `feed` are in the KV
  size_t prompt_feed = 0;           // the prompt part of `feed`
  std::vector<int32_t> generated;
  std::unique_ptr<Sampler> sampler;
  Usage usage;
  // PREFIX mode: chained page hashes of full prompt pages, and whether the
  // newly computed ones were handed to the prefix cache.
  std::vector<std::string> page_ids;
  size_t reused_pages = 0;
  bool prefix_inserted = false;
};

// One missing block, fetched or computed once however many requests wait for
// it.
struct DocJob {
  std::string id;
  std::string ns;
  std::vector<int32_t> tokens;
  bool is_doc = false;
  // kPromoting: its copy in the host tier is being copied into `pages` (`host`, `transfer`).
  enum State { kFetching, kNeedPages, kPromoting, kComputing } state = kFetching;
  // Found in the host tier: pinned there until the copy into the pool is done and checked.
  std::optional<HostTier::Ref> host;
  KvTransferId transfer = 0;
  absl::Time promote_started;
  std::string payload;  // fetched KV to import (kNeedPages after a store hit)
  bool have_payload = false;
  std::string origin;  // StoredDocument::origin of the fetched payload ("" = the
                       // kvstore)
  // Instead of a payload: the document lent in a peer's device pool (copied
  // with Backend::CopyPagesFromPeer once pages are allocated, then finished).
  std::shared_ptr<DeviceLease> lease;
  // Instead of a payload: the fetched KV in a pending host-tier entry, copied into `pages`
  // like a promotion (kPromoting), then committed to the tier with the copy's checksum.
  std::shared_ptr<LandedInHost> landed;
  bool lease_failed = false;  // a device copy failed once: never again for this job
  FetchTicket fetch;          // the fetch in flight (kFetching)
  // Given up for a compute while its fetch ran: the store most likely holds it,
  // and a store that slow is not sent a write-back of it.
  bool hedged = false;
  // Not fetched (the store was predicted slower than recomputing) but the store
  // holds it: computed without a write-back.
  bool in_store = false;
  struct Waiter {
    std::shared_ptr<ScheduledRequest> request;
    int block = 0;
    int epoch = 0;
    bool initiator = false;
  };
  std::vector<Waiter> waiters;
  uint64_t order = 0;  // oldest waiter's order: whom it may preempt
  std::vector<int32_t> pages;
  int fed = 0;
};

}  // namespace lazyrag
