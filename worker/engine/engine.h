// The generation engine over one backend: document blocks cached once in the paged pool and
// referenced by any number of requests (LAZY), copied and re-rotated per request
// (MATERIALIZE), reused only on identical prefixes (PREFIX), or not at all (FULL).
// Knows nothing of gRPC (DESIGN section 9).
//
// Thread safety: RunTokens may be called from many threads; requests currently run one at a
// time (the continuous-batching scheduler of worker/engine replaces this lock).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/backend.h"
#include "worker/cache/document_table.h"
#include "worker/engine/request.h"

namespace lazyrag {

struct EngineOptions {
  int num_pages = 4096;      // KV pool pages
  int page_size = 16;        // tokens per page
  int prefill_chunk = 512;   // query rows per forward step during prefill
  std::string fingerprint;   // model fingerprint, part of every document id
};

struct TokenRunOptions {
  AttentionMode mode = AttentionMode::kLazy;
  int max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;               // generate max_tokens whatever is sampled
  std::vector<int32_t> stop_token_ids;   // EOS and the template's end-of-turn tokens
  std::string cache_namespace;
  // When set, receives the logits of every step: after the prompt, then after each
  // generated token ([max_tokens][vocab] at most). For tests and fixtures.
  std::vector<std::vector<float>>* step_logits = nullptr;
};

// Called with each generated token; return false to stop (stop string, client gone).
using TokenCallback = std::function<bool(int32_t token)>;

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<Backend> backend,
                                                        const EngineOptions& options);

  absl::StatusOr<TokenResult> RunTokens(const TokenPrompt& prompt, const TokenRunOptions& options,
                                        const TokenCallback& on_token = {});

  // The id under which a block of tokens is cached (common/document_id.h).
  std::string BlockId(const std::vector<int32_t>& tokens, const std::string& cache_namespace) const;

  Backend& backend() { return *backend_; }
  const ModelConfig& config() const { return backend_->config(); }
  DocumentTable& documents() { return *table_; }
  const PageAllocator& pages() const { return *allocator_; }
  const EngineOptions& options() const { return options_; }

 private:
  struct Segment {
    int32_t start = 0;
    int32_t len = 0;
    std::vector<int32_t> pages;
  };
  struct RequestState;

  Engine(std::unique_ptr<Backend> backend, const EngineOptions& options);
  absl::Status Validate(const TokenPrompt& prompt, const TokenRunOptions& options) const;
  // Pins the block's KV, computing it (alone, from position 0) on a miss.
  absl::StatusOr<DocumentRun> AcquireBlock(RequestState& st, const std::vector<int32_t>& tokens,
                                           const std::string& ns, bool* computed);
  // Runs `tokens` appended to `active` (after `fixed`), returning the last row's logits when
  // `logits` is set.
  absl::Status Append(const std::vector<Segment>& fixed, Segment& active,
                      const int32_t* tokens, int n, std::vector<float>* logits);
  absl::Status RunPrompt(RequestState& st, const TokenPrompt& prompt,
                         const TokenRunOptions& options, std::vector<float>* logits);

  EngineOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<PageAllocator> allocator_;
  std::unique_ptr<DocumentTable> table_;
  absl::Mutex run_mu_;
  // Segments of the request being run (guarded by run_mu_): fixed blocks and the segment that
  // receives generated tokens.
  std::vector<Segment> active_fixed_;
  Segment active_;
};

}  // namespace lazyrag
