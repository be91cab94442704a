// The OpenAI-compatible request and response shapes, translated to and from the Inference API
// (proto/lazyrag/v1/inference.proto). Pure functions and one accumulator: no I/O, no threads;
// unit-tested alone (openai_api_test.cc). The HTTP server (openai_http_server.h) is the only
// caller in the product.
//
// Requests (JSON bodies of POST /v1/chat/completions and /v1/completions):
//   model           string, optional; echoed in responses (workers serve one model).
//   messages        chat: required; "system"/"developer" messages (joined with a blank line)
//                   become the system prompt; the last message must be "user" and is the query;
//                   other turns (multi-turn chats) are INVALID_ARGUMENT. content: a string or a
//                   list of {"type": "text", "text": ...} parts.
//   prompt          completions: required, a string (or a list of exactly one string).
//   documents       optional list, each its own attention block, in prompt order: a string,
//                   {"text"}, {"title", "text"} (title and text joined by a newline) or {"id"}
//                   (a document the server has seen before).
//   max_completion_tokens, max_tokens
//                   integer >= 1 (the first wins); default OpenAiDefaults::max_tokens. The
//                   server caps it (4096, the model's context).
//   temperature     number >= 0; default 0 (greedy), not OpenAI's 1.
//   top_p           number in (0, 1]; seed: integer; stop: a string or a list of strings.
//   stream, stream_options.include_usage
//                   booleans.
//   n               1 if present; logprobs, echo, tools, functions: absent, null, false or [].
//   lazyrag         extension object: mode ("lazy" | "materialize" | "prefix" | "full"),
//                   cache_namespace, top_k, ignore_eos, request_id, timeout_s (> 0), quality
//                   (recompute_first_tokens, drop_first_tokens, document_temperature,
//                   document_scale: GenerateRequest.quality; the worker checks the ranges).
//   Other members are ignored. Each violation is INVALID_ARGUMENT naming the member (ParamOf).
// Responses carry OpenAI's fields, usage.prompt_tokens_details.cached_tokens (document tokens
// not computed for this request) and an extension object "lazyrag" with the per-tier token
// counts and the quality settings that ran (usage.quality), the document ids (in request
// order), the server timings and the exact finish reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "lazyrag/v1/inference.pb.h"

namespace lazyrag::http {

enum class OpenAiEndpoint { kChatCompletions, kCompletions };

struct OpenAiDefaults {
  // max_tokens of a request that sets none. Default 256.
  int max_tokens = 256;
  // Nesting depth of the JSON body beyond which it is refused (before parsing).
  // Default 64.
  int max_json_depth = 64;
};

// A parsed request body.
struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kChatCompletions;
  lazyrag::v1::GenerateRequest generate;
  std::string model;  // as sent; "" when absent
  bool stream = false;
  bool include_usage = false;             // stream_options.include_usage
  std::optional<absl::Duration> timeout;  // lazyrag.timeout_s
};

// INVALID_ARGUMENT (with ParamOf set) for every malformed body; never throws.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, absl::string_view body,
                                                 const OpenAiDefaults& defaults = {});

// The request member an INVALID_ARGUMENT from ParseOpenAiRequest is about
// ("messages[1].role"), or "" when none.
std::string ParamOf(const absl::Status& status);

// The HTTP status a status code answers with: INVALID_ARGUMENT,
// FAILED_PRECONDITION, OUT_OF_RANGE 400; UNAUTHENTICATED 401; PERMISSION_DENIED
// 403; NOT_FOUND 404; ALREADY_EXISTS, ABORTED 409; RESOURCE_EXHAUSTED 429;
// CANCELLED 499; UNIMPLEMENTED 501; UNAVAILABLE 503; DEADLINE_EXCEEDED 504;
// anything else 500.
int HttpStatusOf(absl::StatusCode code);

// {"error": {"message", "type", "param", "code"}}: type after the HTTP status
// ("invalid_request_error", "authentication_error", "permission_error",
// "not_found_error", "rate_limit_error", "server_error", ...), code the gRPC
// code's name in lower case
// ("resource_exhausted"), param ParamOf(status) or null. REQUIRES:
// !status.ok().
std::string ErrorJson(const absl::Status& status);

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", ...}]},
// one entry per name of the comma-separated `names`.
std::string ModelsJson(absl::string_view names);

// The answer to one request: feed it every message of the Generate stream in
// order. For a streaming request, StreamEvents() returns the Server-Sent Events
// ("data: {...}\n\n") each message turns into and StreamEnd() the closing ones;
// otherwise Body() is the whole response. Not thread-safe.
class OpenAiResponder {
 public:
  // `id`: the response id ("chatcmpl-..."); `created`: Unix seconds; `model`:
  // the name echoed.
  OpenAiResponder(const OpenAiRequest& request, std::string id, int64_t created, std::string model);

  // Records `message` and returns its events when streaming ("" when it carries
  // no text and does not finish the stream).
  std::string Add(const lazyrag::v1::GenerateResponse& message);
  // Streaming, after the last message: the usage chunk (when include_usage) and
  // "[DONE]".
  std::string StreamEnd() const;
  // Streaming, when the call failed after the stream started: an error event
  // and "[DONE]".
  static std::string StreamError(const absl::Status& status);
  // Non-streaming: the response object. REQUIRES: the last message was added.
  std::string Body() const;
  bool finished() const { return finished_; }

 private:
  std::string Chunk(const std::string& text, const lazyrag::v1::FinishReason* finish) const;

  const OpenAiEndpoint endpoint_;
  const bool stream_;
  const bool include_usage_;
  const std::string id_;
  const int64_t created_;
  const std::string model_;
  std::string text_;  // non-streaming: the whole answer
  bool role_sent_ = false;
  bool finished_ = false;
  lazyrag::v1::GenerateResponse last_;  // the message with finish_reason
};

}  // namespace lazyrag::http
