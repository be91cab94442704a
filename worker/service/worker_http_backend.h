// The worker's side of the HTTP front door (http/openai_http_server.h): http::InferenceBackend
// over the InferenceService the gRPC server runs, so that a worker serves the OpenAI-compatible
// API with the same validation, engine call and log line as Inference/Generate.
#pragma once

#include <string>

#include "http/inference_backend.h"
#include "worker/service/inference_service.h"

namespace lazyrag {

// Thread-safe; `service` is not owned and must outlive this object.
class WorkerHttpBackend final : public http::InferenceBackend {
 public:
  explicit WorkerHttpBackend(InferenceService *service) : service_(service) {}

  absl::Status Generate(const v1::GenerateRequest &request, const http::BackendCall &call,
                        const MessageSink &on_message) override {
    Cancellation *cancellation = call.cancellation;
    return service_->Generate(
        request, call.caller.identity, call.deadline,
        [cancellation] { return cancellation != nullptr && cancellation->cancelled(); },
        on_message);
  }
  absl::StatusOr<std::string> ModelName(absl::Time) override {
    return service_->options().model_name;
  }
  absl::Status Health() override { return absl::OkStatus(); }

 private:
  InferenceService *const service_;
};

}  // namespace lazyrag
