// Text-level generation: builds the block prompt from system prompt, documents
// (by text or by id) and query with the model's RAG template, runs it on the
// engine, detokenises the stream (whole UTF-8 characters only) and applies stop
// strings. Knows nothing of gRPC.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/engine/engine.h"
#include "worker/model/tokenizer/chat_template.h"
#include "worker/model/tokenizer/tokenizer.h"

namespace lazyrag {

struct DocumentInput {
  std::string text;  // exactly one of text and id
  std::string id;    // a document id returned earlier (PrepareDocuments or a usage report)
};

struct GenerateRequest {
  std::string request_id;
  std::string system_prompt;  // empty: the template's default
  std::vector<DocumentInput> documents;
  std::string query;
  SamplingParams sampling;
  int max_tokens = 64;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool ignore_eos = false;
  AttentionMode mode = AttentionMode::kLazy;
  std::string cache_namespace;
  // Overrides of the server's answer-quality settings (worker/engine/request.h).
  QualityOptions quality;
  // DEADLINE_EXCEEDED once it passes; polled cancellation (a client that went
  // away).
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> is_cancelled;
};

struct GenerateResult {
  std::string text;
  std::vector<int32_t> token_ids;
  FinishReason finish_reason = FinishReason::kLength;
  Usage usage;
  Timings timings;
  std::vector<std::string> document_ids;
};

// Called with each text delta (possibly empty while bytes are held back) and
// its token. Return false to cancel the request.
using TextCallback = std::function<bool(std::string_view delta, int32_t token)>;

struct PreparedDocument {
  std::string id;
  int num_tokens = 0;
  bool computed = false;  // false: it was already resident
};

class Generator {
 public:
  // `engine` and `tokenizer` must outlive the generator.
  Generator(Engine *engine, const Tokenizer *tokenizer, RagTemplate tmpl);

  absl::StatusOr<GenerateResult> Generate(const GenerateRequest &request,
                                          const TextCallback &on_delta = {});
  // Tokenizes documents and makes them resident ahead of requests (Engine::EncodeDocuments:
  // fetched or computed, written back; pins nothing). Stops at `deadline` (DEADLINE_EXCEEDED)
  // or when `is_cancelled` (optional, polled) turns true (CANCELLED).
  absl::StatusOr<std::vector<PreparedDocument>> PrepareDocuments(
      const std::vector<std::string> &texts, const std::string &cache_namespace,
      absl::Time deadline = absl::InfiniteFuture(), const std::function<bool()> &is_cancelled = {});

  absl::StatusOr<TokenPrompt> BuildPrompt(const GenerateRequest &request,
                                          std::vector<std::string> *document_ids);
  const Tokenizer &tokenizer() const { return *tokenizer_; }
  const RagTemplate &rag_template() const { return template_; }
  Engine &engine() { return *engine_; }
  // The cache namespace a document id was made in, when this generator still remembers it
  // (Stats shows a client only its own documents).
  std::optional<std::string> NamespaceOf(const std::string &id);

 private:
  Engine *engine_;
  const Tokenizer *tokenizer_;
  RagTemplate template_;
  // Document tokens and namespace by id, so that later requests (and FULL/PREFIX modes) can
  // name documents by id; an id resolves only for a request of the namespace that made it.
  // Bounded: the oldest ids are forgotten past kMaxKnownDocuments.
  static constexpr size_t kMaxKnownDocuments = 100000;
  struct KnownDocument {
    std::string cache_namespace;
    std::vector<int32_t> tokens;
  };
  absl::Mutex mu_;
  std::unordered_map<std::string, KnownDocument> known_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> known_order_ ABSL_GUARDED_BY(mu_);
  void Remember(const std::string &id, const std::string &ns, const std::vector<int32_t> &tokens);
  // Token ids of prompt pieces: control tokens only from the template (RagTemplate).
  std::vector<int32_t> Encode(const std::vector<PromptPiece> &pieces) const;
};

// Incremental detokeniser with stop strings: feeds token bytes, releases text
// that is whole UTF-8 and cannot be the start of a stop string.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends bytes; returns the newly releasable text. Sets *stopped when a stop
  // string appeared (the text before it is released, the rest dropped).
  std::string Feed(std::string_view bytes, bool *stopped);
  // Releases what is held back at the end of generation (a trailing partial
  // character is kept as is).
  std::string Flush();
  const std::string &text() const { return text_; }  // everything released so far

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // bytes not yet released
  std::string text_;
};

}  // namespace lazyrag
