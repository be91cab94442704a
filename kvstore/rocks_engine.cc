// KvEngine on a RocksDB index (kvstore/rocks_index.h) plus one file per value
// (kvstore/value_files.h): the value of generation g is the file values/<g>.
//
// Atomic visibility: a put writes its file under a fresh generation that no header points to,
// makes it durable and gives it its final name, then commits with ONE WriteBatch holding the
// new header, the deletion of evicted headers; the files of the replaced and evicted values
// are unlinked after that commit. Readers open the file the header names and keep reading it
// through their descriptor, so they see the old value or the new one, never a mix, also while
// it is replaced or evicted. A crash before the commit leaves a file no header refers to,
// which the next open deletes. Each put syncs only its own file and the small commit, so
// concurrent puts do not wait for each other's bytes.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/logging.h"
#include "common/status.h"
#include "kvstore/index_db.h"
#include "kvstore/kv_engine.h"
#include "kvstore/kvstore_metrics.h"
#include "kvstore/rocks_index.h"
#include "kvstore/value_files.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/write_batch.h"

namespace lazyrag::kvstore {
namespace {

// Written bytes of a put after which the kernel is told to start writing them out, so that
// the commit's fdatasync finds most of the value on disk already.
constexpr uint64_t kWriteBehindBytes = 16ull << 20;

class RocksEngine;

class RocksPutSession final : public PutSession {
 public:
  RocksPutSession(RocksEngine* engine, std::string key, ValueLayout layout, uint64_t gen,
                  UniqueFd fd)
      : engine_(engine),
        key_(std::move(key)),
        layout_(std::move(layout)),
        gen_(gen),
        fd_(std::move(fd)) {
    crcs_.reserve(layout_.num_chunks);
  }
  ~RocksPutSession() override;

  absl::Status AddChunk(uint32_t index, std::string_view data, uint32_t crc32c) override;
  absl::StatusOr<bool> Commit() override;

 private:
  RocksEngine* const engine_;
  const std::string key_;
  const ValueLayout layout_;
  const uint64_t gen_;
  UniqueFd fd_;
  std::vector<uint32_t> crcs_;
  uint64_t written_ = 0;
  uint64_t write_behind_at_ = 0;  // bytes before this offset were handed to write-back
  bool committed_ = false;
};

class RocksValueReader final : public ValueReader {
 public:
  RocksValueReader(RocksEngine* engine, std::string key, ValueRecord record, std::string path,
                   UniqueFd fd)
      : engine_(engine),
        key_(std::move(key)),
        record_(std::move(record)),
        path_(std::move(path)),
        fd_(std::move(fd)) {}

  const ValueLayout& layout() const override { return record_.layout; }
  absl::Status ReadChunk(uint32_t index, std::string* data, uint32_t* crc32c) override;
  absl::Status ReadChunkInto(uint32_t index, char* dst, uint32_t* crc32c) override;
  std::string file_path() const override { return path_; }
  std::span<const uint32_t> chunk_crcs() const override { return record_.crcs; }
  uint64_t version() const override { return record_.gen; }

 private:
  RocksEngine* const engine_;
  const std::string key_;
  const ValueRecord record_;
  const std::string path_;
  UniqueFd fd_;
};

class RocksEngine final : public KvEngine {
 public:
  RocksEngine(RocksEngineOptions options, ValueFiles files)
      : options_(std::move(options)), files_(std::move(files)) {}

  // Opens and loads the index; a corrupt one is repaired once.
  absl::Status Init();

  absl::StatusOr<std::unique_ptr<PutSession>> BeginPut(std::string_view key,
                                                       const ValueLayout& layout) override {
    RETURN_IF_ERROR(CheckCapacity(layout));
    const uint64_t gen = next_gen_.fetch_add(1);
    ASSIGN_OR_RETURN(UniqueFd fd, files_.CreateStaging(gen));
    return std::make_unique<RocksPutSession>(this, std::string(key), layout, gen, std::move(fd));
  }
  absl::StatusOr<bool> PutFile(std::string_view key, const ValueLayout& layout,
                               std::span<const uint32_t> crcs, const std::string& path) override;
  std::string local_dir() const override { return options_.data_dir; }

