// The scheduler's missing blocks (DESIGN section 6, singleflight): one job per block missing
// from the pool however many requests wait for it. A job is promoted from the host tier
// (worker/cache/host_tier.h: copied into its pages on the backend's transfer stream and checked
// against the copy's checksum), else fetched (document_fetcher.h: the store, or a peer's pool
// lent in device memory), given up for a compute past its hedge time, given pages, then
// imported, copied from the peer or computed (its prefill chunks are packed by the step
// planner), inserted in the table, copied to the host tier and written back, and handed to its
// waiters. Scheduler thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/cache/document_table.h"
#include "worker/cache/host_tier.h"
#include "worker/engine/clock.h"
#include "worker/engine/document_fetcher.h"
#include "worker/engine/engine_metrics.h"
#include "worker/engine/host_copies.h"
#include "worker/engine/scheduled_request.h"

namespace lazyrag {

class DocumentJobs {
 public:
  // What the jobs ask of the scheduler.
  struct Hooks {
    // n pages for a job whose oldest waiter has `order` (may preempt younger requests).
    std::function<absl::StatusOr<std::vector<int32_t>>(int n, uint64_t order)> allocate;
    // Ends a waiting request with `status` (its job failed).
    std::function<void(ScheduledRequest &, const absl::Status &)> fail_request;
    // Whether a running request that does not wait for `job` may still free pages.
    std::function<bool(const DocJob &job)> requests_run_besides;
  };

  // Where a job's KV came from.
  enum class Source { kComputed, kStore, kHost };

  // Not owned; must outlive the jobs. `fetcher` is null without a store, `host` and
  // `host_copies` without a host tier; `metrics` may be null.
  DocumentJobs(Backend *backend, DocumentTable *table, DocumentFetcher *fetcher, HostTier *host,
               HostCopies *host_copies, EngineMetrics *metrics, Clock *clock, int page_size,
               Hooks hooks);
  ~DocumentJobs();  // waits for promotions in flight, frees the pages of unfinished jobs

  // Block `block` of `r` (not resident) waits for its job, started here when there is none:
  // a document in the host tier is promoted, one already read for its tokens is imported,
  // otherwise it is fetched (or, without a store, computed).
  void Join(const std::shared_ptr<ScheduledRequest> &r, int block);
  // A fetch's result: its job imports it once it has pages (or computes instead).
  void HandleFetched(FetchedDocument f);
  // Jobs whose kvstore fetch has run past its hedge time are computed instead.
  void HedgeSlowFetches();
  // Jobs waiting for pages get them, oldest waiter first: then they start their promotion,
  // import, copy or start computing. A job that cannot get pages while nothing else runs fails
  // its waiters.
  void StartReady();
  // Promotions whose copy finished: complete when the checksum matches the host copy's, else
  // the host copy is dropped and the document recomputed in the same pages.
  void PollPromotions();
  // Jobs waiting for pages or computing whose waiters have all finished (cancelled, expired)
  // end here, their pages freed: work nobody waits for stops with the last call that wanted it.
  // Returns how many were dropped.
  int DropAbandoned();
  // Whether a promotion is in flight (the scheduler then polls soon instead of sleeping).
  bool promoting() const;
  // The job's KV is complete: inserted in the table, copied to the host tier (computed ones,
  // which are then written back from there) or exported for its write-back, its waiters pinned
  // on it; the job ends.
  void Complete(const std::shared_ptr<DocJob> &job, Source source);
  // The job failed: its waiters end with `status`.
  void Fail(const std::shared_ptr<DocJob> &job, const absl::Status &status);

  const std::map<std::string, std::shared_ptr<DocJob>> &jobs() const { return jobs_; }
  bool empty() const { return jobs_.empty(); }

 private:
  // Puts `job` in the fetcher's queue (state kFetching).
  void QueueFetch(DocJob &job);
  // Tokens of the documents being promoted (the copies queued ahead of a new one).
  int64_t PromotingTokens() const;
  // Drops the job's pin on its host-tier copy.
  void ReleaseHost(DocJob &job);

  Backend *const backend_;
  DocumentTable *const table_;
  DocumentFetcher *const fetcher_;
  HostTier *const host_;
  HostCopies *const host_copies_;
  EngineMetrics *const metrics_;
  Clock *const clock_;
  const int page_size_;
  const Hooks hooks_;
  std::map<std::string, std::shared_ptr<DocJob>> jobs_;
};

}  // namespace lazyrag
