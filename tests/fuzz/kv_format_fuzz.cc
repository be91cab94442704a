// libFuzzer target: the stored document-KV formats, as a shard or a worker reads them back
// from a disk, a peer or the network. The first byte picks the reader; the rest is its input:
//   0: an encoded key (kvstore/format.h DecodeKey; one that decodes must encode back to itself)
//   1: a serialized lazyrag.v1.ValueHeader, checked as a Put's header is (LayoutFromProto),
//      then its chunk and layer ranges
//   2: a kvstore index record (kvstore/rocks_index.h DecodeValueRecord)
//   3: a stored document (worker/engine/document_codec.h): 44 bytes of metadata, then the
//      value bytes, decoded for a small model shape in both KV dtypes
// Any input must give a value or a clean status, never a crash, hang, leak or undefined
// behaviour.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvstore/format.h"
#include "kvstore/rocks_index.h"
#include "lazyrag/v1/kvstore.pb.h"
#include "worker/engine/document_codec.h"

namespace {

using namespace lazyrag;

void Key(std::string_view in) {
  (void)kvstore::DescribeKey(in);
  auto key = kvstore::DecodeKey(in);
  if (!key.ok()) return;
  auto again = kvstore::EncodeKey(*key);
  // A key that decodes is canonical: two encodings of one key would store it twice.
  if (!again.ok() || *again != in) __builtin_trap();
}

void Header(std::string_view in) {
  v1::ValueHeader header;
  if (!header.ParseFromArray(in.data(), int(in.size()))) return;
  auto layout = kvstore::LayoutFromProto(header);
  if (!layout.ok()) return;
  if (layout->num_chunks != kvstore::NumChunks(layout->total_size, layout->chunk_size)) {
    __builtin_trap();
  }
  if (layout->num_chunks > 0) {
    const uint32_t last = layout->num_chunks - 1;
    if (layout->ChunkEnd(last) != layout->total_size) __builtin_trap();
    if (layout->ChunkBegin(last) >= layout->ChunkEnd(last)) __builtin_trap();
  }
  const uint32_t n = uint32_t(layout->layer_offsets.size());
  for (uint32_t first : {0u, n / 2, n, n + 1}) {
    for (uint32_t count : {0u, 1u, n}) {
      auto range = kvstore::LayerRange(*layout, first, count);
      if (range.ok() && (range->begin > range->end || range->end > layout->total_size)) {
        __builtin_trap();
      }
    }
  }
  v1::ValueHeader back;
  kvstore::LayoutToProto(*layout, &back);
  if (!kvstore::LayoutFromProto(back).ok()) __builtin_trap();
}

void Record(std::string_view in) {
  kvstore::ValueRecord record;
  if (!kvstore::DecodeValueRecord(in, &record).ok()) return;
  if (record.crcs.size() != record.layout.num_chunks) __builtin_trap();
}

void Document(std::string_view in) {
  ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position = 128;
  StoredDocument stored;
  stored.metadata = std::string(in.substr(0, 44));
  stored.bytes = std::string(in.substr(std::min<size_t>(44, in.size())));
  for (KvDtype dtype : {KvDtype::kFloat32, KvDtype::kBFloat16}) {
    (void)DecodeDocumentHeader(stored.metadata, c, dtype);
    auto doc = DecodeDocument(stored, c, dtype);
    if (!doc.ok()) continue;
    if (doc->payload.size() != DocumentPayloadBytes(c, dtype, int64_t(doc->tokens.size()))) {
      __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      Key(in);
      break;
    case 1:
      Header(in);
      break;
    case 2:
      Record(in);
      break;
    default:
      Document(in);
      break;
  }
  return 0;
}
