// The router's Inference service: the same API as a worker. A thin gRPC adapter over RequestRouter
// (request_router.h), which holds the routing, retries and error contract shared with the HTTP
// front door: each worker call inherits the client's deadline and is cancelled with the client's
// call; the one status conversion is common/grpc_status.h.
#pragma once

#include <grpcpp/server_context.h>

#include "lazyrag/v1/inference.grpc.pb.h"
#include "router/request_router.h"

namespace lazyrag::router {

// Thread safety: called concurrently by gRPC; `router` is thread-safe and not owned.
class RouterService final : public lazyrag::v1::Inference::Service {
 public:
  // `tokens`: not owned; null: no authentication. With tokens every call needs a client or
  // worker token (common/auth.h): UNAUTHENTICATED without one.
  explicit RouterService(RequestRouter* router, TokenStore* tokens = nullptr);

  grpc::Status Generate(grpc::ServerContext* context, const lazyrag::v1::GenerateRequest* request,
                        grpc::ServerWriter<lazyrag::v1::GenerateResponse>* writer) override;
  grpc::Status PrepareDocuments(grpc::ServerContext* context,
                                const lazyrag::v1::PrepareDocumentsRequest* request,
                                lazyrag::v1::PrepareDocumentsResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const lazyrag::v1::StatsRequest* request,
                     lazyrag::v1::StatsResponse* response) override;

 private:
  RequestRouter* const router_;
  TokenStore* const tokens_;
};

}  // namespace lazyrag::router
