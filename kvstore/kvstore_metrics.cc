#include "kvstore/kvstore_metrics.h"

#include <string>

#include "absl/strings/ascii.h"

namespace lazyrag::kvstore {

KvStoreMetrics::KvStoreMetrics(metrics::Registry* registry)
    : requests_(registry->AddCounter("lazyrag_kvstore_requests_total",
                                     "kvstore RPCs served, by op and result status.")),
      corruptions_(registry->AddCounter(
          "lazyrag_kvstore_corruptions_total",
          "Chunks whose bytes did not match their CRC-32C: read back from disk or received "
          "in a Put. Such data is never served.")),
      transferred_(registry->AddCounter("lazyrag_kvstore_transferred_bytes_total",
                                        "Value bytes received by Put (in) and sent by Get (out).")),
      index_recoveries_(registry->AddCounter(
          "lazyrag_kvstore_index_recoveries_total",
          "Recoveries of the RocksDB index from a background error without a restart, by how "
          "(resume: DB::Resume; reopen: closed and opened again).")),
      index_errors_(registry
                        ->AddCounter("lazyrag_kvstore_index_errors_total",
                                     "RocksDB background errors (failed flush, compaction or "
                                     "log sync); writes fail until the index is recovered.")
                        .Add()),
      entries_(registry->AddGauge("lazyrag_kvstore_entries", "Values stored.").Add()),
      bytes_(registry->AddGauge("lazyrag_kvstore_bytes", "Value bytes stored.").Add()),
      capacity_bytes_(registry
                          ->AddGauge("lazyrag_kvstore_capacity_bytes",
                                     "Byte capacity; least recently used values are evicted "
                                     "beyond it.")
                          .Add()),
      evictions_(registry
                     ->AddCounter("lazyrag_kvstore_evictions_total",
                                  "Values evicted to stay within the byte capacity.")
                     .Add()) {
  for (const char* where : {"disk", "transit"}) corruptions_.Add({{"where", where}});
  // Every op's usual results at zero: a series created on first use loses its first increment
  // to rate(), and ratios over it read wrong (kvstore_handler.cc lists the ops).
  for (const char* op : {"put", "get", "stat", "delete"}) {
    for (const char* result : {"ok", "not_found", "invalid_argument", "data_loss",
                               "resource_exhausted", "internal", "unavailable"}) {
      requests_.Add({{"op", op}, {"result", result}});
    }
  }
  for (const char* how : {"resume", "reopen"}) index_recoveries_.Add({{"how", how}});
  for (const char* direction : {"in", "out"}) transferred_.Add({{"direction", direction}});
}

void KvStoreMetrics::CountRequest(std::string_view op, const absl::Status& status) {
  std::string result = absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
  requests_.Add({{"op", std::string(op)}, {"result", result}}).Increment();
}

void KvStoreMetrics::CountCorruption(std::string_view where) {
  corruptions_.Add({{"where", std::string(where)}}).Increment();
}

void KvStoreMetrics::CountIndexError() { index_errors_.Increment(); }

void KvStoreMetrics::CountIndexRecovery(std::string_view how) {
  index_recoveries_.Add({{"how", std::string(how)}}).Increment();
}

void KvStoreMetrics::SetUsage(uint64_t entries, uint64_t bytes) {
  entries_.Set(static_cast<double>(entries));
  bytes_.Set(static_cast<double>(bytes));
}

void KvStoreMetrics::CountEvictions(uint64_t entries) {
  evictions_.Increment(static_cast<double>(entries));
}

void KvStoreMetrics::CountBytes(std::string_view direction, uint64_t bytes) {
  transferred_.Add({{"direction", std::string(direction)}}).Increment(static_cast<double>(bytes));
}

}  // namespace lazyrag::kvstore
