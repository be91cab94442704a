// The HTTP server over a scripted InferenceBackend: statuses of backend errors before and after the
// stream starts, the authentication seam, client disconnects and deadlines reaching the backend
// call, bodies past the limit, unknown routes, draining.
#include "http/openai_http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace lazyrag::http {
namespace {

using json = nlohmann::json;
using lazyrag::v1::GenerateRequest;
using lazyrag::v1::GenerateResponse;

// Answers by the query: "error:CODE" fails with CODE before any message; "late-error" fails after
// one message; "block" waits until cancelled or past the deadline; else echoes the query in two
// messages.
class ScriptedBackend : public InferenceBackend {
 public:
  absl::Status Generate(const GenerateRequest& request, const BackendCall& call,
                        const MessageSink& on_message) override {
    {
      absl::MutexLock lock(&mu);
      last_request = request;
    }
    const std::string& q = request.query();
    if (q.rfind("error:", 0) == 0) {
      return absl::Status(static_cast<absl::StatusCode>(std::stoi(q.substr(6))), "scripted");
    }
    GenerateResponse m;
    m.set_text("echo: ");
    if (q == "late-error") {
      on_message(m);
      return absl::UnavailableError("worker died");
    }
    if (q == "block") {
      started->Notify();
      while (!call.cancellation->cancelled() && absl::Now() < call.deadline) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      const bool cancelled = call.cancellation->cancelled();
      ended_cancelled = cancelled;
      ended->Notify();
      return cancelled ? absl::CancelledError("cancelled")
                       : absl::DeadlineExceededError("deadline");
    }
    if (!on_message(m)) return absl::CancelledError("client");
    m.set_text(q);
    m.set_finish_reason(lazyrag::v1::FINISH_REASON_EOS);
    m.mutable_usage()->set_prompt_tokens(10);
    m.mutable_usage()->set_cached_document_tokens(4);
    m.add_document_ids("d1");
    on_message(m);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ModelName(absl::Time) override { return "scripted-model"; }
  absl::Status Health() override {
    return healthy ? absl::OkStatus() : absl::UnavailableError("no");
  }

  // Calls run on their own threads (ManyConnectionsAtOnce: many at once).
  GenerateRequest LastRequest() {
    absl::MutexLock lock(&mu);
    return last_request;
  }
  absl::Mutex mu;
  GenerateRequest last_request ABSL_GUARDED_BY(mu);
  // absl::Notification is not reusable: Reset() makes fresh ones (no call may be running).
  void Reset() {
    started = std::make_unique<absl::Notification>();
    ended = std::make_unique<absl::Notification>();
  }
  std::unique_ptr<absl::Notification> started = std::make_unique<absl::Notification>();
  std::unique_ptr<absl::Notification> ended = std::make_unique<absl::Notification>();
  std::atomic<bool> ended_cancelled{false};
  std::atomic<bool> healthy{true};
};

class TokenAuthenticator : public CallerAuthenticator {
 public:
  absl::StatusOr<Caller> Authenticate(std::optional<absl::string_view> token) override {
    if (!token.has_value()) return absl::UnauthenticatedError("missing bearer token");
    if (*token != "good") return absl::PermissionDeniedError("unknown token");
    return Caller{Identity{true, "tenant-a", Role::kClient}};
  }
};

class OpenAiHttpServerTest : public ::testing::Test {
 protected:
  void StartServer(CallerAuthenticator* auth = nullptr) {
    OpenAiHttpOptions options;
    options.listen = "127.0.0.1:0";
    options.max_body_bytes = 1 << 20;
    server_ = std::make_unique<OpenAiHttpServer>(&backend_, options, auth);
    ASSERT_TRUE(server_->Start().ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10, 0);
  }
  void SetUp() override { StartServer(); }

  httplib::Result Chat(const std::string& query, bool stream = false, json extra = json::object()) {
    json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", query}}}}};
    if (stream) body["stream"] = true;
    body.update(extra);
    return client_->Post("/v1/chat/completions", body.dump(), "application/json");
  }

