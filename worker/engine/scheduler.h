// Continuous batching over one backend (DESIGN section 6). One thread owns the
// backend and loops: reap cancelled and expired requests, admit queued ones,
// then run ONE ForwardBatch that packs, under the per-step token budget, the
// decode token of every running request (oldest first), prefill chunks of
// documents being computed, and prefill chunks of requests. Documents are
// resolved pool -> store -> compute with one job per missing document however
// many requests wait for it (singleflight); a fetch thread reads the store and
// a write-back thread writes computed documents to it, so neither blocks a
// step.
//
// Pages: a request owns the pages of its own segment (query + generated tokens;
// every token for MATERIALIZE, FULL and PREFIX) and grows them a page at a
// time. When pages run out after evicting unreferenced documents, the youngest
// request younger than the one that needs pages is preempted: its OWN pages are
// freed and its document pins dropped (document pages are never freed under
// another request) and it is requeued at the front with the tokens it
// generated, to be recomputed when readmitted.
//
// Internal to worker/engine: Engine is the public face.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/backend.h"
#include "worker/cache/document_store.h"
#include "worker/cache/document_table.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_metrics.h"
#include "worker/engine/fetch_cost.h"
#include "worker/engine/request.h"

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

class Scheduler {
 public:
  // Pointers are not owned and must outlive the scheduler; `metrics` may be
  // null.
  Scheduler(Backend *backend, DocumentTable *table, PageAllocator *allocator,
            const EngineOptions &options, EngineMetrics *metrics);
  ~Scheduler();  // fails what is queued or running (UNAVAILABLE), drains
                 // write-backs

  // Queues a validated request. RESOURCE_EXHAUSTED when the waiting queue is
  // full.
  absl::StatusOr<std::shared_ptr<RequestChannel>> Submit(TokenPrompt prompt,
                                                         TokenRunOptions options);
  // The scheduler frees the request's pages at its next step (within
  // milliseconds).
  void Cancel(RequestChannel &channel, bool stopped_by_caller);
  // Runs `task` on the scheduler thread before its next step and returns its status, for
  // backend calls from other threads (the backend is driven by this one thread; a tensor-
  // parallel backend requires it). Blocks the caller meanwhile. UNAVAILABLE when the
  // scheduler is shutting down. REQUIRES: not called from the scheduler thread.
  absl::Status RunOnLoop(std::function<absl::Status()> task);

  int running() const { return running_count_.load(); }
  int waiting() const { return waiting_count_.load(); }
  int64_t preemptions() const { return preemptions_.load(); }

 private:
  struct Request;
  struct DocJob;
  struct Fetched;
  struct WriteBack;
  struct LoopTask;

  void Loop();
  void Step(std::vector<Fetched> fetched);
  void Admit(const std::shared_ptr<Request> &r);
  // Lays out the request's segments once its blocks are pinned; false when it
  // was requeued or failed for lack of pages.
  bool Setup(const std::shared_ptr<Request> &r);
  void Finish(Request &r, absl::Status status, FinishReason reason);
  void Preempt(const std::shared_ptr<Request> &r);
  void ReleaseResources(Request &r);
  // Allocates n pages: free ones, then evicting unreferenced documents, then
  // preempting requests younger than `requester_order` that are not in `busy`.
  absl::StatusOr<std::vector<int32_t>> AllocatePages(int n, uint64_t requester_order);
  bool EnsureOwnPages(const std::shared_ptr<Request> &r, int64_t tokens);
  void HandleFetched(Fetched f);
  // Documents whose kvstore fetch has run past its hedge time are computed instead.
  void HedgeSlowFetches();
  // Puts `job` in the fetch thread's queue (state kFetching): a kvstore fetch with its hedge
  // time, or a peers-only ask when the cost model prefers computing to the kvstore.
  void QueueFetch(DocJob &job);
  void StartJobPages();
  void CompleteJob(const std::shared_ptr<DocJob> &job, bool from_store);
  void FailJob(const std::shared_ptr<DocJob> &job, const absl::Status &status);
  void Deliver(Request &r, int32_t token);
  void UpdateGauges();
  bool OnlyRequestHoldingPages(const Request &r) const;
  // Admission control: true when the pool can hold `w`'s worst case (its own pages for the
  // whole feed and max_tokens, plus its blocks that are not resident) on top of what the
  // running requests may still claim, counting unpinned cached documents as free.
  bool FitsInPool(const Request &w) const;

  void FetchLoop();
  void WriteBackLoop();
  // Write-backs are skipped for a while after the store failed a call (kStoreDownMs).
  bool WritesPaused();

  Backend *backend_;
  DocumentTable *table_;
  PageAllocator *allocator_;
  const EngineOptions options_;
  EngineMetrics *metrics_;
  DocumentStore *store_;

  // Scheduler-thread state.
  uint64_t next_order_ = 0;
  std::deque<std::shared_ptr<Request>> waiting_;
  std::vector<std::shared_ptr<Request>> running_;
  std::map<std::string, std::shared_ptr<DocJob>> jobs_;
  bool busy_ = false;                 // work is runnable without waiting for input
  bool preempted_this_step_ = false;  // no admissions after a preemption in the same step
  std::vector<const Request *> in_batch_;

  std::atomic<int> running_count_{0};
  std::atomic<int> waiting_count_{0};
  std::atomic<int64_t> preemptions_{0};

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<Request>> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<Fetched> fetched_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<LoopTask>> tasks_ ABSL_GUARDED_BY(mu_);

  absl::Mutex fetch_mu_;
  bool fetch_stop_ ABSL_GUARDED_BY(fetch_mu_) = false;
  // A document to look up in the store tier: (namespace, id), its token count, and whether to
  // ask only the store's cheap tiers (peer workers): set when the cost model predicts that
  // recomputing beats a kvstore fetch.
  struct FetchItem {
    std::string ns, id;
    int64_t tokens = 0;
    bool peers_only = false;
    // Set by the scheduler when it gives the fetch up (a hedge); not started then.
    std::shared_ptr<std::atomic<bool>> cancelled;
  };
  std::deque<FetchItem> fetch_queue_ ABSL_GUARDED_BY(fetch_mu_);
  FetchCostModel cost_;
  int64_t store_down_until_ms_ ABSL_GUARDED_BY(fetch_mu_) = 0;
  // After a failed write-back only write-backs pause: a store too slow for a large Put (past
  // its deadline) still answers Gets, which are hedged anyway.
  int64_t writes_down_until_ms_ ABSL_GUARDED_BY(fetch_mu_) = 0;

  absl::Mutex wb_mu_;
  bool wb_stop_ ABSL_GUARDED_BY(wb_mu_) = false;
  std::deque<WriteBack> wb_queue_ ABSL_GUARDED_BY(wb_mu_);
  // Payload bytes queued or being sent (EngineOptions::max_writeback_bytes).
  int64_t wb_pending_bytes_ ABSL_GUARDED_BY(wb_mu_) = 0;

  std::thread loop_thread_;
  std::thread fetch_thread_;
  std::thread wb_thread_;
};

}  // namespace lazyrag
