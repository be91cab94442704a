// Shared pieces of the router's integration tests: a lazyrag-router child process and a
// Generate call that collects the whole stream.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "common/testing/child_process.h"

namespace lazyrag::router::testing {

using ::lazyrag::testing::ChildProcess;
using ::lazyrag::testing::FieldOf;
using ::lazyrag::testing::PickFreePort;

// A lazyrag-router on 127.0.0.1 (ports picked), polling its workers every 100 ms.
class RouterProcess {
 public:
  RouterProcess(std::string binary, std::string workers, std::vector<std::string> extra_args = {});
  absl::Status Start();  // waits for the "ready" line
  void Stop() { process_.Stop(15); }

  const std::string& address() const { return address_; }
  int metrics_port() const { return metrics_port_; }
  std::unique_ptr<lazyrag::v1::Inference::Stub> NewStub() const;
  // The value of one sample of its /metrics (e.g. `lazyrag_router_affinity_hits_total`); -1
  // when absent or unreachable.
  double Metric(const std::string& name_and_labels) const;

 private:
  ChildProcess process_;
  std::string address_;
  int metrics_port_ = 0;
};

struct GenerateResult {
  grpc::Status status;
  std::vector<lazyrag::v1::GenerateResponse> messages;
  absl::Duration elapsed;
  const lazyrag::v1::GenerateResponse& last() const { return messages.back(); }
  std::string text() const;
};

// Calls Generate with `timeout` as the deadline and reads the stream to its end.
GenerateResult CallGenerate(lazyrag::v1::Inference::Stub& stub,
                            const lazyrag::v1::GenerateRequest& request,
                            absl::Duration timeout = absl::Seconds(20));

// A request with the given document texts.
lazyrag::v1::GenerateRequest RequestWithTexts(const std::vector<std::string>& texts,
                                              const std::string& query = "what?",
                                              int max_tokens = 3);

// Polls `condition` every 20 ms until true or `timeout`; returns its last value.
bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout);

}  // namespace lazyrag::router::testing
