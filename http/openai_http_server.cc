#include "http/openai_http_server.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace lazyrag::http {
namespace {

using lazyrag::v1::GenerateResponse;

// The socket of the connection `req` came on, found among the process's descriptors by its
// addresses (httplib does not hand it to handlers); -1 when not found. A few hundred syscalls:
// called only once a request has waited disconnect_poll, never on the fast path.
int ConnectionSocket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(dir)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof(peer), local_len = sizeof(local);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) {
      continue;
    }
    char host[NI_MAXHOST];
    char port[NI_MAXSERV];
    char local_port[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&peer), peer_len, host, sizeof(host), port,
                    sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0 ||
        getnameinfo(reinterpret_cast<sockaddr*>(&local), local_len, nullptr, 0, local_port,
                    sizeof(local_port), NI_NUMERICSERV) != 0) {
      continue;
    }
    if (req.remote_addr == host && std::to_string(req.remote_port) == port &&
        std::to_string(req.local_port) == local_port) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

// httplib's server with its listening socket exposed: the library listens with a backlog of 5,
// which drops connections when a few dozen clients connect at once; Start() raises it.
class ListeningServer : public httplib::Server {
 public:
  int listening_socket() const { return svr_sock_; }
};

// Whether the peer of `fd` has closed the connection (or it failed). A client that pipelines its
// next request leaves bytes to read: that is not a close.
bool PeerClosed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char c;
    return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

std::string RandomHex(int chars) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(chars, '0');
  for (char& c : out) c = kHex[rng() & 15];
  return out;
}

void SendError(httplib::Response& res, const absl::Status& status) {
  res.status = HttpStatusOf(status.code());
  res.set_content(ErrorJson(status), "application/json");
}

std::optional<std::string> BearerToken(const httplib::Request& req) {
  if (!req.has_header("Authorization")) return std::nullopt;
  const std::string value = req.get_header_value("Authorization");
  if (value.size() < 7 ||
      !absl::EqualsIgnoreCase(absl::string_view(value).substr(0, 7), "bearer ")) {
    return std::nullopt;
  }
  return value.substr(7);
}

// One backend call running on its own thread, and what it has produced so far. Shared by the
// handler thread (which writes to the client) and the call's thread.
struct RunningCall {
  absl::Mutex mu;
  std::deque<GenerateResponse> messages ABSL_GUARDED_BY(mu);
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  Cancellation cancellation;

  // What the call has produced since the last Take, and whether it has ended (and how).
  struct Progress {
    std::deque<GenerateResponse> messages;
    bool done = false;
    absl::Status status;
  };
  Progress Take() {
    absl::MutexLock lock(&mu);
    Progress p;
    p.messages.swap(messages);
    p.done = done;
    p.status = status;
    return p;
  }
};

}  // namespace

class OpenAiHttpServer::Impl {
 public:
  Impl(InferenceBackend* backend, const OpenAiHttpOptions& options,
       CallerAuthenticator* authenticator)
      : backend_(backend), options_(options), authenticator_(authenticator) {}

  ListeningServer& server() { return server_; }

