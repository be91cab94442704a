#include "worker/engine/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/document_id.h"
#include "common/sha256.h"
#include "common/status.h"
#include "worker/engine/document_codec.h"
#include "worker/engine/engine_metrics.h"
#include "worker/engine/request_layout.h"
#include "worker/engine/scheduler.h"

namespace lazyrag {

Engine::Engine(std::unique_ptr<Backend> backend, const EngineOptions &options,
               std::unique_ptr<HostTier> host, std::unique_ptr<HostTier> staging)
    : options_(options),
      backend_(std::move(backend)),
      host_(std::move(host)),
      staging_(std::move(staging)) {
  if (options_.clock == nullptr) options_.clock = RealClock();
  // REQUIRES: InitPool done (Create). Asked here, before the scheduler thread drives the backend.
  pool_handle_ = backend_->ExportPoolHandle();
  if (options.store != nullptr && pool_handle_.ok()) {
    // Peer workers whose pool layout matches may lend documents in device memory.
    options.store->EnableDeviceLeases(*pool_handle_);
  }
  allocator_ = std::make_unique<PageAllocator>(options.num_pages);
  table_ = std::make_unique<DocumentTable>(allocator_.get());
  if (options.registry != nullptr) {
    metrics_ =
        std::make_unique<EngineMetrics>(options.registry, options.model_name, options.pool_tier);
  }
  scheduler_ = std::make_unique<Scheduler>(backend_.get(), table_.get(), allocator_.get(),
                                           host_.get(), staging_.get(), options_, metrics_.get());
}

namespace {

// The backend's host memory as the host tier's arena.
class BackendHostArena final : public HostArena {
 public:
  explicit BackendHostArena(std::unique_ptr<HostMemory> memory) : memory_(std::move(memory)) {}
  char *data() override { return memory_->data(); }
  int64_t size() const override { return memory_->size(); }

 private:
  std::unique_ptr<HostMemory> memory_;
};

}  // namespace

Engine::~Engine() { scheduler_.reset(); }

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Backend> backend,
                                                       const EngineOptions &options) {
  if (backend == nullptr) return absl::InvalidArgumentError("engine: no backend");
  if (options.prefill_chunk <= 0)
    return absl::InvalidArgumentError("engine: prefill_chunk must be positive");
  if (options.max_batch_tokens <= 0) {
    return absl::InvalidArgumentError("engine: max_batch_tokens must be positive");
  }
  if (options.max_running <= 0 || options.max_waiting < 0) {
    return absl::InvalidArgumentError("engine: max_running must be positive, max_waiting >= 0");
  }
  if (options.host_cache_bytes < 0 || options.fetch_staging_bytes < 0) {
    return absl::InvalidArgumentError(
        "engine: host_cache_bytes and fetch_staging_bytes must be >= 0");
  }
  if (auto q = ResolveQuality({}, options.quality); !q.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("engine: ", q.status().message()));
  }
  if (options.quality.NeedsQualityViews() && !backend->SupportsQualityViews()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine: recompute_first_tokens > 0, drop_first_tokens > 0 and document temperature / "
        "scale need a backend that skips and scales segment keys; ",
        backend->name(), " does not (the CPU and CUDA backends do)"));
  }
  if (auto st = backend->InitPool(options.num_pages, options.page_size); !st.ok()) return st;
  // A tier over `bytes` of the backend's host memory (`what` names it in errors).
  auto make_tier = [&](int64_t bytes,
                       const char *what) -> absl::StatusOr<std::unique_ptr<HostTier>> {
    absl::StatusOr<std::unique_ptr<HostMemory>> memory = backend->AllocateHostMemory(bytes);
    if (!memory.ok()) {
      return absl::Status(
          memory.status().code(),
          absl::StrCat("engine: ", what, " of ", bytes, " bytes: ", memory.status().message()));
    }
    return std::make_unique<HostTier>(std::make_unique<BackendHostArena>(*std::move(memory)));
  };
  std::unique_ptr<HostTier> host, staging;
  if (options.host_cache_bytes > 0) {
    auto tier = make_tier(options.host_cache_bytes, "host tier");
    if (!tier.ok()) return tier.status();
    host = *std::move(tier);
  } else if (options.store != nullptr && options.fetch_staging_bytes > 0) {
    auto tier = make_tier(options.fetch_staging_bytes, "fetch staging memory");
    if (!tier.ok()) return tier.status();
    staging = *std::move(tier);
  }
  const ModelConfig &mc = backend->config();
  for (int32_t t : options.shared_prefix) {
    if (t < 0 || t >= mc.vocab_size) {
      return absl::InvalidArgumentError("engine: shared_prefix token out of the vocabulary");
    }
  }
  if (PagesFor(int64_t(options.shared_prefix.size()), options.page_size) * 4 > options.num_pages) {
    return absl::InvalidArgumentError("engine: shared_prefix takes over a quarter of the pool");
  }
  std::unique_ptr<Engine> engine(
      new Engine(std::move(backend), options, std::move(host), std::move(staging)));
  if (!options.shared_prefix.empty()) {
    // Computed alone (no sink is set yet), then pinned for the engine's life: every block
    // computed from now on attends it.
    auto ch = engine->scheduler_->SubmitEncode(options.shared_prefix, "", absl::InfiniteFuture());
    if (!ch.ok()) return ch.status();
    {
      absl::MutexLock l(&(*ch)->mu);
      (*ch)->mu.Await(absl::Condition(&(*ch)->done));
      if (!(*ch)->status.ok()) return (*ch)->status;
    }
    RETURN_IF_ERROR(engine->scheduler_->RunOnLoop(
        [&] { return engine->scheduler_->PinSharedPrefix(options.shared_prefix); }));
  }
  return engine;
}

