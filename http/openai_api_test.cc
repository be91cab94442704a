// The OpenAI request/response translation alone: every malformed body is a clear INVALID_ARGUMENT
// naming its member, never a crash; responses carry OpenAI's fields and the lazyrag extension.
#include "http/openai_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace lazyrag::http {
namespace {

using json = nlohmann::json;
using lazyrag::v1::GenerateResponse;

constexpr auto kChat = OpenAiEndpoint::kChatCompletions;

absl::StatusOr<OpenAiRequest> Chat(const json& body) {
  return ParseOpenAiRequest(kChat, body.dump());
}

json Minimal() { return {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "Q?"}}}}}; }

void ExpectInvalid(const absl::StatusOr<OpenAiRequest>& r, const std::string& param,
                   const std::string& in_message) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(ParamOf(r.status()), param) << r.status();
  EXPECT_NE(r.status().message().find(in_message), std::string::npos) << r.status();
}

TEST(OpenAiParse, MinimalChat) {
  absl::StatusOr<OpenAiRequest> r = Chat(Minimal());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.query(), "Q?");
  EXPECT_EQ(r->generate.system_prompt(), "");
  EXPECT_EQ(r->generate.max_tokens(), 256);
  EXPECT_EQ(r->generate.sampling().temperature(), 0);
  EXPECT_EQ(r->model, "m");
  EXPECT_FALSE(r->stream);
}

TEST(OpenAiParse, EveryField) {
  json body = {
      {"model", "smol"},
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}},
        {{"role", "developer"}, {"content", {{{"type", "text"}, {"text", "Cite."}}}}},
        {{"role", "user"},
         {"content",
          {{{"type", "text"}, {"text", "Who? "}}, {{"type", "text"}, {"text", "When?"}}}}}}},
      {"documents",
       {"plain",
        {{"text", "t1"}},
        {{"title", "T"}, {"text", "t2"}},
        {{"id", std::string(64, 'a')}}}},
      {"max_tokens", 9},
      {"max_completion_tokens", 12},
      {"temperature", 0.5},
      {"top_p", 0.9},
      {"seed", 42},
      {"stop", {"\n\n", "END"}},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      {"n", 1},
      {"user", "ignored"},
      {"lazyrag",
       {{"mode", "materialize"},
        {"cache_namespace", "tenant-a"},
        {"top_k", 5},
        {"ignore_eos", true},
        {"request_id", "r1"},
        {"timeout_s", 2.5}}}};
  absl::StatusOr<OpenAiRequest> r = Chat(body);
  ASSERT_TRUE(r.ok()) << r.status();
  const lazyrag::v1::GenerateRequest& g = r->generate;
  EXPECT_EQ(g.system_prompt(), "Be brief.\n\nCite.");
  EXPECT_EQ(g.query(), "Who? When?");
  ASSERT_EQ(g.documents_size(), 4);
  EXPECT_EQ(g.documents(0).text(), "plain");
  EXPECT_EQ(g.documents(1).text(), "t1");
  EXPECT_EQ(g.documents(2).text(), "T\nt2");
  EXPECT_EQ(g.documents(3).id(), std::string(64, 'a'));
  EXPECT_EQ(g.max_tokens(), 12);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9);
  EXPECT_EQ(g.sampling().seed(), 42u);
  EXPECT_EQ(g.sampling().top_k(), 5);
  ASSERT_EQ(g.stop_size(), 2);
  EXPECT_EQ(g.stop(1), "END");
  EXPECT_EQ(g.mode(), lazyrag::v1::ATTENTION_MODE_MATERIALIZE);
  EXPECT_EQ(g.cache_namespace(), "tenant-a");
  EXPECT_TRUE(g.ignore_eos());
  EXPECT_EQ(g.request_id(), "r1");
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  ASSERT_TRUE(r->timeout.has_value());
  EXPECT_EQ(*r->timeout, absl::Milliseconds(2500));
}

