// KvEngine on RocksDB (one database per shard process).
//
// Key schema (bytewise order; integers big-endian so they sort numerically):
//   'H' key                          -> u64 generation, serialized lazyrag.v1.ValueHeader
//   'C' u32(len key) key u64(gen) u32(index) -> u32le CRC-32C, chunk bytes
//   'T' key                          -> u64 last access, Unix ms (best effort, not synced)
//   'M' "epoch"                      -> u64, bumped at every open
//
// Atomic visibility: a put writes its chunks under a fresh generation that no header points
// to, then commits with ONE WriteBatch holding the new header, the deletion of the previous
// generation's chunks and any evictions. Readers go through the header, so they see the old
// value or the new one, never a mix. A crash before the commit leaves unreferenced chunks,
// which the next open deletes. Chunks are written without the write-ahead log and flushed into
// blob files just before the commit, so a value reaches the disk once and the commit's sync
// covers only the small batch. Readers use a RocksDB snapshot, so a value being replaced or
// evicted while it streams out stays readable to the end.
#include <algorithm>
#include <atomic>
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
#include "common/logging.h"
#include "common/status.h"
#include "kvstore/kv_engine.h"
#include "kvstore/kvstore_metrics.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/write_batch.h"

namespace lazyrag::kvstore {
namespace {

constexpr char kHeaderTag = 'H';
constexpr char kChunkTag = 'C';
constexpr char kAccessTag = 'T';
constexpr char kEpochKey[] = "Mepoch";

void AppendU32(uint32_t v, std::string* out) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}
void AppendU64(uint64_t v, std::string* out) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}
uint32_t ReadU32(const char* p) {
  const auto* u = reinterpret_cast<const uint8_t*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | u[3];
}
uint64_t ReadU64(const char* p) { return (uint64_t{ReadU32(p)} << 32) | ReadU32(p + 4); }

std::string TaggedKey(char tag, std::string_view key) {
  std::string out(1, tag);
  out.append(key);
  return out;
}
std::string HeaderKey(std::string_view key) { return TaggedKey(kHeaderTag, key); }
std::string AccessKey(std::string_view key) { return TaggedKey(kAccessTag, key); }

std::string ChunkGenPrefix(std::string_view key, uint64_t gen) {
  std::string out = RocksChunkKeyPrefix(key);
  AppendU64(gen, &out);
  return out;
}

std::string ChunkKey(std::string_view key, uint64_t gen, uint32_t index) {
  std::string out = ChunkGenPrefix(key, gen);
  AppendU32(index, &out);
  return out;
}

// Parses a 'C' key into (key, gen). False when malformed.
bool ParseChunkKey(rocksdb::Slice k, std::string* key, uint64_t* gen) {
  if (k.size() < 1 + 4 || k[0] != kChunkTag) return false;
  const uint32_t len = ReadU32(k.data() + 1);
  if (k.size() != 1 + 4 + size_t{len} + 8 + 4) return false;
  key->assign(k.data() + 5, len);
  *gen = ReadU64(k.data() + 5 + len);
  return true;
}

std::string EncodeHeaderRecord(uint64_t gen, const ValueLayout& layout) {
  std::string out;
  AppendU64(gen, &out);
  lazyrag::v1::ValueHeader header;
  LayoutToProto(layout, &header);
  header.AppendToString(&out);
  return out;
}

absl::Status DecodeHeaderRecord(std::string_view record, uint64_t* gen, ValueLayout* layout) {
  lazyrag::v1::ValueHeader header;
  if (record.size() < 8 ||
      !header.ParseFromArray(record.data() + 8, static_cast<int>(record.size() - 8))) {
    return absl::DataLossError("stored header unreadable");
  }
  *gen = ReadU64(record.data());
  auto parsed = LayoutFromProto(header);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat("stored header invalid: ", parsed.status().message()));
  }
  *layout = *std::move(parsed);
  return absl::OkStatus();
}

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(std::string(what), ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain() || s.IsShutdownInProgress()) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

class RocksEngine;

class RocksPutSession final : public PutSession {
 public:
  RocksPutSession(RocksEngine* engine, std::string key, ValueLayout layout, uint64_t gen)
      : engine_(engine), key_(std::move(key)), layout_(std::move(layout)), gen_(gen) {}
  ~RocksPutSession() override;

