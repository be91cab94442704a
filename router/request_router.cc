#include "router/request_router.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status.h"

namespace lazyrag::router {
namespace {

using lazyrag::v1::GenerateRequest;
using lazyrag::v1::GenerateResponse;
using lazyrag::v1::Inference;

int64_t EstimateTextTokens(const RoutingPolicyOptions& options, size_t bytes) {
  double per_token = options.bytes_per_token > 0 ? options.bytes_per_token : 4;
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(bytes) / per_token));
}

absl::StatusOr<std::vector<DocumentRef>> DocumentsOf(const RoutingPolicyOptions& options,
                                                     const GenerateRequest& request) {
  std::vector<DocumentRef> documents;
  documents.reserve(request.documents_size());
  for (int i = 0; i < request.documents_size(); ++i) {
    const lazyrag::v1::Document& d = request.documents(i);
    switch (d.source_case()) {
      case lazyrag::v1::Document::kText:
        documents.push_back({TextDocumentKey(request.cache_namespace(), d.text()),
                             EstimateTextTokens(options, d.text().size())});
        break;
      case lazyrag::v1::Document::kId:
        documents.push_back({d.id(), 0});
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("documents[", i, "] has neither text nor id"));
    }
  }
  return documents;
}

// The outcome label of a worker call that ended with `code` (not retried, not a failure).
std::string_view OutcomeOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return "ok";
    case absl::StatusCode::kCancelled:
      return "cancelled";
    case absl::StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    default:
      return "error";
  }
}

// The status returned when every worker tried failed before its first message.
absl::Status AllAttemptsFailed(const absl::Status& last_failure, int attempts) {
  if (last_failure.code() == absl::StatusCode::kResourceExhausted) {
    return last_failure;  // every worker tried was full
  }
  return absl::UnavailableError(absl::StrCat("no worker could serve the request (", attempts,
                                             " tried; last: ", last_failure.message(), ")"));
}

// The context of one worker call, with the router's token (`pool`), cancelled through
// `call.cancellation` while it lives.
class AttemptContext {
 public:
  AttemptContext(const WorkerCallOptions& call, const WorkerPool& pool)
      : context_(call.new_context()), cancellation_(call.cancellation) {
    pool.AddAuthToken(*context_);
    if (cancellation_ != nullptr) {
      grpc::ClientContext* context = context_.get();
      cancellation_->SetCallback([context] { context->TryCancel(); });
    }
  }
  ~AttemptContext() {
    if (cancellation_ != nullptr) cancellation_->ClearCallback();
  }
  AttemptContext(const AttemptContext&) = delete;
  AttemptContext& operator=(const AttemptContext&) = delete;

  grpc::ClientContext* get() const { return context_.get(); }

 private:
  std::unique_ptr<grpc::ClientContext> context_;
  Cancellation* const cancellation_;
};

bool ClientGone(const WorkerCallOptions& call) {
  return (call.cancellation != nullptr && call.cancellation->cancelled()) ||
         (call.client_gone && call.client_gone());
}

}  // namespace

RequestRouter::RequestRouter(RequestRouterOptions options, RoutingPolicy* policy, WorkerPool* pool,
                             RouterMetrics* metrics)
    : options_(std::move(options)), policy_(policy), pool_(pool), metrics_(metrics) {}