  absl::StatusOr<std::unique_ptr<ValueReader>> Open(std::string_view key) override;
  absl::StatusOr<KeyStat> Stat(std::string_view key) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;
  absl::StatusOr<uint64_t> EvictTo(uint64_t target_bytes) override;
  EngineUsage Usage() const override {
    absl::MutexLock lock(&mu_);
    return {entries_.size(), bytes_, options_.capacity_bytes};
  }

  // For sessions and readers.
  const ValueFiles& files() const { return files_; }
  bool sync_commits() const { return options_.sync_commits; }
  // Publishes the file of `gen` (written whole at `path`) and commits its header. On error the
  // file is deleted.
  absl::StatusOr<bool> PublishAndCommit(int fd, const std::string& path, const std::string& key,
                                        const ValueLayout& layout, uint64_t gen,
                                        std::span<const uint32_t> crcs);
  void CountCorruption() {
    if (options_.metrics != nullptr) options_.metrics->CountCorruption("disk");
  }
  // Bit rot: counts the corruption and drops the key's value if it is still generation `gen`
  // (index rows and file), so that the key reads as absent and the next put stores it whole.
  // 0 for `gen`: whatever the key holds.
  void Quarantine(const std::string& key, uint64_t gen, std::string_view why);

 private:
  struct Entry {
    uint64_t gen = 0;
    uint64_t size = 0;
    int64_t last_access_ms = 0;
    uint64_t tick = 0;  // position in lru_
  };

  absl::Status CheckCapacity(const ValueLayout& layout) const {
    if (layout.total_size > options_.capacity_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("value of ", layout.total_size,
                                                       " bytes is larger than the capacity of ",
                                                       options_.capacity_bytes, " bytes"));
    }
    return absl::OkStatus();
  }
  int64_t NowMs() const { return absl::ToUnixMillis(absl::Now()); }
  static void AddEntryDeletes(const std::string& key, rocksdb::WriteBatch* batch) {
    batch->Delete(ValueKey(key));
    batch->Delete(AccessKey(key));
  }
  // Forgets `key` in memory; returns its generation (0 when absent).
  uint64_t EraseLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishUsageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.metrics != nullptr) options_.metrics->SetUsage(entries_.size(), bytes_);
  }
  // Adds least recently used entries other than `keep` to `batch` until `*bytes` <= target.
  std::vector<std::string> PickVictimsLocked(uint64_t target, std::string_view keep,
                                             uint64_t* bytes, rocksdb::WriteBatch* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases `victims` in memory and returns their generations (whose files to remove).
  std::vector<uint64_t> EraseVictimsLocked(const std::vector<std::string>& victims)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveFiles(const std::vector<uint64_t>& gens) const {
    for (uint64_t gen : gens) files_.Remove(gen);
  }
  rocksdb::Options IndexOptions() const;
  absl::Status OpenIndex();
  // Reads the index into memory, drops unreferenced files, evicts down to the capacity.
  // DATA_LOSS when the index itself is corrupt.
  absl::Status LoadIndex();

  const RocksEngineOptions options_;
  const ValueFiles files_;
  std::unique_ptr<IndexDb> db_;
  std::atomic<uint64_t> next_gen_{0};

  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, std::string>> lru_ ABSL_GUARDED_BY(mu_);  // (tick, key)
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_tick_ ABSL_GUARDED_BY(mu_) = 1;
};

RocksPutSession::~RocksPutSession() {
  if (committed_) return;
  fd_.reset();
  engine_->files().RemoveStaging(gen_);
}