  absl::Status AddChunk(uint32_t index, std::string_view data, uint32_t crc32c) override;
  absl::StatusOr<bool> Commit() override;

 private:
  RocksEngine* const engine_;
  const std::string key_;
  const ValueLayout layout_;
  const uint64_t gen_;
  uint32_t added_ = 0;
  bool committed_ = false;
};

class RocksValueReader final : public ValueReader {
 public:
  RocksValueReader(RocksEngine* engine, std::string key, ValueLayout layout, uint64_t gen,
                   const rocksdb::Snapshot* snapshot);
  ~RocksValueReader() override;

  const ValueLayout& layout() const override { return layout_; }
  absl::Status ReadChunk(uint32_t index, std::string* data, uint32_t* crc32c) override;

 private:
  RocksEngine* const engine_;
  const std::string key_;
  const ValueLayout layout_;
  const uint64_t gen_;
  const rocksdb::Snapshot* const snapshot_;
};

class RocksEngine final : public KvEngine {
 public:
  explicit RocksEngine(RocksEngineOptions options) : options_(std::move(options)) {}
  ~RocksEngine() override {
    if (db_ != nullptr) {
      rocksdb::Status s = db_->Close();
      if (!s.ok()) {
        LOG_WARNING << "kvstore: closing RocksDB: " << s.ToString();
      }
    }
  }

  absl::Status Init();

  absl::StatusOr<std::unique_ptr<PutSession>> BeginPut(std::string_view key,
                                                       const ValueLayout& layout) override {
    if (layout.total_size > options_.capacity_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("value of ", layout.total_size,
                                                       " bytes is larger than the capacity of ",
                                                       options_.capacity_bytes, " bytes"));
    }
    const uint64_t gen = next_gen_.fetch_add(1);
    return std::make_unique<RocksPutSession>(this, std::string(key), layout, gen);
  }

  absl::StatusOr<std::unique_ptr<ValueReader>> Open(std::string_view key) override;
  absl::StatusOr<KeyStat> Stat(std::string_view key) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;
  absl::StatusOr<uint64_t> EvictTo(uint64_t target_bytes) override;
  EngineUsage Usage() const override {
    absl::MutexLock lock(&mu_);
    return {entries_.size(), bytes_, options_.capacity_bytes};
  }

  // For sessions and readers.
  rocksdb::DB* db() { return db_.get(); }
  absl::StatusOr<bool> CommitPut(const std::string& key, const ValueLayout& layout, uint64_t gen);
  void CountCorruption() {
    if (options_.metrics != nullptr) options_.metrics->CountCorruption("disk");
  }

 private:
  struct Entry {
    uint64_t gen = 0;
    uint64_t size = 0;
    uint32_t num_chunks = 0;
    int64_t last_access_ms = 0;
    uint64_t tick = 0;  // position in lru_
  };

  int64_t NowMs() const { return absl::ToUnixMillis(absl::Now()); }
  static void AddChunkDeletes(const std::string& key, const Entry& e, rocksdb::WriteBatch* batch) {
    for (uint32_t i = 0; i < e.num_chunks; ++i) batch->Delete(ChunkKey(key, e.gen, i));
  }
  static void AddEntryDeletes(const std::string& key, const Entry& e, rocksdb::WriteBatch* batch) {
    batch->Delete(HeaderKey(key));
    batch->Delete(AccessKey(key));
    AddChunkDeletes(key, e, batch);
  }
  void EraseLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishUsageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.metrics != nullptr) options_.metrics->SetUsage(entries_.size(), bytes_);
  }
  // Adds least recently used entries other than `keep` to `batch` until `*bytes` <= target.
  std::vector<std::string> PickVictimsLocked(uint64_t target, std::string_view keep,
                                             uint64_t* bytes, rocksdb::WriteBatch* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RemoveOrphanChunks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RocksEngineOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  std::atomic<uint64_t> next_gen_{0};

  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, std::string>> lru_ ABSL_GUARDED_BY(mu_);  // (tick, key)
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_tick_ ABSL_GUARDED_BY(mu_) = 1;
};

RocksPutSession::~RocksPutSession() {
  if (committed_ || added_ == 0) return;
  rocksdb::WriteBatch batch;
  for (uint32_t i = 0; i < added_; ++i) batch.Delete(ChunkKey(key_, gen_, i));
  rocksdb::Status s = engine_->db()->Write(rocksdb::WriteOptions(), &batch);
  if (!s.ok()) {
    LOG_WARNING << "kvstore: dropping an abandoned put: " << s.ToString();
  }
}

