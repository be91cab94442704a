// The bytes of stored values: one immutable file per put generation, named by the generation,
// under <data_dir>/values. The RocksDB index (rocks_engine.cc) holds each value's header and
// chunk checksums and points to its file by generation. A file is written whole (as
// <gen>.part), made durable and renamed to its final name before any header refers to it, and
// never changed after; replacing or evicting a value unlinks its file after the index commit,
// so a reader that opened the file keeps reading the value it opened.
//
// <data_dir>/incoming holds files that same-host clients wrote for the store to adopt
// (KvEngine::PutFile): the rename into values/ is the only copy-free way in.
//
// After its value's bytes each file carries a trailer naming its key and index record, so that
// a lost or corrupt index can be rebuilt from the files alone:
//   [u32le key length][key][record]  [u32le body length][u32le CRC-32C of the body][u64 magic]
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_io.h"
#include "kvstore/format.h"

namespace lazyrag::kvstore {

class ValueFiles {
 public:
  // Creates <data_dir>/values and <data_dir>/incoming when missing.
  static absl::StatusOr<ValueFiles> Open(const std::string& data_dir);

  const std::string& values_dir() const { return values_dir_; }
  const std::string& incoming_dir() const { return incoming_dir_; }
  std::string PathOf(uint64_t gen) const;
  std::string StagingPathOf(uint64_t gen) const;

  // A new, empty staging file for `gen` (<gen>.part), opened for writing.
  absl::StatusOr<UniqueFd> CreateStaging(uint64_t gen) const;
  void RemoveStaging(uint64_t gen) const;
  // Makes `fd` (the whole value, written at `path`) the file of `gen`: fdatasync when `sync`,
  // rename to its final name, fsync of the directory when `sync`.
  absl::Status Publish(int fd, const std::string& path, uint64_t gen, bool sync) const;
  absl::StatusOr<UniqueFd> OpenForRead(uint64_t gen) const;
  // Unlinks the file of `gen`; a missing file is not an error (logged otherwise).
  void Remove(uint64_t gen) const;
  // Deletes every value file whose generation `live` rejects, every staging file, and every
  // file in incoming/ (called at open, before any client can be writing there). Returns how
  // many files were deleted.
  absl::StatusOr<uint64_t> RemoveUnreferenced(const std::function<bool(uint64_t)>& live) const;
  // The generations of the value files present (not staging files).
  absl::StatusOr<std::vector<uint64_t>> Generations() const;

 private:
  ValueFiles(std::string values_dir, std::string incoming_dir)
      : values_dir_(std::move(values_dir)), incoming_dir_(std::move(incoming_dir)) {}

  std::string values_dir_;
  std::string incoming_dir_;
};

// Writes the trailer (key and index record) at `at`, the end of the value's bytes.
absl::Status WriteTrailer(int fd, uint64_t at, std::string_view key, std::string_view record);
// The key and index record from the trailer of the file `fd`; DATA_LOSS when it has none or a
// damaged one.
struct Trailer {
  std::string key;
  std::string record;
};
absl::StatusOr<Trailer> ReadTrailer(int fd);

// Checks chunk i of the `layout`-shaped value in `fd` against crcs[i] for every chunk, reading
// through a private mapping (no copy). DATA_LOSS naming the first bad chunk; DATA_LOSS when
// the file's size is not the layout's.
absl::Status VerifyValueFile(int fd, const ValueLayout& layout, std::span<const uint32_t> crcs);

}  // namespace lazyrag::kvstore
