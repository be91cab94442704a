#include "worker/engine/scheduler.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/document_id.h"
#include "common/logging.h"

namespace lazyrag {
namespace {

double MsBetween(absl::Time a, absl::Time b) { return absl::ToDoubleMilliseconds(b - a); }

std::string StatusLabel(const absl::Status &s) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(s.code()));
}

}  // namespace

struct Scheduler::LoopTask {
  std::function<absl::Status()> run;
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  void Finish(absl::Status st) {
    absl::MutexLock l(&mu);
    status = std::move(st);
    done = true;
  }
};

Scheduler::Scheduler(Backend *backend, DocumentTable *table, PageAllocator *allocator,
                     HostTier *host, HostTier *staging, const EngineOptions &options,
                     EngineMetrics *metrics)
    : backend_(backend),
      table_(table),
      allocator_(allocator),
      host_(host),
      options_(options),
      metrics_(metrics),
      clock_(options.clock != nullptr ? options.clock : RealClock()),
      budget_(table, allocator, options.page_size),
      planner_(table, options.page_size, options.prefill_chunk, options.max_batch_tokens) {
  if (options.store != nullptr) {
    fetcher_ = std::make_unique<DocumentFetcher>(
        options.store, backend->config(), backend->kv_dtype(), clock_, metrics,
        DocumentFetcherOptions{.fingerprint = options.fingerprint,
                               .chunk_tokens = options.prefill_chunk,
                               .max_writeback_bytes = options.max_writeback_bytes,
                               .host_tier = host != nullptr ? host : staging,
                               .keep_landed = host != nullptr,
                               .mac_key = options.kv_mac_key},
        [this](FetchedDocument f) {
          absl::MutexLock l(&mu_);
          fetched_.push_back(std::move(f));
          wake_ = true;
        });
  }
  if (host != nullptr) {
    host_copies_ = std::make_unique<HostCopies>(backend, host, fetcher_.get(), metrics, clock_);
    // Evicted documents the host tier lacks are copied there before their pages are rewritten.
    budget_.set_on_evicted([this](std::vector<DocumentTable::Evicted> evicted) {
      for (const DocumentTable::Evicted &e : evicted) {
        if (!e.tokens.empty()) host_copies_->CopyOut("", e.id, e.run, e.tokens, false);
      }
    });
  }
  jobs_ = std::make_unique<DocumentJobs>(
      backend, table, fetcher_.get(), host, host_copies_.get(), metrics, clock_, options.page_size,
      DocumentJobs::Hooks{
          .allocate = [this](int n, uint64_t order) { return AllocatePages(n, order); },
          .fail_request = [this](
                              ScheduledRequest &r,
                              const absl::Status &st) { Finish(r, st, FinishReason::kCancelled); },
          .requests_run_besides =
              [this](const DocJob &job) {
                for (const auto &r : running_) {
                  bool waits_here = false;
                  for (const auto &w : job.waiters) waits_here |= w.request == r;
                  if (!r->finished && r->phase == ScheduledRequest::kRun && !waits_here) {
                    return true;
                  }
                }
                return false;
              }});
  loop_thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  loop_thread_.join();
  jobs_.reset();         // frees the pages of unfinished jobs
  host_copies_.reset();  // commits the copies to the host tier in flight
  fetcher_.reset();      // drops fetches not started, sends the write-backs queued
}

absl::StatusOr<std::shared_ptr<RequestChannel>> Scheduler::Submit(TokenPrompt prompt,
                                                                  TokenRunOptions options) {
  auto r = std::make_shared<ScheduledRequest>();
  r->prompt = std::move(prompt);
  r->opts = std::move(options);
  r->opts.is_cancelled = nullptr;  // polled by the caller's thread, never here
  auto quality = ResolveQuality(r->opts.quality, options_.quality);
  if (!quality.ok()) return quality.status();
  r->quality = *quality;
  return Enqueue(std::move(r));
}

absl::StatusOr<std::shared_ptr<RequestChannel>> Scheduler::SubmitEncode(
    std::vector<int32_t> document, std::string cache_namespace, absl::Time deadline) {
  auto r = std::make_shared<ScheduledRequest>();
  r->encode_only = true;
  r->prompt.documents.push_back(std::move(document));
  r->opts.mode = AttentionMode::kLazy;  // the document as a shared block, nothing else
  r->opts.max_tokens = 0;
  r->opts.cache_namespace = std::move(cache_namespace);
  r->opts.deadline = deadline;
  return Enqueue(std::move(r));
}