absl::Status RocksPutSession::AddChunk(uint32_t index, std::string_view data, uint32_t crc32c) {
  if (committed_ || index != added_ || index >= layout_.num_chunks) {
    return absl::FailedPreconditionError(absl::StrCat("chunk ", index, " out of order"));
  }
  char crc_le[4];
  for (int i = 0; i < 4; ++i) crc_le[i] = static_cast<char>(crc32c >> (8 * i));
  const std::string k = ChunkKey(key_, gen_, index);
  rocksdb::Slice key_part(k);
  rocksdb::Slice value_parts[2] = {rocksdb::Slice(crc_le, 4),
                                   rocksdb::Slice(data.data(), data.size())};
  rocksdb::WriteBatch batch(k.size() + data.size() + 64);
  rocksdb::Status s =
      batch.Put(rocksdb::SliceParts(&key_part, 1), rocksdb::SliceParts(value_parts, 2));
  // Chunks skip the write-ahead log: nothing points to them until the commit, which first
  // flushes them into blob files (Commit), so the value is written to disk once, not twice. A
  // crash before that loses only chunks no header refers to.
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  if (s.ok()) s = engine_->db()->Write(wo, &batch);
  RETURN_IF_ERROR(FromRocks(s, "writing a chunk"));
  ++added_;
  return absl::OkStatus();
}

absl::StatusOr<bool> RocksPutSession::Commit() {
  if (committed_ || added_ != layout_.num_chunks) {
    return absl::FailedPreconditionError(
        absl::StrCat("commit after ", added_, " of ", layout_.num_chunks, " chunks"));
  }
  // The chunks (written without the log) reach their files before the header that makes them
  // visible is written.
  rocksdb::FlushOptions fo;
  fo.wait = true;
  fo.allow_write_stall = true;
  RETURN_IF_ERROR(FromRocks(engine_->db()->Flush(fo), "flushing a put's chunks"));
  auto replaced = engine_->CommitPut(key_, layout_, gen_);
  if (replaced.ok()) committed_ = true;
  return replaced;
}

RocksValueReader::RocksValueReader(RocksEngine* engine, std::string key, ValueLayout layout,
                                   uint64_t gen, const rocksdb::Snapshot* snapshot)
    : engine_(engine),
      key_(std::move(key)),
      layout_(std::move(layout)),
      gen_(gen),
      snapshot_(snapshot) {}

RocksValueReader::~RocksValueReader() { engine_->db()->ReleaseSnapshot(snapshot_); }

