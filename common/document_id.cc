#include "common/document_id.h"

#include <algorithm>

#include "common/sha256.h"

namespace lazyrag {
namespace {

void PutLengthPrefixed(Sha256& h, std::string_view s) {
  uint64_t n = s.size();
  uint8_t le[8];
  for (int i = 0; i < 8; ++i) le[i] = uint8_t(n >> (8 * i));
  h.Update(le, 8);
  h.Update(s);
}

}  // namespace

std::string DocumentId(std::string_view model_fingerprint, std::string_view cache_namespace,
                       std::span<const int32_t> token_ids) {
  Sha256 h;
  h.Update("lazyrag.doc.v1");
  PutLengthPrefixed(h, model_fingerprint);
  PutLengthPrefixed(h, cache_namespace);
  uint64_t n = token_ids.size();
  uint8_t le[8];
  for (int i = 0; i < 8; ++i) le[i] = uint8_t(n >> (8 * i));
  h.Update(le, 8);
  // The ids as little-endian bytes, hashed in chunks (one call per token cost more than the
  // hashing itself).
  uint8_t buf[4 * 256];
  for (size_t i = 0; i < token_ids.size(); i += 256) {
    const size_t m = std::min<size_t>(256, token_ids.size() - i);
    for (size_t j = 0; j < m; ++j) {
      const uint32_t t = uint32_t(token_ids[i + j]);
      buf[4 * j] = uint8_t(t);
      buf[4 * j + 1] = uint8_t(t >> 8);
      buf[4 * j + 2] = uint8_t(t >> 16);
      buf[4 * j + 3] = uint8_t(t >> 24);
    }
    h.Update(buf, 4 * m);
  }
  return ToHex(h.Finish());
}

bool IsDocumentId(std::string_view id) {
  if (id.size() != 64) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace lazyrag