std::string Engine::IdNamespace(const std::string &ns) const {
  if (options_.shared_prefix.empty()) return ns;
  Sha256 h;
  h.Update("lazyrag.shared_prefix.v1");
  h.Update(options_.shared_prefix.data(), sizeof(int32_t) * options_.shared_prefix.size());
  return absl::StrCat(ns, "\x1f", "after:", ToHex(h.Finish()).substr(0, 32));
}

std::string Engine::BlockId(const std::vector<int32_t> &tokens, const std::string &ns) const {
  return DocumentId(options_.fingerprint, IdNamespace(ns), tokens);
}

absl::Status Engine::Validate(const TokenPrompt &prompt, const TokenRunOptions &o) const {
  const ModelConfig &c = config();
  if (prompt.suffix.empty()) return absl::InvalidArgumentError("the query block is empty");
  if (o.max_tokens < 1) return absl::InvalidArgumentError("max_tokens must be at least 1");
  if (auto st = o.sampling.Validate(); !st.ok()) return st;
  if (auto q = ResolveQuality(o.quality, options_.quality); !q.ok()) {
    return q.status();
  } else if (q->NeedsQualityViews() && !backend_->SupportsQualityViews() &&
             (o.mode == AttentionMode::kLazy || o.mode == AttentionMode::kMaterialize)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recompute_first_tokens > 0, drop_first_tokens > 0 and document temperature / scale are "
        "not supported by the ",
        backend_->name(), " backend (the CPU and CUDA backends support them)"));
  }
  int64_t total = prompt.total_tokens() + o.max_tokens;
  if (total > c.max_position) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", prompt.total_tokens(), " tokens) + max_tokens (", o.max_tokens,
                     ") exceeds the model context of ", c.max_position, " tokens"));
  }
  if (PagesFor(total, options_.page_size) + int64_t(prompt.documents.size()) + 2 >
      options_.num_pages) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request needs more KV pages than the pool has (", options_.num_pages, ")"));
  }
  auto check = [&](const std::vector<int32_t> &t) {
    for (int32_t id : t) {
      if (id < 0 || id >= c.vocab_size) return false;
    }
    return true;
  };
  bool ok = check(prompt.prefix) && check(prompt.suffix);
  for (const auto &d : prompt.documents) ok = ok && check(d) && !d.empty();
  if (!ok) return absl::InvalidArgumentError("empty document or token id out of the vocabulary");
  if (Now() >= o.deadline) {
    return absl::DeadlineExceededError("the request's deadline has already passed");
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenResult> Engine::RunTokens(const TokenPrompt &given,
                                              const TokenRunOptions &given_options,
                                              const TokenCallback &on_token) {
  TokenPrompt prompt = given;
  prompt.sink = options_.shared_prefix;
  TokenRunOptions o = given_options;
  o.cache_namespace = IdNamespace(given_options.cache_namespace);
  if (auto s = Validate(prompt, o); !s.ok()) return s;
  auto submitted = scheduler_->Submit(prompt, o);
  if (!submitted.ok()) return submitted.status();
  RequestChannel &ch = **submitted;
  TokenResult result;
  size_t consumed = 0;
  bool stopped = false, cancelled = false;
  for (;;) {
    std::vector<int32_t> fresh;
    bool done = false;
    {
      absl::MutexLock l(&ch.mu);
      auto ready = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return ch.done || ch.tokens.size() > consumed;
      };
      if (!ready()) {
        ch.mu.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(20));
      }
      fresh.assign(ch.tokens.begin() + consumed, ch.tokens.end());
      consumed = ch.tokens.size();
      done = ch.done;
    }
    for (int32_t t : fresh) {
      if (stopped || cancelled) break;
      result.token_ids.push_back(t);
      if (on_token && !on_token(t)) {
        stopped = true;
        scheduler_->Cancel(ch, /*stopped_by_caller=*/true);
      }
    }
    if (!stopped && !cancelled && o.is_cancelled && o.is_cancelled()) {
      cancelled = true;
      scheduler_->Cancel(ch, /*stopped_by_caller=*/false);
    }
    if (done) break;
  }
  // The scheduler has released the request's pages before marking it done.
  absl::MutexLock l(&ch.mu);
  if (cancelled) return absl::CancelledError("request cancelled by the client");
  if (!ch.status.ok() && !stopped) return ch.status;
  result.finish_reason = stopped ? FinishReason::kStop : ch.finish;
  result.usage = ch.usage;
  result.usage.completion_tokens = int64_t(result.token_ids.size());
  result.timings = ch.timings;
  return result;
}

