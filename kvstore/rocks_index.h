// The RocksDB index of the kvstore's engine (rocks_engine.cc): its row format, and the
// maintenance that needs no engine state (dropping rows of the earlier format, rebuilding the
// index from the value files' trailers).
//
// Rows (bytewise order; integers big-endian so they sort numerically):
//   'V' key -> u64 generation, u32 n, n x u32le chunk CRC-32C, serialized lazyrag.v1.ValueHeader
//   'T' key -> u64 last access, Unix ms (best effort, not synced)
//   'M' "epoch" -> u64, bumped at every open
// Rows 'H' and 'C' are the earlier format (chunks inside RocksDB).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kvstore/format.h"
#include "kvstore/value_files.h"
#include "rocksdb/db.h"

namespace lazyrag::kvstore {

inline constexpr char kValueTag = 'V';
inline constexpr char kAccessTag = 'T';
inline constexpr char kEpochKey[] = "Mepoch";
inline constexpr char kLegacyHeaderTag = 'H';
inline constexpr char kLegacyChunkTag = 'C';

void AppendU64(uint64_t v, std::string* out);
uint64_t ReadU64(const char* p);

std::string ValueKey(std::string_view key);
std::string AccessKey(std::string_view key);

// A 'V' row: the value of generation `gen` lives in values/<gen>.
struct ValueRecord {
  uint64_t gen = 0;
  ValueLayout layout;
  std::vector<uint32_t> crcs;
};
std::string EncodeValueRecord(uint64_t gen, const ValueLayout& layout,
                              std::span<const uint32_t> crcs);
// DATA_LOSS when malformed.
absl::Status DecodeValueRecord(std::string_view record, ValueRecord* out);

// A RocksDB status as ours: NOT_FOUND, DATA_LOSS (corruption), UNAVAILABLE (busy, timed out,
// shutting down), INTERNAL otherwise; "what: ..." as the message.
absl::Status FromRocks(const rocksdb::Status& s, std::string_view what);

// Deletes every row of the earlier format (logged: those values are recomputed).
absl::Status DropLegacyRows(rocksdb::DB* db);
// Writes rows for every value file whose trailer is intact, the newest generation of each key,
// with `now_ms` as their access time. REQUIRES: an index without 'V' rows.
absl::Status RebuildIndexFromFiles(rocksdb::DB* db, const ValueFiles& files, int64_t now_ms);

}  // namespace lazyrag::kvstore