TEST(OpenAiParse, Completions) {
  absl::StatusOr<OpenAiRequest> r =
      ParseOpenAiRequest(OpenAiEndpoint::kCompletions, R"({"prompt": ["Why?"], "stop": "x"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.query(), "Why?");
  EXPECT_EQ(r->generate.stop(0), "x");
  ExpectInvalid(ParseOpenAiRequest(OpenAiEndpoint::kCompletions, R"({"prompt": ["a", "b"]})"),
                "prompt", "one string");
  ExpectInvalid(ParseOpenAiRequest(OpenAiEndpoint::kCompletions, R"({"messages": []})"), "prompt",
                "required");
}

TEST(OpenAiParse, BadJson) {
  for (const char* body : {"", "{", "not json", R"({"a":1,})", "[1, 2]", "\"x\"", "null",
                           "{\"messages\": \"\xff\xfe\"}"}) {
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(kChat, body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  }
}

TEST(OpenAiParse, DeepNestingIsRefusedBeforeParsing) {
  std::string body = "{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(kChat, body);
  ExpectInvalid(r, "", "nests deeper");
  // Brackets inside strings do not count.
  json ok = Minimal();
  ok["messages"][0]["content"] = std::string(1000, '[');
  EXPECT_TRUE(Chat(ok).ok());
}

TEST(OpenAiParse, MessagesErrors) {
  ExpectInvalid(Chat({{"model", "m"}}), "messages", "required");
  ExpectInvalid(Chat({{"messages", "hi"}}), "messages", "must be a list, not string");
  ExpectInvalid(Chat({{"messages", json::array()}}), "messages", "must not be empty");
  ExpectInvalid(Chat({{"messages", {1}}}), "messages[0]", "must be an object");
  ExpectInvalid(Chat({{"messages", {{{"content", "x"}}}}}), "messages[0].role", "required");
  ExpectInvalid(Chat({{"messages", {{{"role", 3}, {"content", "x"}}}}}), "messages[0].role",
                "must be a string, not number");
  ExpectInvalid(Chat({{"messages", {{{"role", "user"}}}}}), "messages[0].content", "required");
  ExpectInvalid(Chat({{"messages", {{{"role", "user"}, {"content", 5}}}}}), "messages[0].content",
                "a string or a list");
  ExpectInvalid(Chat({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}),
                "messages[0].content[0].type", "only text");
  ExpectInvalid(Chat({{"messages", {{{"role", "system"}, {"content", "s"}}}}}), "messages",
                "last message must have role \"user\"");
  ExpectInvalid(Chat({{"messages",
                       {{{"role", "user"}, {"content", "a"}},
                        {{"role", "assistant"}, {"content", "b"}},
                        {{"role", "user"}, {"content", "c"}}}}}),
                "messages[0].role", "multi-turn");
  ExpectInvalid(Chat({{"messages", {{{"role", "wizard"}, {"content", "a"}}}}}), "messages[0].role",
                "not one of");
}

TEST(OpenAiParse, FieldTypesAndRanges) {
  auto with = [](const char* key, json value) {
    json b = Minimal();
    b[key] = std::move(value);
    return Chat(b);
  };
  ExpectInvalid(with("model", 7), "model", "must be a string");
  ExpectInvalid(with("max_tokens", "10"), "max_tokens", "must be an integer, not string");
  ExpectInvalid(with("max_tokens", 1.5), "max_tokens", "must be an integer");
  ExpectInvalid(with("max_tokens", 0), "max_tokens", "between 1 and 2147483647");
  ExpectInvalid(with("max_tokens", -3), "max_tokens", "between 1 and");
  ExpectInvalid(with("max_tokens", 1e12), "max_tokens", "must be an integer");
  ExpectInvalid(with("max_tokens", 1000000000000LL), "max_tokens", "between 1 and");
  ExpectInvalid(with("max_completion_tokens", 18446744073709551615ULL), "max_completion_tokens",
                "between 1 and");
  ExpectInvalid(with("temperature", "hot"), "temperature", "must be a number");
  ExpectInvalid(with("temperature", -0.1), "temperature", ">= 0");
  ExpectInvalid(with("top_p", 0), "top_p", "(0, 1]");
  ExpectInvalid(with("top_p", 1.5), "top_p", "(0, 1]");
  ExpectInvalid(with("seed", 1.5), "seed", "an integer");
  ExpectInvalid(with("stop", 3), "stop", "a string or a list");
  ExpectInvalid(with("stop", {"a", 2}), "stop[1]", "must be a string");
  ExpectInvalid(with("stream", "yes"), "stream", "a boolean");
  ExpectInvalid(with("stream_options", 1), "stream_options", "an object");
  ExpectInvalid(with("stream_options", {{"include_usage", 1}}), "stream_options.include_usage",
                "a boolean");
  ExpectInvalid(with("n", 2), "n", "must be 1");
  ExpectInvalid(with("logprobs", true), "logprobs", "not served");
  ExpectInvalid(with("tools", {{{"type", "function"}}}), "tools", "not served");
  EXPECT_TRUE(with("logprobs", false).ok());
  EXPECT_TRUE(with("tools", json::array()).ok());
  EXPECT_TRUE(with("seed", -1).ok());
  EXPECT_TRUE(with("max_tokens", nullptr).ok());  // null = absent
}

TEST(OpenAiParse, DocumentsAndExtensionErrors) {
  auto with = [](const char* key, json value) {
    json b = Minimal();
    b[key] = std::move(value);
    return Chat(b);
  };
  ExpectInvalid(with("documents", "text"), "documents", "must be a list");
  ExpectInvalid(with("documents", {5}), "documents[0]", "a string or an object");
  ExpectInvalid(with("documents", {{{"title", "t"}}}), "documents[0]",
                "needs a \"text\" or an \"id\"");
  ExpectInvalid(with("documents", {{{"text", 1}}}), "documents[0].text", "must be a string");
  ExpectInvalid(with("documents", {{{"id", "x"}, {"text", "y"}}}), "documents[0]", "give one");
  ExpectInvalid(with("documents", {{{"text", "x"}, {"title", 2}}}), "documents[0].title",
                "must be a string");
  ExpectInvalid(with("lazyrag", "lazy"), "lazyrag", "an object");
  ExpectInvalid(with("lazyrag", {{"mode", "eager"}}), "lazyrag.mode", "not one of lazy");
  ExpectInvalid(with("lazyrag", {{"mode", 1}}), "lazyrag.mode", "must be a string");
  ExpectInvalid(with("lazyrag", {{"top_k", -1}}), "lazyrag.top_k", "between 0 and");
  ExpectInvalid(with("lazyrag", {{"timeout_s", 0}}), "lazyrag.timeout_s", "(0, 1000000]");
  ExpectInvalid(with("lazyrag", {{"colour", "red"}}), "lazyrag.colour", "not a lazyrag option");
  ExpectInvalid(with("lazyrag", {{"ignore_eos", "y"}}), "lazyrag.ignore_eos", "a boolean");
  absl::StatusOr<OpenAiRequest> full = with("lazyrag", {{"mode", "FULL"}});
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->generate.mode(), lazyrag::v1::ATTENTION_MODE_FULL);
  // The quality options (issue 25) pass to GenerateRequest.quality; unset ones stay unset.
  absl::StatusOr<OpenAiRequest> q =
      with("lazyrag", {{"quality", {{"recompute_first_tokens", 16}, {"document_scale", 1.5}}}});
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->generate.quality().recompute_first_tokens().value(), 16);
  EXPECT_FLOAT_EQ(q->generate.quality().document_scale().value(), 1.5f);
  EXPECT_FALSE(q->generate.quality().has_document_temperature());
  ExpectInvalid(with("lazyrag", {{"quality", 3}}), "lazyrag.quality", "an object");
  ExpectInvalid(with("lazyrag", {{"quality", {{"recompute_first_tokens", -1}}}}),
                "lazyrag.quality.recompute_first_tokens", "between 0 and");
  ExpectInvalid(with("lazyrag", {{"quality", {{"k", 1}}}}), "lazyrag.quality.k",
                "not a quality option");
  absl::StatusOr<OpenAiRequest> d = with("lazyrag", {{"quality", {{"drop_first_tokens", 2}}}});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->generate.quality().drop_first_tokens().value(), 2);
  EXPECT_FALSE(d->generate.quality().has_recompute_first_tokens());
}