absl::StatusOr<std::shared_ptr<RequestChannel>> Scheduler::Enqueue(RequestPtr r) {
  r->ch = std::make_shared<RequestChannel>();
  r->arrival = clock_->Now();
  r->sampler = std::make_unique<Sampler>(r->opts.sampling);
  absl::MutexLock l(&mu_);
  if (stop_) return absl::UnavailableError("engine is shutting down");
  if (waiting_count_.load() >= options_.max_waiting) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the waiting queue is full (", options_.max_waiting, " requests); retry later"));
  }
  r->order = next_order_++;
  waiting_count_.fetch_add(1);
  if (metrics_) metrics_->waiting->Increment();
  inbox_.push_back(r);
  wake_ = true;
  return r->ch;
}

void Scheduler::Cancel(RequestChannel &ch, bool stopped_by_caller) {
  int expected = 0;
  ch.cancel.compare_exchange_strong(expected, stopped_by_caller ? 1 : 2);
  absl::MutexLock l(&mu_);
  wake_ = true;
}

absl::Status Scheduler::RunOnLoop(std::function<absl::Status()> task) {
  auto t = std::make_shared<LoopTask>();
  t->run = std::move(task);
  {
    absl::MutexLock l(&mu_);
    if (stop_) return absl::UnavailableError("engine is shutting down");
    tasks_.push_back(t);
    wake_ = true;
  }
  absl::MutexLock l(&t->mu);
  t->mu.Await(absl::Condition(&t->done));
  return t->status;
}

absl::StatusOr<std::vector<int32_t>> Scheduler::FetchDocumentTokens(const std::string &ns,
                                                                    const std::string &id) {
  if (fetcher_ == nullptr) return absl::NotFoundError("no kvstore configured");
  return fetcher_->FetchTokens(ns, id);
}

void Scheduler::Loop() {
  for (;;) {
    std::vector<FetchedDocument> fetched;
    std::vector<std::shared_ptr<LoopTask>> tasks;
    {
      absl::MutexLock l(&mu_);
      if (!busy_ && !stop_ && !wake_) {
        // Copies to or from the host tier end without waking the loop: they are polled soon.
        const bool copying =
            jobs_->promoting() || (host_copies_ != nullptr && host_copies_->busy());
        mu_.AwaitWithTimeout(
            absl::Condition(
                +[](Scheduler *s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->stop_ || s->wake_; },
                this),
            copying ? absl::Microseconds(200) : absl::Milliseconds(20));
      }
      wake_ = false;
      if (stop_) break;
      for (auto &r : inbox_) waiting_.push_back(std::move(r));
      inbox_.clear();
      fetched.swap(fetched_);
      tasks.swap(tasks_);
    }
    for (auto &t : tasks) t->Finish(t->run());
    Step(std::move(fetched));
  }
  // Shutdown: everything still queued or running fails.
  {
    absl::MutexLock l(&mu_);
    for (auto &r : inbox_) waiting_.push_back(std::move(r));
    inbox_.clear();
    for (auto &t : tasks_) t->Finish(absl::UnavailableError("engine is shutting down"));
    tasks_.clear();
  }
  const absl::Status down = absl::UnavailableError("engine is shutting down");
  for (auto &r : running_) Finish(*r, down, FinishReason::kCancelled);
  for (auto &r : waiting_) Finish(*r, down, FinishReason::kCancelled);
  running_.clear();
  waiting_.clear();
}

absl::Status Scheduler::PinSharedPrefix(const std::vector<int32_t> &tokens) {
  const std::string id = DocumentId(options_.fingerprint, "", tokens);
  auto run = table_->Acquire(id);
  if (!run.ok()) {
    return absl::InternalError("engine: the shared prefix is not resident after its encoding");
  }
  sink_id_ = id;
  planner_.SetSink(id, *run);
  return absl::OkStatus();
}

absl::Status Scheduler::EvictDocument(const std::string &id) {
  return RunOnLoop([this, &id]() -> absl::Status {
    absl::StatusOr<DocumentTable::Evicted> e = table_->Evict(id);
    if (!e.ok()) return e.status();
    if (host_copies_ != nullptr && !e->tokens.empty()) {
      host_copies_->CopyOut("", e->id, e->run, e->tokens, false);
    }
    return absl::OkStatus();
  });
}