absl::StatusOr<std::vector<int32_t>> Engine::FetchDocumentTokens(const std::string &ns,
                                                                 const std::string &id) {
  return scheduler_->FetchDocumentTokens(IdNamespace(ns), id);
}

absl::StatusOr<std::vector<EncodedDocument>> Engine::EncodeDocuments(
    const std::vector<std::vector<int32_t>> &documents, const std::string &ns, absl::Time deadline,
    const std::function<bool()> &is_cancelled) {
  const ModelConfig &c = config();
  for (size_t i = 0; i < documents.size(); ++i) {
    const std::vector<int32_t> &d = documents[i];
    if (d.empty()) return absl::InvalidArgumentError(absl::StrCat("document ", i, " is empty"));
    for (int32_t t : d) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("document ", i, ": token id ", t, " out of the vocabulary"));
      }
    }
    if (int64_t(d.size()) > c.max_position) {
      return absl::InvalidArgumentError(absl::StrCat("document ", i, " (", d.size(),
                                                     " tokens) exceeds the model context of ",
                                                     c.max_position, " tokens"));
    }
    if (PagesFor(int64_t(d.size()), options_.page_size) + 2 > options_.num_pages) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "document ", i, " needs more KV pages than the pool has (", options_.num_pages, ")"));
    }
  }
  if (Now() >= deadline) return absl::DeadlineExceededError("the deadline has already passed");
  // A few documents in flight at once: their computes share steps, and the
  // waiting queue stays open to requests.
  constexpr size_t kInFlight = 8;
  auto cancelled = [&] { return is_cancelled && is_cancelled(); };
  std::vector<EncodedDocument> out;
  for (size_t begin = 0; begin < documents.size(); begin += kInFlight) {
    if (cancelled()) return absl::CancelledError("the caller cancelled the call");
    if (Now() >= deadline) return absl::DeadlineExceededError("deadline exceeded");
    const size_t end = std::min(documents.size(), begin + kInFlight);
    std::vector<std::shared_ptr<RequestChannel>> channels;
    absl::Status failed;
    for (size_t i = begin; i < end; ++i) {
      auto ch = scheduler_->SubmitEncode(documents[i], IdNamespace(ns), deadline);
      if (!ch.ok()) {
        failed = ch.status();
        break;
      }
      channels.push_back(*std::move(ch));
    }
    // The caller going away cancels every document of the batch still queued or computing
    // (the scheduler reaps them at its next step), so the work stops with the call.
    bool cancel_sent = false;
    for (size_t k = 0; k < channels.size(); ++k) {
      RequestChannel &ch = *channels[k];
      for (;;) {
        {
          absl::MutexLock l(&ch.mu);
          if (ch.mu.AwaitWithTimeout(absl::Condition(&ch.done), absl::Milliseconds(20))) break;
        }
        if (!cancel_sent && cancelled()) {
          for (const auto &c : channels) scheduler_->Cancel(*c, /*stopped_by_caller=*/false);
          cancel_sent = true;
          failed = absl::CancelledError("the caller cancelled the call");
        }
      }
      absl::MutexLock l(&ch.mu);
      if (!ch.status.ok()) {
        if (failed.ok()) failed = ch.status;
        continue;
      }
      const std::vector<int32_t> &d = documents[begin + k];
      out.push_back(EncodedDocument{BlockId(d, ns), int(d.size()),
                                    /*computed=*/ch.usage.pool_document_tokens == 0});
    }
    if (!failed.ok()) return failed;
  }
  return out;
}