  void Register() {
    server_.new_task_queue = [threads = options_.threads] {
      return new httplib::ThreadPool(static_cast<size_t>(std::max(1, threads)));
    };
    server_.set_payload_max_length(options_.max_body_bytes);
    server_.set_tcp_nodelay(true);
    server_.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   Completion(OpenAiEndpoint::kChatCompletions, req, res);
                 });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Completion(OpenAiEndpoint::kCompletions, req, res);
    });
    server_.Get("/v1/models",
                [this](const httplib::Request& req, httplib::Response& res) { Models(req, res); });
    server_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      absl::Status s = Draining() ? absl::UnavailableError("shutting down") : backend_->Health();
      if (!s.ok()) return SendError(res, s);
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    server_.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
          SendError(res, absl::InternalError("internal error while serving the request"));
        });
    // Unknown paths and methods, and bodies past the limit (httplib sets 413 itself).
    server_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler's own error
      if (res.status == 413) {        // keeps its status (no gRPC code says "too large")
        res.set_content(ErrorJson(absl::InvalidArgumentError("the request body is too large")),
                        "application/json");
        return;
      }
      if (res.status == 404 || res.status == 405) {
        return SendError(res,
                         absl::NotFoundError(absl::StrCat("no route ", req.method, " ", req.path)));
      }
    });
  }

  // New calls get 503 from now on; waits for the running ones until `deadline`, then cancels them
  // and waits for their threads.
  void Drain(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    mu_.AwaitWithDeadline(
        absl::Condition(
            +[](absl::flat_hash_set<RunningCall*>* calls) { return calls->empty(); }, &calls_),
        deadline);
    for (RunningCall* call : calls_) call->cancellation.Cancel();
    mu_.Await(absl::Condition(
        +[](absl::flat_hash_set<RunningCall*>* calls) { return calls->empty(); }, &calls_));
  }

 private:
  bool Draining() {
    absl::MutexLock lock(&mu_);
    return draining_;
  }

  absl::StatusOr<Caller> Authenticate(const httplib::Request& req) {
    if (authenticator_ == nullptr) return Caller{};
    const std::optional<std::string> token = BearerToken(req);
    return authenticator_->Authenticate(token.has_value() ? std::optional<absl::string_view>(*token)
                                                          : std::nullopt);
  }

  // The served model's name, asked once and remembered ("" while nobody answers).
  std::string ServedModel() {
    {
      absl::MutexLock lock(&mu_);
      if (!model_.empty()) return model_;
    }
    absl::StatusOr<std::string> name = backend_->ModelName(absl::Now() + absl::Seconds(2));
    if (!name.ok()) return "";
    absl::MutexLock lock(&mu_);
    model_ = *name;
    return model_;
  }

  void Models(const httplib::Request& req, httplib::Response& res) {
    if (absl::StatusOr<Caller> caller = Authenticate(req); !caller.ok()) {
      return SendError(res, caller.status());
    }
    absl::StatusOr<std::string> name = backend_->ModelName(absl::Now() + absl::Seconds(5));
    if (!name.ok()) return SendError(res, name.status());
    res.set_content(ModelsJson(*name), "application/json");
  }

  // Starts `request` on its own thread; the handler thread reads what it produces. Null once the
  // server drains.
  std::shared_ptr<RunningCall> StartCall(const OpenAiRequest& request, Caller caller) {
    auto call = std::make_shared<RunningCall>();
    {
      absl::MutexLock lock(&mu_);
      if (draining_) return nullptr;  // checked with the insert, so that Drain() waits for it
      calls_.insert(call.get());
    }
    BackendCall backend_call;
    backend_call.caller = std::move(caller);
    backend_call.deadline = absl::Now() + request.timeout.value_or(options_.default_timeout);
    backend_call.cancellation = &call->cancellation;
    std::thread([this, call, backend_call, generate = request.generate] {
      absl::Status status =
          backend_->Generate(generate, backend_call, [&call](const GenerateResponse& message) {
            absl::MutexLock lock(&call->mu);
            call->messages.push_back(message);
            return !call->cancellation.cancelled();
          });
      {
        absl::MutexLock lock(&call->mu);
        call->done = true;
        call->status = std::move(status);
      }
      absl::MutexLock lock(&mu_);
      calls_.erase(call.get());
    }).detach();
    return call;
  }

  // Waits until `call` has a message or is done, checking every disconnect_poll whether the client
  // of `req` has gone (then cancels the call). Returns false once the client is gone. `socket`: the
  // connection's descriptor once looked up (-2: not yet).
  bool WaitForProgress(const httplib::Request& req, RunningCall& call, int& socket) {
    auto ready = [&call]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(call.mu) {
      return !call.messages.empty() || call.done;
    };
    while (true) {
      {
        absl::MutexLock lock(&call.mu);
        if (call.mu.AwaitWithTimeout(absl::Condition(&ready), options_.disconnect_poll)) {
          return true;
        }
      }
      if (socket == -2) socket = ConnectionSocket(req);
      if (PeerClosed(socket)) {
        call.cancellation.Cancel();
        return false;
      }
    }
  }

  void Completion(OpenAiEndpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    if (Draining()) return SendError(res, absl::UnavailableError("the server is shutting down"));
    absl::StatusOr<Caller> caller = Authenticate(req);
    if (!caller.ok()) return SendError(res, caller.status());
    absl::StatusOr<OpenAiRequest> request =
        ParseOpenAiRequest(endpoint, req.body, options_.defaults);
    if (!request.ok()) return SendError(res, request.status());

    const std::string id = absl::StrCat(
        endpoint == OpenAiEndpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", RandomHex(24));
    if (request->generate.request_id().empty()) request->generate.set_request_id(id);
    std::string model = request->model.empty() ? ServedModel() : request->model;
    auto responder = std::make_shared<OpenAiResponder>(
        *request, id, absl::ToUnixSeconds(absl::Now()), std::move(model));
    std::shared_ptr<RunningCall> call = StartCall(*request, *std::move(caller));
    if (call == nullptr) {
      return SendError(res, absl::UnavailableError("the server is shutting down"));
    }

    // Until the first message, an error still gets its own HTTP status.
    int socket = -2;
    if (!WaitForProgress(req, *call, socket)) {
      return SendError(res, absl::CancelledError("the client went away"));
    }
    {
      absl::MutexLock lock(&call->mu);
      if (call->messages.empty()) {  // done without a message
        absl::Status s = call->status.ok()
                             ? absl::InternalError("the call ended without a final message")
                             : call->status;
        return SendError(res, s);
      }
    }

    if (!request->stream) {
      while (true) {
        RunningCall::Progress p = call->Take();
        for (const GenerateResponse& m : p.messages) responder->Add(m);
        if (p.done) {
          if (!p.status.ok()) return SendError(res, p.status);
          if (!responder->finished()) {
            return SendError(res, absl::InternalError("the stream ended without a final message"));
          }
          res.set_content(responder->Body(), "application/json");
          return;
        }
        if (!WaitForProgress(req, *call, socket)) {
          return SendError(res, absl::CancelledError("the client went away"));
        }
      }
    }

    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, &req, call, responder, socket](size_t, httplib::DataSink& sink) mutable {
          while (true) {
            RunningCall::Progress p = call->Take();
            std::string events;
            for (const GenerateResponse& m : p.messages) events += responder->Add(m);
            if (p.done) {
              if (!p.status.ok()) {
                events += OpenAiResponder::StreamError(p.status);
              } else if (!responder->finished()) {
                events += OpenAiResponder::StreamError(
                    absl::InternalError("the stream ended without a final message"));
              } else {
                events += responder->StreamEnd();
              }
            }
            if (!events.empty() && !sink.write(events.data(), events.size())) {
              call->cancellation.Cancel();
              return false;
            }
            if (p.done) {
              sink.done();
              return true;
            }
            if (!WaitForProgress(req, *call, socket)) return false;
          }
        },
        [call](bool /*success*/) { call->cancellation.Cancel(); });
  }

  InferenceBackend* const backend_;
  const OpenAiHttpOptions& options_;
  CallerAuthenticator* const authenticator_;
  ListeningServer server_;

  absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<RunningCall*> calls_ ABSL_GUARDED_BY(mu_);
  std::string model_ ABSL_GUARDED_BY(mu_);
};