void Scheduler::Reap(ScheduledRequest &r, absl::Time now) {
  if (r.finished) return;
  const int c = r.ch->cancel.load();
  if (c == 1) {
    Finish(r, absl::OkStatus(), FinishReason::kStop);
  } else if (c == 2) {
    Finish(r, absl::CancelledError("request cancelled"), FinishReason::kCancelled);
  } else if (now >= r.opts.deadline) {
    Finish(r, absl::DeadlineExceededError("request deadline exceeded"), FinishReason::kCancelled);
  }
}

void Scheduler::Step(std::vector<FetchedDocument> fetched) {
  preempted_this_step_ = false;
  in_batch_.clear();
  for (FetchedDocument &f : fetched) jobs_->HandleFetched(std::move(f));
  if (fetcher_ != nullptr) jobs_->HedgeSlowFetches();
  if (host_copies_ != nullptr) host_copies_->Poll();
  jobs_->PollPromotions();

  // 1. Reap cancelled and expired requests, wherever they are.
  const absl::Time now = clock_->Now();
  for (auto &r : running_) Reap(*r, now);
  for (auto &r : waiting_) Reap(*r, now);
  jobs_->DropAbandoned();

  // 2. Requests whose documents are now all pinned lay out their segments.
  for (size_t i = 0; i < running_.size(); ++i) {
    auto r = running_[i];
    if (!r->finished && r->phase == ScheduledRequest::kDocs && r->pending == 0) BlocksReady(r);
  }
  // 3. Admit from the front of the queue.
  while (!preempted_this_step_ && !waiting_.empty() &&
         int(running_.size()) < options_.max_running) {
    // Head-of-line: a request that does not fit waits for running ones to finish (it is
    // admitted alone when nothing runs), instead of being admitted and preempted in a loop.
    if (!running_.empty() && !waiting_.front()->finished && !FitsInPool(*waiting_.front())) break;
    auto r = waiting_.front();
    waiting_.pop_front();
    if (r->finished) continue;
    running_.push_back(r);
    Admit(r);
  }
  // 4. Jobs waiting for pages (to compute or to import a fetched payload).
  jobs_->StartReady();

  // 5. Pack one batch and run it.
  std::vector<StepSequence> seqs =
      planner_.Pack(running_, jobs_->jobs(), [this](const RequestPtr &r, int64_t tokens) {
        if (!EnsureOwnPages(r, tokens)) return false;
        in_batch_.push_back(r.get());
        return true;
      });
  const bool stepped = !seqs.empty();
  if (stepped) RunStep(planner_.Build(std::move(seqs)));

  // Sweep finished requests.
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const auto &r) {
                                  return r->finished || r->phase == ScheduledRequest::kWaiting;
                                }),
                 running_.end());
  waiting_.erase(
      std::remove_if(waiting_.begin(), waiting_.end(), [](const auto &r) { return r->finished; }),
      waiting_.end());
  busy_ = stepped || (!waiting_.empty() && int(running_.size()) < options_.max_running);
  for (auto &r : running_) {
    if (r->phase == ScheduledRequest::kDocs && r->pending == 0) busy_ = true;
  }
  UpdateGauges();
}

void Scheduler::RunStep(StepPlan plan) {
  std::vector<float> logits;
  std::vector<int32_t> argmax;
  const absl::Time t_forward = clock_->Now();
  absl::Status st = plan.argmax_only ? backend_->ForwardArgmax(plan.batch, &argmax)
                                     : backend_->Forward(plan.batch, &logits);
  // With outputs on the host the backend has synchronised: the step's wall time is its cost.
  if (st.ok() && (!logits.empty() || !argmax.empty()) && fetcher_ != nullptr) {
    fetcher_->ObserveCompute(int64_t(plan.batch.tokens.size()),
                             absl::ToDoubleSeconds(clock_->Now() - t_forward));
  }
  if (!st.ok()) {
    LOG_ERROR << "forward failed: " << st;
    for (const StepSequence &s : plan.seqs) {
      if (s.job) {
        jobs_->Fail(s.job, st);
      } else {
        Finish(*s.request, st, FinishReason::kCancelled);
      }
    }
    return;
  }
  for (const StepSequence &s : plan.seqs) {
    if (planner_.ApplyFed(s)) jobs_->Complete(s.job, DocumentJobs::Source::kComputed);
  }
  const int vocab = backend_->config().vocab_size;
  for (size_t k = 0; k < plan.logit_seq.size(); ++k) {
    ScheduledRequest &r = *plan.seqs[plan.logit_seq[k]].request;
    if (r.finished) continue;
    const int32_t token = StepPlanner::TokenOf(plan, k, argmax, logits, vocab);
    const bool is_stop = std::find(r.opts.stop_token_ids.begin(), r.opts.stop_token_ids.end(),
                                   token) != r.opts.stop_token_ids.end();
    if (is_stop && !r.opts.ignore_eos) {
      if (!r.started) {
        r.started = true;
        absl::MutexLock l(&r.ch->mu);
        r.ch->timings.ttft_ms = MsBetween(r.arrival, clock_->Now());
      }
      Finish(r, absl::OkStatus(), FinishReason::kEos);
      continue;
    }
    Deliver(r, token);
    if (int(r.generated.size()) >= r.opts.max_tokens) {
      Finish(r, absl::OkStatus(), FinishReason::kLength);
    }
  }
}

