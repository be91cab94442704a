#include "worker/service/inference_service.h"

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status.h"
#include "google/protobuf/unknown_field_set.h"
#include "worker/model/tokenizer/utf8.h"

namespace lazyrag {
namespace {

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

absl::Time DeadlineOf(const grpc::ServerContext &context) {
  const auto d = context.deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

// An id for the log line of a request that came without one: 16 random hex digits.
std::string NewRequestId() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, static_cast<uint64_t>(random()));
  return buf;
}

std::string ModeName(v1::AttentionMode mode) {
  switch (mode) {
    case v1::ATTENTION_MODE_LAZY:
      return "lazy";
    case v1::ATTENTION_MODE_MATERIALIZE:
      return "materialize";
    case v1::ATTENTION_MODE_PREFIX:
      return "prefix";
    case v1::ATTENTION_MODE_FULL:
      return "full";
    default:
      return absl::StrCat(int(mode));  // unknown: the request is rejected
  }
}

// One line per finished Generate call, whatever its outcome (rejected requests too): what the
// request asked, what the engine reported (absent when it did not run to the end) and the
// status the client got. Info, or a warning for a call that failed; `request_id` "": a new one.
// `caller`: its tenant is logged when authenticated.
void LogFinishedRequest(const v1::GenerateRequest &request, const std::string &request_id,
                        const Identity &caller, const std::optional<GenerateResult> &result,
                        const absl::Status &status, absl::Duration wall) {
  const LogLevel level = status.ok() ? LogLevel::kInfo : LogLevel::kWarning;
  if (level < MinLogLevel()) return;
  const absl::StatusCode code = status.code();
  LogMessage line(level, __FILE__, __LINE__);
  line.With("request_id", request_id.empty() ? NewRequestId() : request_id)
      .With("mode", ModeName(request.mode()))
      .With("documents", request.documents_size());
  if (caller.authenticated) line.With("tenant", caller.tenant).With("role", RoleName(caller.role));
  if (result.has_value()) {
    const Usage &u = result->usage;
    line.With("prompt_tokens", u.prompt_tokens)
        .With("document_tokens", u.document_tokens)
        .With("cached_pool_tokens", u.pool_document_tokens)
        .With("cached_host_tokens", u.host_document_tokens)
        .With("cached_store_tokens", u.store_document_tokens)
        .With("computed_tokens", u.computed_tokens)
        .With("completion_tokens", u.completion_tokens)
        .With("queue_ms", result->timings.queue_ms)
        .With("ttft_ms", result->timings.ttft_ms)
        .With("total_ms", result->timings.total_ms)
        .With("finish", FinishReasonName(result->finish_reason));
  }
  line.With("wall_ms", absl::ToDoubleMilliseconds(wall))
      .With("status", absl::StatusCodeToString(code));
  if (!status.ok()) line.With("error", std::string(status.message()));
  line << "request finished";
}

}  // namespace

absl::StatusOr<GenerateRequest> ParseGenerateRequest(const v1::GenerateRequest &p,
                                                     const InferenceServiceOptions &o) {
  GenerateRequest r;
  r.request_id = p.request_id();
  r.system_prompt = p.system_prompt();
  r.query = p.query();
  if (r.query.empty()) return absl::InvalidArgumentError("query is empty");
  if (!IsValidUtf8(r.query)) return absl::InvalidArgumentError("query is not valid UTF-8");
  if (!IsValidUtf8(r.system_prompt)) {
    return absl::InvalidArgumentError("system_prompt is not valid UTF-8");
  }
  if (p.documents_size() > o.max_documents) {
    return absl::InvalidArgumentError(
        absl::StrCat("too many documents (", p.documents_size(), " > ", o.max_documents, ")"));
  }
  for (int i = 0; i < p.documents_size(); ++i) {
    const v1::Document &d = p.documents(i);
    switch (d.source_case()) {
      case v1::Document::kText:
        if (d.text().empty())
          return absl::InvalidArgumentError(absl::StrCat("document ", i, " is empty"));
        if (!IsValidUtf8(d.text())) {
          return absl::InvalidArgumentError(absl::StrCat("document ", i, " is not valid UTF-8"));
        }
        r.documents.push_back({d.text(), ""});
        break;
      case v1::Document::kId:
        r.documents.push_back({"", d.id()});
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("document ", i, ": set text or id"));
    }
  }
  const v1::SamplingParams &s = p.sampling();
  r.sampling.temperature = s.temperature();
  r.sampling.top_p = s.top_p() == 0 ? 1.0f : s.top_p();
  r.sampling.top_k = s.top_k();
  r.sampling.seed = s.seed();
  if (!std::isfinite(r.sampling.temperature) || r.sampling.temperature < 0) {
    return absl::InvalidArgumentError("temperature must be finite and >= 0");
  }
  if (auto st = r.sampling.Validate(); !st.ok()) return st;
  if (p.max_tokens() < 1) return absl::InvalidArgumentError("max_tokens must be at least 1");
  if (p.max_tokens() > o.max_tokens_limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens ", p.max_tokens(), " is above the limit of ", o.max_tokens_limit));
  }
  r.max_tokens = p.max_tokens();
  for (const std::string &stop : p.stop()) {
    if (stop.empty()) return absl::InvalidArgumentError("stop strings must not be empty");
    r.stop.push_back(stop);
  }
  r.ignore_eos = p.ignore_eos();
  switch (p.mode()) {
    case v1::ATTENTION_MODE_LAZY:
      r.mode = AttentionMode::kLazy;
      break;
    case v1::ATTENTION_MODE_MATERIALIZE:
      r.mode = AttentionMode::kMaterialize;
      break;
    case v1::ATTENTION_MODE_PREFIX:
      r.mode = AttentionMode::kPrefix;
      break;
    case v1::ATTENTION_MODE_FULL:
      r.mode = AttentionMode::kFull;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown mode ", int(p.mode()),
                                                     " (LAZY=0, MATERIALIZE=1, PREFIX=2, FULL=3)"));
  }
  r.cache_namespace = p.cache_namespace();
  const v1::QualityOptions &q = p.quality();
  if (!q.GetReflection()->GetUnknownFields(q).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quality: unknown option (field ", q.GetReflection()->GetUnknownFields(q).field(0).number(),
        "); this worker knows recompute_first_tokens, document_temperature, document_scale, "
        "drop_first_tokens"));
  }
  if (q.has_recompute_first_tokens()) {
    r.quality.recompute_first_tokens = q.recompute_first_tokens().value();
  }
  if (q.has_document_temperature()) {
    r.quality.document_temperature = q.document_temperature().value();
  }
  if (q.has_document_scale()) r.quality.document_scale = q.document_scale().value();
  if (q.has_drop_first_tokens()) r.quality.drop_first_tokens = q.drop_first_tokens().value();
  if (auto checked = ResolveQuality(r.quality, QualitySettings{}); !checked.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("quality.", checked.status().message()));
  }
  return r;
}