absl::Status RocksPutSession::AddChunk(uint32_t index, std::string_view data, uint32_t crc32c) {
  if (committed_ || index != crcs_.size() || index >= layout_.num_chunks) {
    return absl::FailedPreconditionError(absl::StrCat("chunk ", index, " out of order"));
  }
  RETURN_IF_ERROR(PwriteAll(fd_.get(), data, written_));
  written_ += data.size();
  crcs_.push_back(crc32c);
  if (engine_->sync_commits() && written_ - write_behind_at_ >= kWriteBehindBytes) {
    // Start writing these bytes out now; the commit's fdatasync then waits for less.
    (void)::sync_file_range(fd_.get(), static_cast<off_t>(write_behind_at_),
                            static_cast<off_t>(written_ - write_behind_at_), SYNC_FILE_RANGE_WRITE);
    write_behind_at_ = written_;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RocksPutSession::Commit() {
  if (committed_ || crcs_.size() != layout_.num_chunks) {
    return absl::FailedPreconditionError(
        absl::StrCat("commit after ", crcs_.size(), " of ", layout_.num_chunks, " chunks"));
  }
  const std::string staging = engine_->files().StagingPathOf(gen_);
  if (absl::Status st = WriteTrailer(fd_.get(), layout_.total_size, key_,
                                     EncodeValueRecord(gen_, layout_, crcs_));
      !st.ok()) {
    return st;  // the destructor removes the staging file
  }
  auto replaced = engine_->PublishAndCommit(fd_.get(), staging, key_, layout_, gen_, crcs_);
  // Published or deleted either way: nothing is left for the destructor.
  committed_ = true;
  return replaced;
}

absl::Status RocksValueReader::ReadChunkInto(uint32_t index, char* dst, uint32_t* crc32c) {
  const ValueLayout& layout = record_.layout;
  if (index >= layout.num_chunks) {
    return absl::OutOfRangeError(absl::StrCat("chunk ", index, " of ", layout.num_chunks));
  }
  const uint64_t begin = layout.ChunkBegin(index);
  const uint64_t size = layout.ChunkEnd(index) - begin;
  auto where = [&] { return absl::StrCat(DescribeKey(key_), " chunk ", index); };
  absl::Status st = PreadAll(fd_.get(), dst, size, begin);
  if (absl::IsDataLoss(st)) {
    engine_->Quarantine(key_, record_.gen, "value file too short");
    return absl::DataLossError(absl::StrCat(where(), ": value file too short"));
  }
  if (!st.ok())
    return absl::Status(st.code(), absl::StrCat("reading ", where(), ": ", st.message()));
  if (Crc32c(std::string_view(dst, size)) != record_.crcs[index]) {
    engine_->Quarantine(key_, record_.gen, absl::StrCat("chunk ", index, " failed its CRC-32C"));
    return absl::DataLossError(absl::StrCat(where(), " failed its CRC-32C check on disk"));
  }
  *crc32c = record_.crcs[index];
  return absl::OkStatus();
}

absl::Status RocksValueReader::ReadChunk(uint32_t index, std::string* data, uint32_t* crc32c) {
  if (index >= record_.layout.num_chunks) {
    return absl::OutOfRangeError(absl::StrCat("chunk ", index, " of ", record_.layout.num_chunks));
  }
  data->resize(record_.layout.ChunkEnd(index) - record_.layout.ChunkBegin(index));
  absl::Status st = ReadChunkInto(index, data->data(), crc32c);
  if (!st.ok()) data->clear();
  return st;
}

absl::Status RocksEngine::Init() {
  if (options_.data_dir.empty()) return absl::InvalidArgumentError("kvstore: data_dir is empty");
  absl::Status st = OpenIndex();
  // RocksDB refusing to open (a damaged CURRENT or MANIFEST names a file that is not there: an
  // I/O error, not a corruption) is bit rot too; a directory locked by another process is not.
  const bool unopenable = !st.ok() && !absl::IsUnavailable(st);
  if (st.ok()) st = LoadIndex();
  if (st.ok() || !(unopenable || absl::IsDataLoss(st))) return st;
  // Bit rot in the index: rebuilt from the value files' trailers (every value whose file is
  // intact comes back; access times restart), then loaded again.
  LOG_ERROR << "kvstore: the index in " << options_.data_dir << " is corrupt (" << st
            << "): rebuilding it from the value files";
  CountCorruption();
  db_.reset();
  {
    absl::MutexLock lock(&mu_);
    entries_.clear();
    lru_.clear();
    bytes_ = 0;
  }
  // RocksDB's own files go; values/, incoming/ and the token file stay.
  RETURN_IF_ERROR(FromRocks(rocksdb::DestroyDB(options_.data_dir, IndexOptions()),
                            "removing the corrupt index"));
  RETURN_IF_ERROR(OpenIndex());
  RETURN_IF_ERROR(RebuildIndexFromFiles(db_->raw(), files_, NowMs()));
  return LoadIndex();
}

rocksdb::Options RocksEngine::IndexOptions() const {
  rocksdb::Options o;
  if (options_.env != nullptr) o.env = options_.env.get();
  o.create_if_missing = true;
  o.max_background_jobs = 2;
  o.write_buffer_size = options_.index_write_buffer_bytes;  // headers and access times only
  return o;
}

absl::Status RocksEngine::OpenIndex() {
  ASSIGN_OR_RETURN(db_, IndexDb::Open(options_.data_dir, IndexOptions(), options_.metrics));
  return absl::OkStatus();
}

absl::Status RocksEngine::LoadIndex() {
  // Generations: epoch << 32 | counter, unique across restarts (and above every stored one, in
  // case a repaired index lost the epoch row).
  std::string epoch_value;
  uint64_t epoch = 0;
  rocksdb::Status s = db_->Get(kEpochKey, &epoch_value);
  if (s.ok() && epoch_value.size() == 8) epoch = ReadU64(epoch_value.data());
  if (!s.ok() && !s.IsNotFound()) return FromRocks(s, "reading epoch");
  rocksdb::WriteOptions sync;
  sync.sync = true;
  RETURN_IF_ERROR(DropLegacyRows(db_->raw()));

  absl::MutexLock lock(&mu_);
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->raw()->NewIterator(rocksdb::ReadOptions()));
    rocksdb::WriteBatch bad;
    for (it->Seek(std::string(1, kValueTag)); it->Valid() && it->key()[0] == kValueTag;
         it->Next()) {
      std::string key = it->key().ToString().substr(1);
      ValueRecord record;
      absl::Status st = DecodeValueRecord(it->value().ToStringView(), &record);
      if (!st.ok()) {
        LOG_ERROR << "kvstore: dropping " << DescribeKey(key) << ": " << st;
        CountCorruption();
        bad.Delete(it->key());
        continue;
      }
      Entry e;
      e.gen = record.gen;
      e.size = record.layout.total_size;
      bytes_ += e.size;
      entries_.emplace(std::move(key), e);
    }
    RETURN_IF_ERROR(FromRocks(it->status(), "scanning headers"));
    for (it->Seek(std::string(1, kAccessTag)); it->Valid() && it->key()[0] == kAccessTag;
         it->Next()) {
      auto e = entries_.find(it->key().ToString().substr(1));
      if (e == entries_.end()) {
        bad.Delete(it->key());
      } else if (it->value().size() == 8) {
        e->second.last_access_ms = static_cast<int64_t>(ReadU64(it->value().data()));
      }
    }
    RETURN_IF_ERROR(FromRocks(it->status(), "scanning access times"));
    if (bad.Count() > 0) RETURN_IF_ERROR(FromRocks(db_->Write(sync, &bad), "dropping bad rows"));
  }
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [key, e] : entries_) order.emplace_back(e.last_access_ms, key);
  std::sort(order.begin(), order.end());
  for (const auto& [ms, key] : order) {
    Entry& e = entries_[key];
    e.tick = next_tick_++;
    lru_.emplace(e.tick, key);
  }
  for (const auto& [key, e] : entries_) epoch = std::max(epoch, e.gen >> 32);
  ++epoch;
  epoch_value.clear();
  AppendU64(epoch, &epoch_value);
  RETURN_IF_ERROR(FromRocks(db_->Put(sync, kEpochKey, epoch_value), "writing epoch"));
  next_gen_ = epoch << 32;
  // Files no header refers to were left by puts that never committed (or by a crash between a
  // commit and its unlinks). A header whose file is missing is found on its first read.
  std::set<uint64_t> live;
  for (const auto& [key, e] : entries_) live.insert(e.gen);
  ASSIGN_OR_RETURN(const uint64_t orphans,
                   files_.RemoveUnreferenced([&](uint64_t gen) { return live.count(gen) > 0; }));
  if (orphans > 0) {
    LOG_INFO << "kvstore: removed " << orphans << " files of uncommitted puts";
  }
  if (bytes_ > options_.capacity_bytes) {
    uint64_t bytes = bytes_;
    rocksdb::WriteBatch batch;
    auto victims = PickVictimsLocked(options_.capacity_bytes, "", &bytes, &batch);
    RETURN_IF_ERROR(FromRocks(db_->Write(sync, &batch), "evicting at open"));
    RemoveFiles(EraseVictimsLocked(victims));
    if (options_.metrics != nullptr) options_.metrics->CountEvictions(victims.size());
  }
  if (options_.metrics != nullptr) {
    options_.metrics->capacity_bytes().Set(static_cast<double>(options_.capacity_bytes));
  }
  PublishUsageLocked();
  LOG_INFO << "kvstore: opened " << options_.data_dir << ": " << entries_.size() << " values, "
           << bytes_ << " bytes, capacity " << options_.capacity_bytes;
  return absl::OkStatus();
}

