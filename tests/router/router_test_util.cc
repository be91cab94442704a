#include "tests/router/router_test_util.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "kvstore/tests/test_util.h"

namespace lazyrag::router::testing {

RouterProcess::RouterProcess(std::string binary, std::string workers,
                             std::vector<std::string> extra_args)
    : process_([&] {
        std::vector<std::string> argv = {std::move(binary),          "--listen=127.0.0.1:0",
                                         "--workers=" + workers,     "--metrics_port=0",
                                         "--metrics_host=127.0.0.1", "--poll_interval_s=0.1",
                                         "--poll_timeout_s=0.5",     "--shutdown_grace_s=2"};
        argv.insert(argv.end(), extra_args.begin(), extra_args.end());
        return argv;
      }()) {}

absl::Status RouterProcess::Start() {
  if (absl::Status s = process_.Start(); !s.ok()) return s;
  absl::StatusOr<std::string> line =
      process_.WaitForLine("lazyrag-router ready", absl::Seconds(30));
  if (!line.ok()) return line.status();
  address_ = FieldOf(*line, "grpc");
  if (!absl::SimpleAtoi(FieldOf(*line, "metrics"), &metrics_port_)) {
    return absl::InternalError("bad ready line: " + *line);
  }
  return absl::OkStatus();
}

std::unique_ptr<lazyrag::v1::Inference::Stub> RouterProcess::NewStub() const {
  return lazyrag::v1::Inference::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
}

double RouterProcess::Metric(const std::string& name_and_labels) const {
  absl::StatusOr<std::string> text = kvstore::testing::FetchMetrics(metrics_port_);
  if (!text.ok()) return -1;
  return kvstore::testing::MetricValue(*text, name_and_labels);
}

std::string GenerateResult::text() const {
  std::string out;
  for (const auto& m : messages) out += m.text();
  return out;
}

GenerateResult CallGenerate(lazyrag::v1::Inference::Stub& stub,
                            const lazyrag::v1::GenerateRequest& request, absl::Duration timeout) {
  GenerateResult result;
  const absl::Time start = absl::Now();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(start + timeout));
  auto reader = stub.Generate(&context, request);
  lazyrag::v1::GenerateResponse message;
  while (reader->Read(&message)) result.messages.push_back(message);
  result.status = reader->Finish();
  result.elapsed = absl::Now() - start;
  return result;
}

lazyrag::v1::GenerateRequest RequestWithTexts(const std::vector<std::string>& texts,
                                              const std::string& query, int max_tokens) {
  lazyrag::v1::GenerateRequest request;
  for (const std::string& t : texts) request.add_documents()->set_text(t);
  request.set_query(query);
  request.set_max_tokens(max_tokens);
  return request;
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (condition()) return true;
    if (absl::Now() >= deadline) return condition();
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace lazyrag::router::testing
