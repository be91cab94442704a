#include "worker/engine/engine.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/document_id.h"
#include "common/sha256.h"

namespace lazyrag {
namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
int PagesFor(int64_t tokens, int page_size) { return int((tokens + page_size - 1) / page_size); }

}  // namespace

// Per-request resources; released (unpinned / freed) when the request ends, whatever happens.
struct Engine::RequestState {
  DocumentTable* table = nullptr;
  std::vector<std::string> pinned;   // ids Acquire'd or Insert'ed by this request
  std::vector<int32_t> own_pages;    // pages this request owns outright
  Usage usage;
  ~RequestState() {
    for (const std::string& id : pinned) table->Release(id);
    table->FreePages(own_pages);
  }
};

Engine::Engine(std::unique_ptr<Backend> backend, const EngineOptions& options)
    : options_(options), backend_(std::move(backend)) {
  allocator_ = std::make_unique<PageAllocator>(options.num_pages);
  table_ = std::make_unique<DocumentTable>(allocator_.get());
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Backend> backend,
                                                       const EngineOptions& options) {
  if (backend == nullptr) return absl::InvalidArgumentError("engine: no backend");
  if (options.prefill_chunk <= 0) return absl::InvalidArgumentError("engine: prefill_chunk must be positive");
  if (auto st = backend->InitPool(options.num_pages, options.page_size); !st.ok()) return st;
  return std::unique_ptr<Engine>(new Engine(std::move(backend), options));
}

std::string Engine::BlockId(const std::vector<int32_t>& tokens, const std::string& ns) const {
  return DocumentId(options_.fingerprint, ns, tokens);
}

absl::Status Engine::Validate(const TokenPrompt& prompt, const TokenRunOptions& o) const {
  const ModelConfig& c = config();
  if (prompt.suffix.empty()) return absl::InvalidArgumentError("the query block is empty");
  if (o.max_tokens < 1) return absl::InvalidArgumentError("max_tokens must be at least 1");
  if (auto st = o.sampling.Validate(); !st.ok()) return st;
  int64_t total = prompt.total_tokens() + o.max_tokens;
  if (total > c.max_position) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", prompt.total_tokens(),
                                                   " tokens) + max_tokens (", o.max_tokens,
                                                   ") exceeds the model context of ",
                                                   c.max_position, " tokens"));
  }
  if (PagesFor(total, options_.page_size) + int64_t(prompt.documents.size()) + 1 >
      options_.num_pages) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request needs more KV pages than the pool has (", options_.num_pages, ")"));
  }
  auto check = [&](const std::vector<int32_t>& t) {
    for (int32_t id : t) {
      if (id < 0 || id >= c.vocab_size) return false;
    }
    return true;
  };
  bool ok = check(prompt.prefix) && check(prompt.suffix);
  for (const auto& d : prompt.documents) ok = ok && check(d);
  if (!ok) return absl::InvalidArgumentError("token id out of the vocabulary");
  return absl::OkStatus();
}

absl::Status Engine::Append(const std::vector<Segment>& fixed, Segment& active,
                            const int32_t* tokens, int n, std::vector<float>* logits) {
  const int ps = options_.page_size;
  for (int done = 0; done < n;) {
    const int chunk = std::min(options_.prefill_chunk, n - done);
    const bool last = done + chunk == n;
    ForwardBatch b;
    b.view.page_size = ps;
    for (const Segment& s : fixed) b.view.AddSegment(s.start, s.len, s.pages);
    if (int64_t(active.pages.size()) * ps < active.len + chunk) {
      return absl::InternalError("engine: active segment has too few pages");
    }
    b.view.AddSegment(active.start, active.len + chunk, active.pages);
    std::vector<int32_t> q_pos(chunk);
    for (int i = 0; i < chunk; ++i) {
      const int32_t local = active.len + i;
      b.tokens.push_back(tokens[done + i]);
      b.kv_pos.push_back(local);
      b.kv_slot.push_back(int64_t(active.pages[local / ps]) * ps + local % ps);
      q_pos[i] = active.start + local;
    }
    b.view.EndRequest(q_pos);
    if (last && logits != nullptr) b.logit_rows.push_back(chunk - 1);
    std::vector<float> out;
    if (auto st = backend_->Forward(b, &out); !st.ok()) return st;
    if (last && logits != nullptr) *logits = std::move(out);
    active.len += chunk;
    done += chunk;
  }
  return absl::OkStatus();
}