// Values of the earlier format (chunks inside RocksDB) are dropped: the store is a cache of
// recomputable KV.
uint64_t RocksEngine::EraseLocked(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return 0;
  const uint64_t gen = it->second.gen;
  lru_.erase({it->second.tick, key});
  bytes_ -= it->second.size;
  entries_.erase(it);
  return gen;
}

std::vector<uint64_t> RocksEngine::EraseVictimsLocked(const std::vector<std::string>& victims) {
  std::vector<uint64_t> gens;
  for (const auto& v : victims) gens.push_back(EraseLocked(v));
  return gens;
}

std::vector<std::string> RocksEngine::PickVictimsLocked(uint64_t target, std::string_view keep,
                                                        uint64_t* bytes,
                                                        rocksdb::WriteBatch* batch) {
  std::vector<std::string> victims;
  for (auto it = lru_.begin(); *bytes > target && it != lru_.end(); ++it) {
    if (it->second == keep) continue;
    const Entry& e = entries_.at(it->second);
    AddEntryDeletes(it->second, batch);
    *bytes -= e.size;
    victims.push_back(it->second);
  }
  return victims;
}

absl::StatusOr<bool> RocksEngine::PublishAndCommit(int fd, const std::string& path,
                                                   const std::string& key,
                                                   const ValueLayout& layout, uint64_t gen,
                                                   std::span<const uint32_t> crcs) {
  if (absl::Status st = files_.Publish(fd, path, gen, options_.sync_commits); !st.ok()) {
    ::unlink(path.c_str());
    return st;
  }
  const int64_t now = NowMs();
  std::string access;
  AppendU64(static_cast<uint64_t>(now), &access);
  std::vector<uint64_t> dead;  // generations whose files go once the commit is durable
  bool replaced = false;
  {
    absl::MutexLock lock(&mu_);
    rocksdb::WriteBatch batch;
    batch.Put(ValueKey(key), EncodeValueRecord(gen, layout, crcs));
    batch.Put(AccessKey(key), access);
    auto old = entries_.find(key);
    replaced = old != entries_.end();
    uint64_t bytes = bytes_ + layout.total_size;
    if (replaced) bytes -= old->second.size;
    std::vector<std::string> victims =
        PickVictimsLocked(options_.capacity_bytes, key, &bytes, &batch);
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync_commits;
    if (absl::Status st = FromRocks(db_->Write(wo, &batch), "committing a put"); !st.ok()) {
      files_.Remove(gen);
      return st;
    }
    dead = EraseVictimsLocked(victims);
    if (const uint64_t old_gen = EraseLocked(key); replaced) dead.push_back(old_gen);
    Entry e{gen, layout.total_size, now, next_tick_++};
    lru_.emplace(e.tick, key);
    bytes_ += e.size;
    entries_[key] = e;
    if (options_.metrics != nullptr && !victims.empty()) {
      options_.metrics->CountEvictions(victims.size());
    }
    PublishUsageLocked();
  }
  RemoveFiles(dead);
  return replaced;
}

