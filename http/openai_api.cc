#include "http/openai_api.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/json.h"

namespace lazyrag::http {
namespace {

using json = nlohmann::json;
using lazyrag::v1::FinishReason;
using lazyrag::v1::GenerateResponse;

constexpr char kParamPayload[] = "type.lazyrag.dev/openai.param";

absl::Status Invalid(const std::string& param, const std::string& message) {
  absl::Status status = absl::InvalidArgumentError(message);
  if (!param.empty()) status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

std::string Dump(const json& j) {
  // Text from the model is whole UTF-8 characters; replace anything else rather than throw.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

const char* TypeName(const json& j) { return j.type_name(); }

absl::Status WrongType(const std::string& param, const char* expected, const json& got) {
  return Invalid(param, absl::StrCat("'", param, "' must be ", expected, ", not ", TypeName(got)));
}

// An optional member: null when absent or JSON null.
const json* Member(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::string> StringOf(const json& j, const std::string& param) {
  if (!j.is_string()) return WrongType(param, "a string", j);
  return j.get<std::string>();
}

absl::StatusOr<bool> BoolOf(const json& j, const std::string& param) {
  if (!j.is_boolean()) return WrongType(param, "a boolean", j);
  return j.get<bool>();
}

absl::StatusOr<double> NumberOf(const json& j, const std::string& param) {
  if (!j.is_number()) return WrongType(param, "a number", j);
  return j.get<double>();
}

// An integer in [lo, hi] (JSON numbers with a fraction are refused).
absl::StatusOr<int64_t> IntegerOf(const json& j, const std::string& param, int64_t lo, int64_t hi) {
  if (!j.is_number_integer()) return WrongType(param, "an integer", j);
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Invalid(param, absl::StrCat("'", param, "' must be between ", lo, " and ", hi));
  }
  const int64_t v = j.get<int64_t>();
  if (v < lo || v > hi) {
    return Invalid(param, absl::StrCat("'", param, "' must be between ", lo, " and ", hi));
  }
  return v;
}

// A message's content: a string, or a list of {"type": "text", "text": ...} parts.
absl::StatusOr<std::string> ContentOf(const json& message, const std::string& param) {
  const json* content = Member(message, "content");
  if (content == nullptr) return Invalid(param + ".content", "'" + param + ".content' is required");
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) return WrongType(param + ".content", "a string or a list", *content);
  std::string text;
  for (size_t i = 0; i < content->size(); ++i) {
    const std::string p = absl::StrCat(param, ".content[", i, "]");
    const json& part = (*content)[i];
    if (!part.is_object()) return WrongType(p, "an object", part);
    const json* type = Member(part, "type");
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
      return Invalid(p + ".type",
                     "'" + p + ".type' must be \"text\" (only text content is served)");
    }
    const json* t = Member(part, "text");
    if (t == nullptr) return Invalid(p + ".text", "'" + p + ".text' is required");
    absl::StatusOr<std::string> s = StringOf(*t, p + ".text");
    if (!s.ok()) return s.status();
    text += *s;
  }
  return text;
}

absl::Status ParseMessages(const json& body, lazyrag::v1::GenerateRequest* out) {
  const json* messages = Member(body, "messages");
  if (messages == nullptr) return Invalid("messages", "'messages' is required");
  if (!messages->is_array()) return WrongType("messages", "a list", *messages);
  if (messages->empty()) return Invalid("messages", "'messages' must not be empty");
  std::vector<std::string> system;
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string p = absl::StrCat("messages[", i, "]");
    const json& m = (*messages)[i];
    if (!m.is_object()) return WrongType(p, "an object", m);
    const json* role_json = Member(m, "role");
    if (role_json == nullptr) return Invalid(p + ".role", "'" + p + ".role' is required");
    absl::StatusOr<std::string> role = StringOf(*role_json, p + ".role");
    if (!role.ok()) return role.status();
    absl::StatusOr<std::string> content = ContentOf(m, p);
    if (!content.ok()) return content.status();
    const bool last = i + 1 == messages->size();
    if (*role == "system" || *role == "developer") {
      if (last) {
        return Invalid("messages", "the last message must have role \"user\" (the query)");
      }
      system.push_back(std::move(*content));
    } else if (*role == "user" && last) {
      out->set_query(std::move(*content));
    } else if (*role == "user" || *role == "assistant" || *role == "tool") {
      return Invalid(p + ".role",
                     absl::StrCat("'", p, ".role' is \"", *role,
                                  "\": multi-turn conversations are not served; send system "
                                  "messages and one final user message (the query)"));
    } else {
      return Invalid(p + ".role", absl::StrCat("'", p, ".role' \"", *role,
                                               "\" is not one of system, developer, user"));
    }
  }
  out->set_system_prompt(absl::StrJoin(system, "\n\n"));
  return absl::OkStatus();
}

absl::Status ParsePrompt(const json& body, lazyrag::v1::GenerateRequest* out) {
  const json* prompt = Member(body, "prompt");
  if (prompt == nullptr) return Invalid("prompt", "'prompt' is required");
  if (prompt->is_array()) {
    if (prompt->size() != 1) {
      return Invalid("prompt",
                     "'prompt' must be a string or a list of one string (one "
                     "completion per request)");
    }
    prompt = &(*prompt)[0];
  }
  absl::StatusOr<std::string> s = StringOf(*prompt, "prompt");
  if (!s.ok()) return s.status();
  out->set_query(std::move(*s));
  return absl::OkStatus();
}

absl::Status ParseDocuments(const json& body, lazyrag::v1::GenerateRequest* out) {
  const json* documents = Member(body, "documents");
  if (documents == nullptr) return absl::OkStatus();
  if (!documents->is_array()) return WrongType("documents", "a list", *documents);
  for (size_t i = 0; i < documents->size(); ++i) {
    const std::string p = absl::StrCat("documents[", i, "]");
    const json& d = (*documents)[i];
    lazyrag::v1::Document* doc = out->add_documents();
    if (d.is_string()) {
      doc->set_text(d.get<std::string>());
      continue;
    }
    if (!d.is_object()) return WrongType(p, "a string or an object", d);
    const json* id = Member(d, "id");
    const json* text = Member(d, "text");
    const json* title = Member(d, "title");
    if (id != nullptr) {
      if (text != nullptr || title != nullptr) {
        return Invalid(p, "'" + p + "' has an id and a text or title: give one of them");
      }
      absl::StatusOr<std::string> s = StringOf(*id, p + ".id");
      if (!s.ok()) return s.status();
      doc->set_id(std::move(*s));
      continue;
    }
    if (text == nullptr) return Invalid(p, "'" + p + "' needs a \"text\" or an \"id\"");
    absl::StatusOr<std::string> s = StringOf(*text, p + ".text");
    if (!s.ok()) return s.status();
    if (title != nullptr) {
      absl::StatusOr<std::string> t = StringOf(*title, p + ".title");
      if (!t.ok()) return t.status();
      *s = absl::StrCat(*t, "\n", *s);
    }
    doc->set_text(std::move(*s));
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const json& stop, lazyrag::v1::GenerateRequest* out) {
  if (stop.is_string()) {
    out->add_stop(stop.get<std::string>());
    return absl::OkStatus();
  }
  if (!stop.is_array()) return WrongType("stop", "a string or a list of strings", stop);
  for (size_t i = 0; i < stop.size(); ++i) {
    absl::StatusOr<std::string> s = StringOf(stop[i], absl::StrCat("stop[", i, "]"));
    if (!s.ok()) return s.status();
    out->add_stop(std::move(*s));
  }
  return absl::OkStatus();
}

// lazyrag.quality: GenerateRequest.quality (the worker checks the ranges).
absl::Status ParseQuality(const json& q, const std::string& p, lazyrag::v1::QualityOptions* out) {
  if (!q.is_object()) return WrongType(p, "an object", q);
  for (const auto& [key, value] : q.items()) {
    const std::string name = p + "." + key;
    if (value.is_null()) continue;
    if (key == "recompute_first_tokens" || key == "drop_first_tokens") {
      absl::StatusOr<int64_t> k = IntegerOf(value, name, 0, 1 << 20);
      if (!k.ok()) return k.status();
      (key == "recompute_first_tokens" ? out->mutable_recompute_first_tokens()
                                       : out->mutable_drop_first_tokens())
          ->set_value(static_cast<int32_t>(*k));
    } else if (key == "document_temperature" || key == "document_scale") {
      absl::StatusOr<double> v = NumberOf(value, name);
      if (!v.ok()) return v.status();
      (key == "document_temperature" ? out->mutable_document_temperature()
                                     : out->mutable_document_scale())
          ->set_value(static_cast<float>(*v));
    } else {
      return Invalid(name, absl::StrCat("'", name,
                                        "' is not a quality option (recompute_first_tokens, "
                                        "drop_first_tokens, document_temperature, "
                                        "document_scale)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseExtension(const json& ext, OpenAiRequest* out) {
  if (!ext.is_object()) return WrongType("lazyrag", "an object", ext);
  lazyrag::v1::GenerateRequest& g = out->generate;
  for (const auto& [key, value] : ext.items()) {
    const std::string p = "lazyrag." + key;
    if (value.is_null()) continue;
    if (key == "mode") {
      absl::StatusOr<std::string> mode = StringOf(value, p);
      if (!mode.ok()) return mode.status();
      lazyrag::v1::AttentionMode m;
      if (!lazyrag::v1::AttentionMode_Parse("ATTENTION_MODE_" + absl::AsciiStrToUpper(*mode), &m)) {
        return Invalid(p, absl::StrCat("'", p, "' \"", *mode,
                                       "\" is not one of lazy, materialize, prefix, full"));
      }
      g.set_mode(m);
    } else if (key == "cache_namespace") {
      absl::StatusOr<std::string> s = StringOf(value, p);
      if (!s.ok()) return s.status();
      g.set_cache_namespace(std::move(*s));
    } else if (key == "request_id") {
      absl::StatusOr<std::string> s = StringOf(value, p);
      if (!s.ok()) return s.status();
      g.set_request_id(std::move(*s));
    } else if (key == "top_k") {
      absl::StatusOr<int64_t> k = IntegerOf(value, p, 0, std::numeric_limits<int32_t>::max());
      if (!k.ok()) return k.status();
      g.mutable_sampling()->set_top_k(static_cast<int32_t>(*k));
    } else if (key == "ignore_eos") {
      absl::StatusOr<bool> b = BoolOf(value, p);
      if (!b.ok()) return b.status();
      g.set_ignore_eos(*b);
    } else if (key == "timeout_s") {
      absl::StatusOr<double> t = NumberOf(value, p);
      if (!t.ok()) return t.status();
      if (!(*t > 0) || *t > 1e6) return Invalid(p, "'" + p + "' must be in (0, 1000000] seconds");
      out->timeout = absl::Seconds(*t);
    } else if (key == "quality") {
      if (absl::Status st = ParseQuality(value, p, g.mutable_quality()); !st.ok()) return st;
    } else {
      return Invalid(p, absl::StrCat("'", p,
                                     "' is not a lazyrag option (mode, cache_namespace, "
                                     "top_k, ignore_eos, request_id, timeout_s, quality)"));
    }
  }
  return absl::OkStatus();
}

// Members OpenAI defines that lazyrag does not serve: refused when they ask for something.
absl::Status RefuseUnserved(const json& body) {
  if (const json* n = Member(body, "n")) {
    absl::StatusOr<int64_t> v = IntegerOf(*n, "n", 1, 1);
    if (!v.ok()) return Invalid("n", "'n' must be 1 (one choice per request)");
  }
  for (const char* key : {"logprobs", "echo"}) {
    if (const json* v = Member(body, key)) {
      if (!(v->is_boolean() && !v->get<bool>())) {
        return Invalid(key, absl::StrCat("'", key, "' is not served"));
      }
    }
  }
  for (const char* key : {"tools", "functions"}) {
    if (const json* v = Member(body, key)) {
      if (!(v->is_array() && v->empty())) {
        return Invalid(key, absl::StrCat("'", key, "' (tool calls) is not served"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParseBody(const json& body, OpenAiEndpoint endpoint, const OpenAiDefaults& defaults,
                       OpenAiRequest* out) {
  lazyrag::v1::GenerateRequest& g = out->generate;
  if (const json* model = Member(body, "model")) {
    absl::StatusOr<std::string> s = StringOf(*model, "model");
    if (!s.ok()) return s.status();
    out->model = std::move(*s);
  }
  absl::Status s = endpoint == OpenAiEndpoint::kChatCompletions ? ParseMessages(body, &g)
                                                                : ParsePrompt(body, &g);
  if (!s.ok()) return s;
  if (s = ParseDocuments(body, &g); !s.ok()) return s;
  if (s = RefuseUnserved(body); !s.ok()) return s;

  int64_t max_tokens = defaults.max_tokens;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {  // the second wins
    if (const json* v = Member(body, key)) {
      absl::StatusOr<int64_t> n = IntegerOf(*v, key, 1, std::numeric_limits<int32_t>::max());
      if (!n.ok()) return n.status();
      max_tokens = *n;
    }
  }
  g.set_max_tokens(static_cast<int32_t>(max_tokens));
  if (const json* v = Member(body, "temperature")) {
    absl::StatusOr<double> t = NumberOf(*v, "temperature");
    if (!t.ok()) return t.status();
    if (*t < 0 || *t > 1e6) return Invalid("temperature", "'temperature' must be >= 0");
    g.mutable_sampling()->set_temperature(static_cast<float>(*t));
  }
  if (const json* v = Member(body, "top_p")) {
    absl::StatusOr<double> p = NumberOf(*v, "top_p");
    if (!p.ok()) return p.status();
    if (!(*p > 0 && *p <= 1)) return Invalid("top_p", "'top_p' must be in (0, 1]");
    g.mutable_sampling()->set_top_p(static_cast<float>(*p));
  }
  if (const json* v = Member(body, "seed")) {
    if (!v->is_number_integer()) return WrongType("seed", "an integer", *v);
    g.mutable_sampling()->set_seed(
        v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>()));
  }
  if (const json* v = Member(body, "stop")) {
    if (s = ParseStop(*v, &g); !s.ok()) return s;
  }
  if (const json* v = Member(body, "stream")) {
    absl::StatusOr<bool> b = BoolOf(*v, "stream");
    if (!b.ok()) return b.status();
    out->stream = *b;
  }
  if (const json* v = Member(body, "stream_options")) {
    if (!v->is_object()) return WrongType("stream_options", "an object", *v);
    if (const json* u = Member(*v, "include_usage")) {
      absl::StatusOr<bool> b = BoolOf(*u, "stream_options.include_usage");
      if (!b.ok()) return b.status();
      out->include_usage = *b;
    }
  }
  if (const json* v = Member(body, "lazyrag")) {
    if (s = ParseExtension(*v, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

const char* ErrorTypeOf(int http_status) {
  switch (http_status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 409:
      return "conflict_error";
    case 429:
      return "rate_limit_error";
    case 499:
      return "cancelled_error";
    case 501:
      return "not_implemented_error";
    case 503:
      return "service_unavailable_error";
    case 504:
      return "timeout_error";
    default:
      return "server_error";
  }
}

const char* OpenAiFinishReason(FinishReason reason) {
  return reason == lazyrag::v1::FINISH_REASON_LENGTH ? "length" : "stop";
}

std::string LazyragFinishReason(FinishReason reason) {
  switch (reason) {
    case lazyrag::v1::FINISH_REASON_LENGTH:
      return "length";
    case lazyrag::v1::FINISH_REASON_STOP:
      return "stop";
    case lazyrag::v1::FINISH_REASON_EOS:
      return "eos";
    case lazyrag::v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    default:
      return "unspecified";
  }
}

json UsageJson(const lazyrag::v1::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_document_tokens()}}}};
}

// The "lazyrag" extension of a finished response.
json ExtensionJson(const GenerateResponse& last) {
  const lazyrag::v1::Usage& u = last.usage();
  const lazyrag::v1::Timings& t = last.timings();
  return {{"usage",
           {{"document_tokens", u.document_tokens()},
            {"cached_document_tokens", u.cached_document_tokens()},
            {"pool_document_tokens", u.pool_document_tokens()},
            {"host_document_tokens", u.host_document_tokens()},
            {"store_document_tokens", u.store_document_tokens()},
            {"computed_tokens", u.computed_tokens()},
            {"recomputed_document_tokens", u.recomputed_document_tokens()},
            // The quality settings that ran (the request's over the worker's defaults).
            {"quality",
             {{"recompute_first_tokens", u.recompute_first_tokens()},
              {"drop_first_tokens", u.drop_first_tokens()},
              {"document_temperature", u.document_temperature()},
              {"document_scale", u.document_scale()}}}}},
          {"document_ids",
           json(std::vector<std::string>(last.document_ids().begin(), last.document_ids().end()))},
          {"timings",
           {{"queue_ms", t.queue_ms()}, {"ttft_ms", t.ttft_ms()}, {"total_ms", t.total_ms()}}},
          {"finish_reason", LazyragFinishReason(last.finish_reason())},
          {"request_id", last.request_id()}};
}

std::string Event(const json& data) { return absl::StrCat("data: ", Dump(data), "\n\n"); }

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, absl::string_view body,
                                                 const OpenAiDefaults& defaults) {
  if (JsonNestingDepth(body) > defaults.max_json_depth) {
    return Invalid("", absl::StrCat("the request body nests deeper than ", defaults.max_json_depth,
                                    " levels"));
  }
  json parsed = json::parse(body.begin(), body.end(), nullptr,
                            /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return Invalid("", "the request body is not valid JSON (UTF-8, RFC 8259)");
  }
  if (!parsed.is_object()) {
    return Invalid(
        "", absl::StrCat("the request body must be a JSON object, not ", parsed.type_name()));
  }
  OpenAiRequest out;
  out.endpoint = endpoint;
  if (absl::Status s = ParseBody(parsed, endpoint, defaults, &out); !s.ok()) return s;
  return out;
}

std::string ParamOf(const absl::Status& status) {
  auto param = status.GetPayload(kParamPayload);
  return param.has_value() ? std::string(*param) : std::string();
}

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string ErrorJson(const absl::Status& status) {
  const std::string param = ParamOf(status);
  json error = {{"message", std::string(status.message())},
                {"type", ErrorTypeOf(HttpStatusOf(status.code()))},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))}};
  return Dump(json{{"error", std::move(error)}});
}

std::string ModelsJson(absl::string_view names) {
  json data = json::array();
  for (absl::string_view name : absl::StrSplit(names, ',', absl::SkipEmpty())) {
    data.push_back(
        {{"id", std::string(name)}, {"object", "model"}, {"created", 0}, {"owned_by", "lazyrag"}});
  }
  return Dump(json{{"object", "list"}, {"data", std::move(data)}});
}

OpenAiResponder::OpenAiResponder(const OpenAiRequest& request, std::string id, int64_t created,
                                 std::string model)
    : endpoint_(request.endpoint),
      stream_(request.stream),
      include_usage_(request.include_usage),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)) {}

std::string OpenAiResponder::Chunk(const std::string& text, const FinishReason* finish) const {
  json choice = {{"index", 0},
                 {"finish_reason", finish ? json(OpenAiFinishReason(*finish)) : json(nullptr)}};
  if (endpoint_ == OpenAiEndpoint::kChatCompletions) {
    json delta = json::object();
    if (!role_sent_) delta["role"] = "assistant";
    if (!text.empty() || !role_sent_) delta["content"] = text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  json chunk = {{"id", id_},
                {"object", endpoint_ == OpenAiEndpoint::kChatCompletions ? "chat.completion.chunk"
                                                                         : "text_completion"},
                {"created", created_},
                {"model", model_},
                {"choices", json::array({std::move(choice)})}};
  if (include_usage_) chunk["usage"] = nullptr;  // OpenAI: null on every chunk but the last
  return Event(chunk);
}

std::string OpenAiResponder::Add(const GenerateResponse& message) {
  const bool last = message.finish_reason() != lazyrag::v1::FINISH_REASON_UNSPECIFIED;
  if (last) {
    finished_ = true;
    last_ = message;
  }
  if (!stream_) {
    text_ += message.text();
    return "";
  }
  if (message.text().empty() && !last) return "";
  std::string events;
  if (last) {
    // The text of the last message (if any) in its own chunk, then the finish chunk.
    if (!message.text().empty()) {
      events = Chunk(message.text(), nullptr);
      role_sent_ = true;
    }
    const FinishReason reason = message.finish_reason();
    events += Chunk("", &reason);
  } else {
    events = Chunk(message.text(), nullptr);
  }
  role_sent_ = true;
  return events;
}

std::string OpenAiResponder::StreamEnd() const {
  std::string events;
  if (include_usage_) {
    json chunk = {{"id", id_},
                  {"object", endpoint_ == OpenAiEndpoint::kChatCompletions ? "chat.completion.chunk"
                                                                           : "text_completion"},
                  {"created", created_},
                  {"model", model_},
                  {"choices", json::array()},
                  {"usage", UsageJson(last_.usage())},
                  {"lazyrag", ExtensionJson(last_)}};
    events = Event(chunk);
  }
  return events + "data: [DONE]\n\n";
}

std::string OpenAiResponder::StreamError(const absl::Status& status) {
  return absl::StrCat("data: ", ErrorJson(status), "\n\ndata: [DONE]\n\n");
}

std::string OpenAiResponder::Body() const {
  json choice = {{"index", 0}, {"finish_reason", OpenAiFinishReason(last_.finish_reason())}};
  if (endpoint_ == OpenAiEndpoint::kChatCompletions) {
    choice["message"] = {{"role", "assistant"}, {"content", text_}};
  } else {
    choice["text"] = text_;
  }
  json body = {{"id", id_},
               {"object", endpoint_ == OpenAiEndpoint::kChatCompletions ? "chat.completion"
                                                                        : "text_completion"},
               {"created", created_},
               {"model", model_},
               {"choices", json::array({std::move(choice)})},
               {"usage", UsageJson(last_.usage())},
               {"lazyrag", ExtensionJson(last_)}};
  return Dump(body);
}

}  // namespace lazyrag::http