absl::Status RocksValueReader::ReadChunk(uint32_t index, std::string* data, uint32_t* crc32c) {
  if (index >= layout_.num_chunks) {
    return absl::OutOfRangeError(absl::StrCat("chunk ", index, " of ", layout_.num_chunks));
  }
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot_;
  ro.fill_cache = false;
  rocksdb::PinnableSlice value;
  rocksdb::Status s = engine_->db()->Get(ro, engine_->db()->DefaultColumnFamily(),
                                         ChunkKey(key_, gen_, index), &value);
  auto where = [&] { return absl::StrCat(DescribeKey(key_), " chunk ", index); };
  if (s.IsNotFound()) {
    engine_->CountCorruption();
    return absl::DataLossError(absl::StrCat(where(), " missing from disk"));
  }
  if (s.IsCorruption()) engine_->CountCorruption();
  if (!s.ok()) return FromRocks(s, absl::StrCat("reading ", where()));
  const uint64_t want = layout_.ChunkEnd(index) - layout_.ChunkBegin(index);
  if (value.size() != 4 + want) {
    engine_->CountCorruption();
    return absl::DataLossError(
        absl::StrCat(where(), " has ", value.size() - 4, " bytes on disk, ", want, " expected"));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(value.data());
  const uint32_t stored =
      uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
  std::string_view bytes(value.data() + 4, value.size() - 4);
  if (Crc32c(bytes) != stored) {
    engine_->CountCorruption();
    return absl::DataLossError(absl::StrCat(where(), " failed its CRC-32C check on disk"));
  }
  data->assign(bytes);
  *crc32c = stored;
  return absl::OkStatus();
}

absl::Status RocksEngine::Init() {
  if (options_.data_dir.empty()) return absl::InvalidArgumentError("kvstore: data_dir is empty");
  rocksdb::Options o;
  o.create_if_missing = true;
  o.max_background_jobs = 2;
  // Values are MiB-sized chunks: keep them in blob files, out of the LSM tree, so compaction
  // does not rewrite them.
  o.enable_blob_files = true;
  o.min_blob_size = 64 << 10;
  o.blob_file_size = 256 << 20;
  o.enable_blob_garbage_collection = true;
  o.write_buffer_size = 64 << 20;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, options_.data_dir, &raw);
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
      return absl::UnavailableError(absl::StrCat("kvstore: ", options_.data_dir,
                                                 " is in use by another process: ", s.ToString()));
    }
    return FromRocks(s, absl::StrCat("opening ", options_.data_dir));
  }
  db_.reset(raw);

  // Generations: epoch << 32 | counter, unique across restarts.
  std::string epoch_value;
  uint64_t epoch = 0;
  s = db_->Get(rocksdb::ReadOptions(), kEpochKey, &epoch_value);
  if (s.ok() && epoch_value.size() == 8) epoch = ReadU64(epoch_value.data());
  if (!s.ok() && !s.IsNotFound()) return FromRocks(s, "reading epoch");
  ++epoch;
  epoch_value.clear();
  AppendU64(epoch, &epoch_value);
  rocksdb::WriteOptions sync;
  sync.sync = true;
  RETURN_IF_ERROR(FromRocks(db_->Put(sync, kEpochKey, epoch_value), "writing epoch"));
  next_gen_ = epoch << 32;

  absl::MutexLock lock(&mu_);
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    rocksdb::WriteBatch bad;
    for (it->Seek(std::string(1, kHeaderTag)); it->Valid() && it->key()[0] == kHeaderTag;
         it->Next()) {
      std::string key = it->key().ToString().substr(1);
      Entry e;
      ValueLayout layout;
      absl::Status st = DecodeHeaderRecord(it->value().ToStringView(), &e.gen, &layout);
      if (!st.ok()) {
        LOG_ERROR << "kvstore: dropping " << DescribeKey(key) << ": " << st;
        CountCorruption();
        bad.Delete(it->key());
        continue;
      }
      e.size = layout.total_size;
      e.num_chunks = layout.num_chunks;
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
  RETURN_IF_ERROR(RemoveOrphanChunks());
  if (bytes_ > options_.capacity_bytes) {
    uint64_t bytes = bytes_;
    rocksdb::WriteBatch batch;
    auto victims = PickVictimsLocked(options_.capacity_bytes, "", &bytes, &batch);
    RETURN_IF_ERROR(FromRocks(db_->Write(sync, &batch), "evicting at open"));
    for (const auto& v : victims) EraseLocked(v);
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

// Chunks of a generation no header points at were left by a put that never committed.
absl::Status RocksEngine::RemoveOrphanChunks() {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  rocksdb::WriteBatch batch;
  uint64_t orphans = 0;
  std::string key;
  uint64_t gen = 0;
  for (it->Seek(std::string(1, kChunkTag)); it->Valid() && it->key()[0] == kChunkTag;) {
    if (!ParseChunkKey(it->key(), &key, &gen)) {
      batch.Delete(it->key());
      ++orphans;
      it->Next();
      continue;
    }
    auto e = entries_.find(key);
    if (e != entries_.end() && e->second.gen == gen) {
      it->Seek(ChunkGenPrefix(key, gen + 1));  // skip this live value's chunks
      continue;
    }
    batch.Delete(it->key());
    ++orphans;
    it->Next();
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "scanning chunks"));
  if (orphans > 0) {
    LOG_INFO << "kvstore: removing " << orphans << " chunks of puts that never committed";
    RETURN_IF_ERROR(FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "removing orphans"));
  }
  return absl::OkStatus();
}

void RocksEngine::EraseLocked(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  lru_.erase({it->second.tick, key});
  bytes_ -= it->second.size;
  entries_.erase(it);
}