absl::StatusOr<DocumentRun> Engine::AcquireBlock(RequestState& st,
                                                 const std::vector<int32_t>& tokens,
                                                 const std::string& ns, bool* computed) {
  const std::string id = BlockId(tokens, ns);
  *computed = false;
  auto hit = table_->Acquire(id);
  if (hit.ok()) {
    st.pinned.push_back(id);
    return hit;
  }
  // Miss: encode the block alone from position 0 into fresh pages.
  auto pages = table_->AllocatePages(PagesFor(tokens.size(), options_.page_size));
  if (!pages.ok()) return pages.status();
  Segment seg{0, 0, *pages};
  if (auto s = Append({}, seg, tokens.data(), int(tokens.size()), nullptr); !s.ok()) {
    table_->FreePages(*pages);
    return s;
  }
  *computed = true;
  DocumentRun run = table_->Insert(id, DocumentRun{*pages, int32_t(tokens.size())});
  st.pinned.push_back(id);
  return run;
}

absl::Status Engine::RunPrompt(RequestState& st, const TokenPrompt& prompt,
                               const TokenRunOptions& o, std::vector<float>* logits) {
  const int ps = options_.page_size;
  const int64_t prompt_len = prompt.total_tokens();
  const int64_t capacity = prompt_len + o.max_tokens;
  Usage& u = st.usage;
  u.prompt_tokens = prompt_len;
  for (const auto& d : prompt.documents) u.document_tokens += d.size();

  if (o.mode == AttentionMode::kLazy || o.mode == AttentionMode::kMaterialize) {
    // Blocks: the prefix, then each document, at logical starts S_0 = 0, S_d = sum before.
    std::vector<Segment> blocks;
    int32_t start = 0;
    auto add_block = [&](const std::vector<int32_t>& tokens, bool is_doc) -> absl::Status {
      if (tokens.empty()) return absl::OkStatus();
      bool computed = false;
      auto run = AcquireBlock(st, tokens, o.cache_namespace, &computed);
      if (!run.ok()) return run.status();
      if (computed) u.computed_tokens += tokens.size();
      if (is_doc && !computed) {
        u.cached_document_tokens += tokens.size();
        u.pool_document_tokens += tokens.size();
      }
      blocks.push_back(Segment{start, run->num_tokens, run->pages});
      start += run->num_tokens;
      return absl::OkStatus();
    };
    if (auto s = add_block(prompt.prefix, false); !s.ok()) return s;
    for (const auto& d : prompt.documents) {
      if (auto s = add_block(d, true); !s.ok()) return s;
    }
    if (o.mode == AttentionMode::kLazy) {
      // The request's own segment: query and generated tokens, rotated locally from `start`.
      auto pages = table_->AllocatePages(PagesFor(prompt.suffix.size() + o.max_tokens, ps));
      if (!pages.ok()) return pages.status();
      st.own_pages = *pages;
      Segment own{start, 0, *pages};
      u.computed_tokens += prompt.suffix.size();
      if (auto s = Append(blocks, own, prompt.suffix.data(), int(prompt.suffix.size()), logits); !s.ok()) return s;
      // Decode continues on the same segments; keep them for the caller.
      active_fixed_ = std::move(blocks);
      active_ = std::move(own);
      return absl::OkStatus();
    }
    // MATERIALIZE: copy every block into the request's pages, re-rotating keys by S.
    auto pages = table_->AllocatePages(PagesFor(capacity, ps));
    if (!pages.ok()) return pages.status();
    st.own_pages = *pages;
    std::vector<MaterializeCopy> copies;
    for (const Segment& b : blocks) {
      copies.push_back(MaterializeCopy{b.pages, b.len, *pages, b.start, b.start});
    }
    if (auto s = backend_->Materialize(copies); !s.ok()) return s;
    Segment active{0, start, *pages};
    u.computed_tokens += prompt.suffix.size();
    if (auto s = Append({}, active, prompt.suffix.data(), int(prompt.suffix.size()), logits); !s.ok()) return s;
    active_fixed_.clear();
    active_ = std::move(active);
    return absl::OkStatus();
  }

  // FULL and PREFIX: plain causal attention over the concatenated prompt.
  std::vector<int32_t> all(prompt.prefix);
  std::vector<std::pair<int64_t, int64_t>> doc_spans;
  for (const auto& d : prompt.documents) {
    doc_spans.push_back({int64_t(all.size()), int64_t(all.size() + d.size())});
    all.insert(all.end(), d.begin(), d.end());
  }
  all.insert(all.end(), prompt.suffix.begin(), prompt.suffix.end());

  std::vector<int32_t> reused_pages;
  std::vector<std::string> page_ids;  // chained page hashes (PREFIX)
  if (o.mode == AttentionMode::kPrefix) {
    Digest256 chain{};
    for (int64_t k = 0; (k + 1) * ps <= prompt_len; ++k) {
      Sha256 h;
      h.Update("lazyrag.prefix.v1");
      h.Update(options_.fingerprint);
      h.Update(o.cache_namespace);
      h.Update(chain.data(), chain.size());
      h.Update(&all[k * ps], sizeof(int32_t) * ps);
      chain = h.Finish();
      page_ids.push_back("prefix:" + ToHex(chain));
    }
    // Reuse the longest cached run, leaving at least one prompt token to compute.
    for (int64_t k = 0; k < int64_t(page_ids.size()) && (k + 1) * ps < prompt_len; ++k) {
      auto hit = table_->Acquire(page_ids[k]);
      if (!hit.ok()) break;
      st.pinned.push_back(page_ids[k]);
      reused_pages.push_back(hit->pages[0]);
    }
  }
  const int64_t reused = int64_t(reused_pages.size()) * ps;
  for (auto [b, e] : doc_spans) {
    u.cached_document_tokens += std::max<int64_t>(0, std::min(e, reused) - b);
  }
  u.pool_document_tokens = u.cached_document_tokens;
  auto pages = table_->AllocatePages(PagesFor(capacity, ps) - int(reused_pages.size()));
  if (!pages.ok()) return pages.status();
  st.own_pages = *pages;
  Segment active{0, int32_t(reused), reused_pages};
  active.pages.insert(active.pages.end(), pages->begin(), pages->end());
  u.computed_tokens += prompt_len - reused;
  if (auto s = Append({}, active, all.data() + reused, int(prompt_len - reused), logits); !s.ok()) return s;
  if (o.mode == AttentionMode::kPrefix) {
    // Hand the newly computed full prompt pages to the prefix cache.
    for (int64_t k = reused_pages.size(); k < int64_t(page_ids.size()); ++k) {
      const int32_t page = active.pages[k];
      DocumentRun run = table_->Insert(page_ids[k], DocumentRun{{page}, ps});
      st.pinned.push_back(page_ids[k]);
      st.own_pages.erase(std::find(st.own_pages.begin(), st.own_pages.end(), page));
      if (run.pages[0] != page) active.pages[k] = run.pages[0];  // raced: use the cached copy
    }
  }
  active_fixed_.clear();
  active_ = std::move(active);
  return absl::OkStatus();
}

