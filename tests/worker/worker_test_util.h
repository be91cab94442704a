// Helpers of the worker process tests (worker, peer, GPU peer and TLS): a lazyrag-worker child
// process with an Inference stub and its /metrics, and one streamed Generate call collected into
// a Reply. Header-only; include from test files that link lazyrag_common_grpc.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/auth.h"
#include "common/grpc_auth.h"
#include "kvstore/tests/test_util.h"
#include "lazyrag/v1/inference.grpc.pb.h"

namespace lazyrag::worker_test {

// lazyrag-worker on a loopback port it picks, /metrics on 127.0.0.1; `args` follow the binary's
// --listen and --metrics flags. Start() waits for the ready line; the process is SIGKILLed on
// destruction if still running. Metric() is -2 when /metrics cannot be read, -1 when the
// sample is missing.
class WorkerProcess {
 public:
  explicit WorkerProcess(std::vector<std::string> args, std::string binary = LAZYRAG_WORKER_BINARY,
                         int max_receive_bytes = 0)
      : args_(std::move(args)), binary_(std::move(binary)), max_receive_bytes_(max_receive_bytes) {}

  absl::Status Start() {
    std::vector<std::string> args = {binary_, "--listen=127.0.0.1:0", "--metrics_port=0",
                                     "--metrics_host=127.0.0.1"};
    args.insert(args.end(), args_.begin(), args_.end());
    if (absl::Status st = process_.Start(std::move(args)); !st.ok()) return st;
    grpc::ChannelArguments ca;
    if (max_receive_bytes_ > 0) ca.SetMaxReceiveMessageSize(max_receive_bytes_);
    stub_ = v1::Inference::NewStub(
        grpc::CreateCustomChannel(process_.address(), grpc::InsecureChannelCredentials(), ca));
    return absl::OkStatus();
  }
  void Stop(int signal) { process_.Stop(signal); }
  v1::Inference::Stub &stub() { return *stub_; }
  const std::string &address() const { return process_.address(); }
  int metrics_port() const { return process_.metrics_port(); }
  std::string Metrics() {
    auto m = kvstore::testing::FetchMetrics(process_.metrics_port());
    return m.ok() ? *m : "";
  }
  double Metric(const std::string &name) {
    auto m = kvstore::testing::FetchMetrics(process_.metrics_port());
    return m.ok() ? kvstore::testing::MetricValue(*m, name) : -2;
  }

 private:
  std::vector<std::string> args_;
  std::string binary_;
  int max_receive_bytes_;
  kvstore::testing::ReadyProcess process_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

// One Generate call read to the end.
struct Reply {
  grpc::Status status;
  std::string text;
  std::vector<int32_t> tokens;
  v1::GenerateResponse last;  // the message with the finish reason (usage, timings)
  int messages = 0;
  double wall_ms = 0;  // client wall time of the whole call
};

// `token`: sent on the call (common/grpc_auth.h, AddBearerToken); null: none.
inline Reply Generate(v1::Inference::Stub &stub, const v1::GenerateRequest &req,
                      double timeout_s = 60, BearerToken *token = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  AddBearerToken(ctx, token);
  auto reader = stub.Generate(&ctx, req);
  Reply r;
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    ++r.messages;
    r.text += m.text();
    r.tokens.insert(r.tokens.end(), m.token_ids().begin(), m.token_ids().end());
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) r.last = m;
  }
  r.status = reader->Finish();
  r.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace lazyrag::worker_test
