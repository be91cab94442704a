#include "worker/engine/document_jobs.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace lazyrag {

DocumentJobs::DocumentJobs(Backend *backend, DocumentTable *table, DocumentFetcher *fetcher,
                           HostTier *host, HostCopies *host_copies, EngineMetrics *metrics,
                           Clock *clock, int page_size, Hooks hooks)
    : backend_(backend),
      table_(table),
      fetcher_(fetcher),
      host_(host),
      host_copies_(host_copies),
      metrics_(metrics),
      clock_(clock),
      page_size_(page_size),
      hooks_(std::move(hooks)) {}

DocumentJobs::~DocumentJobs() {
  for (auto &[id, job] : jobs_) {
    // A copy into the pages still in flight finishes before they go back to the allocator.
    if (job->state == DocJob::kPromoting) (void)backend_->WaitKvTransfer(job->transfer);
    ReleaseHost(*job);
    job->landed.reset();  // aborted while the tier is certainly alive
    if (!job->pages.empty()) table_->FreePages(job->pages);
  }
}

void DocumentJobs::ReleaseHost(DocJob &job) {
  if (!job.host.has_value()) return;
  host_->Release(job.id);
  job.host.reset();
}

int64_t DocumentJobs::PromotingTokens() const {
  int64_t tokens = 0;
  for (const auto &[id, job] : jobs_) {
    if (job->state == DocJob::kPromoting) tokens += int64_t(job->tokens.size());
  }
  return tokens;
}

bool DocumentJobs::promoting() const {
  for (const auto &[id, job] : jobs_) {
    if (job->state == DocJob::kPromoting) return true;
  }
  return false;
}

void DocumentJobs::Join(const std::shared_ptr<ScheduledRequest> &r, int block) {
  const Block &blk = r->blocks[block];
  if (auto it = jobs_.find(blk.id); it != jobs_.end()) {
    DocJob &job = *it->second;
    job.waiters.push_back({r, block, r->epoch, false});
    job.order = std::min(job.order, r->order);
    return;
  }
  auto job = std::make_shared<DocJob>();
  job->id = blk.id;
  job->ns = r->opts.cache_namespace;
  job->tokens = *blk.tokens;
  job->is_doc = blk.is_doc;
  job->order = r->order;
  job->waiters.push_back({r, block, r->epoch, true});
  jobs_[blk.id] = job;
  // The host tier, unless the cost model (which needs a store) predicts recomputing the
  // document faster than promoting it behind the promotions in flight.
  if (host_ != nullptr) {
    std::optional<HostTier::Ref> ref = host_->Acquire(job->id);
    const bool usable = ref.has_value() && ref->num_tokens == int32_t(job->tokens.size()) &&
                        (ref->tokens.empty() || ref->tokens == job->tokens);
    if (usable && (fetcher_ == nullptr || !fetcher_->PreferComputeToHost(
                                              int64_t(job->tokens.size()), PromotingTokens()))) {
      job->host = std::move(ref);
      job->state = DocJob::kNeedPages;
      return;
    }
    if (ref.has_value()) host_->Release(job->id);
  }
  if (fetcher_ == nullptr) {
    job->state = DocJob::kNeedPages;
    return;
  }
  // A document read on a caller's thread for its tokens (named by id) is not read again.
  if (auto prefetched = fetcher_->TakePrefetched(job->ns, job->id); prefetched.has_value()) {
    job->state = DocJob::kFetching;
    HandleFetched(std::move(*prefetched));
    return;
  }
  QueueFetch(*job);
}

void DocumentJobs::HedgeSlowFetches() {
  for (auto &[id, job] : jobs_) {
    if (job->state != DocJob::kFetching || !fetcher_->GiveUpIfDue(&job->fetch)) continue;
    job->state = DocJob::kNeedPages;
    job->hedged = true;
  }
}

void DocumentJobs::QueueFetch(DocJob &job) {
  job.state = DocJob::kFetching;
  job.fetch = fetcher_->Queue(job.ns, job.id, int64_t(job.tokens.size()));
}

