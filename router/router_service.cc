#include "router/router_service.h"

#include <grpcpp/client_context.h>

#include <memory>

#include "absl/time/time.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"

namespace lazyrag::router {
namespace {

// Worker calls inherit the client's deadline and are cancelled with the client's call.
WorkerCallOptions CallOf(grpc::ServerContext* context, Identity caller) {
  WorkerCallOptions call;
  call.caller = std::move(caller);
  call.new_context = [context] { return grpc::ClientContext::FromServerContext(*context); };
  call.client_gone = [context] { return context->IsCancelled(); };
  return call;
}

}  // namespace

RouterService::RouterService(RequestRouter* router, TokenStore* tokens)
    : router_(router), tokens_(tokens) {}

grpc::Status RouterService::Generate(grpc::ServerContext* context,
                                     const lazyrag::v1::GenerateRequest* request,
                                     grpc::ServerWriter<lazyrag::v1::GenerateResponse>* writer) {
  auto caller = AuthenticateCall(tokens_, *context, Role::kClient);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(router_->Generate(
      *request, CallOf(context, *std::move(caller)),
      [writer](const lazyrag::v1::GenerateResponse& message) { return writer->Write(message); }));
}

grpc::Status RouterService::PrepareDocuments(grpc::ServerContext* context,
                                             const lazyrag::v1::PrepareDocumentsRequest* request,
                                             lazyrag::v1::PrepareDocumentsResponse* response) {
  auto caller = AuthenticateCall(tokens_, *context, Role::kClient);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(
      router_->PrepareDocuments(*request, CallOf(context, *std::move(caller)), response));
}

grpc::Status RouterService::Stats(grpc::ServerContext* context,
                                  const lazyrag::v1::StatsRequest* request,
                                  lazyrag::v1::StatsResponse* response) {
  auto caller = AuthenticateCall(tokens_, *context, Role::kClient);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(
      router_->Stats(*request, absl::FromChrono(context->deadline()), response, *caller));
}

}  // namespace lazyrag::router
