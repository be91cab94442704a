#include "router/worker_pool.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>

#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "common/grpc_auth.h"
#include "common/grpc_channel.h"
#include "common/logging.h"
#include "common/tls.h"

namespace lazyrag::router {
namespace {

constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";
constexpr int kServing = 1;  // grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING

// grpc.health.v1.HealthCheckResponse is one enum field (number 1). The router reads it from
// the wire rather than carrying a copy of health.proto.
int ParseServingStatus(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return 0;
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  int status = 0;
  while (uint32_t tag = in.ReadTag()) {
    if (tag == ((1u << 3) | 0u)) {  // field 1, varint
      uint32_t value = 0;
      if (!in.ReadVarint32(&value)) return 0;
      status = static_cast<int>(value);
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) {
      return 0;
    }
  }
  return status;
}

// The state of one worker's poll: a health check, then (when SERVING) a Stats call.
struct WorkerPoll {
  std::string worker;
  std::shared_ptr<grpc::Channel> channel;
  std::shared_ptr<lazyrag::v1::Inference::Stub> stub;
  std::unique_ptr<grpc::GenericStub> generic;
  grpc::ClientContext check_context;
  grpc::ByteBuffer check_request;
  grpc::ByteBuffer check_response;
  grpc::ClientContext stats_context;
  lazyrag::v1::StatsRequest stats_request;
  lazyrag::v1::StatsResponse stats_response;
  StatsTicket ticket;
};

}  // namespace

WorkerPool::WorkerPool(WorkerPoolOptions options, WorkerResolver resolver, RoutingPolicy* policy,
                       RouterMetrics* metrics)
    : options_(std::move(options)),
      resolver_(std::move(resolver)),
      policy_(policy),
      metrics_(metrics) {}

WorkerPool::~WorkerPool() { Stop(); }

absl::Status WorkerPool::Start() {
  auto credentials = ChannelCredentialsFor(options_.tls);
  if (!credentials.ok()) return credentials.status();
  credentials_ = std::move(*credentials);
  Resolve();
  PollOnce();
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void WorkerPool::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<lazyrag::v1::Inference::Stub> WorkerPool::Stub(const std::string& worker) const {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(worker);
  return it == connections_.end() ? nullptr : it->second.stub;
}

void WorkerPool::AddAuthToken(grpc::ClientContext& context) const {
  AddBearerToken(context, options_.auth_token.get());
}

std::vector<std::string> WorkerPool::Workers() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [address, connection] : connections_) out.push_back(address);
  return out;
}

void WorkerPool::Resolve() {
  absl::StatusOr<std::vector<std::string>> addresses = resolver_();
  if (!addresses.ok()) {
    LOG_WARNING << "router: " << addresses.status().message() << "; keeping the previous workers";
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    std::map<std::string, Connection> next;
    for (const std::string& address : *addresses) {
      auto it = connections_.find(address);
      if (it != connections_.end()) {
        next.emplace(address, std::move(it->second));
        continue;
      }
      // A restarted worker is reconnected within about a poll interval.
      Connection c;
      c.channel = grpc::CreateCustomChannel(address, credentials_,
                                            ServiceChannelArgs(options_.max_message_bytes));
      c.stub = lazyrag::v1::Inference::NewStub(c.channel);
      LOG_INFO << "router: worker " << address << " added";
      if (metrics_ != nullptr) metrics_->AddWorker(address);
      next.emplace(address, std::move(c));
    }
    for (const auto& [address, c] : connections_) {
      if (!next.contains(address)) {
        LOG_INFO << "router: worker " << address << " removed";
      }
    }
    connections_ = std::move(next);
  }
  policy_->SetWorkers(*addresses);
}

void WorkerPool::PollOnce() {
  std::vector<std::shared_ptr<WorkerPoll>> polls;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [address, connection] : connections_) {
      auto poll = std::make_shared<WorkerPoll>();
      poll->worker = address;
      poll->channel = connection.channel;
      poll->stub = connection.stub;
      poll->generic = std::make_unique<grpc::GenericStub>(connection.channel);
      polls.push_back(std::move(poll));
    }
  }
  absl::BlockingCounter pending(static_cast<int>(polls.size()));
  const absl::Time deadline = absl::Now() + options_.poll_timeout;
  for (const std::shared_ptr<WorkerPoll>& poll : polls) {
    poll->check_context.set_deadline(absl::ToChronoTime(deadline));
    AddAuthToken(poll->check_context);  // Health needs none; sent as on every worker call
    // grpc.health.v1.HealthCheckRequest{service: ""} is the empty message.
    grpc::Slice empty;
    poll->check_request = grpc::ByteBuffer(&empty, 1);
    poll->generic->UnaryCall(
        &poll->check_context, kHealthCheckMethod, grpc::StubOptions(), &poll->check_request,
        &poll->check_response, [this, poll, &pending, deadline](grpc::Status status) {
          const bool serving = status.ok() && ParseServingStatus(poll->check_response) == kServing;
          if (policy_->SetHealthy(poll->worker, serving)) {
            if (serving) {
              LOG_INFO << "router: worker " << poll->worker << " readmitted (health check SERVING)";
            } else {
              LOG_WARNING << "router: worker " << poll->worker << " ejected (health check: "
                          << (status.ok() ? "not serving" : status.error_message()) << ")";
            }
          }
          if (!serving) {
            pending.DecrementCount();
            return;
          }
          poll->ticket = policy_->BeginStatsPoll(poll->worker);
          poll->stats_context.set_deadline(absl::ToChronoTime(deadline));
          AddAuthToken(poll->stats_context);
          poll->stub->async()->Stats(
              &poll->stats_context, &poll->stats_request, &poll->stats_response,
              [this, poll, &pending](grpc::Status stats_status) {
                if (stats_status.ok()) {
                  const auto& r = poll->stats_response;
                  WorkerLoadReport report;
                  report.resident_document_ids.assign(r.resident_document_ids().begin(),
                                                      r.resident_document_ids().end());
                  report.running = r.running_requests();
                  report.waiting = r.waiting_requests();
                  policy_->UpdateStats(poll->worker, poll->ticket, report);
                } else {
                  LOG_DEBUG << "router: Stats of " << poll->worker << ": "
                            << stats_status.error_message();
                }
                pending.DecrementCount();
              });
        });
  }
  pending.Wait();
  int healthy = 0;
  int ejected = 0;
  for (const WorkerView& w : policy_->Workers()) (w.healthy ? healthy : ejected)++;
  metrics_->SetWorkers(healthy, ejected);
}

void WorkerPool::Run() {
  absl::Time next_resolve = absl::Now() + options_.resolve_interval;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.poll_interval)) return;
    }
    if (absl::Now() >= next_resolve) {
      Resolve();
      next_resolve = absl::Now() + options_.resolve_interval;
    }
    PollOnce();
  }
}

}  // namespace lazyrag::router