void DocumentJobs::HandleFetched(FetchedDocument f) {
  auto it = jobs_.find(f.id);
  if (it == jobs_.end()) {
    if (f.lease != nullptr) f.lease->Finish(absl::CancelledError("not used"));
    return;
  }
  DocJob &job = *it->second;
  if (job.state != DocJob::kFetching) {
    // Hedged: the document went to compute while this fetch ran. Its bytes still serve while
    // the job waits for pages (imported instead of computed); later they are dropped.
    const bool usable = job.state == DocJob::kNeedPages && job.pages.empty() && !job.have_payload &&
                        job.lease == nullptr && job.landed == nullptr && f.doc.ok();
    if (!usable) {
      if (f.lease != nullptr) f.lease->Finish(absl::CancelledError("not used"));
      return;
    }
  }
  job.state = DocJob::kNeedPages;
  job.fetch.hedge_at = absl::InfiniteFuture();
  job.in_store = f.in_store;
  if (f.lease != nullptr) {
    if (f.doc.ok() && f.doc->tokens == job.tokens && !job.lease_failed) {
      job.lease = std::move(f.lease);
      job.origin = std::move(f.origin);
    } else {
      // Never copies the same document twice by lease; a token mismatch cannot come from a
      // store that checked the id, but is recomputed all the same.
      f.lease->Finish(absl::CancelledError("not used"));
    }
    return;
  }
  if (f.doc.ok() && f.doc->tokens == job.tokens && f.landed != nullptr) {
    job.landed = std::move(f.landed);
    job.origin = std::move(f.origin);
  } else if (f.doc.ok() && f.doc->tokens == job.tokens) {
    job.payload = std::move(f.doc->payload);
    job.have_payload = true;
    job.origin = std::move(f.origin);
  } else if (f.doc.ok()) {
    LOG_WARNING << "kvstore value for " << f.id << " holds other tokens: recomputing";
  }
}

void DocumentJobs::StartReady() {
  std::vector<std::shared_ptr<DocJob>> ready;
  for (auto &[id, job] : jobs_) {
    if (job->state == DocJob::kNeedPages) ready.push_back(job);
  }
  std::sort(ready.begin(), ready.end(),
            [](const auto &a, const auto &b) { return a->order < b->order; });
  for (auto &job : ready) {
    const int n = int(job->tokens.size());
    auto pages = hooks_.allocate(PagesFor(n, page_size_), job->order);
    if (!pages.ok()) {
      // Retry next step while other work may free pages; fail when nothing else runs.
      bool others = hooks_.requests_run_besides(*job);
      for (const auto &[id, other] : jobs_)
        others |= other != job && other->state != DocJob::kNeedPages;
      if (!others) Fail(job, pages.status());
      continue;
    }
    job->pages = *pages;
    if (job->host.has_value()) {
      absl::StatusOr<KvTransferId> t = backend_->StartKvFromHost(job->pages, n, job->host->data);
      if (t.ok()) {
        job->state = DocJob::kPromoting;
        job->transfer = *t;
        job->promote_started = clock_->Now();
        continue;
      }
      LOG_WARNING << "promotion of document " << job->id << " failed (" << t.status()
                  << "): recomputing";
      ReleaseHost(*job);
    }
    if (job->landed != nullptr) {
      absl::StatusOr<KvTransferId> t =
          backend_->StartKvFromHost(job->pages, n, job->landed->data());
      if (t.ok()) {
        job->state = DocJob::kPromoting;
        job->transfer = *t;
        job->promote_started = clock_->Now();
        continue;
      }
      LOG_WARNING << "import of fetched document " << job->id << " failed (" << t.status()
                  << "): recomputing";
      job->landed.reset();
    }
    if (job->lease != nullptr) {
      // The fast path: the peer's pages straight into ours, GPU to GPU, on this thread (it
      // drives the backend). A lease that expired (or a copy that outlived it) is not trusted:
      // the peer may have reused those pages.
      std::shared_ptr<DeviceLease> lease = std::move(job->lease);
      absl::Status st = lease->Valid()
                            ? backend_->CopyPagesFromPeer(lease->pool(), lease->pages(), job->pages)
                            : absl::DeadlineExceededError("peer lease expired before the copy");
      if (st.ok() && !lease->Valid()) {
        st = absl::DeadlineExceededError("peer lease expired during the copy");
      }
      lease->Finish(st);
      if (st.ok()) {
        Complete(job, Source::kStore);
        continue;
      }
      // Fall back: fetch again (the store now serves bytes from that peer, else the kvstore),
      // else compute; like a first fetch, given up for a compute past its hedge time.
      LOG_WARNING << "device copy of document " << job->id << " from a peer failed (" << st
                  << "): fetching it again";
      table_->FreePages(job->pages);
      job->pages.clear();
      job->lease_failed = true;
      job->origin.clear();
      QueueFetch(*job);
      continue;
    }
    if (job->have_payload) {
      absl::Status st = backend_->ImportKv(job->pages, n, job->payload);
      job->payload.clear();
      if (st.ok()) {
        Complete(job, Source::kStore);
        continue;
      }
      LOG_WARNING << "importing document " << job->id << " failed (" << st << "): recomputing";
    }
    job->state = DocJob::kComputing;
    job->fed = 0;
  }
}

