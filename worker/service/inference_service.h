// The gRPC adapter of the worker (DESIGN section 9: a thin layer): parses and
// validates lazyrag.v1.Inference requests, calls the Generator / Engine, maps
// results and errors (the one conversion lives in common/grpc_status.h).
// Deadlines and client cancellation reach the engine, which frees the request's
// pages at once.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "worker/runtime/generator.h"

namespace lazyrag {

struct InferenceServiceOptions {
  std::string model_name;       // reported by Stats
  int max_tokens_limit = 4096;  // larger max_tokens: INVALID_ARGUMENT
  int max_documents = 256;      // documents per request
  // PrepareDocuments: more texts, or more text bytes in all, than these is RESOURCE_EXHAUSTED
  // (one call must not hold the worker for long). Defaults 256 texts, 16 MiB.
  int max_prepare_texts = 256;
  int64_t max_prepare_bytes = 16 << 20;
  // Not owned; null: no authentication. With tokens every call needs a client or worker token
  // (common/auth.h); a client's cache namespace is derived from its tenant (EffectiveNamespace)
  // and its Stats list only its own documents.
  TokenStore *tokens = nullptr;
  NamespacePolicy namespaces;  // public cache namespaces
};

// Proto -> engine request. INVALID_ARGUMENT with the reason for bad input
// (exposed for tests).
absl::StatusOr<GenerateRequest> ParseGenerateRequest(const v1::GenerateRequest &request,
                                                     const InferenceServiceOptions &options);

// Thread-safe (gRPC calls handlers from many threads). `generator` must outlive
// it.
class InferenceService final : public v1::Inference::Service {
 public:
  InferenceService(Generator *generator, InferenceServiceOptions options);

  grpc::Status Generate(grpc::ServerContext *context, const v1::GenerateRequest *request,
                        grpc::ServerWriter<v1::GenerateResponse> *writer) override;
  grpc::Status PrepareDocuments(grpc::ServerContext *context,
                                const v1::PrepareDocumentsRequest *request,
                                v1::PrepareDocumentsResponse *response) override;
  grpc::Status Stats(grpc::ServerContext *context, const v1::StatsRequest *request,
                     v1::StatsResponse *response) override;

  // Receives each message of a Generate stream in order; false when the client cannot take it.
  using MessageSink = std::function<bool(const v1::GenerateResponse &)>;
  // Generate outside gRPC (the HTTP front door, worker_http_backend.h): the same validation,
  // engine call, messages, statuses and log line as the gRPC method. `is_cancelled` is polled
  // by the engine; the call ends DEADLINE_EXCEEDED past `deadline`.
  // `caller`: who asked (Identity{} without authentication), which scopes the namespace.
  absl::Status Generate(const v1::GenerateRequest &request, const Identity &caller,
                        absl::Time deadline, std::function<bool()> is_cancelled,
                        const MessageSink &write);
  const InferenceServiceOptions &options() const { return options_; }

 private:
  // Generate without its log line; sets `logged` (usage, timings, finish reason) when the engine
  // ran the request to the end.
  absl::Status GenerateStream(const v1::GenerateRequest &request, const Identity &caller,
                              absl::Time deadline, std::function<bool()> is_cancelled,
                              const MessageSink &write, std::optional<GenerateResult> *logged);

  Generator *generator_;
  const InferenceServiceOptions options_;
};

}  // namespace lazyrag
