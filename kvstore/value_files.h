// The bytes of stored values: one immutable file per put generation, named by the generation,
// under <data_dir>/values. The RocksDB index (rocks_engine.cc) holds each value's header and
// chunk checksums and points to its file by generation. A file is written whole (as
// <gen>.part), made durable and renamed to its final name before any header refers to it, and
// never changed after; replacing or evicting a value unlinks its file after the index commit,
// so a reader that opened the file keeps reading the value it opened.
//
// <data_dir>/incoming holds files that same-host clients wrote for the store to adopt
// (KvEngine::PutFile): the rename into values/ is the only copy-free way in.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

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

 private:
  ValueFiles(std::string values_dir, std::string incoming_dir)
      : values_dir_(std::move(values_dir)), incoming_dir_(std::move(incoming_dir)) {}

  std::string values_dir_;
  std::string incoming_dir_;
};

// Checks chunk i of the `layout`-shaped value in `fd` against crcs[i] for every chunk, reading
// through a private mapping (no copy). DATA_LOSS naming the first bad chunk; DATA_LOSS when
// the file's size is not the layout's.
absl::Status VerifyValueFile(int fd, const ValueLayout& layout, std::span<const uint32_t> crcs);

}  // namespace lazyrag::kvstore
