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
  // `observer_verifies`: the observer checks every byte itself; the readers skip the CRC-32C.
  static absl::StatusOr<Scatter> Of(std::vector<MutableBytes> spans, uint64_t bytes,
                                    ChunkObserver observer = nullptr,
                                    bool observer_verifies = false);
  // Whether chunks written here need no CRC-32C check (CallOptions::on_chunk_verifies).
  bool skips_crc() const { return skip_crc_; }
  // The pieces of [begin, begin + size), in order. REQUIRES: within the spans.
  std::vector<MutableBytes> Pieces(uint64_t begin, uint64_t size) const;
  // Copies `data` to value offset `begin`.
  void Write(uint64_t begin, std::string_view data) const;
  // Copies `data` to value offset `begin` and returns its CRC-32C (0 when skips_crc()), in
  // cache-sized steps, each checksummed (and shown to the observer, if any) right after its copy.
  uint32_t Land(uint64_t begin, std::string_view data) const;
  bool observed() const { return observer_ != nullptr; }
  void Observe(uint64_t begin, const char* data, uint64_t size) const {
    observer_(begin, data, size);
  }

 private:
  ChunkObserver observer_;
  bool skip_crc_ = false;
  std::vector<MutableBytes> spans_;
  std::vector<uint64_t> starts_;
};

// How many threads move a value of `bytes`: `max_threads` from 64 MiB on, else 1.
int ThreadsFor(uint64_t bytes, int max_threads);

// Reads every chunk of the `layout`-shaped value in `fd` into `dst` and checks chunk i against
// crcs[i] (unless dst.skips_crc()): DATA_LOSS naming the chunk on a mismatch (and *corrupt
// set), the read's error otherwise. REQUIRES: crcs.size() == layout.num_chunks.
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