OpenAiHttpServer::OpenAiHttpServer(InferenceBackend* backend, OpenAiHttpOptions options,
                                   CallerAuthenticator* authenticator)
    : backend_(backend), options_(std::move(options)), authenticator_(authenticator) {}

OpenAiHttpServer::~OpenAiHttpServer() { Shutdown(absl::Now()); }

absl::Status OpenAiHttpServer::Start() {
  if (impl_ != nullptr) return absl::FailedPreconditionError("HTTP server already started");
  const size_t colon = options_.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(options_.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_listen '", options_.listen, "' is not HOST:PORT"));
  }
  std::string host = options_.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  auto impl = std::make_unique<Impl>(backend_, options_, authenticator_);
  impl->Register();
  ListeningServer& server = impl->server();
  const int bound =
      port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("HTTP: cannot bind ", options_.listen));
  }
  // listen() again on a listening socket only changes its backlog (Linux; the kernel caps it at
  // net.core.somaxconn).
  if (::listen(server.listening_socket(), std::max(1, options_.listen_backlog)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("HTTP: cannot set the listen backlog of ", options_.listen));
  }
  port_ = bound;
  impl_ = std::move(impl);
  thread_ = std::thread([s = &server] { s->listen_after_bind(); });
  // httplib's stop() is a no-op until the listen loop runs; wait for it so Shutdown() works.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!server.is_running() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  return absl::OkStatus();
}

void OpenAiHttpServer::Shutdown(absl::Time deadline) {
  if (impl_ == nullptr) return;
  impl_->Drain(deadline);
  impl_->server().stop();
  if (thread_.joinable()) thread_.join();
  impl_.reset();
}

}  // namespace lazyrag::http