TEST(OpenAiErrors, HttpStatusAndShape) {
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kDataLoss), 500);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kUnimplemented), 501);

  absl::StatusOr<OpenAiRequest> bad = Chat({{"messages", 1}});
  json e = json::parse(ErrorJson(bad.status()));
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["code"], "invalid_argument");
  EXPECT_EQ(e["error"]["param"], "messages");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("must be a list"), std::string::npos);
  json n = json::parse(ErrorJson(absl::NotFoundError("document abc")));
  EXPECT_EQ(n["error"]["type"], "not_found_error");
  EXPECT_TRUE(n["error"]["param"].is_null());
  EXPECT_EQ(json::parse(ErrorJson(absl::ResourceExhaustedError("full")))["error"]["code"],
            "resource_exhausted");
}

GenerateResponse Message(const std::string& text, lazyrag::v1::FinishReason finish =
                                                      lazyrag::v1::FINISH_REASON_UNSPECIFIED) {
  GenerateResponse m;
  m.set_request_id("r");
  m.set_text(text);
  m.set_finish_reason(finish);
  if (finish != lazyrag::v1::FINISH_REASON_UNSPECIFIED) {
    lazyrag::v1::Usage* u = m.mutable_usage();
    u->set_prompt_tokens(100);
    u->set_completion_tokens(3);
    u->set_document_tokens(80);
    u->set_cached_document_tokens(60);
    u->set_pool_document_tokens(40);
    u->set_host_document_tokens(5);
    u->set_store_document_tokens(15);
    u->set_computed_tokens(40);
    u->set_recomputed_document_tokens(12);
    u->set_recompute_first_tokens(4);
    u->set_document_temperature(1.0f);
    u->set_document_scale(1.0f);
    m.mutable_timings()->set_ttft_ms(12.5);
    m.add_document_ids("id1");
    m.add_document_ids("id2");
  }
  return m;
}