absl::Status RequestRouter::WithRetries(const std::string& what,
                                        const std::vector<DocumentRef>& documents,
                                        const AttemptFn& attempt) {
  absl::flat_hash_set<std::string> tried;
  absl::Status last_failure;
  for (int n = 0; n < std::max(1, options_.max_attempts); ++n) {
    absl::StatusOr<RouteDecision> decision = policy_->Route(documents, tried);
    if (!decision.ok()) {
      if (tried.empty()) {
        metrics_->CountRequest("none", "failed");
        return decision.status();
      }
      break;
    }
    const std::string worker = decision->worker;
    tried.insert(worker);
    std::shared_ptr<lazyrag::v1::Inference::Stub> stub = pool_->Stub(worker);
    if (stub == nullptr) {  // removed from the set since the policy saw it
      policy_->Finish(worker, documents, false);
      continue;
    }
    const bool affinity = decision->affinity_hit();  // counted with the call's outcome
    LOG_DEBUG << "router: " << what << " -> " << worker << " (" << RouteReasonName(decision->reason)
              << ", " << decision->missing_tokens << "/" << decision->document_tokens
              << " document tokens missing)";

    const Attempt a = attempt(*stub);
    if (a.status.ok() && !a.client_cancelled) {
      policy_->Finish(worker, documents, true, a.document_ids);
      metrics_->CountRequest(worker, "ok", affinity);
      return absl::OkStatus();
    }
    policy_->Finish(worker, documents, false);
    if (a.client_cancelled) {
      metrics_->CountRequest(worker, "cancelled", affinity);
      return absl::CancelledError("the client cancelled");
    }
    const absl::Status& status = a.status;
    if (status.code() == absl::StatusCode::kUnavailable && policy_->SetHealthy(worker, false)) {
      LOG_WARNING << "router: worker " << worker << " ejected (" << status.message() << ")";
    }
    if (!a.streamed && IsRetryableBeforeFirstToken(status.code(), false)) {
      metrics_->CountRequest(worker, "retried", affinity);
      last_failure = absl::Status(status.code(), absl::StrCat(worker, ": ", status.message()));
      continue;
    }
    const bool worker_failed = IsRetryableBeforeFirstToken(status.code(), false) &&
                               status.code() != absl::StatusCode::kResourceExhausted;
    if (a.streamed && worker_failed) {
      metrics_->CountRequest(worker, "failed", affinity);
      return absl::UnavailableError(
          absl::StrCat("worker ", worker, " failed after the stream started: ", status.message()));
    }
    metrics_->CountRequest(worker, OutcomeOf(status.code()), affinity);
    return status;
  }
  metrics_->CountRequest("none", "failed");
  return AllAttemptsFailed(last_failure, static_cast<int>(tried.size()));
}

absl::Status RequestRouter::Generate(const GenerateRequest& client_request,
                                     const WorkerCallOptions& call, const MessageSink& on_message) {
  const absl::Time arrival = absl::Now();
  GenerateRequest request = client_request;
  ASSIGN_OR_RETURN(*request.mutable_cache_namespace(),
                   EffectiveNamespace(call.caller, request.cache_namespace(), options_.namespaces));
  absl::StatusOr<std::vector<DocumentRef>> documents = DocumentsOf(policy_->options(), request);
  if (!documents.ok()) return documents.status();
  const std::string what = absl::StrCat("Generate ", request.request_id());
  return WithRetries(what, *documents, [&](Inference::Stub& stub) {
    AttemptContext context(call, *pool_);
    std::unique_ptr<grpc::ClientReader<GenerateResponse>> reader =
        stub.Generate(context.get(), request);
    Attempt a;
    GenerateResponse message;
    bool client_gone = false;
    while (reader->Read(&message)) {
      if (!a.streamed) {
        a.streamed = true;
        metrics_->time_to_first_token().Observe(absl::ToDoubleSeconds(absl::Now() - arrival));
      }
      if (message.document_ids_size() > 0) {
        a.document_ids.assign(message.document_ids().begin(), message.document_ids().end());
      }
      if (!on_message(message)) {
        client_gone = true;
        context.get()->TryCancel();
        break;
      }
    }
    a.status = FromGrpcStatus(reader->Finish());
    a.client_cancelled = client_gone || ClientGone(call);
    return a;
  });
}

absl::Status RequestRouter::PrepareDocuments(
    const lazyrag::v1::PrepareDocumentsRequest& client_request, const WorkerCallOptions& call,
    lazyrag::v1::PrepareDocumentsResponse* response) {
  lazyrag::v1::PrepareDocumentsRequest request = client_request;
  ASSIGN_OR_RETURN(*request.mutable_cache_namespace(),
                   EffectiveNamespace(call.caller, request.cache_namespace(), options_.namespaces));
  std::vector<DocumentRef> documents;
  documents.reserve(request.texts_size());
  for (const std::string& text : request.texts()) {
    documents.push_back({TextDocumentKey(request.cache_namespace(), text),
                         EstimateTextTokens(policy_->options(), text.size())});
  }
  return WithRetries("PrepareDocuments", documents, [&](Inference::Stub& stub) {
    AttemptContext context(call, *pool_);
    response->Clear();
    Attempt a;
    a.status = FromGrpcStatus(stub.PrepareDocuments(context.get(), request, response));
    a.client_cancelled = !a.status.ok() && ClientGone(call);
    if (a.status.ok()) {
      for (int i = 0; i < response->documents_size(); ++i) {
        const lazyrag::v1::PreparedDocument& d = response->documents(i);
        a.document_ids.push_back(d.id());
        if (i < static_cast<int>(documents.size())) {
          policy_->LearnDocumentTokens(documents[i].key, d.id(), d.num_tokens());
        }
      }
    }
    return a;
  });
}

