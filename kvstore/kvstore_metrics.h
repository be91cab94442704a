// The kvstore server's Prometheus metrics (DESIGN section 7), registered on one Registry.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "common/metrics.h"

namespace lazyrag::kvstore {

// Thread-safe; pointers into `registry`, which must outlive this object.
class KvStoreMetrics {
 public:
  explicit KvStoreMetrics(metrics::Registry* registry);

  // lazyrag_kvstore_requests_total{op, result}; result is the status code in lower case
  // ("ok", "not_found", "data_loss", ...). Every op's usual results start at zero.
  void CountRequest(std::string_view op, const absl::Status& status);
  // lazyrag_kvstore_corruptions_total{where="disk|transit"}: a chunk whose bytes did not
  // match its checksum, read back from disk or received in a Put.
  void CountCorruption(std::string_view where);
  // lazyrag_kvstore_index_errors_total: RocksDB background errors (failed flush, compaction or
  // log sync), after which the index refuses writes until it is recovered.
  void CountIndexError();
  // lazyrag_kvstore_index_recoveries_total{how="resume|reopen"}: recoveries from such errors
  // without a restart (kvstore/index_db.h).
  void CountIndexRecovery(std::string_view how);
  void SetUsage(uint64_t entries, uint64_t bytes);
  void CountEvictions(uint64_t entries);
  void CountBytes(std::string_view direction, uint64_t bytes);  // "in" (put) or "out" (get)

  metrics::Gauge& entries() { return entries_; }
  metrics::Gauge& bytes() { return bytes_; }
  metrics::Gauge& capacity_bytes() { return capacity_bytes_; }
  metrics::Counter& evictions() { return evictions_; }

 private:
  metrics::Family<metrics::Counter>& requests_;
  metrics::Family<metrics::Counter>& corruptions_;
  metrics::Family<metrics::Counter>& transferred_;
  metrics::Family<metrics::Counter>& index_recoveries_;
  metrics::Counter& index_errors_;
  metrics::Gauge& entries_;
  metrics::Gauge& bytes_;
  metrics::Gauge& capacity_bytes_;
  metrics::Counter& evictions_;
};

}  // namespace lazyrag::kvstore
