#include "kvstore/kvstore_service.h"

#include <chrono>

#include "common/grpc_auth.h"
#include "common/grpc_status.h"

namespace lazyrag::kvstore {
namespace {

template <typename T>
class GrpcMessageReader final : public MessageReader<T> {
 public:
  GrpcMessageReader(grpc::ServerContext* context, grpc::ServerReader<T>* reader)
      : context_(context), reader_(reader) {}
  bool Read(T* message) override { return reader_->Read(message); }
  absl::Status EndedBy() const override {
    if (!context_->IsCancelled()) return absl::OkStatus();
    // This side's deadline is the client's timeout counted from when the call arrived, so a
    // client cancelling at its own deadline is seen here a little before it: within 100 ms it
    // counts as the deadline (a guess either way; both mean the client gave up).
    if (std::chrono::system_clock::now() + std::chrono::milliseconds(100) >= context_->deadline()) {
      return absl::DeadlineExceededError("the client's deadline passed");
    }
    return absl::CancelledError("the client cancelled the call");
  }

 private:
  grpc::ServerContext* context_;
  grpc::ServerReader<T>* reader_;
};

template <typename T>
class GrpcMessageWriter final : public MessageWriter<T> {
 public:
  explicit GrpcMessageWriter(grpc::ServerWriter<T>* writer) : writer_(writer) {}
  bool Write(const T& message) override { return writer_->Write(message); }

 private:
  grpc::ServerWriter<T>* writer_;
};

}  // namespace

grpc::Status KvStoreService::CheckCaller(const grpc::ServerContext& context) const {
  // Only the cluster's workers read and write stored KV.
  auto caller = AuthenticateCall(tokens_, context, Role::kWorker);
  return caller.ok() ? grpc::Status::OK : ToGrpcStatus(caller.status());
}

grpc::Status KvStoreService::Put(grpc::ServerContext* context,
                                 grpc::ServerReader<lazyrag::v1::PutRequest>* reader,
                                 lazyrag::v1::PutResponse* response) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
  GrpcMessageReader<lazyrag::v1::PutRequest> in(context, reader);
  auto result = handler_->Put(in);
  if (result.ok()) *response = *std::move(result);
  return ToGrpcStatus(result.status());
}

grpc::Status KvStoreService::Get(grpc::ServerContext* context,
                                 const lazyrag::v1::GetRequest* request,
                                 grpc::ServerWriter<lazyrag::v1::GetResponse>* writer) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
  GrpcMessageWriter<lazyrag::v1::GetResponse> out(writer);
  return ToGrpcStatus(handler_->Get(*request, out));
}

grpc::Status KvStoreService::Stat(grpc::ServerContext* context,
                                  const lazyrag::v1::StatRequest* request,
                                  lazyrag::v1::StatResponse* response) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
  auto result = handler_->Stat(*request);
  if (result.ok()) *response = *std::move(result);
  return ToGrpcStatus(result.status());
}

grpc::Status KvStoreService::Delete(grpc::ServerContext* context,
                                    const lazyrag::v1::DeleteRequest* request,
                                    lazyrag::v1::DeleteResponse* response) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
  auto result = handler_->Delete(*request);
  if (result.ok()) *response = *std::move(result);
  return ToGrpcStatus(result.status());
}

namespace {
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (result.ok()) *response = *std::move(result);
  return ToGrpcStatus(result.status());
}
}  // namespace

grpc::Status KvStoreService::Describe(grpc::ServerContext* context,
                                      const lazyrag::v1::DescribeRequest*,
                                      lazyrag::v1::DescribeResponse* response) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
  return Reply(handler_->Describe(), response);
}

grpc::Status KvStoreService::GetLocal(grpc::ServerContext* context,
                                      const lazyrag::v1::GetLocalRequest* request,
                                      lazyrag::v1::GetLocalResponse* response) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
  return Reply(handler_->GetLocal(*request), response);
}

grpc::Status KvStoreService::PutLocal(grpc::ServerContext* context,
                                      const lazyrag::v1::PutLocalRequest* request,
                                      lazyrag::v1::PutResponse* response) {
  if (grpc::Status refused = CheckCaller(*context); !refused.ok()) return refused;
  return Reply(handler_->PutLocal(*request), response);
}

}  // namespace lazyrag::kvstore
