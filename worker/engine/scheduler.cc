#include "worker/engine/scheduler.h"

#include <algorithm>
#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/document_id.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "worker/engine/document_codec.h"
#include "worker/engine/sampler.h"

namespace lazyrag {
namespace {

using Clock = std::chrono::steady_clock;
double MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
int PagesFor(int64_t tokens, int page_size) { return int((tokens + page_size - 1) / page_size); }
int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

struct Segment {
  int32_t start = 0;
  int32_t len = 0;
  std::vector<int32_t> pages;
};

constexpr size_t kMaxWriteBacks = 64;
constexpr int64_t kStoreDownMs = 2000;  // after an unreachable store, skip it this long

std::string StatusLabel(const absl::Status &s) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(s.code()));
}

}  // namespace

// A prefix or document block of a LAZY / MATERIALIZE request.
struct Block {
  std::string id;
  const std::vector<int32_t> *tokens = nullptr;
  bool is_doc = false;
  bool resolved = false;
  DocumentRun run;
};

struct Scheduler::Request {
  uint64_t order = 0;  // larger = younger (submitted later)
  TokenPrompt prompt;
  TokenRunOptions opts;
  std::shared_ptr<RequestChannel> ch;
  Clock::time_point arrival, admitted, last_token;
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
  Segment own;                      // the segment receiving fed tokens
  std::vector<int32_t> feed;        // tokens of the own segment: prompt part + generated
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

struct Scheduler::DocJob {
  std::string id;
  std::string ns;
  std::vector<int32_t> tokens;
  bool is_doc = false;
  enum State { kFetching, kNeedPages, kComputing } state = kFetching;
  std::string payload;  // fetched KV to import (kNeedPages after a store hit)
  bool have_payload = false;
  std::string origin;  // StoredDocument::origin of the fetched payload ("" = the kvstore)
  // Instead of a payload: the document lent in a peer's device pool (copied with
  // Backend::CopyPagesFromPeer once pages are allocated, then finished).
  std::shared_ptr<DeviceLease> lease;
  bool lease_failed = false;  // a device copy failed once: never again for this job
  // A kvstore fetch in flight: when to give it up for a compute (max: never), and the flag
  // that tells the fetch thread so.
  Clock::time_point hedge_at = Clock::time_point::max();
  std::shared_ptr<std::atomic<bool>> fetch_cancelled;
  // Given up for a compute while its fetch ran: the store most likely holds it, and a store
  // that slow is not sent a write-back of it.
  bool hedged = false;
  // Not fetched (the store was predicted slower than recomputing) but the store holds it:
  // computed without a write-back.
  bool in_store = false;
  struct Waiter {
    std::shared_ptr<Request> request;
    int block = 0;
    int epoch = 0;
    bool initiator = false;
  };
  std::vector<Waiter> waiters;
  uint64_t order = 0;  // oldest waiter's order: whom it may preempt
  std::vector<int32_t> pages;
  int fed = 0;
};

struct Scheduler::Fetched {
  std::string id;
  absl::StatusOr<DecodedDocument> doc;  // tokens only (no payload) when `lease` is set
  std::string origin;                   // StoredDocument::origin on a hit
  std::shared_ptr<DeviceLease> lease;
  bool in_store = false;  // DocJob::in_store
};

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

// A computed document's KV on its way to the store; encoded (a copy and a checksum of the
// whole payload: ~0.27 GB for a 2,048-token document of the 8B model) on the write-back
// thread, not the scheduler's.
struct Scheduler::WriteBack {
  std::string ns;
  std::string id;
  std::vector<int32_t> tokens;
  std::string payload;
};

Scheduler::Scheduler(Backend *backend, DocumentTable *table, PageAllocator *allocator,
                     const EngineOptions &options, EngineMetrics *metrics)
    : backend_(backend),
      table_(table),
      allocator_(allocator),
      options_(options),
      metrics_(metrics),
      store_(options.store),
      cost_(FetchCostOptions{.chunk_tokens = std::max<int64_t>(1, options.prefill_chunk)}) {
  loop_thread_ = std::thread([this] { Loop(); });
  if (store_ != nullptr) {
    fetch_thread_ = std::thread([this] { FetchLoop(); });
    wb_thread_ = std::thread([this] { WriteBackLoop(); });
  }
}

Scheduler::~Scheduler() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  loop_thread_.join();
  if (store_ != nullptr) {
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
}

absl::StatusOr<std::shared_ptr<RequestChannel>> Scheduler::Submit(TokenPrompt prompt,
                                                                  TokenRunOptions options) {
  auto r = std::make_shared<Request>();
  r->prompt = std::move(prompt);
  r->opts = std::move(options);
  r->opts.is_cancelled = nullptr;  // polled by the caller's thread, never here
  r->ch = std::make_shared<RequestChannel>();
  r->arrival = Clock::now();
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

void Scheduler::Loop() {
  for (;;) {
    std::vector<Fetched> fetched;
    std::vector<std::shared_ptr<LoopTask>> tasks;
    {
      absl::MutexLock l(&mu_);
      if (!busy_ && !stop_ && !wake_) {
        mu_.AwaitWithTimeout(
            absl::Condition(
                +[](Scheduler *s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->stop_ || s->wake_; },
                this),
            absl::Milliseconds(20));
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
  for (auto &[id, job] : jobs_) {
    if (!job->pages.empty()) table_->FreePages(job->pages);
  }
  jobs_.clear();
}

void Scheduler::Step(std::vector<Fetched> fetched) {
  preempted_this_step_ = false;
  in_batch_.clear();
  for (Fetched &f : fetched) HandleFetched(std::move(f));
  HedgeSlowFetches();

  // 1. Reap cancelled and expired requests, wherever they are.
  const absl::Time now = absl::Now();
  auto reap = [&](Request &r) {
    if (r.finished) return;
    const int c = r.ch->cancel.load();
    if (c == 1) {
      Finish(r, absl::OkStatus(), FinishReason::kStop);
    } else if (c == 2) {
      Finish(r, absl::CancelledError("request cancelled"), FinishReason::kCancelled);
    } else if (now >= r.opts.deadline) {
      Finish(r, absl::DeadlineExceededError("request deadline exceeded"), FinishReason::kCancelled);
    }
  };
  for (auto &r : running_) reap(*r);
  for (auto &r : waiting_) reap(*r);

  // 2. Requests whose documents are now all pinned lay out their segments.
  for (size_t i = 0; i < running_.size(); ++i) {
    auto r = running_[i];
    if (!r->finished && r->phase == Request::kDocs && r->pending == 0) Setup(r);
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
  StartJobPages();

  // 5. Pack one batch: decode tokens first (oldest request first), then prefill
  // chunks of documents being computed, then of requests.
  struct Seq {
    std::shared_ptr<Request> r;
    std::shared_ptr<DocJob> job;
    int n = 0;
  };
  std::vector<Seq> seqs;
  int budget = options_.max_batch_tokens;
  auto remaining = [](const Request &r) { return int64_t(r.feed.size()) - int64_t(r.fed); };
  std::vector<std::shared_ptr<Request>> by_age;
  for (auto &r : running_) {
    if (!r->finished && r->phase == Request::kRun && remaining(*r) > 0) by_age.push_back(r);
  }
  std::sort(by_age.begin(), by_age.end(),
            [](const auto &a, const auto &b) { return a->order < b->order; });
  auto add_request = [&](const std::shared_ptr<Request> &r) {
    if (r->finished || r->phase != Request::kRun || budget <= 0) return;
    const int n = int(std::min<int64_t>({remaining(*r), options_.prefill_chunk, budget}));
    if (!EnsureOwnPages(r, int64_t(r->own.len) + n)) return;
    if (r->finished || r->phase != Request::kRun) return;
    seqs.push_back({r, nullptr, n});
    in_batch_.push_back(r.get());
    budget -= n;
  };
  for (auto &r : by_age) {
    if (remaining(*r) == 1 && !r->generated.empty()) add_request(r);
  }
  for (auto &[id, job] : jobs_) {
    if (job->state != DocJob::kComputing || budget <= 0) continue;
    const int n =
        std::min<int>({int(job->tokens.size()) - job->fed, options_.prefill_chunk, budget});
    if (n <= 0) continue;
    seqs.push_back({nullptr, job, n});
    budget -= n;
  }
  for (auto &r : by_age) {
    if (!(remaining(*r) == 1 && !r->generated.empty())) add_request(r);
  }
  // Drop sequences whose request was preempted or failed after being packed.
  seqs.erase(std::remove_if(seqs.begin(), seqs.end(),
                            [](const Seq &s) {
                              return s.r != nullptr &&
                                     (s.r->finished || s.r->phase != Request::kRun);
                            }),
             seqs.end());

  if (!seqs.empty()) {
    const int ps = options_.page_size;
    ForwardBatch b;
    b.view.page_size = ps;
    std::vector<int> logit_seq;  // seq index of each logit row
    int row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const Seq &s = seqs[i];
      std::vector<int32_t> q_pos(s.n);
      if (s.job) {
        DocJob &j = *s.job;
        b.view.AddSegment(0, j.fed + s.n, j.pages);
        for (int t = 0; t < s.n; ++t) {
          const int32_t local = j.fed + t;
          b.tokens.push_back(j.tokens[local]);
          b.kv_pos.push_back(local);
          b.kv_slot.push_back(int64_t(j.pages[local / ps]) * ps + local % ps);
          q_pos[t] = local;
        }
      } else {
        Request &r = *s.r;
        for (const Segment &f : r.fixed) b.view.AddSegment(f.start, f.len, f.pages);
        b.view.AddSegment(r.own.start, r.own.len + s.n, r.own.pages);
        for (int t = 0; t < s.n; ++t) {
          const int32_t local = r.own.len + t;
          b.tokens.push_back(r.feed[r.fed + t]);
          b.kv_pos.push_back(local);
          b.kv_slot.push_back(int64_t(r.own.pages[local / ps]) * ps + local % ps);
          q_pos[t] = r.own.start + local;
        }
        if (r.fed + s.n == r.feed.size()) {
          b.logit_rows.push_back(row + s.n - 1);
          logit_seq.push_back(int(i));
        }
      }
      b.view.EndRequest(q_pos);
      row += s.n;
    }
    // Greedy rows whose caller does not want the logits need only their argmax: the backend
    // may reduce on the device and return one id per row (ForwardArgmax).
    bool argmax_only = !logit_seq.empty();
    for (int i : logit_seq) {
      const Request &r = *seqs[i].r;
      argmax_only = argmax_only && r.opts.sampling.temperature == 0.0f && !r.opts.step_logits;
    }
    std::vector<float> logits;
    std::vector<int32_t> argmax;
    const auto t_forward = Clock::now();
    absl::Status st =
        argmax_only ? backend_->ForwardArgmax(b, &argmax) : backend_->Forward(b, &logits);
    // With outputs on the host the backend has synchronised: the step's wall time is its cost.
    if (st.ok() && (!logits.empty() || !argmax.empty())) {
      cost_.ObserveCompute(int64_t(b.tokens.size()), MsBetween(t_forward, Clock::now()) / 1000);
    }
    if (!st.ok()) {
      LOG_ERROR << "forward failed: " << st;
      for (const Seq &s : seqs) {
        if (s.job) {
          FailJob(s.job, st);
        } else {
          Finish(*s.r, st, FinishReason::kCancelled);
        }
      }
    } else {
      for (const Seq &s : seqs) {
        if (s.job) {
          s.job->fed += s.n;
          if (s.job->fed == int(s.job->tokens.size())) CompleteJob(s.job, /*from_store=*/false);
          continue;
        }
        Request &r = *s.r;
        r.own.len += s.n;
        r.fed += s.n;
        if (r.opts.mode == AttentionMode::kPrefix && !r.prefix_inserted && r.fed >= r.prompt_feed) {
          // Hand the newly computed full prompt pages to the prefix cache.
          r.prefix_inserted = true;
          for (size_t k = r.reused_pages; k < r.page_ids.size(); ++k) {
            const int32_t page = r.own.pages[k];
            auto owned = std::find(r.own_pages.begin(), r.own_pages.end(), page);
            if (owned == r.own_pages.end()) continue;
            r.own_pages.erase(owned);
            DocumentRun run = table_->Insert(r.page_ids[k], DocumentRun{{page}, ps});
            r.pinned.push_back(r.page_ids[k]);
            r.own.pages[k] = run.pages[0];  // a concurrent insert won: same KV, its page
          }
        }
      }
      const int vocab = backend_->config().vocab_size;
      for (size_t k = 0; k < logit_seq.size(); ++k) {
        Request &r = *seqs[logit_seq[k]].r;
        if (r.finished) continue;
        int32_t token;
        if (argmax_only) {
          token = argmax[k];
        } else {
          std::span<const float> row_logits(logits.data() + k * vocab, vocab);
          if (r.opts.step_logits)
            r.opts.step_logits->emplace_back(row_logits.begin(), row_logits.end());
          token = r.sampler->Sample(row_logits);
        }
        const bool is_stop = std::find(r.opts.stop_token_ids.begin(), r.opts.stop_token_ids.end(),
                                       token) != r.opts.stop_token_ids.end();
        if (is_stop && !r.opts.ignore_eos) {
          if (!r.started) {
            r.started = true;
            absl::MutexLock l(&r.ch->mu);
            r.ch->timings.ttft_ms = MsBetween(r.arrival, Clock::now());
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
  }

  // Sweep finished requests.
  running_.erase(
      std::remove_if(running_.begin(), running_.end(),
                     [](const auto &r) { return r->finished || r->phase == Request::kWaiting; }),
      running_.end());
  waiting_.erase(
      std::remove_if(waiting_.begin(), waiting_.end(), [](const auto &r) { return r->finished; }),
      waiting_.end());
  busy_ = !seqs.empty() || (!waiting_.empty() && int(running_.size()) < options_.max_running);
  for (auto &r : running_) {
    if (r->phase == Request::kDocs && r->pending == 0) busy_ = true;
  }
  UpdateGauges();
}

void Scheduler::Deliver(Request &r, int32_t token) {
  const auto now = Clock::now();
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

void Scheduler::Admit(const std::shared_ptr<Request> &r) {
  waiting_count_.fetch_sub(1);
  if (metrics_) metrics_->waiting->Decrement();
  r->phase = Request::kDocs;
  ++r->epoch;
  r->admitted = Clock::now();
  if (!r->admitted_once) {
    r->admitted_once = true;
    absl::MutexLock l(&r->ch->mu);
    r->ch->timings.queue_ms = MsBetween(r->arrival, r->admitted);
  }
  if (!r->usage_done) r->usage = Usage{};
  r->blocks.clear();
  r->pending = 0;
  const AttentionMode mode = r->opts.mode;
  if (mode == AttentionMode::kLazy || mode == AttentionMode::kMaterialize) {
    auto add = [&](const std::vector<int32_t> &tokens, bool is_doc) {
      if (tokens.empty()) return;
      Block blk;
      blk.id = DocumentId(options_.fingerprint, r->opts.cache_namespace, tokens);
      blk.tokens = &tokens;
      blk.is_doc = is_doc;
      r->blocks.push_back(std::move(blk));
    };
    add(r->prompt.prefix, false);
    for (const auto &d : r->prompt.documents) add(d, true);
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
          metrics_->Hits("gpu").Increment();
          metrics_->HitTokens("gpu").Increment(double(n));
        }
      }
      continue;
    }
    ++r->pending;
    auto it = jobs_.find(blk.id);
    if (it != jobs_.end()) {
      DocJob &job = *it->second;
      job.waiters.push_back({r, int(i), r->epoch, false});
      job.order = std::min(job.order, r->order);
      continue;
    }
    auto job = std::make_shared<DocJob>();
    job->id = blk.id;
    job->ns = r->opts.cache_namespace;
    job->tokens = *blk.tokens;
    job->is_doc = blk.is_doc;
    job->order = r->order;
    job->waiters.push_back({r, int(i), r->epoch, true});
    jobs_[blk.id] = job;
    if (store_ != nullptr) {
      QueueFetch(*job);
    } else {
      job->state = DocJob::kNeedPages;
    }
  }
  if (r->pending == 0) Setup(r);
}

bool Scheduler::OnlyRequestHoldingPages(const Request &r) const {
  for (const auto &o : running_) {
    if (o.get() != &r && !o->finished && o->phase != Request::kWaiting) return false;
  }
  return jobs_.empty();
}

bool Scheduler::Setup(const std::shared_ptr<Request> &rp) {
  Request &r = *rp;
  const int ps = options_.page_size;
  const TokenPrompt &p = r.prompt;
  const int64_t prompt_len = p.total_tokens();
  const bool count = !r.usage_done;
  Usage &u = r.usage;
  if (count) {
    u.prompt_tokens = prompt_len;
    u.document_tokens = 0;
    for (const auto &d : p.documents) u.document_tokens += int64_t(d.size());
  }
  r.fixed.clear();
  r.own = Segment{};
  r.feed.clear();
  r.fed = 0;
  const AttentionMode mode = r.opts.mode;
  if (mode == AttentionMode::kLazy || mode == AttentionMode::kMaterialize) {
    int32_t start = 0;
    for (const Block &blk : r.blocks) {
      r.fixed.push_back(Segment{start, blk.run.num_tokens, blk.run.pages});
      start += blk.run.num_tokens;
    }
    r.feed = p.suffix;
    if (mode == AttentionMode::kLazy) {
      r.own = Segment{start, 0, {}};
    } else {
      // MATERIALIZE: copy every block into the request's pages, re-rotating
      // keys by S.
      auto pages = AllocatePages(PagesFor(int64_t(start) + 1, ps), r.order);
      if (!pages.ok()) {
        if (OnlyRequestHoldingPages(r)) {
          Finish(r, pages.status(), FinishReason::kCancelled);
        } else {
          Preempt(rp);
        }
        return false;
      }
      r.own_pages = *pages;
      r.own = Segment{0, 0, *pages};
      std::vector<MaterializeCopy> copies;
      for (const Segment &f : r.fixed) {
        copies.push_back(MaterializeCopy{f.pages, f.len, r.own.pages, f.start, f.start});
      }
      if (auto st = backend_->Materialize(copies); !st.ok()) {
        Finish(r, st, FinishReason::kCancelled);
        return false;
      }
      r.own.len = start;
      r.fixed.clear();
      // The copies own the KV now: let the documents go (evictable once
      // unreferenced).
      for (const std::string &id : r.pinned) table_->Release(id);
      r.pinned.clear();
    }
    if (count) u.computed_tokens += int64_t(p.suffix.size());
  } else {
    // FULL and PREFIX: plain causal attention over the concatenated prompt.
    std::vector<int32_t> all(p.prefix);
    std::vector<std::pair<int64_t, int64_t>> doc_spans;
    for (const auto &d : p.documents) {
      doc_spans.push_back({int64_t(all.size()), int64_t(all.size() + d.size())});
      all.insert(all.end(), d.begin(), d.end());
    }
    all.insert(all.end(), p.suffix.begin(), p.suffix.end());
    std::vector<int32_t> reused;
    r.page_ids.clear();
    r.prefix_inserted = mode != AttentionMode::kPrefix;
    if (mode == AttentionMode::kPrefix) {
      Digest256 chain{};
      for (int64_t k = 0; (k + 1) * ps <= prompt_len; ++k) {
        Sha256 h;
        h.Update("lazyrag.prefix.v1");
        h.Update(options_.fingerprint);
        h.Update(r.opts.cache_namespace);
        h.Update(chain.data(), chain.size());
        h.Update(&all[k * ps], sizeof(int32_t) * ps);
        chain = h.Finish();
        r.page_ids.push_back("prefix:" + ToHex(chain));
      }
      // Reuse the longest cached run, leaving at least one prompt token to
      // compute.
      for (int64_t k = 0; k < int64_t(r.page_ids.size()) && (k + 1) * ps < prompt_len; ++k) {
        auto hit = table_->Acquire(r.page_ids[k]);
        if (!hit.ok()) break;
        r.pinned.push_back(r.page_ids[k]);
        reused.push_back(hit->pages[0]);
      }
    }
    r.reused_pages = reused.size();
    const int64_t reused_tokens = int64_t(reused.size()) * ps;
    if (count) {
      for (auto [b, e] : doc_spans) {
        u.cached_document_tokens += std::max<int64_t>(0, std::min(e, reused_tokens) - b);
      }
      u.pool_document_tokens = u.cached_document_tokens;
      u.computed_tokens = prompt_len - reused_tokens;
    }
    r.own = Segment{0, int32_t(reused_tokens), reused};
    r.feed.assign(all.begin() + reused_tokens, all.end());
  }
  r.prompt_feed = r.feed.size();
  r.feed.insert(r.feed.end(), r.generated.begin(), r.generated.end());
  if (count) {
    r.usage_done = true;
    if (metrics_) metrics_->PromptTokens(mode).Increment(double(prompt_len));
    absl::MutexLock l(&r.ch->mu);
    r.ch->usage = u;
  }
  r.phase = Request::kRun;
  return true;
}

absl::StatusOr<std::vector<int32_t>> Scheduler::AllocatePages(int n, uint64_t requester_order) {
  for (;;) {
    auto pages = table_->AllocatePages(n);  // evicts unreferenced documents LRU first
    if (pages.ok() || !absl::IsResourceExhausted(pages.status())) return pages;
    // Preempt the youngest request younger than the requester, not packed in
    // this step.
    std::shared_ptr<Request> victim;
    for (const auto &o : running_) {
      if (o->finished || o->phase == Request::kWaiting || o->order <= requester_order) continue;
      if (std::find(in_batch_.begin(), in_batch_.end(), o.get()) != in_batch_.end()) continue;
      if (o->own_pages.empty() && o->pinned.empty()) continue;
      if (!victim || o->order > victim->order) victim = o;
    }
    if (!victim) {
      return absl::ResourceExhaustedError(absl::StrCat("KV pool exhausted (",
                                                       allocator_->num_pages(), " pages of ",
                                                       options_.page_size, " tokens)"));
    }
    Preempt(victim);
  }
}

bool Scheduler::FitsInPool(const Request &w) const {
  const int ps = options_.page_size;
  // Tokens of the segment a request feeds: the query block in LAZY, the whole prompt (copied
  // or computed) in the other modes; plus what it may generate.
  auto own_tokens = [](const Request &r) -> int64_t {
    const int64_t gen = r.opts.max_tokens;
    if (r.opts.mode == AttentionMode::kLazy) return int64_t(r.prompt.suffix.size()) + gen;
    return r.prompt.total_tokens() + gen;
  };
  int64_t reserved = 0;
  for (const auto &r : running_) {
    if (r->finished) continue;
    reserved += std::max<int64_t>(0, PagesFor(own_tokens(*r), ps) - int64_t(r->own_pages.size()));
  }
  int64_t need = PagesFor(own_tokens(w), ps);
  if (w.opts.mode == AttentionMode::kLazy || w.opts.mode == AttentionMode::kMaterialize) {
    auto block = [&](const std::vector<int32_t> &tokens) {
      if (tokens.empty()) return;
      if (!table_->Contains(DocumentId(options_.fingerprint, w.opts.cache_namespace, tokens))) {
        need += PagesFor(int64_t(tokens.size()), ps);
      }
    };
    block(w.prompt.prefix);
    for (const auto &d : w.prompt.documents) block(d);
  }
  const DocumentTableStats st = table_->Stats();
  const int64_t available = allocator_->num_free() + (st.cached_pages - st.pinned_pages);
  return need + reserved <= available;
}

bool Scheduler::EnsureOwnPages(const std::shared_ptr<Request> &rp, int64_t tokens) {
  Request &r = *rp;
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

void Scheduler::ReleaseResources(Request &r) {
  for (const std::string &id : r.pinned) table_->Release(id);
  r.pinned.clear();
  table_->FreePages(r.own_pages);
  r.own_pages.clear();
  r.fixed.clear();
  r.own = Segment{};
  r.blocks.clear();
  r.pending = 0;
}

void Scheduler::Preempt(const std::shared_ptr<Request> &r) {
  ReleaseResources(*r);
  r->phase = Request::kWaiting;
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

void Scheduler::Finish(Request &r, absl::Status status, FinishReason reason) {
  if (r.finished) return;
  if (r.phase == Request::kWaiting) {
    waiting_count_.fetch_sub(1);
    if (metrics_) metrics_->waiting->Decrement();
  }
  ReleaseResources(r);
  r.finished = true;
  const auto now = Clock::now();
  if (metrics_) {
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

void Scheduler::HedgeSlowFetches() {
  const Clock::time_point now = Clock::now();
  for (auto &[id, job] : jobs_) {
    if (job->state != DocJob::kFetching || now < job->hedge_at) continue;
    job->state = DocJob::kNeedPages;
    job->hedge_at = Clock::time_point::max();
    job->hedged = true;
    if (job->fetch_cancelled != nullptr) job->fetch_cancelled->store(true);
    if (metrics_) metrics_->KvRequests("get", "hedged").Increment();
  }
}

void Scheduler::QueueFetch(DocJob &job) {
  job.state = DocJob::kFetching;
  job.fetch_cancelled = std::make_shared<std::atomic<bool>>(false);
  job.hedge_at = Clock::time_point::max();
  absl::MutexLock l(&fetch_mu_);
  int64_t backlog = 0;  // tokens the fetch thread will fetch from the store first
  for (const FetchItem &q : fetch_queue_) backlog += q.peers_only ? 0 : q.tokens;
  const int64_t tokens = int64_t(job.tokens.size());
  const bool peers_only = cost_.PreferCompute(tokens, backlog);
  // Only a kvstore fetch is hedged (peers-only asks are the cheap tier).
  if (const double after = peers_only ? 0 : cost_.HedgeAfterSeconds(tokens); after > 0) {
    job.hedge_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(after));
  }
  fetch_queue_.push_back({job.ns, job.id, tokens, peers_only, job.fetch_cancelled});
}

void Scheduler::HandleFetched(Fetched f) {
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
                        job.lease == nullptr && f.doc.ok();
    if (!usable) {
      if (f.lease != nullptr) f.lease->Finish(absl::CancelledError("not used"));
      return;
    }
  }
  job.state = DocJob::kNeedPages;
  job.hedge_at = Clock::time_point::max();
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
  if (f.doc.ok() && f.doc->tokens == job.tokens) {
    job.payload = std::move(f.doc->payload);
    job.have_payload = true;
    job.origin = std::move(f.origin);
  } else if (f.doc.ok()) {
    LOG_WARNING << "kvstore value for " << f.id << " holds other tokens: recomputing";
  }
}

void Scheduler::StartJobPages() {
  std::vector<std::shared_ptr<DocJob>> ready;
  for (auto &[id, job] : jobs_) {
    if (job->state == DocJob::kNeedPages) ready.push_back(job);
  }
  std::sort(ready.begin(), ready.end(),
            [](const auto &a, const auto &b) { return a->order < b->order; });
  for (auto &job : ready) {
    const int n = int(job->tokens.size());
    auto pages = AllocatePages(PagesFor(n, options_.page_size), job->order);
    if (!pages.ok()) {
      // Retry next step while other work may free pages; fail when nothing else
      // runs.
      bool others = false;
      for (const auto &r : running_) {
        bool waits_here = false;
        for (const auto &w : job->waiters) waits_here |= w.request == r;
        others |= !r->finished && r->phase == Request::kRun && !waits_here;
      }
      for (const auto &[id, other] : jobs_)
        others |= other != job && other->state != DocJob::kNeedPages;
      if (!others) FailJob(job, pages.status());
      continue;
    }
    job->pages = *pages;
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
        CompleteJob(job, /*from_store=*/true);
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
        CompleteJob(job, /*from_store=*/true);
        continue;
      }
      LOG_WARNING << "importing document " << job->id << " failed (" << st << "): recomputing";
    }
    job->state = DocJob::kComputing;
    job->fed = 0;
  }
}

void Scheduler::CompleteJob(const std::shared_ptr<DocJob> &job, bool from_store) {
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
  if (!from_store && !job->hedged && !job->in_store && store_ != nullptr &&
      store_->accepts_writes()) {
    // The export copies the document's KV to the host on this thread (268 MB for 2,048 tokens
    // of an 8B model): only for a write-back that will be queued and sent. Only this thread
    // adds to the queue, so it cannot fill up between the check and the push.
    const bool paused = WritesPaused();
    bool full = false;
    {
      const int64_t bytes = backend_->BytesPerPage() * n / std::max(1, backend_->page_size());
      absl::MutexLock l(&wb_mu_);
      full = wb_queue_.size() >= kMaxWriteBacks ||
             (wb_pending_bytes_ > 0 && wb_pending_bytes_ + bytes > options_.max_writeback_bytes);
    }
    if (paused) {
      if (metrics_) metrics_->KvRequests("put", "skipped").Increment();
    } else if (full) {
      if (metrics_) metrics_->writeback_dropped->Increment();
    } else {
      std::string payload;
      absl::Status st = backend_->ExportKv(job->pages, int(n), &payload);
      if (st.ok()) {
        absl::MutexLock l(&wb_mu_);
        wb_pending_bytes_ += int64_t(payload.size());
        wb_queue_.push_back(WriteBack{job->ns, job->id, job->tokens, std::move(payload)});
      } else {
        LOG_WARNING << "export of document " << job->id << " failed: " << st;
      }
    }
  }
  job->pages.clear();  // owned by the table entry now
  for (const auto &w : job->waiters) {
    Request &r = *w.request;
    if (r.finished || r.epoch != w.epoch || r.phase != Request::kDocs) continue;
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
      const char *tier = !w.initiator ? "gpu" : job->origin.empty() ? "store" : "peer";
      r.usage.cached_document_tokens += n;
      (w.initiator ? r.usage.store_document_tokens : r.usage.pool_document_tokens) += n;
      if (metrics_) {
        metrics_->Hits(tier).Increment();
        metrics_->HitTokens(tier).Increment(double(n));
      }
    }
  }
  table_->Release(job->id);
  jobs_.erase(job->id);
}

void Scheduler::FailJob(const std::shared_ptr<DocJob> &job, const absl::Status &status) {
  if (!job->pages.empty()) table_->FreePages(job->pages);
  job->pages.clear();
  for (const auto &w : job->waiters) {
    Request &r = *w.request;
    if (r.finished || r.epoch != w.epoch) continue;
    Finish(r, status, FinishReason::kCancelled);
  }
  jobs_.erase(job->id);
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
}

void Scheduler::FetchLoop() {
  const ModelConfig &config = backend_->config();
  const KvDtype dtype = backend_->kv_dtype();
  for (;;) {
    FetchItem item;
    bool down = false;
    {
      absl::MutexLock l(&fetch_mu_);
      fetch_mu_.Await(absl::Condition(
          +[](Scheduler *s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return s->fetch_stop_ || !s->fetch_queue_.empty();
          },
          this));
      if (fetch_stop_) return;
      item = std::move(fetch_queue_.front());
      fetch_queue_.pop_front();
      down = NowMs() < store_down_until_ms_;
    }
    Fetched f{item.id,
              down ? absl::UnavailableError("kvstore marked down")
                   : absl::UnavailableError("kvstore slower than recomputing"),
              "", nullptr};
    if (item.cancelled != nullptr && item.cancelled->load()) {
      // Given up (hedged) before it started: the document is being computed.
      f.doc = absl::CancelledError("fetch given up for a compute");
      if (metrics_) metrics_->KvRequests("get", "cancelled").Increment();
    } else if (down || item.peers_only) {
      // The store failed recently, or fetching from it is predicted to take longer than
      // recomputing: only its cheap tiers (peer workers) are asked.
      auto got = store_->GetWhileDown(item.ns, item.id);
      if (got.ok() && got->lease != nullptr) {
        f.doc = DecodedDocument{{}, got->lease->tokens(), {}};
        f.origin = std::move(got->origin);
        f.lease = std::move(got->lease);
      } else if (got.ok()) {
        f.doc = DecodeDocument(*got, config, dtype);
        f.origin = std::move(got->origin);
      } else {
        if (metrics_) {
          metrics_->KvRequests("get", down ? "skipped" : "slower_than_compute").Increment();
        }
        // Computed instead of fetched: whether a write-back would repeat what the store holds
        // (an existence check, no bytes; a store that cannot tell gets the write-back).
        if (!down) {
          auto has = store_->Contains(item.ns, item.id);
          f.in_store = has.ok() && *has;
        }
      }
    } else {
      const auto t0 = Clock::now();
      auto got = store_->Get(item.ns, item.id);
      if (got.ok() && got->lease != nullptr) {
        // Lent in a peer's device pool: the peer store counts it (lazyrag_worker_peer_*).
        f.doc = DecodedDocument{{}, got->lease->tokens(), {}};
        f.origin = std::move(got->origin);
        f.lease = std::move(got->lease);
      } else if (got.ok() && !got->origin.empty()) {
        // From a peer worker: the peer store counts it (lazyrag_worker_peer_fetch_*).
        f.doc = DecodeDocument(*got, config, dtype);
        f.origin = std::move(got->origin);
      } else if (got.ok()) {
        cost_.ObserveFetch(item.tokens, MsBetween(t0, Clock::now()) / 1000);
        if (metrics_) {
          metrics_->fetch_seconds->Observe(MsBetween(t0, Clock::now()) / 1000);
          metrics_->fetch_bytes->Increment(double(got->bytes.size()));
        }
        f.doc = DecodeDocument(*got, config, dtype);
        if (metrics_)
          metrics_->KvRequests("get", f.doc.ok() ? "hit" : StatusLabel(f.doc.status())).Increment();
      } else {
        f.doc = got.status();
        const bool miss = absl::IsNotFound(got.status());
        if (metrics_)
          metrics_->KvRequests("get", miss ? "miss" : StatusLabel(got.status())).Increment();
        if (!miss) {
          LOG_WARNING << "kvstore get failed (" << got.status() << "): recomputing";
          absl::MutexLock l(&fetch_mu_);
          store_down_until_ms_ = NowMs() + kStoreDownMs;
        }
      }
    }
    absl::MutexLock l(&mu_);
    fetched_.push_back(std::move(f));
    wake_ = true;
  }
}

bool Scheduler::WritesPaused() {
  absl::MutexLock l(&fetch_mu_);
  return NowMs() < std::max(store_down_until_ms_, writes_down_until_ms_);
}

void Scheduler::WriteBackLoop() {
  for (;;) {
    WriteBack wb;
    {
      absl::MutexLock l(&wb_mu_);
      wb_mu_.Await(absl::Condition(
          +[](Scheduler *s)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->wb_stop_ || !s->wb_queue_.empty(); },
          this));
      if (wb_queue_.empty()) return;  // stopping with nothing left: done
      wb = std::move(wb_queue_.front());
      wb_queue_.pop_front();
    }
    // Pending until sent (or skipped): the payload and its encoded copy live until then.
    const int64_t bytes = int64_t(wb.payload.size());
    absl::Cleanup sent = [this, bytes] {
      absl::MutexLock l(&wb_mu_);
      wb_pending_bytes_ -= bytes;
    };
    if (WritesPaused()) {
      if (metrics_) metrics_->KvRequests("put", "skipped").Increment();
      continue;
    }
    absl::Status st = store_->Put(
        wb.ns, wb.id,
        EncodeDocument(backend_->config(), backend_->kv_dtype(), wb.tokens, wb.payload));
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
