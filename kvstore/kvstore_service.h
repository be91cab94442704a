// gRPC adapter for KvStoreHandler: moves messages between gRPC streams and the handler and
// converts the status. No logic of its own.
#pragma once

#include "kvstore/kvstore_handler.h"
#include "lazyrag/v1/kvstore.grpc.pb.h"

namespace lazyrag {
class TokenStore;
}

namespace lazyrag::kvstore {

class KvStoreService final : public lazyrag::v1::KvStore::Service {
 public:
  // `handler` and `tokens` (null: no authentication) are not owned and must outlive the
  // service. With tokens, every call needs a worker identity (common/auth.h):
  // UNAUTHENTICATED without a known token, PERMISSION_DENIED for a client's.
  explicit KvStoreService(KvStoreHandler* handler, TokenStore* tokens = nullptr)
      : handler_(handler), tokens_(tokens) {}

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
  grpc::Status CheckCaller(const grpc::ServerContext& context) const;

  KvStoreHandler* const handler_;
  TokenStore* const tokens_;
};

}  // namespace lazyrag::kvstore