absl::StatusOr<bool> RocksEngine::PutFile(std::string_view key, const ValueLayout& layout,
                                          std::span<const uint32_t> crcs, const std::string& path) {
  auto fd = OpenFile(path, O_RDONLY | O_NOFOLLOW);
  if (!fd.ok()) {
    ::unlink(path.c_str());
    return fd.status();
  }
  struct stat st;
  absl::Status check = CheckCapacity(layout);
  if (check.ok() && (::fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode))) {
    check = absl::InvalidArgumentError("put: the handed-over file is not a regular file");
  }
  if (check.ok()) check = VerifyValueFile(fd->get(), layout, crcs);
  const uint64_t gen = next_gen_.fetch_add(1);
  if (check.ok()) {
    auto writable = OpenFile(path, O_WRONLY | O_NOFOLLOW);
    check = writable.ok() ? WriteTrailer(writable->get(), layout.total_size, key,
                                         EncodeValueRecord(gen, layout, crcs))
                          : writable.status();
  }
  if (!check.ok()) {
    ::unlink(path.c_str());
    return check;
  }
  return PublishAndCommit(fd->get(), path, std::string(key), layout, gen, crcs);
}

absl::StatusOr<std::unique_ptr<ValueReader>> RocksEngine::Open(std::string_view key) {
  // A value replaced or evicted between reading its header and opening its file: read the
  // header again (at most once more; then the key is treated as absent).
  for (int attempt = 0;; ++attempt) {
    std::string raw;
    rocksdb::Status s = db_->Get(ValueKey(key), &raw);
    if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat(DescribeKey(key), " not stored"));
    if (!s.ok()) return FromRocks(s, "reading a header");
    ValueRecord record;
    if (absl::Status st = DecodeValueRecord(raw, &record); !st.ok()) {
      Quarantine(std::string(key), 0, std::string(st.message()));
      return st;
    }
    auto fd = files_.OpenForRead(record.gen);
    if (absl::IsNotFound(fd.status())) {
      if (attempt == 0) continue;
      // The header outlived its file (a crash between a commit and a later unlink cannot cause
      // this; a file deleted by hand can).
      Quarantine(std::string(key), record.gen, "value file missing");
      return absl::DataLossError(absl::StrCat(DescribeKey(key), ": value file missing"));
    }
    if (!fd.ok()) return fd.status();
    const int64_t now = NowMs();
    bool touched = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(std::string(key));
      if (it != entries_.end() && it->second.gen == record.gen) {
        lru_.erase({it->second.tick, it->first});
        it->second.tick = next_tick_++;
        it->second.last_access_ms = now;
        lru_.emplace(it->second.tick, it->first);
        touched = true;
      }
    }
    if (touched) {
      std::string access;
      AppendU64(static_cast<uint64_t>(now), &access);
      // Best effort: losing an access time in a crash only makes eviction slightly less fair.
      rocksdb::Status ws = db_->Put(rocksdb::WriteOptions(), AccessKey(key), access);
      if (!ws.ok()) {
        LOG_WARNING << "kvstore: recording an access: " << ws.ToString();
      }
    }
    std::string path = files_.PathOf(record.gen);
    return std::make_unique<RocksValueReader>(this, std::string(key), std::move(record),
                                              std::move(path), *std::move(fd));
  }
}

