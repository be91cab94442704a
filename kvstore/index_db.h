// The kvstore engine's RocksDB handle, recovering from RocksDB background errors without a
// process restart. A failed flush, compaction or write-ahead-log sync puts RocksDB into a
// read-only "background error" state in which every later write fails; IndexDb then tries
// DB::Resume() and, when RocksDB refuses (a fatal error), closes and reopens the database in
// place, and retries the write once. Reads and writes during a recovery wait for it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace lazyrag::kvstore {

class KvStoreMetrics;

// Thread-safe.
class IndexDb {
 public:
  // Opens (or creates) the database at `dir` with `options` (an event listener is added that
  // logs and counts background errors). `metrics` is optional, not owned.
  static absl::StatusOr<std::unique_ptr<IndexDb>> Open(const std::string& dir,
                                                       rocksdb::Options options,
                                                       KvStoreMetrics* metrics);
  ~IndexDb();

  rocksdb::Status Get(std::string_view key, std::string* value);
  // Retried once after a recovery when the first attempt fails with an I/O error or
  // corruption (what a background error makes every write return).
  rocksdb::Status Write(const rocksdb::WriteOptions& options, rocksdb::WriteBatch* batch);
  rocksdb::Status Put(const rocksdb::WriteOptions& options, std::string_view key,
                      std::string_view value);

  // The database itself, for the single-threaded work at open (scans, repairs).
  // REQUIRES: no concurrent call on this object while the pointer is used.
  rocksdb::DB* raw() ABSL_NO_THREAD_SAFETY_ANALYSIS { return db_.get(); }

  // Recoveries done so far (Resume or reopen).
  uint64_t recoveries() const;

 private:
  IndexDb(std::string dir, rocksdb::Options options, KvStoreMetrics* metrics)
      : dir_(std::move(dir)), options_(std::move(options)), metrics_(metrics) {}

  // Brings the database out of a background error (`cause` is the failed call's status) unless
  // another thread has done so since it read `epoch`. Returns whether the database is usable.
  bool Recover(uint64_t epoch, const rocksdb::Status& cause) ABSL_LOCKS_EXCLUDED(mu_);
  template <typename Op>
  rocksdb::Status WithRecovery(Op op);

  const std::string dir_;
  const rocksdb::Options options_;
  KvStoreMetrics* const metrics_;
  // Shared by every call on db_; exclusive while recovering (db_ may be replaced).
  mutable absl::Mutex mu_;
  std::unique_ptr<rocksdb::DB> db_ ABSL_GUARDED_BY(mu_);  // null only after a failed reopen
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;               // bumped by each recovery
};

}  // namespace lazyrag::kvstore
