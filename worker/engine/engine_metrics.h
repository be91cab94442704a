// The engine's Prometheus metrics (DESIGN section 7), all prefixed lazyrag_,
// histograms in seconds, labelled `model` (and `mode` for per-request figures):
//   time_to_first_token_seconds{mode,model}      arrival -> first generated
//   token inter_token_latency_seconds{mode,model}      between consecutive
//   generated tokens request_duration_seconds{mode,model}         arrival ->
//   end, finished requests requests_running{model}, requests_waiting{model}
//   requests_finished_total{mode,model,outcome}  outcome: length|stop|eos|error
//   codes prompt_tokens_total{mode,model}, generation_tokens_total{mode,model}
//   doc_cache_lookups_total{model}               one per document of an
//   admitted request doc_cache_hits_total{tier,model}             tier="gpu":
//   the KV pool, whatever the device
//                                                (the pool of a CPU worker is
//                                                labelled "gpu" too, so
//                                                dashboards need one query);
//                                                "peer": another worker of
//                                                this host (--peers);
//                                                "store": kvstore
//   doc_cache_hit_tokens_total{tier,model}
//   doc_computed_total{model}, doc_computed_tokens_total{model}  documents run
//   through the
//                                                model (lookups - hits)
//   kv_pool_pages{state="free|used|pinned",model}
//   kv_pool_evictions_total{model}, preemptions_total{model}
//   kvstore_fetch_seconds, kvstore_fetch_bytes_total   successful store reads
//   kvstore_requests_total{op="get|put",result}  result:
//   hit|miss|ok|skipped|slower_than_compute|<status code>
//                                                (skipped: store marked down,
//                                                recomputed; slower_than_compute:
//                                                not asked, recomputing was
//                                                predicted cheaper: fetch_cost.h;
//                                                put already_stored: such a
//                                                document the store holds, not
//                                                written back)
//   kvstore_writeback_dropped_total              write-backs dropped, queue
//   full
//   kvstore_mac_failures_total                   stored values without a valid MAC
//                                                (document_mac.h): missed, recomputed
//   queue_time_seconds{mode,model}               arrival -> first admission
// Every labelled series whose label values are known up front (modes, outcomes, tiers, the
// usual kvstore results) is created at zero in the constructor: a series that appears on first
// use loses its first increment to rate(), and a mode with one request would read NaN.
#pragma once

#include <string>

#include "common/metrics.h"
#include "worker/engine/request.h"

namespace lazyrag {

// Thread-safe. All pointers are into `registry`, which must outlive this
// object.
class EngineMetrics {
 public:
  // `pool_tier`: the tier label of KV pool hits ("gpu" on cuda, "cpu" on cpu).
  EngineMetrics(metrics::Registry *registry, const std::string &model,
                const std::string &pool_tier = "gpu");

  // The `tier` label of hits in this worker's KV pool.
  const char *pool_tier() const { return pool_tier_.c_str(); }
  metrics::Histogram &QueueTime(AttentionMode m) { return queue_time_->Add(ModeLabels(m)); }

  metrics::Histogram &Ttft(AttentionMode m) { return ttft_->Add(ModeLabels(m)); }
  metrics::Histogram &Itl(AttentionMode m) { return itl_->Add(ModeLabels(m)); }
  metrics::Histogram &Duration(AttentionMode m) { return duration_->Add(ModeLabels(m)); }
  metrics::Counter &PromptTokens(AttentionMode m) { return prompt_tokens_->Add(ModeLabels(m)); }
  metrics::Counter &GenerationTokens(AttentionMode m) {
    return generation_tokens_->Add(ModeLabels(m));
  }
  metrics::Counter &Finished(AttentionMode m, const std::string &outcome);
  metrics::Counter &Hits(const char *tier) {
    return hits_->Add({{"tier", tier}, {"model", model_}});
  }
  metrics::Counter &HitTokens(const char *tier) {
    return hit_tokens_->Add({{"tier", tier}, {"model", model_}});
  }
  metrics::Counter &KvRequests(const char *op, const std::string &result) {
    return kv_requests_->Add({{"op", op}, {"result", result}});
  }

  metrics::Gauge *running;
  metrics::Gauge *waiting;
  metrics::Counter *lookups;
  metrics::Counter *computed;
  metrics::Counter *computed_tokens;
  metrics::Gauge *pages_free;
  metrics::Gauge *pages_used;
  metrics::Gauge *pages_pinned;
  metrics::Counter *evictions;
  metrics::Counter *preemptions;
  metrics::Histogram *fetch_seconds;
  metrics::Counter *fetch_bytes;
  metrics::Counter *writeback_dropped;
  metrics::Counter *mac_failures;  // stored values whose MAC failed: recomputed
  // The host tier (worker/cache/host_tier.h).
  metrics::Gauge *host_bytes;
  metrics::Gauge *host_capacity;
  metrics::Gauge *host_entries;
  metrics::Counter *host_demotions;        // documents copied to the host tier
  metrics::Counter *host_promotions;       // documents copied back into the pool
  metrics::Counter *host_checksum_failures;
  metrics::Histogram *host_demotion_seconds;
  metrics::Histogram *host_promotion_seconds;

 private:
  metrics::Labels ModeLabels(AttentionMode m) const;

  std::string model_;
  std::string pool_tier_;
  metrics::Family<metrics::Histogram> *ttft_;
  metrics::Family<metrics::Histogram> *queue_time_;
  metrics::Family<metrics::Histogram> *itl_;
  metrics::Family<metrics::Histogram> *duration_;
  metrics::Family<metrics::Counter> *prompt_tokens_;
  metrics::Family<metrics::Counter> *generation_tokens_;
  metrics::Family<metrics::Counter> *finished_;
  metrics::Family<metrics::Counter> *hits_;
  metrics::Family<metrics::Counter> *hit_tokens_;
  metrics::Family<metrics::Counter> *kv_requests_;
};

}  // namespace lazyrag