void DocumentJobs::PollPromotions() {
  std::vector<std::shared_ptr<DocJob>> promoting;
  for (auto &[id, job] : jobs_) {
    if (job->state == DocJob::kPromoting) promoting.push_back(job);
  }
  for (auto &job : promoting) {
    absl::StatusOr<std::optional<uint64_t>> polled = backend_->PollKvTransfer(job->transfer);
    if (polled.ok() && !polled->has_value()) continue;
    if (job->landed != nullptr) {
      // A kvstore fetch that landed in the tier (checked chunk by chunk on its way in): the
      // tier keeps it with the checksum this copy computed.
      std::shared_ptr<LandedInHost> landed = std::move(job->landed);
      if (polled.ok()) {
        if (!landed->keep()) {
          landed->Abort();  // staging memory: free for the next fetch
        } else if (absl::Status st = landed->Commit(**polled); !st.ok()) {
          LOG_WARNING << "host tier refused fetched document " << job->id << ": " << st;
        }
        Complete(job, Source::kStore);
        continue;
      }
      LOG_WARNING << "import of fetched document " << job->id << " failed (" << polled.status()
                  << "): recomputing";
      landed->Abort();
      job->state = DocJob::kComputing;
      job->fed = 0;
      continue;
    }
    const bool intact = polled.ok() && **polled == job->host->checksum;
    if (intact) {
      ReleaseHost(*job);
      const double seconds = absl::ToDoubleSeconds(clock_->Now() - job->promote_started);
      if (metrics_ != nullptr) {
        metrics_->host_promotions->Increment();
        metrics_->host_promotion_seconds->Observe(seconds);
      }
      if (fetcher_ != nullptr) fetcher_->ObserveHostCopy(int64_t(job->tokens.size()), seconds);
      Complete(job, Source::kHost);
      continue;
    }
    // Never served: a copy that failed or whose bytes changed in host memory is dropped and the
    // document recomputed in the pages it was given.
    if (polled.ok()) {
      LOG_WARNING << "host copy of document " << job->id << " failed its checksum: recomputing";
      host_->Erase(job->id, /*corrupt=*/true);
      if (metrics_ != nullptr) metrics_->host_checksum_failures->Increment();
    } else {
      LOG_WARNING << "promotion of document " << job->id << " failed (" << polled.status()
                  << "): recomputing";
    }
    ReleaseHost(*job);
    job->state = DocJob::kComputing;
    job->fed = 0;
  }
}