  ScriptedBackend backend_;
  std::unique_ptr<OpenAiHttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(OpenAiHttpServerTest, NonStreamingAnswer) {
  httplib::Result r = Chat("hello");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json b = json::parse(r->body);
  EXPECT_EQ(b["choices"][0]["message"]["content"], "echo: hello");
  EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(b["lazyrag"]["document_ids"][0], "d1");
  EXPECT_EQ(b["model"], "m");
  // The response id is the request id the backend saw.
  EXPECT_EQ(backend_.LastRequest().request_id(), b["id"]);
}

TEST_F(OpenAiHttpServerTest, StreamingAnswer) {
  httplib::Result r = Chat("hi", true);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_NE(r->body.find(R"("content":"echo: ")"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find(R"("finish_reason":"stop")"), std::string::npos) << r->body;
  EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");
}

TEST_F(OpenAiHttpServerTest, BackendErrorsBeforeTheFirstMessageKeepTheirStatus) {
  const std::pair<absl::StatusCode, int> cases[] = {
      {absl::StatusCode::kInvalidArgument, 400},   {absl::StatusCode::kNotFound, 404},
      {absl::StatusCode::kResourceExhausted, 429}, {absl::StatusCode::kUnavailable, 503},
      {absl::StatusCode::kDeadlineExceeded, 504},  {absl::StatusCode::kInternal, 500}};
  for (bool stream : {false, true}) {
    for (const auto& [code, http] : cases) {
      httplib::Result r = Chat("error:" + std::to_string(static_cast<int>(code)), stream);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, http) << r->body;
      json e = json::parse(r->body);
      EXPECT_EQ(e["error"]["message"], "scripted");
      EXPECT_EQ(e["error"]["code"], absl::AsciiStrToLower(absl::StatusCodeToString(code)));
    }
  }
}

TEST_F(OpenAiHttpServerTest, ErrorAfterTheStreamStarted) {
  httplib::Result r = Chat("late-error", true);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->body.find(R"("code":"unavailable")"), std::string::npos) << r->body;
  // Non-streaming: nothing was sent yet, so the status is the error's.
  r = Chat("late-error", false);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
}

TEST_F(OpenAiHttpServerTest, BadRequestsGet400WithParam) {
  httplib::Result r = client_->Post("/v1/chat/completions", "{not json", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "invalid_request_error");
  r = Chat("q", false, {{"max_tokens", "lots"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "max_tokens");
  r = client_->Post("/v1/chat/completions", std::string(2 << 20, ' '), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  r = client_->Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "not_found_error");
}

TEST_F(OpenAiHttpServerTest, ModelsAndHealth) {
  httplib::Result r = client_->Get("/v1/models");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["data"][0]["id"], "scripted-model");
  r = client_->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  backend_.healthy = false;
  r = client_->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  // Without "model" the served model's name is echoed.
  r = client_->Post("/v1/completions", R"({"prompt": "x"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["model"], "scripted-model");
}

TEST_F(OpenAiHttpServerTest, DeadlineEndsTheCallWith504) {
  const absl::Time start = absl::Now();
  httplib::Result r = Chat("block", false, {{"lazyrag", {{"timeout_s", 0.3}}}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(OpenAiHttpServerTest, ClientDisconnectCancelsTheBackendCall) {
  for (bool stream : {false, true}) {
    backend_.Reset();
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(0,
                       300000);  // gives up (closes the connection) after 0.3 s
    json body = {{"messages", {{{"role", "user"}, {"content", "block"}}}}, {"stream", stream}};
    httplib::Result r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_FALSE(r);  // timed out
    c.stop();
    ASSERT_TRUE(backend_.ended->WaitForNotificationWithTimeout(absl::Seconds(5)))
        << "the backend call was not cancelled (stream=" << stream << ")";
    EXPECT_TRUE(backend_.ended_cancelled);
  }
}

TEST_F(OpenAiHttpServerTest, AuthenticationSeam) {
  TokenAuthenticator auth;
  server_.reset();
  StartServer(&auth);
  httplib::Result r = Chat("hello");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
  client_->set_bearer_token_auth("bad");
  r = Chat("hello");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  client_->set_bearer_token_auth("good");
  r = Chat("hello");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  server_.reset();
}

// httplib listens with a backlog of 5; the server raises it, so that a burst of connections is
// served instead of dropped.
TEST_F(OpenAiHttpServerTest, ManyConnectionsAtOnce) {
  constexpr int kClients = 128;
  std::atomic<int> ok{0};
  std::atomic<int> waiting{kClients};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", server_->port());
      c.set_read_timeout(20, 0);
      json body = {{"messages", {{{"role", "user"}, {"content", "c" + std::to_string(i)}}}},
                   {"stream", i % 2 == 0}};
      waiting.fetch_sub(1);
      while (waiting.load() > 0) std::this_thread::yield();
      httplib::Result r = c.Post("/v1/chat/completions", body.dump(), "application/json");
      if (r && r->status == 200 && r->body.find("c" + std::to_string(i)) != std::string::npos) {
        ok.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients);
}

TEST_F(OpenAiHttpServerTest, ShutdownCancelsRunningCallsAfterTheDeadline) {
  std::thread t([&] { Chat("block"); });
  ASSERT_TRUE(backend_.started->WaitForNotificationWithTimeout(absl::Seconds(5)));
  server_->Shutdown(absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(backend_.ended->HasBeenNotified());
  EXPECT_TRUE(backend_.ended_cancelled);
  t.join();
}

}  // namespace
}  // namespace lazyrag::http
