// What the kvstore server and its client library agree on beyond the proto: the canonical
// key encoding, size limits, and how a value is laid out in chunks and layers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lazyrag/v1/kvstore.pb.h"

namespace lazyrag::kvstore {

inline constexpr uint32_t kMaxChunkBytes = 4u << 20;      // 4 MiB
inline constexpr uint32_t kDefaultChunkBytes = 2u << 20;  // 2 MiB
inline constexpr uint64_t kMaxValueBytes = 1ull << 30;    // 1 GiB
inline constexpr size_t kMaxKeyBytes = 1024;              // encoded key
inline constexpr size_t kMaxMetadataBytes = 64 << 10;     // ValueHeader.metadata
inline constexpr size_t kMaxLayers = 4096;
inline constexpr size_t kMaxStatKeys = 1024;
// Largest gRPC message either side needs: a full chunk plus framing, or a header with the
// largest metadata and layer table. Servers and channels allow this much; nothing bigger is
// ever sent.
inline constexpr int kMaxMessageBytes = 8 << 20;

// The layout of a value (everything of ValueHeader but the checksum algorithm).
struct ValueLayout {
  uint64_t total_size = 0;
  uint32_t chunk_size = kDefaultChunkBytes;
  uint32_t num_chunks = 0;
  // Layer i spans [layer_offsets[i], layer_offsets[i+1]) and the last ends at total_size.
  // Empty when the value has no layer structure.
  std::vector<uint64_t> layer_offsets;
  std::string metadata;  // opaque

  // Bytes [begin, end) of chunk `index`. REQUIRES: index < num_chunks.
  uint64_t ChunkBegin(uint32_t index) const { return uint64_t{index} * chunk_size; }
  uint64_t ChunkEnd(uint32_t index) const;
};

// Fills in num_chunks for a value of `total_size` bytes cut in `chunk_size` pieces.
uint32_t NumChunks(uint64_t total_size, uint32_t chunk_size);

// Canonical byte encoding of a key (see kvstore.proto). INVALID_ARGUMENT for an empty,
// incomplete or oversized key.
absl::StatusOr<std::string> EncodeKey(const lazyrag::v1::KvKey& key);
// The inverse, for operators and logs.
absl::StatusOr<lazyrag::v1::KvKey> DecodeKey(std::string_view encoded);
// A readable form of an encoded key for log lines and error messages (truncated).
std::string DescribeKey(std::string_view encoded);

// Checks a header sent by a writer: chunk size 1..kMaxChunkBytes, total size within
// kMaxValueBytes, num_chunks consistent, layer offsets in order, metadata within limits.
// INVALID_ARGUMENT with the reason otherwise.
absl::StatusOr<ValueLayout> LayoutFromProto(const lazyrag::v1::ValueHeader& header);
void LayoutToProto(const ValueLayout& layout, lazyrag::v1::ValueHeader* header);

// The byte range [begin, end) of layers [first_layer, first_layer + num_layers).
// num_layers == 0 means the whole value. INVALID_ARGUMENT when the value has no layer table,
// OUT_OF_RANGE when the layers do not exist.
struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};
absl::StatusOr<ByteRange> LayerRange(const ValueLayout& layout, uint32_t first_layer,
                                     uint32_t num_layers);

}  // namespace lazyrag::kvstore