void Scheduler::Deliver(ScheduledRequest &r, int32_t token) {
  const absl::Time now = clock_->Now();
  r.generated.push_back(token);
  r.feed.push_back(token);
  if (metrics_) {
    metrics_->GenerationTokens(r.opts.mode).Increment();
    if (r.started) metrics_->Itl(r.opts.mode).Observe(MsBetween(r.last_token, now) / 1000);
  }
  r.last_token = now;
  absl::MutexLock l(&r.ch->mu);
  if (!r.started) {
    r.started = true;
    r.ch->timings.ttft_ms = MsBetween(r.arrival, now);
    if (metrics_) metrics_->Ttft(r.opts.mode).Observe(r.ch->timings.ttft_ms / 1000);
  }
  r.ch->tokens.push_back(token);
}

void Scheduler::Admit(const RequestPtr &r) {
  waiting_count_.fetch_sub(1);
  if (metrics_) metrics_->waiting->Decrement();
  r->phase = ScheduledRequest::kDocs;
  ++r->epoch;
  r->admitted = clock_->Now();
  if (!r->admitted_once) {
    r->admitted_once = true;
    absl::MutexLock l(&r->ch->mu);
    r->ch->timings.queue_ms = MsBetween(r->arrival, r->admitted);
    if (metrics_ && !r->encode_only) {
      metrics_->QueueTime(r->opts.mode).Observe(MsBetween(r->arrival, r->admitted) / 1000);
    }
  }
  if (!r->usage_done) r->usage = Usage{};
  r->blocks.clear();
  r->pending = 0;
  for (const BlockRef &b : RequestBlocks(r->prompt, r->opts.mode)) {
    Block blk;
    blk.id = b.is_sink ? sink_id_
                       : DocumentId(options_.fingerprint, r->opts.cache_namespace, *b.tokens);
    blk.tokens = b.tokens;
    blk.is_doc = b.is_doc;
    r->blocks.push_back(std::move(blk));
  }
  const bool count = !r->usage_done;
  for (size_t i = 0; i < r->blocks.size(); ++i) {
    Block &blk = r->blocks[i];
    const int64_t n = int64_t(blk.tokens->size());
    if (count && blk.is_doc && metrics_) metrics_->lookups->Increment();
    auto hit = table_->Acquire(blk.id);
    if (hit.ok()) {
      r->pinned.push_back(blk.id);
      blk.run = *hit;
      blk.resolved = true;
      if (count && blk.is_doc) {
        r->usage.cached_document_tokens += n;
        r->usage.pool_document_tokens += n;
        if (metrics_) {
          metrics_->Hits(metrics_->pool_tier()).Increment();
          metrics_->HitTokens(metrics_->pool_tier()).Increment(double(n));
        }
      }
      continue;
    }
    ++r->pending;
    jobs_->Join(r, int(i));
  }
  // An encode's usage says only whether its document was resident at its first admission.
  if (r->encode_only) r->usage_done = true;
  if (r->pending == 0) BlocksReady(r);
}

void Scheduler::BlocksReady(const RequestPtr &r) {
  if (r->encode_only) {
    Finish(*r, absl::OkStatus(), FinishReason::kLength);
  } else {
    Setup(r);
  }
}

bool Scheduler::OnlyRequestHoldingPages(const ScheduledRequest &r) const {
  for (const auto &o : running_) {
    if (o.get() != &r && !o->finished && o->phase != ScheduledRequest::kWaiting) return false;
  }
  return jobs_->empty();
}