void RocksEngine::Quarantine(const std::string& key, uint64_t gen, std::string_view why) {
  CountCorruption();
  uint64_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || (gen != 0 && it->second.gen != gen)) return;  // replaced since
    rocksdb::WriteBatch batch;
    AddEntryDeletes(key, &batch);
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync_commits;
    if (rocksdb::Status s = db_->Write(wo, &batch); !s.ok()) {
      LOG_ERROR << "kvstore: cannot drop corrupt " << DescribeKey(key) << ": " << s.ToString();
      return;
    }
    dropped = EraseLocked(key);
    PublishUsageLocked();
  }
  files_.Remove(dropped);
  LOG_ERROR << "kvstore: dropped " << DescribeKey(key) << " (" << why
            << "); it reads as absent until put again";
}

absl::StatusOr<KeyStat> RocksEngine::Stat(std::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(std::string(key));
  if (it == entries_.end()) return KeyStat{};
  return KeyStat{true, it->second.size, it->second.last_access_ms};
}

absl::StatusOr<bool> RocksEngine::Delete(std::string_view key) {
  uint64_t gen = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(std::string(key));
    if (it == entries_.end()) return false;
    rocksdb::WriteBatch batch;
    AddEntryDeletes(it->first, &batch);
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync_commits;
    RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "deleting"));
    gen = EraseLocked(std::string(key));
    PublishUsageLocked();
  }
  files_.Remove(gen);
  return true;
}

