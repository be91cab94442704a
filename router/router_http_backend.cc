#include "router/router_http_backend.h"

#include <grpcpp/client_context.h>

#include <memory>

#include "absl/time/clock.h"

namespace lazyrag::router {

absl::Status RouterHttpBackend::Generate(const lazyrag::v1::GenerateRequest& request,
                                         const http::BackendCall& call,
                                         const MessageSink& on_message) {
  WorkerCallOptions worker_call;
  const absl::Time deadline = call.deadline;
  worker_call.new_context = [deadline] {
    auto context = std::make_unique<grpc::ClientContext>();
    if (deadline != absl::InfiniteFuture()) context->set_deadline(absl::ToChronoTime(deadline));
    return context;
  };
  worker_call.cancellation = call.cancellation;
  worker_call.caller = call.caller.identity;
  return router_->Generate(request, worker_call, on_message);
}

absl::StatusOr<std::string> RouterHttpBackend::ModelName(absl::Time deadline) {
  lazyrag::v1::StatsResponse stats;
  if (absl::Status s = router_->Stats(lazyrag::v1::StatsRequest(), deadline, &stats); !s.ok()) {
    return s;
  }
  return stats.model();
}

}  // namespace lazyrag::router