void DocumentJobs::Complete(const std::shared_ptr<DocJob> &job, Source source) {
  const bool from_store = source != Source::kComputed;
  const int64_t n = int64_t(job->tokens.size());
  // Pinned for the job; the tokens let a peer worker take the document (ExportResidentDocument).
  table_->Insert(job->id, DocumentRun{job->pages, int32_t(n)}, job->tokens);
  if (!from_store && metrics_ && job->is_doc) {
    metrics_->computed->Increment();
    metrics_->computed_tokens->Increment(double(n));
  }
  if (!from_store && job->in_store && metrics_) {
    metrics_->KvRequests("put", "already_stored").Increment();
  }
  // A computed document goes to the host tier (a copy queued on the transfer stream) and its
  // write-back, if the fetcher accepts one, is sent from there. Without the tier the export
  // copies the document's KV to pageable memory on this thread (268 MB for 2,048 tokens of an
  // 8B model): only for a write-back that the fetcher accepts and will send.
  const bool write_back = !from_store && !job->hedged && !job->in_store && fetcher_ != nullptr &&
                          fetcher_->AcceptWriteBack(backend_->KvBytes(n));
  const bool copied = source == Source::kComputed && job->is_doc && host_copies_ != nullptr &&
                      host_copies_->CopyOut(job->ns, job->id, DocumentRun{job->pages, int32_t(n)},
                                            job->tokens, write_back);
  if (write_back && !copied) {
    std::string payload;
    absl::Status st = backend_->ExportKv(job->pages, int(n), &payload);
    if (st.ok()) {
      fetcher_->QueueWriteBack(job->ns, job->id, job->tokens, std::move(payload));
    } else {
      LOG_WARNING << "export of document " << job->id << " failed: " << st;
    }
  }
  job->pages.clear();  // owned by the table entry now
  for (const auto &w : job->waiters) {
    ScheduledRequest &r = *w.request;
    if (r.finished || r.epoch != w.epoch || r.phase != ScheduledRequest::kDocs) continue;
    auto hit = table_->Acquire(job->id);
    if (!hit.ok()) continue;  // cannot happen: the job's pin keeps it resident
    r.pinned.push_back(job->id);
    Block &blk = r.blocks[w.block];
    blk.run = *hit;
    blk.resolved = true;
    --r.pending;
    if (r.usage_done) continue;
    if (w.initiator && !from_store) {
      r.usage.computed_tokens += n;
    } else if (job->is_doc) {
      // "peer": another worker's pool (worker/peer), counted as a store hit in the usage.
      const char *tier = !w.initiator              ? (metrics_ ? metrics_->pool_tier() : "gpu")
                         : source == Source::kHost ? "host"
                         : job->origin.empty()     ? "store"
                                                   : "peer";
      r.usage.cached_document_tokens += n;
      (!w.initiator              ? r.usage.pool_document_tokens
       : source == Source::kHost ? r.usage.host_document_tokens
                                 : r.usage.store_document_tokens) += n;
      if (metrics_) {
        metrics_->Hits(tier).Increment();
        metrics_->HitTokens(tier).Increment(double(n));
      }
    }
  }
  table_->Release(job->id, DocumentTable::ReleaseBy::kJob);
  jobs_.erase(job->id);
}

int DocumentJobs::DropAbandoned() {
  int dropped = 0;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    DocJob &job = *it->second;
    const bool abandoned = (job.state == DocJob::kNeedPages || job.state == DocJob::kComputing) &&
                           !job.waiters.empty() &&
                           std::all_of(job.waiters.begin(), job.waiters.end(),
                                       [](const DocJob::Waiter &w) { return w.request->finished; });
    if (!abandoned) {
      ++it;
      continue;
    }
    ReleaseHost(job);
    job.landed.reset();
    if (job.lease != nullptr) job.lease->Finish(absl::CancelledError("not used"));
    if (!job.pages.empty()) table_->FreePages(job.pages);
    job.pages.clear();
    it = jobs_.erase(it);
    ++dropped;
  }
  return dropped;
}

void DocumentJobs::Fail(const std::shared_ptr<DocJob> &job, const absl::Status &status) {
  if (job->state == DocJob::kPromoting) (void)backend_->WaitKvTransfer(job->transfer);
  ReleaseHost(*job);
  job->landed.reset();
  if (!job->pages.empty()) table_->FreePages(job->pages);
  job->pages.clear();
  for (const auto &w : job->waiters) {
    ScheduledRequest &r = *w.request;
    if (r.finished || r.epoch != w.epoch) continue;
    hooks_.fail_request(r, status);
  }
  jobs_.erase(job->id);
}

}  // namespace lazyrag