absl::StatusOr<uint64_t> RocksEngine::EvictTo(uint64_t target_bytes) {
  std::vector<uint64_t> dead;
  {
    absl::MutexLock lock(&mu_);
    uint64_t bytes = bytes_;
    rocksdb::WriteBatch batch;
    auto victims = PickVictimsLocked(target_bytes, "", &bytes, &batch);
    if (victims.empty()) return 0;
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync_commits;
    RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "evicting"));
    dead = EraseVictimsLocked(victims);
    if (options_.metrics != nullptr) options_.metrics->CountEvictions(victims.size());
    PublishUsageLocked();
  }
  RemoveFiles(dead);
  return dead.size();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvEngine>> OpenRocksEngine(const RocksEngineOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("kvstore: data_dir is empty");
  if (::mkdir(options.data_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("creating ", options.data_dir));
  }
  ASSIGN_OR_RETURN(ValueFiles files, ValueFiles::Open(options.data_dir));
  auto engine = std::make_unique<RocksEngine>(options, std::move(files));
  RETURN_IF_ERROR(engine->Init());
  return engine;
}

absl::StatusOr<std::string> StoredValuePath(const std::string& data_dir,
                                            std::string_view encoded_key) {
  rocksdb::DB* raw = nullptr;
  RETURN_IF_ERROR(FromRocks(rocksdb::DB::OpenForReadOnly(rocksdb::Options(), data_dir, &raw),
                            "opening read-only"));
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string record;
  RETURN_IF_ERROR(FromRocks(db->Get(rocksdb::ReadOptions(), ValueKey(encoded_key), &record),
                            "reading a header"));
  ValueRecord decoded;
  RETURN_IF_ERROR(DecodeValueRecord(record, &decoded));
  ASSIGN_OR_RETURN(ValueFiles files, ValueFiles::Open(data_dir));
  return files.PathOf(decoded.gen);
}

}  // namespace lazyrag::kvstore