absl::StatusOr<TokenResult> Engine::RunTokens(const TokenPrompt& prompt,
                                              const TokenRunOptions& o,
                                              const TokenCallback& on_token) {
  const auto t_arrive = Clock::now();
  if (auto s = Validate(prompt, o); !s.ok()) return s;
  absl::MutexLock lock(&run_mu_);
  const auto t_start = Clock::now();
  RequestState st;
  st.table = table_.get();
  TokenResult result;
  std::vector<float> logits;
  if (auto s = RunPrompt(st, prompt, o, &logits); !s.ok()) return s;
  Sampler sampler(o.sampling);
  const int vocab = config().vocab_size;
  for (int step = 0; step < o.max_tokens; ++step) {
    if (o.step_logits) o.step_logits->push_back(logits);
    const int32_t token = sampler.Sample(std::span<const float>(logits.data(), vocab));
    if (step == 0) result.timings.ttft_ms = MsSince(t_arrive);
    const bool is_stop = std::find(o.stop_token_ids.begin(), o.stop_token_ids.end(), token) !=
                         o.stop_token_ids.end();
    if (is_stop && !o.ignore_eos) {
      result.finish_reason = FinishReason::kEos;
      break;
    }
    result.token_ids.push_back(token);
    if (on_token && !on_token(token)) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    if (step + 1 == o.max_tokens) break;
    if (auto s = Append(active_fixed_, active_, &token, 1, &logits); !s.ok()) return s;
  }
  result.usage = st.usage;
  result.usage.completion_tokens = result.token_ids.size();
  result.timings.queue_ms = std::chrono::duration<double, std::milli>(t_start - t_arrive).count();
  result.timings.total_ms = MsSince(t_arrive);
  return result;
}

}  // namespace lazyrag
