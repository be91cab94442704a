#include "kvstore/kvstore_service.h"

#include "common/grpc_status.h"

namespace lazyrag::kvstore {
namespace {

template <typename T>
class GrpcMessageReader final : public MessageReader<T> {
 public:
  explicit GrpcMessageReader(grpc::ServerReader<T>* reader) : reader_(reader) {}
  bool Read(T* message) override { return reader_->Read(message); }

 private:
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

grpc::Status KvStoreService::Put(grpc::ServerContext*,
                                 grpc::ServerReader<lazyrag::v1::PutRequest>* reader,
                                 lazyrag::v1::PutResponse* response) {
  GrpcMessageReader<lazyrag::v1::PutRequest> in(reader);
  auto result = handler_->Put(in);
  if (result.ok()) *response = *std::move(result);
  return ToGrpcStatus(result.status());
}

grpc::Status KvStoreService::Get(grpc::ServerContext*, const lazyrag::v1::GetRequest* request,
                                 grpc::ServerWriter<lazyrag::v1::GetResponse>* writer) {
  GrpcMessageWriter<lazyrag::v1::GetResponse> out(writer);
  return ToGrpcStatus(handler_->Get(*request, out));
}

grpc::Status KvStoreService::Stat(grpc::ServerContext*, const lazyrag::v1::StatRequest* request,
                                  lazyrag::v1::StatResponse* response) {
  auto result = handler_->Stat(*request);
  if (result.ok()) *response = *std::move(result);
  return ToGrpcStatus(result.status());
}

grpc::Status KvStoreService::Delete(grpc::ServerContext*, const lazyrag::v1::DeleteRequest* request,
                                    lazyrag::v1::DeleteResponse* response) {
  auto result = handler_->Delete(*request);
  if (result.ok()) *response = *std::move(result);
  return ToGrpcStatus(result.status());
}

}  // namespace lazyrag::kvstore
