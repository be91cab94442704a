#include "kvstore/index_db.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "kvstore/kvstore_metrics.h"
#include "kvstore/rocks_index.h"
#include "rocksdb/listener.h"

namespace lazyrag::kvstore {
namespace {

// Logs and counts what RocksDB reports; the recovery itself runs on the next failing call
// (RocksDB's own automatic recovery covers only retryable and no-space errors).
class BackgroundErrorListener final : public rocksdb::EventListener {
 public:
  explicit BackgroundErrorListener(KvStoreMetrics* metrics) : metrics_(metrics) {}
  const char* Name() const override { return "lazyrag.kvstore.BackgroundErrorListener"; }

  void OnBackgroundError(rocksdb::BackgroundErrorReason reason,
                         rocksdb::Status* bg_error) override {
    LOG_ERROR << "kvstore: RocksDB background error (reason " << static_cast<int>(reason)
              << "): " << bg_error->ToString();
    if (metrics_ != nullptr) metrics_->CountIndexError();
  }
  void OnErrorRecoveryEnd(const rocksdb::BackgroundErrorRecoveryInfo& info) override {
    LOG_INFO << "kvstore: RocksDB recovery ended: " << info.new_bg_error.ToString() << " (was "
             << info.old_bg_error.ToString() << ")";
  }

 private:
  KvStoreMetrics* const metrics_;
};

// What a database in the background-error state answers every write (and what a broken
// handle answers reads).
bool MayNeedRecovery(const rocksdb::Status& s) { return s.IsIOError() || s.IsCorruption(); }

}  // namespace

absl::StatusOr<std::unique_ptr<IndexDb>> IndexDb::Open(const std::string& dir,
                                                       rocksdb::Options options,
                                                       KvStoreMetrics* metrics) {
  options.listeners.push_back(std::make_shared<BackgroundErrorListener>(metrics));
  std::unique_ptr<IndexDb> db(new IndexDb(dir, std::move(options), metrics));
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db->options_, dir, &raw);
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
      return absl::UnavailableError(
          absl::StrCat("kvstore: ", dir, " is in use by another process: ", s.ToString()));
    }
    return FromRocks(s, absl::StrCat("opening ", dir));
  }
  absl::MutexLock lock(&db->mu_);
  db->db_.reset(raw);
  return db;
}

IndexDb::~IndexDb() {
  absl::MutexLock lock(&mu_);
  if (db_ == nullptr) return;
  rocksdb::Status s = db_->Close();
  if (!s.ok()) {
    LOG_WARNING << "kvstore: closing RocksDB: " << s.ToString();
  }
}

uint64_t IndexDb::recoveries() const {
  absl::ReaderMutexLock lock(&mu_);
  return epoch_;
}

template <typename Op>
rocksdb::Status IndexDb::WithRecovery(Op op) {
  for (int attempt = 0;; ++attempt) {
    rocksdb::Status s;
    uint64_t epoch = 0;
    {
      absl::ReaderMutexLock lock(&mu_);
      epoch = epoch_;
      s = db_ != nullptr ? op(db_.get()) : rocksdb::Status::IOError("index closed after an error");
    }
    if (s.ok() || attempt > 0 || !MayNeedRecovery(s) || !Recover(epoch, s)) return s;
  }
}

rocksdb::Status IndexDb::Get(std::string_view key, std::string* value) {
  return WithRecovery([&](rocksdb::DB* db) {
    return db->Get(rocksdb::ReadOptions(), rocksdb::Slice(key.data(), key.size()), value);
  });
}

rocksdb::Status IndexDb::Write(const rocksdb::WriteOptions& options, rocksdb::WriteBatch* batch) {
  return WithRecovery([&](rocksdb::DB* db) { return db->Write(options, batch); });
}

rocksdb::Status IndexDb::Put(const rocksdb::WriteOptions& options, std::string_view key,
                             std::string_view value) {
  return WithRecovery([&](rocksdb::DB* db) {
    return db->Put(options, rocksdb::Slice(key.data(), key.size()),
                   rocksdb::Slice(value.data(), value.size()));
  });
}

bool IndexDb::Recover(uint64_t epoch, const rocksdb::Status& cause) {
  absl::MutexLock lock(&mu_);
  if (epoch_ != epoch) return db_ != nullptr;  // another caller recovered meanwhile
  if (db_ != nullptr) {
    // Resume() answers OK also when there was no background error (a plain failed read or
    // write): then the retry shows whether the error persists.
    rocksdb::Status s = db_->Resume();
    if (s.ok()) {
      ++epoch_;
      LOG_WARNING << "kvstore: index resumed after: " << cause.ToString();
      if (metrics_ != nullptr) metrics_->CountIndexRecovery("resume");
      return true;
    }
    LOG_ERROR << "kvstore: resuming the index failed (" << s.ToString() << "); reopening it";
    s = db_->Close();
    if (!s.ok()) {
      LOG_WARNING << "kvstore: closing RocksDB: " << s.ToString();
    }
    db_.reset();
  }
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options_, dir_, &raw);
  if (!s.ok()) {
    LOG_ERROR << "kvstore: reopening the index failed: " << s.ToString()
              << " (the next call tries again)";
    ++epoch_;
    return false;
  }
  db_.reset(raw);
  ++epoch_;
  LOG_WARNING << "kvstore: index reopened after: " << cause.ToString();
  if (metrics_ != nullptr) metrics_->CountIndexRecovery("reopen");
  return true;
}

}  // namespace lazyrag::kvstore
