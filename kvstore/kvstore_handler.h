// The kvstore's request handling, free of gRPC: validates requests, drives a KvEngine and
// fills replies. KvStoreService (kvstore_service.h) adapts it to gRPC streams.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/kv_engine.h"
#include "kvstore/kvstore_metrics.h"
#include "lazyrag/v1/kvstore.pb.h"

namespace lazyrag::kvstore {

// A source of request messages (a client stream). Read() returns false at the end.
template <typename T>
class MessageReader {
 public:
  virtual ~MessageReader() = default;
  virtual bool Read(T* message) = 0;
  // After Read() returned false: why the stream ended, when it was not the client's
  // WritesDone: CANCELLED (the client cancelled the call) or DEADLINE_EXCEEDED (its deadline
  // passed). OK otherwise (also for a reader that cannot tell).
  virtual absl::Status EndedBy() const { return absl::OkStatus(); }
};

// A sink of reply messages (a server stream). Write() returns false when the peer is gone.
template <typename T>
class MessageWriter {
 public:
  virtual ~MessageWriter() = default;
  virtual bool Write(const T& message) = 0;
};

// Thread-safe; `engine` and `metrics` are not owned and must outlive it.
class KvStoreHandler {
 public:
  KvStoreHandler(KvEngine* engine, KvStoreMetrics* metrics) : engine_(engine), metrics_(metrics) {}

  // Stream: one header, then chunks 0..num_chunks-1 in order, each with a matching CRC-32C.
  // INVALID_ARGUMENT for a malformed stream (missing header, bad key, chunk out of order or of
  // the wrong size, stream ending early), DATA_LOSS for a checksum mismatch,
  // RESOURCE_EXHAUSTED for a value larger than the capacity. On any error nothing is stored
  // and the key's earlier value, if any, is untouched.
  absl::StatusOr<lazyrag::v1::PutResponse> Put(MessageReader<lazyrag::v1::PutRequest>& in);
  // Writes the header, then the chunks of the requested range. NOT_FOUND for an unknown key;
  // DATA_LOSS when a stored chunk fails its checksum (the stream stops before that chunk).
  absl::Status Get(const lazyrag::v1::GetRequest& request,
                   MessageWriter<lazyrag::v1::GetResponse>& out);
  absl::StatusOr<lazyrag::v1::StatResponse> Stat(const lazyrag::v1::StatRequest& request);
  absl::StatusOr<lazyrag::v1::DeleteResponse> Delete(const lazyrag::v1::DeleteRequest& request);

  // Same-host clients (kvstore.proto, DescribeRequest). Off until EnableLocalClients; then
  // Describe names `dir` and `token` (the content of <dir>/local-token). REQUIRES: called
  // before the first call is served.
  void EnableLocalClients(std::string dir, std::string token) {
    local_dir_ = std::move(dir);
    local_token_ = std::move(token);
  }
  absl::StatusOr<lazyrag::v1::DescribeResponse> Describe() const;
  // FAILED_PRECONDITION when same-host clients are off; else as Get of the whole value.
  absl::StatusOr<lazyrag::v1::GetLocalResponse> GetLocal(
      const lazyrag::v1::GetLocalRequest& request);
  // FAILED_PRECONDITION when same-host clients are off; INVALID_ARGUMENT for a file name that
  // is not a plain name, a bad key or header, or a checksum count other than the chunk count;
  // DATA_LOSS when a chunk does not match. The file is consumed in every case.
  absl::StatusOr<lazyrag::v1::PutResponse> PutLocal(const lazyrag::v1::PutLocalRequest& request);

 private:
  absl::StatusOr<lazyrag::v1::PutResponse> DoPut(MessageReader<lazyrag::v1::PutRequest>& in);
  absl::Status DoGet(const lazyrag::v1::GetRequest& request,
                     MessageWriter<lazyrag::v1::GetResponse>& out);
  absl::StatusOr<lazyrag::v1::StatResponse> DoStat(const lazyrag::v1::StatRequest& request);
  absl::StatusOr<lazyrag::v1::DeleteResponse> DoDelete(const lazyrag::v1::DeleteRequest& request);

  absl::StatusOr<lazyrag::v1::GetLocalResponse> DoGetLocal(
      const lazyrag::v1::GetLocalRequest& request);
  absl::StatusOr<lazyrag::v1::PutResponse> DoPutLocal(const lazyrag::v1::PutLocalRequest& request);

  KvEngine* const engine_;
  KvStoreMetrics* const metrics_;
  std::string local_dir_;  // empty: same-host clients off
  std::string local_token_;
};

}  // namespace lazyrag::kvstore
