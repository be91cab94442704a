#include "tests/router/fake_worker.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sha256.h"

namespace lazyrag::router::testing {

using lazyrag::v1::GenerateResponse;

std::string FakeDocumentId(const std::string& cache_namespace, const std::string& text) {
  return ToHex(Sha256Of("fake\n" + cache_namespace + "\n" + text));
}

bool FakeWorker::SleepUnlessCancelled(grpc::ServerContext* context, absl::Duration d) {
  const absl::Time end = absl::Now() + d;
  while (absl::Now() < end) {
    if (context->IsCancelled()) return false;
    absl::SleepFor(std::min(absl::Milliseconds(2), end - absl::Now()));
  }
  return !context->IsCancelled();
}

void FakeWorker::Hold() {
  absl::MutexLock lock(&mu_);
  held_ = true;
}

void FakeWorker::Release() {
  absl::MutexLock lock(&mu_);
  held_ = false;
}

bool FakeWorker::IsResident(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  return resident_.contains(id);
}

grpc::Status FakeWorker::Generate(grpc::ServerContext* context,
                                  const lazyrag::v1::GenerateRequest* request,
                                  grpc::ServerWriter<GenerateResponse>* writer) {
  const absl::Time arrival = absl::Now();
  generate_calls_++;
  if (request->query().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "query is empty");
  }
  int fail = fail_next_.load();
  while (fail > 0 && !fail_next_.compare_exchange_weak(fail, fail - 1)) {
  }
  if (fail > 0) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake worker: injected failure");
  }
  running_++;
  struct Done {
    std::atomic<int>* running;
    ~Done() { (*running)--; }
  } done{&running_};

  // Wait while held.
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (!held_) break;
    }
    if (!SleepUnlessCancelled(context, absl::Milliseconds(5))) {
      cancellations_seen_++;
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while held");
    }
  }

  std::vector<std::string> ids;
  int cold = 0;
  int64_t document_tokens = 0;
  int64_t cached_tokens = 0;
  for (const lazyrag::v1::Document& d : request->documents()) {
    std::string id = d.has_text() ? FakeDocumentId(request->cache_namespace(), d.text()) : d.id();
    int64_t tokens = d.has_text() ? static_cast<int64_t>(d.text().size()) / 4 + 1 : 100;
    document_tokens += tokens;
    absl::MutexLock lock(&mu_);
    if (resident_.contains(id)) {
      cached_tokens += tokens;
    } else if (d.has_text()) {
      ++cold;
    } else {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown document id " + id);
    }
    ids.push_back(std::move(id));
  }
  if (!SleepUnlessCancelled(context, options_.cold_document_delay * cold)) {
    cancellations_seen_++;
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  }
  {
    absl::MutexLock lock(&mu_);
    resident_.insert(ids.begin(), ids.end());
  }
  const double ttft_ms = absl::ToDoubleMilliseconds(absl::Now() - arrival);
  const int tokens = request->max_tokens() > 0 ? request->max_tokens() : options_.tokens;
  for (int i = 0; i < tokens; ++i) {
    GenerateResponse message;
    message.set_request_id(request->request_id());
    message.set_text(absl::StrCat("t", i, " "));
    message.add_token_ids(i);
    const bool last = i + 1 == tokens;
    if (last) {
      message.set_finish_reason(lazyrag::v1::FINISH_REASON_LENGTH);
      message.mutable_usage()->set_document_tokens(document_tokens);
      message.mutable_usage()->set_cached_document_tokens(cached_tokens);
      message.mutable_usage()->set_pool_document_tokens(cached_tokens);
      message.mutable_usage()->set_completion_tokens(tokens);
      message.mutable_timings()->set_ttft_ms(ttft_ms);
      message.mutable_timings()->set_total_ms(absl::ToDoubleMilliseconds(absl::Now() - arrival));
      for (const std::string& id : ids) message.add_document_ids(id);
    }
    if (!writer->Write(message)) {
      cancellations_seen_++;
      return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
    }
    if (i == 0 && hang_) {
      while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(2));
      cancellations_seen_++;
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while hanging");
    }
    if (!last && !SleepUnlessCancelled(context, options_.token_interval)) {
      cancellations_seen_++;
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
  }
  completed_++;
  return grpc::Status::OK;
}

grpc::Status FakeWorker::PrepareDocuments(grpc::ServerContext* /*context*/,
                                          const lazyrag::v1::PrepareDocumentsRequest* request,
                                          lazyrag::v1::PrepareDocumentsResponse* response) {
  absl::MutexLock lock(&mu_);
  for (const std::string& text : request->texts()) {
    if (text.empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a document text is empty");
    }
    std::string id = FakeDocumentId(request->cache_namespace(), text);
    lazyrag::v1::PreparedDocument* d = response->add_documents();
    d->set_id(id);
    d->set_num_tokens(static_cast<int>(text.size() / 4 + 1));
    d->set_computed(resident_.insert(id).second);
  }
  return grpc::Status::OK;
}

grpc::Status FakeWorker::Stats(grpc::ServerContext* /*context*/,
                               const lazyrag::v1::StatsRequest* /*request*/,
                               lazyrag::v1::StatsResponse* response) {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : resident_) response->add_resident_document_ids(id);
  response->set_running_requests(running_);
  response->set_waiting_requests(0);
  response->set_model("fake");
  response->set_model_fingerprint("fake-fingerprint");
  response->mutable_pool()->set_page_size(16);
  response->mutable_pool()->set_pages_total(100);
  response->mutable_pool()->set_pages_free(100);
  response->mutable_host_cache()->set_capacity_bytes(1000);
  response->mutable_host_cache()->set_used_bytes(256);
  response->mutable_host_cache()->set_entries(1);
  return grpc::Status::OK;
}

FakeWorkerServer::FakeWorkerServer(FakeWorkerOptions options, int port)
    : worker_(options), port_(port) {}

absl::Status FakeWorkerServer::Start() {
  if (server_ != nullptr) return absl::FailedPreconditionError("already started");
  GrpcServerOptions options;
  options.listen = absl::StrCat("127.0.0.1:", port_);
  server_ = std::make_unique<GrpcServer>(options);
  server_->AddService(&worker_);
  absl::Status status = server_->Start();
  if (!status.ok()) {
    server_.reset();
    return status;
  }
  port_ = server_->port();
  return absl::OkStatus();
}

std::string FakeWorkerServer::address() const { return absl::StrCat("127.0.0.1:", port_); }

void FakeWorkerServer::Stop() {
  if (server_ == nullptr) return;
  server_->Shutdown(absl::Now());
  server_.reset();
}

}  // namespace lazyrag::router::testing
