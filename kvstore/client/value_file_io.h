// The file side of the kvstore client's same-host fast path (kvstore_client.h): value bytes
// read from a shard's value file into the caller's spans, and written into a hand-over file,
// several threads for large values, every chunk's CRC-32C checked on the way in.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/client/kvstore_client.h"
#include "kvstore/format.h"

namespace lazyrag::kvstore {

// The destination spans of a value's bytes, addressed by value offset.
class Scatter {
 public:
  // INTERNAL when the spans hold fewer than `bytes` bytes. `observer` (may be null) is told
  // of each range passed to Checked().
  static absl::StatusOr<Scatter> Of(std::vector<MutableBytes> spans, uint64_t bytes,
                                    ChunkObserver observer = nullptr);
  // The pieces of [begin, begin + size), in order. REQUIRES: within the spans.
  std::vector<MutableBytes> Pieces(uint64_t begin, uint64_t size) const;
  // Copies `data` to value offset `begin`.
  void Write(uint64_t begin, std::string_view data) const;
  // [begin, begin + size) is in place and passed its check: tells the observer, piece by piece.
  void Checked(uint64_t begin, uint64_t size) const;

 private:
  ChunkObserver observer_;
  std::vector<MutableBytes> spans_;
  std::vector<uint64_t> starts_;
};

// How many threads move a value of `bytes`: `max_threads` from 64 MiB on, else 1.
int ThreadsFor(uint64_t bytes, int max_threads);

// Reads every chunk of the `layout`-shaped value in `fd` into `dst` and checks chunk i against
// crcs[i]: DATA_LOSS naming the chunk on a mismatch (and *corrupt set), the read's error
// otherwise. REQUIRES: crcs.size() == layout.num_chunks.
absl::Status ReadValueFile(int fd, const ValueLayout& layout, std::span<const uint32_t> crcs,
                           const Scatter& dst, int threads, bool* corrupt);

// One chunk of a value being written: bytes [offset, offset + size).
struct ValueFileChunk {
  uint64_t offset = 0;
  uint64_t size = 0;
};
// Writes each chunk of `value` at its offset of `fd`, starting the kernel's write-out as it
// goes (so that a later fdatasync waits for less).
absl::Status WriteValueFile(int fd, std::string_view value, std::span<const ValueFileChunk> chunks,
                            int threads);

// Whether the file <dir>/local-token holds exactly `token`.
bool HoldsLocalToken(const std::string& dir, const std::string& token);

}  // namespace lazyrag::kvstore