InferenceService::InferenceService(Generator *generator, InferenceServiceOptions options)
    : generator_(generator), options_(std::move(options)) {}

grpc::Status InferenceService::Generate(grpc::ServerContext *context,
                                        const v1::GenerateRequest *request,
                                        grpc::ServerWriter<v1::GenerateResponse> *writer) {
  auto caller = AuthenticateCall(options_.tokens, *context, Role::kClient);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(Generate(
      *request, *caller, DeadlineOf(*context), [context] { return context->IsCancelled(); },
      [writer](const v1::GenerateResponse &m) { return writer->Write(m); }));
}

absl::Status InferenceService::Generate(const v1::GenerateRequest &request, const Identity &caller,
                                        absl::Time deadline, std::function<bool()> is_cancelled,
                                        const MessageSink &write) {
  const absl::Time start = absl::Now();
  // The result stays empty unless the engine ran the request to the end.
  std::optional<GenerateResult> logged;
  const absl::Status status =
      GenerateStream(request, caller, deadline, std::move(is_cancelled), write, &logged);
  LogFinishedRequest(request, request.request_id(), caller, logged, status, absl::Now() - start);
  return status;
}

absl::Status InferenceService::GenerateStream(const v1::GenerateRequest &request,
                                              const Identity &caller, absl::Time deadline,
                                              std::function<bool()> is_cancelled,
                                              const MessageSink &write,
                                              std::optional<GenerateResult> *logged) {
  auto parsed = ParseGenerateRequest(request, options_);
  if (!parsed.ok()) return parsed.status();
  GenerateRequest r = std::move(*parsed);
  ASSIGN_OR_RETURN(r.cache_namespace,
                   EffectiveNamespace(caller, r.cache_namespace, options_.namespaces));
  r.deadline = deadline;
  if (absl::Now() >= r.deadline) {
    return absl::DeadlineExceededError("the call's deadline has already passed");
  }
  r.is_cancelled = is_cancelled;
  bool write_failed = false;
  auto result = generator_->Generate(r, [&](std::string_view delta, int32_t token) {
    v1::GenerateResponse m;
    m.set_request_id(request.request_id());
    m.set_text(std::string(delta));
    if (token >= 0) m.add_token_ids(token);
    if (!write(m)) {
      write_failed = true;
      return false;
    }
    return true;
  });
  if (result.ok()) {  // what the log line needs, not the text
    GenerateResult summary;
    summary.finish_reason = result->finish_reason;
    summary.usage = result->usage;
    summary.timings = result->timings;
    *logged = std::move(summary);
  }
  if (!result.ok()) {
    if (absl::IsCancelled(result.status()) && absl::Now() >= r.deadline) {
      return absl::DeadlineExceededError("request deadline exceeded");
    }
    return result.status();
  }
  if (write_failed || (is_cancelled && is_cancelled())) {
    return absl::CancelledError("the client went away");
  }
  v1::GenerateResponse last;
  last.set_request_id(request.request_id());
  last.set_finish_reason(ToProto(result->finish_reason));
  v1::Usage *u = last.mutable_usage();
  u->set_prompt_tokens(result->usage.prompt_tokens);
  u->set_document_tokens(result->usage.document_tokens);
  u->set_cached_document_tokens(result->usage.cached_document_tokens);
  u->set_pool_document_tokens(result->usage.pool_document_tokens);
  u->set_store_document_tokens(result->usage.store_document_tokens);
  u->set_host_document_tokens(result->usage.host_document_tokens);
  u->set_computed_tokens(result->usage.computed_tokens);
  u->set_completion_tokens(result->usage.completion_tokens);
  u->set_recompute_first_tokens(result->usage.recompute_first_tokens);
  u->set_recomputed_document_tokens(result->usage.recomputed_document_tokens);
  u->set_document_temperature(result->usage.document_temperature);
  u->set_document_scale(result->usage.document_scale);
  u->set_drop_first_tokens(result->usage.drop_first_tokens);
  v1::Timings *t = last.mutable_timings();
  t->set_queue_ms(result->timings.queue_ms);
  t->set_ttft_ms(result->timings.ttft_ms);
  t->set_total_ms(result->timings.total_ms);
  for (const std::string &id : result->document_ids) last.add_document_ids(id);
  write(last);
  return absl::OkStatus();
}

