#include "worker/engine/document_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace lazyrag {
namespace {

constexpr uint32_t kMagic = 0x564b5a4c;  // "LZKV" little-endian
constexpr uint32_t kChecksumCrc32c = 1;
constexpr uint32_t kChecksumCrc32cMac = 2;
constexpr int kHeaderWords = 11;
constexpr size_t kWordBytes = kHeaderWords * sizeof(uint32_t);
constexpr size_t kMacHeaderBytes = kWordBytes + kMacNonceBytes + kMacTagBytes;

}  // namespace

uint64_t DocumentPayloadBytes(const ModelConfig &c, KvDtype dtype, int64_t num_tokens) {
  return uint64_t(2) * c.num_layers * uint64_t(num_tokens) * c.kv_dim() *
         (dtype == KvDtype::kFloat32 ? 4 : 2);
}

DocumentMacBinding MacBindingOf(std::string_view metadata, const DocumentMacScope &scope) {
  return DocumentMacBinding{metadata.substr(0, kWordBytes), scope.model_fingerprint,
                            scope.cache_namespace, scope.document_id};
}

StoredDocument EncodeDocument(const ModelConfig &c, KvDtype dtype,
                              const std::vector<int32_t> &tokens, std::string_view payload,
                              const DocumentMacScope &mac) {
  StoredDocument doc;
  doc.bytes.reserve(tokens.size() * sizeof(int32_t) + payload.size());  // one allocation
  doc.bytes.resize(tokens.size() * sizeof(int32_t));
  std::memcpy(doc.bytes.data(), tokens.data(), doc.bytes.size());
  doc.bytes += payload;
  uint32_t theta_bits = 0;
  std::memcpy(&theta_bits, &c.rope_theta, sizeof(theta_bits));
  const uint32_t words[kHeaderWords] = {kMagic,
                                        kDocumentKvFormatVersion,
                                        uint32_t(dtype),
                                        uint32_t(c.num_layers),
                                        uint32_t(c.num_kv_heads),
                                        uint32_t(c.head_dim),
                                        uint32_t(tokens.size()),
                                        theta_bits,
                                        uint32_t(payload.size()),
                                        mac.key != nullptr ? kChecksumCrc32cMac : kChecksumCrc32c,
                                        Crc32c(doc.bytes)};
  doc.metadata.resize(sizeof(words));
  std::memcpy(doc.metadata.data(), words, sizeof(words));
  if (mac.key != nullptr) {
    const std::array<uint8_t, kMacNonceBytes> nonce = NewMacNonce();
    const MacTag tag =
        ComputeDocumentMac(*mac.key, nonce, MacBindingOf(doc.metadata, mac), doc.bytes);
    doc.metadata.append(reinterpret_cast<const char *>(nonce.data()), nonce.size());
    doc.metadata.append(reinterpret_cast<const char *>(tag.data()), tag.size());
  }
  return doc;
}

absl::StatusOr<DocumentKvHeader> DecodeDocumentHeader(std::string_view metadata,
                                                      const ModelConfig &c, KvDtype dtype) {
  uint32_t w[kHeaderWords];
  if (metadata.size() < sizeof(w)) {
    return absl::DataLossError("stored document: header has the wrong size");
  }
  std::memcpy(w, metadata.data(), sizeof(w));
  if (w[0] != kMagic || (w[9] != kChecksumCrc32c && w[9] != kChecksumCrc32cMac)) {
    return absl::DataLossError("stored document: not a lazyrag document header");
  }
  if (metadata.size() != (w[9] == kChecksumCrc32cMac ? kMacHeaderBytes : kWordBytes)) {
    return absl::DataLossError("stored document: header has the wrong size");
  }
  if (w[1] != kDocumentKvFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("stored document: format version ", w[1]));
  }
  DocumentKvHeader h;
  h.version = w[1];
  h.dtype = KvDtype(w[2]);
  h.num_layers = w[3];
  h.num_kv_heads = w[4];
  h.head_dim = w[5];
  h.num_tokens = w[6];
  std::memcpy(&h.rope_theta, &w[7], sizeof(float));
  h.payload_bytes = w[8];
  h.has_mac = w[9] == kChecksumCrc32cMac;
  if (h.has_mac) {
    std::memcpy(h.mac_nonce.data(), metadata.data() + kWordBytes, kMacNonceBytes);
    std::memcpy(h.mac_tag.data(), metadata.data() + kWordBytes + kMacNonceBytes, kMacTagBytes);
  }
  if (h.dtype != dtype || int(h.num_layers) != c.num_layers ||
      int(h.num_kv_heads) != c.num_kv_heads || int(h.head_dim) != c.head_dim ||
      h.rope_theta != c.rope_theta) {
    return absl::FailedPreconditionError("stored document: written for another shape or dtype");
  }
  if (h.payload_bytes != DocumentPayloadBytes(c, dtype, h.num_tokens)) {
    return absl::DataLossError("stored document: payload size does not match its header");
  }
  return h;
}

absl::StatusOr<DecodedDocument> DecodeDocument(const StoredDocument &stored, const ModelConfig &c,
                                               KvDtype dtype) {
  auto header = DecodeDocumentHeader(stored.metadata, c, dtype);
  if (!header.ok()) return header.status();
  DecodedDocument d;
  d.header = *header;
  const uint64_t token_bytes = uint64_t(d.header.num_tokens) * sizeof(int32_t);
  if (stored.bytes.size() != token_bytes + d.header.payload_bytes) {
    return absl::DataLossError("stored document: value size does not match its header");
  }
  uint32_t crc = 0;
  std::memcpy(&crc, stored.metadata.data() + 10 * sizeof(uint32_t), sizeof(crc));
  if (Crc32c(stored.bytes) != crc) return absl::DataLossError("stored document: checksum");
  d.tokens.resize(d.header.num_tokens);
  std::memcpy(d.tokens.data(), stored.bytes.data(), token_bytes);
  d.payload = stored.bytes.substr(token_bytes);
  return d;
}

absl::Status VerifyDocumentMac(const StoredDocument &stored, const DocumentKvHeader &header,
                               const DocumentMacScope &mac) {
  if (mac.key == nullptr) return absl::OkStatus();
  if (!header.has_mac) return absl::DataLossError(absl::StrCat(kMacFailure, " (none stored)"));
  DocumentMacCheck check(mac.key, header.mac_nonce, stored.bytes.size());
  std::vector<ByteSpan> spans = {
      {const_cast<char *>(stored.bytes.data()), uint64_t(stored.bytes.size())}};
  if (!check.Finish(spans, MacBindingOf(stored.metadata, mac), header.mac_tag)) {
    return absl::DataLossError(kMacFailure);
  }
  return absl::OkStatus();
}

}  // namespace lazyrag
