// The router's side of the HTTP front door: http::InferenceBackend over the RequestRouter its gRPC
// service uses, so that both share one validation, routing and retry path.
#pragma once

#include <string>

#include "http/inference_backend.h"
#include "router/request_router.h"

namespace lazyrag::router {

// Thread-safe; `router` is not owned and must outlive this object.
class RouterHttpBackend final : public http::InferenceBackend {
 public:
  explicit RouterHttpBackend(RequestRouter* router) : router_(router) {}

  absl::Status Generate(const lazyrag::v1::GenerateRequest& request, const http::BackendCall& call,
                        const MessageSink& on_message) override;
  absl::StatusOr<std::string> ModelName(absl::Time deadline) override;
  absl::Status Health() override { return router_->Health(); }

 private:
  RequestRouter* const router_;
};

}  // namespace lazyrag::router
