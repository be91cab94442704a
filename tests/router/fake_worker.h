// An in-process stand-in for lazyrag-worker that serves the Inference API on loopback, for
// router tests that must control timing and failures. Documents it has seen are "resident";
// a request pays `cold_document_delay` per document that is not. Requests can be held before
// their first token (to build a queue), made to fail, or made to hang until cancelled.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_server.h"
#include "lazyrag/v1/inference.grpc.pb.h"

namespace lazyrag::router::testing {

struct FakeWorkerOptions {
  // Messages streamed per request (one token each) when max_tokens is 0. Default 3.
  int tokens = 3;
  // Pause between streamed messages. Default 2 ms.
  absl::Duration token_interval = absl::Milliseconds(2);
  // Time "computing" each document that is not resident. Default 40 ms.
  absl::Duration cold_document_delay = absl::Milliseconds(40);
};

// The fake's document id of a text: 64 lowercase hex characters over (namespace, text).
std::string FakeDocumentId(const std::string& cache_namespace, const std::string& text);

// Thread-safe. Counters are cumulative since construction.
class FakeWorker final : public lazyrag::v1::Inference::Service {
 public:
  explicit FakeWorker(FakeWorkerOptions options = {}) : options_(options) {}

  grpc::Status Generate(grpc::ServerContext* context, const lazyrag::v1::GenerateRequest* request,
                        grpc::ServerWriter<lazyrag::v1::GenerateResponse>* writer) override;
  grpc::Status PrepareDocuments(grpc::ServerContext* context,
                                const lazyrag::v1::PrepareDocumentsRequest* request,
                                lazyrag::v1::PrepareDocumentsResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const lazyrag::v1::StatsRequest* request,
                     lazyrag::v1::StatsResponse* response) override;

  // While held, Generate calls wait (counted as running) before their first token.
  void Hold();
  void Release();
  // The next `n` Generate calls fail with UNAVAILABLE before any token.
  void FailNext(int n) { fail_next_ = n; }
  // Generate streams one message, then waits until its call is cancelled (deadline or client).
  void SetHangAfterFirstToken(bool hang) { hang_ = hang; }

  int generate_calls() const { return generate_calls_; }  // all, including failed ones
  int completed() const { return completed_; }            // streamed to the end
  int cancellations_seen() const { return cancellations_seen_; }
  int running() const { return running_; }
  bool IsResident(const std::string& id) const;

 private:
  // Sleeps for `d` unless the call is cancelled first; false when cancelled.
  static bool SleepUnlessCancelled(grpc::ServerContext* context, absl::Duration d);

  const FakeWorkerOptions options_;
  mutable absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<std::string> resident_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> fail_next_{0};
  std::atomic<bool> hang_{false};
  std::atomic<int> generate_calls_{0};
  std::atomic<int> completed_{0};
  std::atomic<int> cancellations_seen_{0};
  std::atomic<int> running_{0};
};

// A FakeWorker served on 127.0.0.1. Stop() and Start() again keep the port (a "restart").
class FakeWorkerServer {
 public:
  // `port` 0 picks a free one at the first Start().
  explicit FakeWorkerServer(FakeWorkerOptions options = {}, int port = 0);
  ~FakeWorkerServer() { Stop(); }

  absl::Status Start();
  // Stops at once: calls in flight are cancelled (the worker "dies").
  void Stop();

  std::string address() const;
  FakeWorker& worker() { return worker_; }

 private:
  FakeWorker worker_;
  std::unique_ptr<GrpcServer> server_;
  int port_ = 0;
};

}  // namespace lazyrag::router::testing
