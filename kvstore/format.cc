#include "kvstore/format.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace lazyrag::kvstore {
namespace {

void AppendField(std::string_view field, std::string* out) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  const char len[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                       static_cast<char>(n >> 8), static_cast<char>(n)};
  out->append(len, 4);
  out->append(field);
}

bool ReadField(std::string_view* in, std::string* field) {
  if (in->size() < 4) return false;
  const auto* p = reinterpret_cast<const uint8_t*>(in->data());
  const uint32_t n = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
  in->remove_prefix(4);
  if (in->size() < n) return false;
  field->assign(in->substr(0, n));
  in->remove_prefix(n);
  return true;
}

}  // namespace

uint64_t ValueLayout::ChunkEnd(uint32_t index) const {
  return std::min<uint64_t>(total_size, uint64_t{index + 1} * chunk_size);
}

uint32_t NumChunks(uint64_t total_size, uint32_t chunk_size) {
  if (chunk_size == 0) return 0;
  return static_cast<uint32_t>((total_size + chunk_size - 1) / chunk_size);
}

absl::StatusOr<std::string> EncodeKey(const lazyrag::v1::KvKey& key) {
  std::string out;
  switch (key.kind_case()) {
    case lazyrag::v1::KvKey::kDocument: {
      const auto& d = key.document();
      if (d.model_fingerprint().empty() || d.document_id().empty()) {
        return absl::InvalidArgumentError(
            "key: document key needs model_fingerprint and document_id");
      }
      out.push_back('D');
      AppendField(d.model_fingerprint(), &out);
      AppendField(d.cache_namespace(), &out);
      AppendField(d.document_id(), &out);
      break;
    }
    case lazyrag::v1::KvKey::kRaw:
      if (key.raw().empty()) return absl::InvalidArgumentError("key: empty raw key");
      out.push_back('R');
      out.append(key.raw());
      break;
    default:
      return absl::InvalidArgumentError("key: missing (neither document nor raw)");
  }
  if (out.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: ", out.size(), " bytes encoded, more than the limit of ", kMaxKeyBytes));
  }
  return out;
}

absl::StatusOr<lazyrag::v1::KvKey> DecodeKey(std::string_view encoded) {
  lazyrag::v1::KvKey key;
  bool parsed = false;
  if (encoded.size() >= 2 && encoded[0] == 'R') {
    key.set_raw(std::string(encoded.substr(1)));
    parsed = true;
  } else if (!encoded.empty() && encoded[0] == 'D') {
    std::string_view in = encoded.substr(1);
    auto* d = key.mutable_document();
    parsed = ReadField(&in, d->mutable_model_fingerprint()) &&
             ReadField(&in, d->mutable_cache_namespace()) &&
             ReadField(&in, d->mutable_document_id()) && in.empty();
  }
  // Only what EncodeKey produces (no empty fingerprint or id, no oversized key) is a key.
  if (parsed) {
    auto again = EncodeKey(key);
    if (again.ok() && *again == encoded) return key;
  }
  return absl::InvalidArgumentError("key: not a canonical key encoding");
}

std::string DescribeKey(std::string_view encoded) {
  std::string out;
  auto key = DecodeKey(encoded);
  if (!key.ok()) {
    out = absl::StrCat("<bad key ", absl::CHexEscape(std::string(encoded.substr(0, 64))), ">");
  } else if (key->has_document()) {
    out = absl::StrCat("doc:", absl::CHexEscape(key->document().model_fingerprint()), "/",
                       absl::CHexEscape(key->document().cache_namespace()), "/",
                       absl::CHexEscape(key->document().document_id()));
  } else {
    out = absl::StrCat("raw:", absl::CHexEscape(key->raw()));
  }
  if (out.size() > 200) out = out.substr(0, 200) + "...";
  return out;
}

absl::StatusOr<ValueLayout> LayoutFromProto(const lazyrag::v1::ValueHeader& header) {
  if (header.checksum_algorithm() != lazyrag::v1::CHECKSUM_ALGORITHM_UNSPECIFIED &&
      header.checksum_algorithm() != lazyrag::v1::CHECKSUM_ALGORITHM_CRC32C) {
    return absl::InvalidArgumentError("header: unsupported checksum algorithm (want CRC32C)");
  }
  if (header.chunk_size() == 0 || header.chunk_size() > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header: chunk_size ", header.chunk_size(), " outside 1..", kMaxChunkBytes));
  }
  if (header.total_size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("header: total_size ", header.total_size(),
                                                   " above the limit of ", kMaxValueBytes));
  }
  const uint32_t want_chunks = NumChunks(header.total_size(), header.chunk_size());
  if (header.num_chunks() != want_chunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header: num_chunks ", header.num_chunks(), " but total_size ", header.total_size(),
        " / chunk_size ", header.chunk_size(), " needs ", want_chunks));
  }
  if (header.metadata().size() > kMaxMetadataBytes) {
    return absl::InvalidArgumentError(absl::StrCat("header: metadata of ", header.metadata().size(),
                                                   " bytes above the limit of ",
                                                   kMaxMetadataBytes));
  }
  if (static_cast<size_t>(header.layer_offsets_size()) > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("header: more than ", kMaxLayers, " layers"));
  }
  ValueLayout layout;
  layout.total_size = header.total_size();
  layout.chunk_size = header.chunk_size();
  layout.num_chunks = header.num_chunks();
  layout.metadata = header.metadata();
  layout.layer_offsets.assign(header.layer_offsets().begin(), header.layer_offsets().end());
  for (size_t i = 0; i < layout.layer_offsets.size(); ++i) {
    const uint64_t off = layout.layer_offsets[i];
    const bool ordered = i == 0 ? off == 0 : off >= layout.layer_offsets[i - 1];
    if (!ordered || off > layout.total_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "header: layer_offsets must start at 0, not decrease and stay within total_size; "
          "offset ",
          i, " is ", off));
    }
  }
  return layout;
}

void LayoutToProto(const ValueLayout& layout, lazyrag::v1::ValueHeader* header) {
  header->set_total_size(layout.total_size);
  header->set_chunk_size(layout.chunk_size);
  header->set_num_chunks(layout.num_chunks);
  header->mutable_layer_offsets()->Assign(layout.layer_offsets.begin(), layout.layer_offsets.end());
  header->set_checksum_algorithm(lazyrag::v1::CHECKSUM_ALGORITHM_CRC32C);
  header->set_metadata(layout.metadata);
}

absl::StatusOr<ByteRange> LayerRange(const ValueLayout& layout, uint32_t first_layer,
                                     uint32_t num_layers) {
  if (num_layers == 0) {
    if (first_layer != 0) {
      return absl::InvalidArgumentError("layer range: first_layer set but num_layers is 0");
    }
    return ByteRange{0, layout.total_size};
  }
  const size_t layers = layout.layer_offsets.size();
  if (layers == 0) {
    return absl::InvalidArgumentError("layer range: the value was stored without layer_offsets");
  }
  const uint64_t last = uint64_t{first_layer} + num_layers;
  if (last > layers) {
    return absl::OutOfRangeError(absl::StrCat("layer range: layers [", first_layer, ", ", last,
                                              ") asked, the value has ", layers));
  }
  ByteRange r;
  r.begin = layout.layer_offsets[first_layer];
  r.end = last == layers ? layout.total_size : layout.layer_offsets[last];
  return r;
}

}  // namespace lazyrag::kvstore
