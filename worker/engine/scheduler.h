// Continuous batching over one backend (DESIGN section 6). One thread owns the
// backend and loops: reap cancelled and expired requests, admit queued ones,
// then run ONE ForwardBatch that packs, under the per-step token budget, the
// decode token of every running request (oldest first), prefill chunks of
// documents being computed, and prefill chunks of requests (step_planner.h).
// Documents are resolved pool -> host tier -> store -> compute with one job per
// missing document however many requests wait for it (singleflight,
// document_jobs.h); the document fetcher (document_fetcher.h) reads the store
// and writes computed documents back on its own threads, and host copies
// (host_copies.h) move documents to and from host memory on the backend's
// transfer stream, so none of them blocks a step.
//
// Pages (page_budget.h): a request owns the pages of its own segment (query +
// generated tokens; every token for MATERIALIZE, FULL and PREFIX:
// request_layout.h) and grows them a page at a time. When pages run out after
// evicting unreferenced documents, the youngest request younger than the one
// that needs pages is preempted: its OWN pages are freed and its document pins
// dropped (document pages are never freed under another request) and it is
// requeued at the front with the tokens it generated, to be recomputed when
// readmitted.
//
// Time (deadlines, hedges, the store's down windows, costs, timings) comes from
// EngineOptions::clock.
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
#include "worker/cache/document_table.h"
#include "worker/engine/clock.h"
#include "worker/engine/document_fetcher.h"
#include "worker/engine/document_jobs.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_metrics.h"
#include "worker/engine/host_copies.h"
#include "worker/engine/page_budget.h"
#include "worker/engine/scheduled_request.h"
#include "worker/engine/step_planner.h"

namespace lazyrag {

class Scheduler {
 public:
  // Pointers are not owned and must outlive the scheduler; `host` (the host
  // tier), `staging` (fetch staging memory, EngineOptions::fetch_staging_bytes) and `metrics`
  // may be null.
  Scheduler(Backend *backend, DocumentTable *table, PageAllocator *allocator, HostTier *host,
            HostTier *staging, const EngineOptions &options, EngineMetrics *metrics);
  ~Scheduler();  // fails what is queued or running (UNAVAILABLE), drains
                 // write-backs

  // Queues a validated request. RESOURCE_EXHAUSTED when the waiting queue is
  // full.
  absl::StatusOr<std::shared_ptr<RequestChannel>> Submit(TokenPrompt prompt,
                                                         TokenRunOptions options);
  // Queues the encoding of one validated document: it is made resident in the
  // pool (from the pool, the store or computed, then written back like any
  // computed document) and the channel ends OK without a token;
  // usage.pool_document_tokens > 0 tells that it was resident already. Queued
  // and admitted like a request (RESOURCE_EXHAUSTED when the waiting queue is
  // full); pins nothing once done.
  absl::StatusOr<std::shared_ptr<RequestChannel>> SubmitEncode(std::vector<int32_t> document,
                                                               std::string cache_namespace,
                                                               absl::Time deadline);
  // The scheduler frees the request's pages at its next step (within
  // milliseconds).
  void Cancel(RequestChannel &channel, bool stopped_by_caller);
  // Runs `task` on the scheduler thread before its next step and returns its
  // status, for backend calls from other threads (the backend is driven by this
  // one thread; a tensor- parallel backend requires it). Blocks the caller
  // meanwhile. UNAVAILABLE when the scheduler is shutting down. REQUIRES: not
  // called from the scheduler thread.
  absl::Status RunOnLoop(std::function<absl::Status()> task);
  // The tokens of a document known only by id, read from the store on the
  // caller's thread (DocumentFetcher::FetchTokens): the document itself is
  // kept, and a request for it that follows imports it instead of reading the
  // store again. NOT_FOUND without a store.
  absl::StatusOr<std::vector<int32_t>> FetchDocumentTokens(const std::string &cache_namespace,
                                                           const std::string &id);

  // Engine::EvictDocument, on the scheduler thread (RunOnLoop).
  absl::Status EvictDocument(const std::string &id);

  // On the scheduler thread (RunOnLoop), once, after the shared prefix was encoded
  // (SubmitEncode with namespace ""): pins it for the scheduler's life, opens every LAZY /
  // MATERIALIZE request with it and computes every later block after it.
  absl::Status PinSharedPrefix(const std::vector<int32_t> &tokens);

  int running() const { return running_count_.load(); }
  int waiting() const { return waiting_count_.load(); }
  int64_t preemptions() const { return preemptions_.load(); }

 private:
  using RequestPtr = std::shared_ptr<ScheduledRequest>;
  struct LoopTask;

  absl::StatusOr<std::shared_ptr<RequestChannel>> Enqueue(RequestPtr r);
  void Loop();
  void Step(std::vector<FetchedDocument> fetched);
  void Reap(ScheduledRequest &r, absl::Time now);
  void Admit(const RequestPtr &r);
  // A request whose blocks are all pinned: an encode ends; a generation lays
  // out its segments.
  void BlocksReady(const RequestPtr &r);
  // Lays out the request's segments once its blocks are pinned
  // (request_layout.h); false when it was requeued or failed for lack of pages.
  bool Setup(const RequestPtr &r);
  // Runs the step's ForwardBatch and hands out its outputs.
  void RunStep(StepPlan plan);
  void Finish(ScheduledRequest &r, absl::Status status, FinishReason reason);
  void Preempt(const RequestPtr &r);
  void ReleaseResources(ScheduledRequest &r);
  // Allocates n pages: free ones, then evicting unreferenced documents, then
  // preempting requests younger than `requester_order` that are not packed in
  // this step.
  absl::StatusOr<std::vector<int32_t>> AllocatePages(int n, uint64_t requester_order);
  // Grows the request's own pages to hold `tokens`; on failure preempts it (or
  // fails it when it is alone) and returns false.
  bool EnsureOwnPages(const RequestPtr &r, int64_t tokens);
  // Admission control: true when the pool can hold `w`'s worst case on top of
  // what the running requests may still claim (PageBudget::Fits).
  bool FitsInPool(const ScheduledRequest &w) const;
  bool OnlyRequestHoldingPages(const ScheduledRequest &r) const;
  void Deliver(ScheduledRequest &r, int32_t token);
  void UpdateGauges();

  Backend *backend_;
  DocumentTable *table_;
  PageAllocator *allocator_;
  HostTier *host_;  // null without a host tier
  const EngineOptions options_;
  EngineMetrics *metrics_;
  Clock *const clock_;
  PageBudget budget_;
  StepPlanner planner_;
  // Null without a store.
  std::unique_ptr<DocumentFetcher> fetcher_;
  // Null without a host tier. Uses fetcher_: destroyed before it.
  std::unique_ptr<HostCopies> host_copies_;
  // Uses fetcher_: destroyed before it.
  std::unique_ptr<DocumentJobs> jobs_;

  // Scheduler-thread state.
  std::string sink_id_;  // the pinned shared prefix; empty without one
  uint64_t next_order_ = 0;
  std::deque<RequestPtr> waiting_;
  std::vector<RequestPtr> running_;
  bool busy_ = false;                 // work is runnable without waiting for input
  bool preempted_this_step_ = false;  // no admissions after a preemption in the same step
  std::vector<const ScheduledRequest *> in_batch_;

  std::atomic<int> running_count_{0};
  std::atomic<int> waiting_count_{0};
  std::atomic<int64_t> preemptions_{0};

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<RequestPtr> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<FetchedDocument> fetched_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<LoopTask>> tasks_ ABSL_GUARDED_BY(mu_);

  std::thread loop_thread_;
};

}  // namespace lazyrag