bool Scheduler::Setup(const RequestPtr &rp) {
  ScheduledRequest &r = *rp;
  const TokenPrompt &p = r.prompt;
  const bool count = !r.usage_done;
  Usage &u = r.usage;
  if (count) {
    u.prompt_tokens = p.total_tokens();
    u.document_tokens = 0;
    for (const auto &d : p.documents) u.document_tokens += int64_t(d.size());
  }
  const AttentionMode mode = r.opts.mode;
  RequestLayout layout;
  if (mode == AttentionMode::kLazy || mode == AttentionMode::kMaterialize) {
    std::vector<DocumentRun> runs;
    for (const Block &blk : r.blocks) runs.push_back(blk.run);
    layout = LayoutBlocks(p, runs, r.quality);
    if (mode == AttentionMode::kMaterialize) {
      // Copy every block into the request's pages, re-rotating keys by their start.
      auto pages =
          AllocatePages(PagesFor(int64_t(layout.blocks_tokens) + 1, options_.page_size), r.order);
      if (!pages.ok()) {
        if (OnlyRequestHoldingPages(r)) {
          Finish(r, pages.status(), FinishReason::kCancelled);
        } else {
          Preempt(rp);
        }
        return false;
      }
      r.own_pages = *pages;
      if (auto st = backend_->Materialize(MaterializeInto(&layout, *pages)); !st.ok()) {
        r.own = layout.own;
        Finish(r, st, FinishReason::kCancelled);
        return false;
      }
      // The copies own the KV now: let the documents go (evictable once unreferenced).
      for (const std::string &id : r.pinned) table_->Release(id);
      r.pinned.clear();
    }
    if (count) {
      u.computed_tokens += layout.computed_tokens;
      u.recompute_first_tokens = r.quality.recompute_first_tokens;
      u.document_temperature = r.quality.document_temperature;
      u.document_scale = r.quality.document_scale;
      u.drop_first_tokens = r.quality.drop_first_tokens;
      u.recomputed_document_tokens = layout.recomputed_document_tokens;
    }
  } else {
    std::vector<int32_t> reused;
    r.page_ids.clear();
    r.prefix_inserted = mode != AttentionMode::kPrefix;
    if (mode == AttentionMode::kPrefix) {
      const int64_t prompt_len = p.total_tokens();
      r.page_ids =
          PrefixPageIds(p, options_.fingerprint, r.opts.cache_namespace, options_.page_size);
      // Reuse the longest cached run, leaving at least one prompt token to compute.
      for (int64_t k = 0;
           k < int64_t(r.page_ids.size()) && (k + 1) * options_.page_size < prompt_len; ++k) {
        auto hit = table_->Acquire(r.page_ids[k]);
        if (!hit.ok()) break;
        r.pinned.push_back(r.page_ids[k]);
        reused.push_back(hit->pages[0]);
      }
    }
    r.reused_pages = reused.size();
    layout = LayoutConcatenated(p, reused, options_.page_size);
    if (count) {
      u.cached_document_tokens += layout.cached_document_tokens;
      u.pool_document_tokens = u.cached_document_tokens;
      u.computed_tokens = layout.computed_tokens;
    }
  }
  r.fixed = std::move(layout.fixed);
  r.own_pieces = std::move(layout.own_pieces);
  r.own = std::move(layout.own);
  r.feed = std::move(layout.feed);
  r.fill_slot = std::move(layout.fill_slot);
  r.fill_pos = std::move(layout.fill_pos);
  r.fed = 0;
  r.prompt_feed = r.feed.size();
  r.feed.insert(r.feed.end(), r.generated.begin(), r.generated.end());
  if (count) {
    r.usage_done = true;
    if (metrics_) metrics_->PromptTokens(mode).Increment(double(p.total_tokens()));
    absl::MutexLock l(&r.ch->mu);
    r.ch->usage = u;
  }
  r.phase = ScheduledRequest::kRun;
  return true;
}

absl::StatusOr<std::vector<int32_t>> Scheduler::AllocatePages(int n, uint64_t requester_order) {
  return budget_.Allocate(n, [&] {
    // Preempt the youngest request younger than the requester, not packed in this step.
    std::vector<PreemptionCandidate> candidates;
    std::vector<RequestPtr> holders;
    for (const auto &o : running_) {
      if (o->finished || o->phase == ScheduledRequest::kWaiting) continue;
      const bool packed = std::find(in_batch_.begin(), in_batch_.end(), o.get()) != in_batch_.end();
      candidates.push_back({o->order, packed, !o->own_pages.empty() || !o->pinned.empty()});
      holders.push_back(o);
    }
    const int victim = ChooseVictim(candidates, requester_order);
    if (victim < 0) return false;
    Preempt(holders[victim]);
    return true;
  });
}