TEST(OpenAiResponder, NonStreamingBody) {
  OpenAiRequest req = *Chat(Minimal());
  OpenAiResponder r(req, "chatcmpl-1", 1700000000, "smol");
  EXPECT_EQ(r.Add(Message("Hel")), "");
  EXPECT_EQ(r.Add(Message("lo", lazyrag::v1::FINISH_REASON_EOS)), "");
  ASSERT_TRUE(r.finished());
  json b = json::parse(r.Body());
  EXPECT_EQ(b["id"], "chatcmpl-1");
  EXPECT_EQ(b["object"], "chat.completion");
  EXPECT_EQ(b["model"], "smol");
  EXPECT_EQ(b["created"], 1700000000);
  EXPECT_EQ(b["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(b["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(b["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(b["usage"]["prompt_tokens"], 100);
  EXPECT_EQ(b["usage"]["completion_tokens"], 3);
  EXPECT_EQ(b["usage"]["total_tokens"], 103);
  EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], 60);
  EXPECT_EQ(b["lazyrag"]["usage"]["pool_document_tokens"], 40);
  EXPECT_EQ(b["lazyrag"]["usage"]["host_document_tokens"], 5);
  EXPECT_EQ(b["lazyrag"]["usage"]["store_document_tokens"], 15);
  EXPECT_EQ(b["lazyrag"]["usage"]["computed_tokens"], 40);
  EXPECT_EQ(b["lazyrag"]["usage"]["recomputed_document_tokens"], 12);
  EXPECT_EQ(b["lazyrag"]["usage"]["quality"]["recompute_first_tokens"], 4);
  EXPECT_EQ(b["lazyrag"]["usage"]["quality"]["drop_first_tokens"], 0);
  EXPECT_EQ(b["lazyrag"]["usage"]["quality"]["document_temperature"], 1.0);
  EXPECT_EQ(b["lazyrag"]["document_ids"], json({"id1", "id2"}));
  EXPECT_EQ(b["lazyrag"]["finish_reason"], "eos");
  EXPECT_EQ(b["lazyrag"]["timings"]["ttft_ms"], 12.5);
}

// Splits "data: X\n\n" events into their JSON payloads ("[DONE]" kept as a string).
std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  size_t at = 0;
  while (at < sse.size()) {
    EXPECT_EQ(sse.compare(at, 6, "data: "), 0) << sse.substr(at);
    size_t end = sse.find("\n\n", at);
    if (end == std::string::npos) break;
    std::string payload = sse.substr(at + 6, end - at - 6);
    out.push_back(payload == "[DONE]" ? json("[DONE]") : json::parse(payload));
    at = end + 2;
  }
  return out;
}

TEST(OpenAiResponder, StreamingChunks) {
  json body = Minimal();
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  OpenAiRequest req = *Chat(body);
  OpenAiResponder r(req, "chatcmpl-2", 1, "smol");
  std::string sse = r.Add(Message(""));  // held-back bytes: nothing to send
  EXPECT_EQ(sse, "");
  sse += r.Add(Message("Hi"));
  sse += r.Add(Message(" there", lazyrag::v1::FINISH_REASON_LENGTH));
  sse += r.StreamEnd();
  std::vector<json> e = Events(sse);
  ASSERT_EQ(e.size(), 5u) << sse;
  EXPECT_EQ(e[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(e[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(e[0]["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(e[0]["usage"].is_null());
  EXPECT_FALSE(e[1]["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(e[1]["choices"][0]["delta"]["content"], " there");
  EXPECT_TRUE(e[1]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(e[2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(e[2]["choices"][0]["delta"], json::object());
  EXPECT_TRUE(e[3]["choices"].empty());
  EXPECT_EQ(e[3]["usage"]["prompt_tokens_details"]["cached_tokens"], 60);
  EXPECT_EQ(e[3]["lazyrag"]["document_ids"][1], "id2");
  EXPECT_EQ(e[4], "[DONE]");

  std::vector<json> err = Events(OpenAiResponder::StreamError(absl::UnavailableError("gone")));
  ASSERT_EQ(err.size(), 2u);
  EXPECT_EQ(err[0]["error"]["code"], "unavailable");
}

TEST(OpenAiResponder, CompletionsShapeAndInvalidUtf8) {
  OpenAiRequest req = *ParseOpenAiRequest(OpenAiEndpoint::kCompletions, R"({"prompt": "p"})");
  OpenAiResponder r(req, "cmpl-1", 1, "m");
  r.Add(Message("bad \xff byte", lazyrag::v1::FINISH_REASON_STOP));
  json b = json::parse(r.Body());  // replaced, still valid JSON
  EXPECT_EQ(b["object"], "text_completion");
  EXPECT_NE(b["choices"][0]["text"].get<std::string>().find("bad"), std::string::npos);
}

TEST(OpenAiModels, List) {
  json m = json::parse(ModelsJson("a,b"));
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 2u);
  EXPECT_EQ(m["data"][1]["id"], "b");
  EXPECT_EQ(m["data"][0]["object"], "model");
}

}  // namespace
}  // namespace lazyrag::http
