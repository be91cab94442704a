// What the HTTP front door (openai_http_server.h) calls: the server's own Inference path. The
// router implements it over its RequestRouter (the code its gRPC service runs), so HTTP and gRPC
// share one implementation of validation and routing. No HTTP or gRPC types here.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/cancellation.h"
#include "lazyrag/v1/inference.pb.h"

namespace lazyrag::http {

// Who is calling, as the CallerAuthenticator (openai_http_server.h) established it.
struct Caller {
  // The authenticated caller (common/auth.h): its tenant and role; Identity{} (not
  // authenticated) on a server without a token file. The backend derives the request's cache
  // namespace from it (EffectiveNamespace).
  Identity identity;
};

// One call's limits, given by the front door.
struct BackendCall {
  Caller caller;
  // The call ends DEADLINE_EXCEEDED past it.
  absl::Time deadline = absl::InfiniteFuture();
  // Raised when the HTTP client goes away: the call ends CANCELLED soon after. Not owned; never
  // null while Generate runs.
  Cancellation* cancellation = nullptr;
};

// Thread-safe: called concurrently, one call per HTTP request.
class InferenceBackend {
 public:
  // Receives each message of the Generate stream in order (on the thread that called Generate);
  // returns false when the client cannot take it (the call then ends CANCELLED).
  using MessageSink = std::function<bool(const lazyrag::v1::GenerateResponse&)>;

  virtual ~InferenceBackend() = default;

  // The Inference/Generate contract (proto/lazyrag/v1/inference.proto): the same statuses, the same
  // messages.
  virtual absl::Status Generate(const lazyrag::v1::GenerateRequest& request,
                                const BackendCall& call, const MessageSink& on_message) = 0;
  // The served model's name ("a,b" when workers disagree); UNAVAILABLE when nobody answers.
  virtual absl::StatusOr<std::string> ModelName(absl::Time deadline) = 0;
  // OK when the server can take requests (a router: at least one healthy worker).
  virtual absl::Status Health() = 0;
};

}  // namespace lazyrag::http