grpc::Status InferenceService::PrepareDocuments(grpc::ServerContext *context,
                                                const v1::PrepareDocumentsRequest *request,
                                                v1::PrepareDocumentsResponse *response) {
  auto caller = AuthenticateCall(options_.tokens, *context, Role::kClient);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  auto ns = EffectiveNamespace(*caller, request->cache_namespace(), options_.namespaces);
  if (!ns.ok()) return ToGrpcStatus(ns.status());
  if (request->texts_size() > options_.max_prepare_texts) {
    return ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("too many texts in one PrepareDocuments call (", request->texts_size(), " > ",
                     options_.max_prepare_texts, "); send them in several calls")));
  }
  int64_t bytes = 0;
  for (const std::string &text : request->texts()) bytes += int64_t(text.size());
  if (bytes > options_.max_prepare_bytes) {
    return ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("too many text bytes in one PrepareDocuments call (", bytes, " > ",
                     options_.max_prepare_bytes, "); send them in several calls")));
  }
  std::vector<std::string> texts(request->texts().begin(), request->texts().end());
  for (size_t i = 0; i < texts.size(); ++i) {
    if (texts[i].empty() || !IsValidUtf8(texts[i])) {
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat("text ", i, " is empty or not valid UTF-8")));
    }
  }
  // The work stops when the call ends: its deadline passes or the client cancels it.
  auto prepared = generator_->PrepareDocuments(texts, *ns, DeadlineOf(*context),
                                               [context] { return context->IsCancelled(); });
  if (!prepared.ok()) return ToGrpcStatus(prepared.status());
  for (const PreparedDocument &d : *prepared) {
    v1::PreparedDocument *out = response->add_documents();
    out->set_id(d.id);
    out->set_num_tokens(d.num_tokens);
    out->set_computed(d.computed);
  }
  return grpc::Status::OK;
}

grpc::Status InferenceService::Stats(grpc::ServerContext *context, const v1::StatsRequest *request,
                                     v1::StatsResponse *response) {
  auto caller = AuthenticateCall(options_.tokens, *context, Role::kClient);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (caller->Allows(Role::kWorker) && !request->for_tenant().empty()) {
    // A router asking on behalf of its client: that tenant's view.
    *caller = Identity{true, request->for_tenant(), Role::kClient};
  }
  Engine &engine = generator_->engine();
  const EngineStats s = engine.Stats();
  const bool everything = caller->Allows(Role::kWorker);  // no auth, or the router's affinity
  for (const std::string &id : s.resident_ids) {
    if (id.rfind("prefix:", 0) == 0) continue;
    if (!everything) {
      // A client sees the documents of its own namespaces (and public ones) only; an id whose
      // namespace this worker no longer remembers is not shown.
      std::optional<std::string> ns = generator_->NamespaceOf(id);
      if (!ns.has_value() || !NamespaceVisibleTo(*caller, *ns, options_.namespaces)) continue;
    }
    response->add_resident_document_ids(id);
  }
  v1::PoolStats *pool = response->mutable_pool();
  pool->set_page_size(engine.options().page_size);
  pool->set_pages_total(s.pages_total);
  pool->set_pages_free(s.pages_free);
  pool->set_pages_used(s.pages_total - s.pages_free);
  pool->set_pages_pinned(s.pages_pinned);
  response->set_running_requests(s.running);
  response->set_waiting_requests(s.waiting);
  response->set_model(options_.model_name);
  response->set_model_fingerprint(engine.options().fingerprint);
  v1::HostCacheStats *host = response->mutable_host_cache();
  host->set_capacity_bytes(s.host.capacity_bytes);
  host->set_used_bytes(s.host.used_bytes);
  host->set_entries(s.host.entries);
  return grpc::Status::OK;
}

}  // namespace lazyrag
