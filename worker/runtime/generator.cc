#include "worker/runtime/generator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/document_id.h"
#include "worker/model/tokenizer/utf8.h"

namespace lazyrag {

std::string StopStringMatcher::Feed(std::string_view bytes, bool *stopped) {
  *stopped = false;
  pending_.append(bytes);
  // A stop string fully inside released + pending text (it may straddle the
  // boundary only within pending, since released text never ends with a
  // stop-string prefix).
  for (const std::string &s : stops_) {
    if (s.empty()) continue;
    size_t at = pending_.find(s);
    if (at != std::string::npos) {
      std::string out = pending_.substr(0, at);
      text_ += out;
      pending_.clear();
      *stopped = true;
      return out;
    }
  }
  size_t release = Utf8CompletePrefix(pending_);
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string &s : stops_) {
    for (size_t n = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  release = std::min(release, pending_.size() - hold);
  std::string out = pending_.substr(0, release);
  pending_.erase(0, release);
  text_ += out;
  return out;
}

std::string StopStringMatcher::Flush() {
  std::string out = std::move(pending_);
  pending_.clear();
  text_ += out;
  return out;
}

Generator::Generator(Engine *engine, const Tokenizer *tokenizer, RagTemplate tmpl)
    : engine_(engine), tokenizer_(tokenizer), template_(std::move(tmpl)) {}

std::vector<int32_t> Generator::Encode(const std::vector<PromptPiece> &pieces) const {
  return tokenizer_->EncodePieces(pieces, template_.parse_special_in_text);
}

std::optional<std::string> Generator::NamespaceOf(const std::string &id) {
  absl::MutexLock lock(&mu_);
  auto it = known_.find(id);
  if (it == known_.end()) return std::nullopt;
  return it->second.cache_namespace;
}

void Generator::Remember(const std::string &id, const std::string &ns,
                         const std::vector<int32_t> &tokens) {
  absl::MutexLock lock(&mu_);
  if (known_.emplace(id, KnownDocument{ns, tokens}).second) {
    known_order_.push_back(id);
    if (known_order_.size() > kMaxKnownDocuments) {
      known_.erase(known_order_.front());
      known_order_.pop_front();
    }
  }
}

absl::StatusOr<TokenPrompt> Generator::BuildPrompt(const GenerateRequest &r,
                                                   std::vector<std::string> *document_ids) {
  if (r.query.empty()) return absl::InvalidArgumentError("query is empty");
  if (!IsValidUtf8(r.query) || !IsValidUtf8(r.system_prompt)) {
    return absl::InvalidArgumentError("query and system prompt must be valid UTF-8");
  }
  TokenPrompt p;
  p.prefix = Encode(template_.PrefixPieces(r.system_prompt));
  p.suffix = Encode(template_.SuffixPieces(r.query));
  for (size_t i = 0; i < r.documents.size(); ++i) {
    const DocumentInput &d = r.documents[i];
    if (!d.text.empty() && !d.id.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("document ", i, ": give text or id, not both"));
    }
    std::vector<int32_t> tokens;
    std::string id;
    if (!d.id.empty()) {
      if (!IsDocumentId(d.id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("document ", i, ": '", d.id, "' is not a document id"));
      }
      {
        // An id made in another namespace is treated exactly as an unknown one (the same
        // store lookup, in this request's namespace, and NOT_FOUND), so that neither the
        // answer nor its timing tells a caller that another tenant holds the document.
        absl::MutexLock lock(&mu_);
        auto it = known_.find(d.id);
        if (it != known_.end() && it->second.cache_namespace == r.cache_namespace) {
          tokens = it->second.tokens;
        }
      }
      if (tokens.empty()) {
        // Not seen by this process (e.g. after a restart): the store keeps the
        // tokens too, under this namespace's key.
        auto fetched = engine_->FetchDocumentTokens(r.cache_namespace, d.id);
        if (absl::IsNotFound(fetched.status())) {
          return absl::NotFoundError(absl::StrCat("document ", i, ": unknown document id ", d.id));
        }
        if (!fetched.ok()) {
          return absl::UnavailableError(absl::StrCat(
              "document ", i, ": id ", d.id,
              " is not known here and the kvstore failed: ", fetched.status().message()));
        }
        tokens = std::move(*fetched);
        Remember(d.id, r.cache_namespace, tokens);
      }
      id = d.id;
    } else {
      if (d.text.empty())
        return absl::InvalidArgumentError(absl::StrCat("document ", i, " is empty"));
      if (!IsValidUtf8(d.text)) {
        return absl::InvalidArgumentError(absl::StrCat("document ", i, " is not valid UTF-8"));
      }
      tokens = Encode(template_.DocumentPieces(d.text));
      id = engine_->BlockId(tokens, r.cache_namespace);
      Remember(id, r.cache_namespace, tokens);
    }
    if (document_ids) document_ids->push_back(id);
    p.documents.push_back(std::move(tokens));
  }
  return p;
}

absl::StatusOr<GenerateResult> Generator::Generate(const GenerateRequest &r,
                                                   const TextCallback &on_delta) {
  GenerateResult result;
  auto prompt = BuildPrompt(r, &result.document_ids);
  if (!prompt.ok()) return prompt.status();
  TokenRunOptions o;
  o.mode = r.mode;
  o.max_tokens = r.max_tokens;
  o.sampling = r.sampling;
  o.ignore_eos = r.ignore_eos;
  o.stop_token_ids = template_.stop_token_ids;
  if (tokenizer_->eos_id() >= 0 && std::find(o.stop_token_ids.begin(), o.stop_token_ids.end(),
                                             tokenizer_->eos_id()) == o.stop_token_ids.end()) {
    o.stop_token_ids.push_back(tokenizer_->eos_id());
  }
  o.cache_namespace = r.cache_namespace;
  o.quality = r.quality;
  o.deadline = r.deadline;
  o.is_cancelled = r.is_cancelled;
  for (const std::string &s : r.stop) {
    if (s.empty()) return absl::InvalidArgumentError("stop strings must not be empty");
  }
  StopStringMatcher matcher(r.stop);
  bool stopped_by_string = false, cancelled = false;
  auto run = engine_->RunTokens(*prompt, o, [&](int32_t token) {
    bool stopped = false;
    std::string delta = matcher.Feed(tokenizer_->TokenBytes(token), &stopped);
    if (on_delta && !on_delta(delta, token)) {
      cancelled = true;
      return false;
    }
    if (stopped) stopped_by_string = true;
    return !stopped;
  });
  if (!run.ok()) return run.status();
  std::string tail = matcher.Flush();
  if (!tail.empty() && on_delta) on_delta(tail, -1);
  result.text = matcher.text();
  result.token_ids = run->token_ids;
  result.finish_reason = cancelled           ? FinishReason::kCancelled
                         : stopped_by_string ? FinishReason::kStop
                                             : run->finish_reason;
  result.usage = run->usage;
  result.timings = run->timings;
  return result;
}

absl::StatusOr<std::vector<PreparedDocument>> Generator::PrepareDocuments(
    const std::vector<std::string> &texts, const std::string &cache_namespace, absl::Time deadline,
    const std::function<bool()> &is_cancelled) {
  std::vector<std::vector<int32_t>> documents;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (is_cancelled && is_cancelled())
      return absl::CancelledError("the caller cancelled the call");
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("deadline exceeded");
    const std::string &text = texts[i];
    if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("document ", i, " is empty"));
    if (!IsValidUtf8(text)) {
      return absl::InvalidArgumentError(absl::StrCat("document ", i, " is not valid UTF-8"));
    }
    documents.push_back(Encode(template_.DocumentPieces(text)));
    Remember(engine_->BlockId(documents.back(), cache_namespace), cache_namespace,
             documents.back());
  }
  auto encoded = engine_->EncodeDocuments(documents, cache_namespace, deadline, is_cancelled);
  if (!encoded.ok()) return encoded.status();
  std::vector<PreparedDocument> out;
  for (const EncodedDocument &d : *encoded) out.push_back({d.id, d.num_tokens, d.computed});
  return out;
}

}  // namespace lazyrag
