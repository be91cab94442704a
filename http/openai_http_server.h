// The OpenAI-compatible HTTP front door (issue 26), served by the router beside its gRPC port:
//   POST /v1/chat/completions, POST /v1/completions   JSON, or Server-Sent Events with
//                                                     "stream": true (openai_api.h)
//   GET  /v1/models                                   the served model
//   GET  /health                                      200 when the backend can take requests
// Every request goes to an InferenceBackend (the server's own Generate path). Errors are
// OpenAI-shaped, {"error": {"message", "type", "param", "code"}}, with HttpStatusOf(code). A call
// ends when its deadline passes (lazyrag.timeout_s, else default_timeout: 504) or when the client
// closes its connection (the backend call is cancelled within disconnect_poll).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "http/inference_backend.h"
#include "http/openai_api.h"

namespace lazyrag::http {

// The seam where authentication plugs in (issue 28 brings the token store shared with the gRPC
// side): maps a request's `Authorization: Bearer TOKEN` to its Caller. Without one (nullptr) the
// server accepts every request as Caller{} and ignores the header. Thread-safe.
class CallerAuthenticator {
 public:
  virtual ~CallerAuthenticator() = default;
  // `bearer_token`: the token of an "Authorization: Bearer" header; nullopt when the request has
  // none (or another scheme). UNAUTHENTICATED (401) or PERMISSION_DENIED (403) to refuse.
  virtual absl::StatusOr<Caller> Authenticate(std::optional<absl::string_view> bearer_token) = 0;
};

// The CallerAuthenticator of a server with a token file: a client or worker token of `tokens`
// (common/auth.h), UNAUTHENTICATED (401) otherwise. `tokens` is not owned.
class TokenStoreAuthenticator final : public CallerAuthenticator {
 public:
  explicit TokenStoreAuthenticator(TokenStore* tokens) : tokens_(tokens) {}
  absl::StatusOr<Caller> Authenticate(std::optional<absl::string_view> bearer_token) override {
    absl::StatusOr<Identity> id = tokens_->Authenticate(
        bearer_token.has_value() ? std::optional<std::string_view>(
                                       std::string_view(bearer_token->data(), bearer_token->size()))
                                 : std::nullopt,
        Role::kClient);
    if (!id.ok()) return id.status();
    return Caller{*std::move(id)};
  }

 private:
  TokenStore* const tokens_;
};

struct OpenAiHttpOptions {
  // HOST:PORT to bind; port 0 picks one (see port()). Required.
  std::string listen;
  // Connections served at once (each open connection, streaming or idle keep-alive, holds one
  // thread). Default 256.
  int threads = 256;
  // Connections the kernel queues before they are accepted. Default 1024.
  int listen_backlog = 1024;
  // Larger request bodies get 413. Default 32 MiB.
  size_t max_body_bytes = 32 << 20;
  // Deadline of a request without lazyrag.timeout_s. Default 10 minutes.
  absl::Duration default_timeout = absl::Minutes(10);
  // How often a waiting request checks whether its client has gone. Default 20 ms.
  absl::Duration disconnect_poll = absl::Milliseconds(20);
  OpenAiDefaults defaults;
};

// Start() once, Shutdown(deadline) once (the destructor does it too). `backend` and `authenticator`
// (nullable) are not owned and must outlive this object.
class OpenAiHttpServer {
 public:
  OpenAiHttpServer(InferenceBackend* backend, OpenAiHttpOptions options,
                   CallerAuthenticator* authenticator = nullptr);
  ~OpenAiHttpServer();
  OpenAiHttpServer(const OpenAiHttpServer&) = delete;
  OpenAiHttpServer& operator=(const OpenAiHttpServer&) = delete;

  // INVALID_ARGUMENT for a malformed listen address; UNAVAILABLE when it cannot be bound.
  absl::Status Start();
  // New requests get 503; running ones may finish until `deadline`, then are cancelled.
  void Shutdown(absl::Time deadline);
  // The bound port; valid after Start().
  int port() const { return port_; }

  class Impl;  // the httplib side (openai_http_server.cc)

 private:
  InferenceBackend* const backend_;
  const OpenAiHttpOptions options_;
  CallerAuthenticator* const authenticator_;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace lazyrag::http