std::vector<std::string> RocksEngine::PickVictimsLocked(uint64_t target, std::string_view keep,
                                                        uint64_t* bytes,
                                                        rocksdb::WriteBatch* batch) {
  std::vector<std::string> victims;
  for (auto it = lru_.begin(); *bytes > target && it != lru_.end(); ++it) {
    if (it->second == keep) continue;
    const Entry& e = entries_.at(it->second);
    AddEntryDeletes(it->second, e, batch);
    *bytes -= e.size;
    victims.push_back(it->second);
  }
  return victims;
}

absl::StatusOr<bool> RocksEngine::CommitPut(const std::string& key, const ValueLayout& layout,
                                            uint64_t gen) {
  const int64_t now = NowMs();
  std::string access;
  AppendU64(static_cast<uint64_t>(now), &access);
  absl::MutexLock lock(&mu_);
  rocksdb::WriteBatch batch;
  batch.Put(HeaderKey(key), EncodeHeaderRecord(gen, layout));
  batch.Put(AccessKey(key), access);
  auto old = entries_.find(key);
  const bool replaced = old != entries_.end();
  uint64_t bytes = bytes_ + layout.total_size;
  if (replaced) {
    AddChunkDeletes(key, old->second, &batch);
    bytes -= old->second.size;
  }
  std::vector<std::string> victims =
      PickVictimsLocked(options_.capacity_bytes, key, &bytes, &batch);
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_commits;
  RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "committing a put"));
  for (const auto& v : victims) EraseLocked(v);
  EraseLocked(key);
  Entry e{gen, layout.total_size, layout.num_chunks, now, next_tick_++};
  lru_.emplace(e.tick, key);
  bytes_ += e.size;
  entries_[key] = e;
  if (options_.metrics != nullptr && !victims.empty()) {
    options_.metrics->CountEvictions(victims.size());
  }
  PublishUsageLocked();
  return replaced;
}

absl::StatusOr<std::unique_ptr<ValueReader>> RocksEngine::Open(std::string_view key) {
  const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot;
  std::string record;
  rocksdb::Status s = db_->Get(ro, HeaderKey(key), &record);
  if (!s.ok()) {
    db_->ReleaseSnapshot(snapshot);
    if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat(DescribeKey(key), " not stored"));
    return FromRocks(s, "reading a header");
  }
  uint64_t gen = 0;
  ValueLayout layout;
  absl::Status st = DecodeHeaderRecord(record, &gen, &layout);
  if (!st.ok()) {
    db_->ReleaseSnapshot(snapshot);
    CountCorruption();
    return st;
  }
  const int64_t now = NowMs();
  bool touched = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(std::string(key));
    if (it != entries_.end() && it->second.gen == gen) {
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
  return std::make_unique<RocksValueReader>(this, std::string(key), std::move(layout), gen,
                                            snapshot);
}

absl::StatusOr<KeyStat> RocksEngine::Stat(std::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(std::string(key));
  if (it == entries_.end()) return KeyStat{};
  return KeyStat{true, it->second.size, it->second.last_access_ms};
}

absl::StatusOr<bool> RocksEngine::Delete(std::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(std::string(key));
  if (it == entries_.end()) return false;
  rocksdb::WriteBatch batch;
  AddEntryDeletes(it->first, it->second, &batch);
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_commits;
  RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "deleting"));
  EraseLocked(std::string(key));
  PublishUsageLocked();
  return true;
}

absl::StatusOr<uint64_t> RocksEngine::EvictTo(uint64_t target_bytes) {
  absl::MutexLock lock(&mu_);
  uint64_t bytes = bytes_;
  rocksdb::WriteBatch batch;
  auto victims = PickVictimsLocked(target_bytes, "", &bytes, &batch);
  if (victims.empty()) return 0;
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_commits;
  RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "evicting"));
  for (const auto& v : victims) EraseLocked(v);
  if (options_.metrics != nullptr) options_.metrics->CountEvictions(victims.size());
  PublishUsageLocked();
  return victims.size();
}

}  // namespace

std::string RocksChunkKeyPrefix(std::string_view encoded_key) {
  std::string out(1, kChunkTag);
  AppendU32(static_cast<uint32_t>(encoded_key.size()), &out);
  out.append(encoded_key);
  return out;
}

absl::StatusOr<std::unique_ptr<KvEngine>> OpenRocksEngine(const RocksEngineOptions& options) {
  auto engine = std::make_unique<RocksEngine>(options);
  RETURN_IF_ERROR(engine->Init());
  return engine;
}

}  // namespace lazyrag::kvstore