bool Scheduler::FitsInPool(const ScheduledRequest &w) const {
  int64_t reserved = 0;
  for (const auto &r : running_) {
    if (r->finished) continue;
    reserved += std::max<int64_t>(
        0, budget_.OwnPagesAtMost(r->prompt, r->opts, r->quality) -
               int64_t(r->own_pages.size()));
  }
  return budget_.Fits(budget_.AdmissionPages(w.prompt, w.opts, w.quality, options_.fingerprint),
                      reserved);
}

bool Scheduler::EnsureOwnPages(const RequestPtr &rp, int64_t tokens) {
  ScheduledRequest &r = *rp;
  const int need = PagesFor(tokens, options_.page_size) - int(r.own.pages.size());
  if (need <= 0) return true;
  // Grow a little ahead (a prefill chunk at once, decode a page at a time).
  auto pages = AllocatePages(need, r.order);
  if (!pages.ok()) {
    if (OnlyRequestHoldingPages(r)) {
      Finish(r, pages.status(), FinishReason::kCancelled);
    } else {
      Preempt(rp);
    }
    return false;
  }
  r.own_pages.insert(r.own_pages.end(), pages->begin(), pages->end());
  r.own.pages.insert(r.own.pages.end(), pages->begin(), pages->end());
  return true;
}

void Scheduler::ReleaseResources(ScheduledRequest &r) {
  const auto by = r.encode_only ? DocumentTable::ReleaseBy::kPreparation
                                : DocumentTable::ReleaseBy::kRequest;
  for (const std::string &id : r.pinned) table_->Release(id, by);
  r.pinned.clear();
  table_->FreePages(r.own_pages);
  r.own_pages.clear();
  r.fixed.clear();
  r.own_pieces.clear();
  r.fill_slot.clear();
  r.fill_pos.clear();
  r.own = Segment{};
  r.blocks.clear();
  r.pending = 0;
}

void Scheduler::Preempt(const RequestPtr &r) {
  ReleaseResources(*r);
  r->phase = ScheduledRequest::kWaiting;
  ++r->epoch;
  waiting_.push_front(r);
  waiting_count_.fetch_add(1);
  if (metrics_) {
    metrics_->waiting->Increment();
    metrics_->preemptions->Increment();
  }
  preemptions_.fetch_add(1);
  preempted_this_step_ = true;
}

void Scheduler::Finish(ScheduledRequest &r, absl::Status status, FinishReason reason) {
  if (r.finished) return;
  if (r.phase == ScheduledRequest::kWaiting) {
    waiting_count_.fetch_sub(1);
    if (metrics_) metrics_->waiting->Decrement();
  }
  ReleaseResources(r);
  r.finished = true;
  const absl::Time now = clock_->Now();
  if (metrics_ && !r.encode_only) {  // an encode is not a request
    metrics_->Duration(r.opts.mode).Observe(MsBetween(r.arrival, now) / 1000);
    metrics_
        ->Finished(r.opts.mode,
                   status.ok() ? std::string(FinishReasonName(reason)) : StatusLabel(status))
        .Increment();
  }
  absl::MutexLock l(&r.ch->mu);
  r.ch->done = true;
  r.ch->status = std::move(status);
  r.ch->finish = reason;
  r.ch->usage = r.usage;
  r.ch->usage.completion_tokens = int64_t(r.generated.size());
  r.ch->timings.total_ms = MsBetween(r.arrival, now);
}

void Scheduler::UpdateGauges() {
  running_count_.store(int(running_.size()));
  if (!metrics_) return;
  metrics_->running->Set(double(running_.size()));
  const DocumentTableStats s = table_->Stats();
  const int free = allocator_->num_free();
  metrics_->pages_free->Set(free);
  metrics_->pages_used->Set(allocator_->num_pages() - free);
  metrics_->pages_pinned->Set(double(s.pinned_pages));
  const double ev = double(s.evictions) - metrics_->evictions->Value();
  if (ev > 0) metrics_->evictions->Increment(ev);
  if (host_ != nullptr) {
    const HostTierStats h = host_->Stats();
    metrics_->host_bytes->Set(double(h.used_bytes));
    metrics_->host_capacity->Set(double(h.capacity_bytes));
    metrics_->host_entries->Set(double(h.entries));
  }
}

}  // namespace lazyrag
