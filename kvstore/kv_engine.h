// The storage engine behind the kvstore service: values are stored by canonical key
// (kvstore/format.h) as a layout plus checksummed chunks. The service talks to this interface
// only, so tests can pass a fault-injecting engine; OpenRocksEngine() is the real one.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/format.h"

namespace rocksdb {
class Env;
}

namespace lazyrag::kvstore {

struct KeyStat {
  bool present = false;
  uint64_t size = 0;
  int64_t last_access_unix_ms = 0;  // last put or read; 0 when absent
};

struct EngineUsage {
  uint64_t entries = 0;
  uint64_t bytes = 0;  // sum of stored values' total_size
  uint64_t capacity_bytes = 0;
};

// A put in progress. Chunks arrive in order; nothing is visible to readers until Commit().
// Destroying a session that was not committed abandons it and removes what it staged.
// Not thread-safe (one stream feeds one session). REQUIRES: destroyed before its engine.
class PutSession {
 public:
  virtual ~PutSession() = default;
  // REQUIRES: index == chunks added so far; data.size() == the layout's size for that chunk;
  // crc32c == Crc32c(data) (the caller has checked).
  virtual absl::Status AddChunk(uint32_t index, std::string_view data, uint32_t crc32c) = 0;
  // Makes the value visible at once (header and every chunk), replacing any earlier value of
  // the key and evicting least recently used values to stay within capacity. Returns whether
  // a value was replaced. REQUIRES: every chunk added.
  virtual absl::StatusOr<bool> Commit() = 0;
};

// A consistent view of one stored value: later puts, deletes or evictions of the key do not
// change what it reads. REQUIRES: destroyed before its engine.
class ValueReader {
 public:
  virtual ~ValueReader() = default;
  virtual const ValueLayout& layout() const = 0;
  // Reads chunk `index` and checks it against its stored CRC-32C: DATA_LOSS on mismatch (the
  // data is not returned). REQUIRES: index < layout().num_chunks.
  virtual absl::Status ReadChunk(uint32_t index, std::string* data, uint32_t* crc32c) = 0;
  // The same into `dst` (layout().ChunkEnd(index) - ChunkBegin(index) bytes); on DATA_LOSS the
  // bytes in `dst` are unspecified. Default: through ReadChunk.
  virtual absl::Status ReadChunkInto(uint32_t index, char* dst, uint32_t* crc32c);
  // Where a same-host reader finds the value's bytes: an immutable file holding exactly the
  // value, and the stored CRC-32C of each chunk. Empty when the engine keeps no such files.
  virtual std::string file_path() const { return {}; }
  virtual std::span<const uint32_t> chunk_crcs() const { return {}; }
  // Identifies the stored version read (a later put of the key gets another); 0: unknown.
  virtual uint64_t version() const { return 0; }
};

// Thread-safe.
class KvEngine {
 public:
  virtual ~KvEngine() = default;

  // `key` is an encoded key, `layout` already validated (LayoutFromProto).
  // RESOURCE_EXHAUSTED when the value alone is larger than the capacity.
  virtual absl::StatusOr<std::unique_ptr<PutSession>> BeginPut(std::string_view key,
                                                               const ValueLayout& layout) = 0;
  // A put whose bytes are already in the file at `path` (a same-host client wrote it under
  // local_dir()/incoming): chunk i must match crcs[i] (checked here; DATA_LOSS otherwise).
  // The file is consumed: on return it is the value's, or deleted. Returns whether a value was
  // replaced. Default: read through BeginPut / AddChunk / Commit.
  virtual absl::StatusOr<bool> PutFile(std::string_view key, const ValueLayout& layout,
                                       std::span<const uint32_t> crcs, const std::string& path);
  // The directory same-host clients may read value files from and hand files over in
  // (<dir>/incoming); empty when the engine keeps no value files.
  virtual std::string local_dir() const { return {}; }
  // NOT_FOUND when absent. Counts as an access for LRU.
  virtual absl::StatusOr<std::unique_ptr<ValueReader>> Open(std::string_view key) = 0;
  virtual absl::StatusOr<KeyStat> Stat(std::string_view key) = 0;
  // Returns whether the key was stored.
  virtual absl::StatusOr<bool> Delete(std::string_view key) = 0;
  // Evicts least recently used values until at most `target_bytes` are stored; returns how
  // many were evicted.
  virtual absl::StatusOr<uint64_t> EvictTo(uint64_t target_bytes) = 0;
  virtual EngineUsage Usage() const = 0;
};

class KvStoreMetrics;

struct RocksEngineOptions {
  // Directory of the RocksDB index (headers, chunk checksums, access times) and of the value
  // files (kvstore/value_files.h); created when missing. Required.
  std::string data_dir;
  // Byte capacity of stored values (sum of total_size). Default 64 GiB.
  uint64_t capacity_bytes = 64ull << 30;
  // fdatasync every value file and fsync the write-ahead log on every commit, so a committed
  // put survives a machine crash, not only a process crash. Default true.
  bool sync_commits = true;
  // RocksDB memtable size of the index (headers and access times). Small values make RocksDB
  // flush and compact often (the crash test uses that). Default 16 MiB.
  uint64_t index_write_buffer_bytes = 16 << 20;
  // Metrics to update (entries, bytes, evictions, corruptions). Optional, not owned.
  KvStoreMetrics* metrics = nullptr;
  // The RocksDB environment of the index; null: the default. For tests that inject faults.
  std::shared_ptr<rocksdb::Env> env;
};

// Opens (or creates) the database and drops what interrupted puts left behind (and values
// stored in the earlier chunks-in-RocksDB format, which are recomputed). One database per
// shard process: a second open of the same directory fails (UNAVAILABLE).
absl::StatusOr<std::unique_ptr<KvEngine>> OpenRocksEngine(const RocksEngineOptions& options);

// The file holding the value of `encoded_key` in the closed database at `data_dir` (opened
// read-only). For tests that corrupt stored bytes; NOT_FOUND when the key is not stored.
absl::StatusOr<std::string> StoredValuePath(const std::string& data_dir,
                                            std::string_view encoded_key);

}  // namespace lazyrag::kvstore
