// gRPC adapter for KvStoreHandler: moves messages between gRPC streams and the handler and
// converts the status. No logic of its own.
#pragma once

#include "kvstore/kvstore_handler.h"
#include "lazyrag/v1/kvstore.grpc.pb.h"

namespace lazyrag::kvstore {

class KvStoreService final : public lazyrag::v1::KvStore::Service {
 public:
  // `handler` is not owned and must outlive the service.
  explicit KvStoreService(KvStoreHandler* handler) : handler_(handler) {}

  grpc::Status Put(grpc::ServerContext* context,
                   grpc::ServerReader<lazyrag::v1::PutRequest>* reader,
                   lazyrag::v1::PutResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const lazyrag::v1::GetRequest* request,
                   grpc::ServerWriter<lazyrag::v1::GetResponse>* writer) override;
  grpc::Status Stat(grpc::ServerContext* context, const lazyrag::v1::StatRequest* request,
                    lazyrag::v1::StatResponse* response) override;
  grpc::Status Delete(grpc::ServerContext* context, const lazyrag::v1::DeleteRequest* request,
                      lazyrag::v1::DeleteResponse* response) override;
  grpc::Status Describe(grpc::ServerContext* context, const lazyrag::v1::DescribeRequest* request,
                        lazyrag::v1::DescribeResponse* response) override;
  grpc::Status GetLocal(grpc::ServerContext* context, const lazyrag::v1::GetLocalRequest* request,
                        lazyrag::v1::GetLocalResponse* response) override;
  grpc::Status PutLocal(grpc::ServerContext* context, const lazyrag::v1::PutLocalRequest* request,
                        lazyrag::v1::PutResponse* response) override;

 private:
  KvStoreHandler* const handler_;
};

}  // namespace lazyrag::kvstore