absl::Status RequestRouter::Health() const {
  for (const WorkerView& w : policy_->Workers()) {
    if (w.healthy) return absl::OkStatus();
  }
  return absl::UnavailableError("no healthy worker");
}

absl::Status RequestRouter::Stats(const lazyrag::v1::StatsRequest& client_request,
                                  absl::Time deadline, lazyrag::v1::StatsResponse* response,
                                  const Identity& caller) {
  lazyrag::v1::StatsRequest request = client_request;
  // A client sees its own documents only, whatever it asked; a worker identity may ask for a
  // tenant's view.
  if (!caller.Allows(Role::kWorker)) request.set_for_tenant(caller.tenant);
  struct Call {
    std::string worker;
    std::shared_ptr<lazyrag::v1::Inference::Stub> stub;
    grpc::ClientContext context;
    lazyrag::v1::StatsResponse response;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (const WorkerView& w : policy_->Workers()) {
    if (!w.healthy) continue;
    auto call = std::make_unique<Call>();
    call->worker = w.address;
    call->stub = pool_->Stub(w.address);
    if (call->stub != nullptr) calls.push_back(std::move(call));
  }
  if (calls.empty()) return absl::UnavailableError("no healthy worker");

  const auto call_deadline =
      absl::ToChronoTime(std::min(deadline, absl::Now() + options_.stats_timeout));
  absl::BlockingCounter pending(static_cast<int>(calls.size()));
  for (const std::unique_ptr<Call>& call : calls) {
    call->context.set_deadline(call_deadline);
    pool_->AddAuthToken(call->context);
    Call* c = call.get();
    c->stub->async()->Stats(&c->context, &request, &c->response, [c, &pending](grpc::Status s) {
      c->status = std::move(s);
      pending.DecrementCount();
    });
  }
  pending.Wait();

  std::vector<std::string> resident;
  std::vector<std::string> models;
  std::vector<std::string> fingerprints;
  std::vector<std::string> failures;
  int answered = 0;
  lazyrag::v1::PoolStats* pool = response->mutable_pool();
  for (const std::unique_ptr<Call>& call : calls) {
    if (!call->status.ok()) {
      failures.push_back(absl::StrCat(call->worker, ": ", call->status.error_message()));
      continue;
    }
    ++answered;
    const lazyrag::v1::StatsResponse& r = call->response;
    resident.insert(resident.end(), r.resident_document_ids().begin(),
                    r.resident_document_ids().end());
    if (pool->page_size() == 0) pool->set_page_size(r.pool().page_size());
    pool->set_pages_total(pool->pages_total() + r.pool().pages_total());
    pool->set_pages_free(pool->pages_free() + r.pool().pages_free());
    pool->set_pages_used(pool->pages_used() + r.pool().pages_used());
    pool->set_pages_pinned(pool->pages_pinned() + r.pool().pages_pinned());
    lazyrag::v1::HostCacheStats* host = response->mutable_host_cache();
    host->set_capacity_bytes(host->capacity_bytes() + r.host_cache().capacity_bytes());
    host->set_used_bytes(host->used_bytes() + r.host_cache().used_bytes());
    host->set_entries(host->entries() + r.host_cache().entries());
    response->set_running_requests(response->running_requests() + r.running_requests());
    response->set_waiting_requests(response->waiting_requests() + r.waiting_requests());
    if (std::find(models.begin(), models.end(), r.model()) == models.end()) {
      models.push_back(r.model());
    }
    if (std::find(fingerprints.begin(), fingerprints.end(), r.model_fingerprint()) ==
        fingerprints.end()) {
      fingerprints.push_back(r.model_fingerprint());
    }
  }
  if (answered == 0) {
    return absl::UnavailableError(
        absl::StrCat("no worker answered Stats: ", absl::StrJoin(failures, "; ")));
  }
  std::sort(resident.begin(), resident.end());
  resident.erase(std::unique(resident.begin(), resident.end()), resident.end());
  for (std::string& id : resident) response->add_resident_document_ids(std::move(id));
  // Workers of one deployment serve one model; if they do not, every distinct value is listed.
  response->set_model(absl::StrJoin(models, ","));
  response->set_model_fingerprint(absl::StrJoin(fingerprints, ","));
  return absl::OkStatus();
}

}  // namespace lazyrag::router
