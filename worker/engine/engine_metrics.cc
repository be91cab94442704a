#include "worker/engine/engine_metrics.h"

namespace lazyrag {

namespace {

constexpr AttentionMode kModes[] = {AttentionMode::kLazy, AttentionMode::kMaterialize,
                                    AttentionMode::kPrefix, AttentionMode::kFull};
// requests_finished_total's outcomes: the finish reasons (request.h) and the status codes a
// request ends with (lower case, as StatusLabel writes them).
constexpr const char *kOutcomes[] = {
    "length", "stop", "eos", "cancelled", "invalid_argument",
    "resource_exhausted", "deadline_exceeded", "unavailable", "internal"};
// kvstore_requests_total's results (document_fetcher.cc, document_jobs.cc).
constexpr const char *kGetResults[] = {
    "hit",       "miss",        "skipped",           "slower_than_compute", "hedged",
    "cancelled", "unavailable", "deadline_exceeded", "data_loss"};
constexpr const char *kPutResults[] = {
    "ok",          "skipped",           "corrupt", "already_stored",
    "unavailable", "deadline_exceeded", "resource_exhausted"};

}  // namespace

EngineMetrics::EngineMetrics(metrics::Registry *r, const std::string &model,
                             const std::string &pool_tier)
    : model_(model), pool_tier_(pool_tier) {
  const metrics::Labels m{{"model", model}};
  const auto latency = metrics::ExponentialBuckets(0.001, 2, 16);  // 1 ms .. 33 s
  ttft_ = &r->AddHistogram("lazyrag_time_to_first_token_seconds",
                           "Request arrival to its first generated token.", latency);
  itl_ = &r->AddHistogram("lazyrag_inter_token_latency_seconds",
                          "Time between consecutive generated tokens of a request.", latency);
  duration_ = &r->AddHistogram("lazyrag_request_duration_seconds",
                               "Request arrival to its end (finished requests).", latency);
  prompt_tokens_ =
      &r->AddCounter("lazyrag_prompt_tokens_total", "Prompt tokens of admitted requests.");
  generation_tokens_ = &r->AddCounter("lazyrag_generation_tokens_total", "Tokens generated.");
  queue_time_ = &r->AddHistogram("lazyrag_queue_time_seconds",
                                 "Request arrival to its first admission by the scheduler.",
                                 latency);
  finished_ = &r->AddCounter("lazyrag_requests_finished_total",
                             "Requests ended, by outcome (finish reason or status code).");
  running = &r->AddGauge("lazyrag_requests_running", "Requests admitted by the scheduler.").Add(m);
  waiting = &r->AddGauge("lazyrag_requests_waiting", "Requests queued for admission.").Add(m);
  lookups =
      &r->AddCounter("lazyrag_doc_cache_lookups_total", "Documents looked up by admitted requests.")
           .Add(m);
  hits_ = &r->AddCounter("lazyrag_doc_cache_hits_total",
                         "Document lookups served without computing, by tier (gpu or cpu = the "
                         "KV pool, named by its device; host = this worker's host-memory tier; "
                         "peer = another "
                         "worker of this host; store = the kvstore).");
  hit_tokens_ = &r->AddCounter("lazyrag_doc_cache_hit_tokens_total",
                               "Tokens of the document lookups served without computing.");
  for (const char *tier : {pool_tier_.c_str(), "host", "peer", "store"}) {
    Hits(tier);
    HitTokens(tier);
  }
  computed = &r->AddCounter("lazyrag_doc_computed_total",
                            "Documents run through the model (once however "
                            "many requests wait).")
                  .Add(m);
  computed_tokens =
      &r->AddCounter("lazyrag_doc_computed_tokens_total", "Tokens of the documents computed.")
           .Add(m);
  auto &pages = r->AddGauge("lazyrag_kv_pool_pages",
                            "KV pool pages by state: free, used (requests and cached "
                            "documents), pinned (document pages referenced by requests).");
  pages_free = &pages.Add({{"state", "free"}, {"model", model}});
  pages_used = &pages.Add({{"state", "used"}, {"model", model}});
  pages_pinned = &pages.Add({{"state", "pinned"}, {"model", model}});
  evictions = &r->AddCounter("lazyrag_kv_pool_evictions_total",
                             "Unreferenced documents evicted from the KV pool.")
                   .Add(m);
  preemptions = &r->AddCounter("lazyrag_preemptions_total",
                               "Requests whose own pages were freed and that were requeued.")
                     .Add(m);
  fetch_seconds = &r->AddHistogram("lazyrag_kvstore_fetch_seconds",
                                   "Time to fetch a document from the kvstore (successful gets).",
                                   metrics::ExponentialBuckets(0.001, 2, 16))
                       .Add();
  fetch_bytes = &r->AddCounter("lazyrag_kvstore_fetch_bytes_total",
                               "Document bytes fetched from the kvstore.")
                     .Add();
  kv_requests_ = &r->AddCounter("lazyrag_kvstore_requests_total",
                                "Worker calls to the kvstore, by op and result.");
  for (const char *result : kGetResults) KvRequests("get", result);
  for (const char *result : kPutResults) KvRequests("put", result);
  writeback_dropped = &r->AddCounter("lazyrag_kvstore_writeback_dropped_total",
                                     "Computed documents not written back: queue full.")
                           .Add();
  mac_failures = &r->AddCounter("lazyrag_kvstore_mac_failures_total",
                                "Stored document values whose MAC did not verify (or that had "
                                "none): treated as misses, recomputed and written back.")
                      .Add();
  const auto transfer = metrics::ExponentialBuckets(0.0001, 2, 16);  // 0.1 ms .. 3.3 s
  host_bytes = &r->AddGauge("lazyrag_host_cache_bytes",
                            "Bytes of document KV held in the worker's host-memory tier.")
                    .Add(m);
  host_capacity = &r->AddGauge("lazyrag_host_cache_capacity_bytes",
                               "Bytes of host memory the host-memory tier may hold (0: none).")
                       .Add(m);
  host_entries = &r->AddGauge("lazyrag_host_cache_entries",
                              "Documents held in the worker's host-memory tier.")
                      .Add(m);
  host_demotions = &r->AddCounter("lazyrag_host_cache_demotions_total",
                                  "Documents copied from the KV pool to the host-memory tier.")
                        .Add(m);
  host_promotions = &r->AddCounter("lazyrag_host_cache_promotions_total",
                                   "Documents copied from the host-memory tier into the KV pool.")
                         .Add(m);
  host_checksum_failures =
      &r->AddCounter("lazyrag_host_cache_checksum_failures_total",
                     "Host-tier copies whose checksum did not match: dropped and recomputed.")
           .Add(m);
  host_demotion_seconds =
      &r->AddHistogram("lazyrag_host_cache_demotion_seconds",
                       "Time to copy a document from the KV pool to the host-memory tier.",
                       transfer)
           .Add(m);
  host_promotion_seconds =
      &r->AddHistogram("lazyrag_host_cache_promotion_seconds",
                       "Time to copy a document from the host-memory tier into the KV pool.",
                       transfer)
           .Add(m);
  for (AttentionMode mode : kModes) {
    Ttft(mode);
    Itl(mode);
    Duration(mode);
    QueueTime(mode);
    PromptTokens(mode);
    GenerationTokens(mode);
    for (const char *outcome : kOutcomes) Finished(mode, outcome);
  }
}

metrics::Labels EngineMetrics::ModeLabels(AttentionMode mode) const {
  return {{"mode", std::string(AttentionModeName(mode))}, {"model", model_}};
}

metrics::Counter &EngineMetrics::Finished(AttentionMode mode, const std::string &outcome) {
  metrics::Labels l = ModeLabels(mode);
  l["outcome"] = outcome;
  return finished_->Add(l);
}

}  // namespace lazyrag
