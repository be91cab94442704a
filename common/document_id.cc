#include "common/document_id.h"

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
  for (int32_t t : token_ids) {
    uint8_t b[4] = {uint8_t(t), uint8_t(t >> 8), uint8_t(t >> 16), uint8_t(uint32_t(t) >> 24)};
    h.Update(b, 4);
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