absl::StatusOr<StoredDocument> Engine::ExportResidentDocument(const std::string &id) {
  std::vector<int32_t> tokens;
  auto run = table_->Acquire(id, &tokens);  // pinned from here to Release
  if (!run.ok()) return absl::NotFoundError(absl::StrCat("document ", id, " is not resident"));
  absl::StatusOr<StoredDocument> out;
  if (tokens.empty() || int64_t(tokens.size()) != run->num_tokens) {
    out = absl::NotFoundError(absl::StrCat("pool entry ", id, " is not a document"));
  } else {
    // The copy runs on the scheduler thread, which drives the backend; the pin taken above
    // keeps the pages from being evicted until it is done.
    std::string payload;
    absl::Status st = scheduler_->RunOnLoop(
        [&] { return backend_->ExportKv(run->pages, run->num_tokens, &payload); });
    if (st.ok()) {
      out = EncodeDocument(config(), backend_->kv_dtype(), tokens, payload);
    } else {
      out = st;
    }
  }
  table_->Release(id);
  return out;
}

absl::StatusOr<Engine::PinnedDocument> Engine::PinResidentDocument(const std::string &id) {
  PinnedDocument d;
  auto run = table_->Acquire(id, &d.tokens);  // pinned from here to UnpinDocument
  if (!run.ok()) return absl::NotFoundError(absl::StrCat("document ", id, " is not resident"));
  if (d.tokens.empty() || int64_t(d.tokens.size()) != run->num_tokens) {
    table_->Release(id);
    return absl::NotFoundError(absl::StrCat("pool entry ", id, " is not a document"));
  }
  d.pages = run->pages;
  d.num_tokens = run->num_tokens;
  return d;
}

void Engine::UnpinDocument(const std::string &id) { table_->Release(id); }

absl::Status Engine::EvictDocument(const std::string &id) { return scheduler_->EvictDocument(id); }

EngineStats Engine::Stats() const {
  EngineStats s;
  s.running = scheduler_->running();
  s.waiting = scheduler_->waiting();
  s.pages_total = allocator_->num_pages();
  s.pages_free = allocator_->num_free();
  const DocumentTableStats t = table_->Stats();
  s.pages_pinned = t.pinned_pages;
  s.evictions = t.evictions;
  s.preemptions = scheduler_->preemptions();
  s.resident_ids = table_->ResidentIds();
  if (host_ != nullptr) s.host = host_->Stats();
  return s;
}

}  // namespace lazyrag
