// The stored form of a document's KV (DESIGN section 4): a header in the
// kvstore value's metadata, and the value bytes = token ids then the
// Backend::ExportKv payload. The token ids travel with the KV so that a
// document named by id survives a worker restart. Pages are not part of it: the
// KV imports into any page run.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/cache/document_store.h"
#include "worker/engine/document_mac.h"
#include "worker/model/config.h"

namespace lazyrag {

inline constexpr uint32_t kDocumentKvFormatVersion = 1;

// metadata: 11 little-endian u32: magic "LZKV", format version, kv dtype
// (KvDtype), layers, kv heads, head dim, tokens, rope theta (float bits),
// payload bytes, checksum algorithm (1 = CRC-32C of the value bytes, as the
// kvstore checks per chunk; 2 = the same plus a MAC), CRC-32C of the bytes; with algorithm 2
// then the MAC's 8-byte nonce and 32-byte tag (document_mac.h).
struct DocumentKvHeader {
  uint32_t version = kDocumentKvFormatVersion;
  KvDtype dtype = KvDtype::kFloat32;
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t num_tokens = 0;
  float rope_theta = 0;
  uint64_t payload_bytes = 0;
  bool has_mac = false;
  std::array<uint8_t, kMacNonceBytes> mac_nonce{};
  MacTag mac_tag{};
};

// Who signs or checks a value's MAC: the workers' key (null: no MAC) and the kvstore key the
// value is stored under (the MAC binds it, so a value copied under another key fails).
struct DocumentMacScope {
  const DocumentMacKey *key = nullptr;
  std::string_view model_fingerprint;
  std::string_view cache_namespace;
  std::string_view document_id;
};

// The header part of `metadata` the MAC binds (the 11 words), with the scope's key.
DocumentMacBinding MacBindingOf(std::string_view metadata, const DocumentMacScope &scope);

// Bytes of the ExportKv payload for `num_tokens` tokens: layers x {K, V} x
// [num_tokens, num_kv_heads, head_dim] x dtype size.
uint64_t DocumentPayloadBytes(const ModelConfig &config, KvDtype dtype, int64_t num_tokens);

// With mac.key set the value carries a MAC (algorithm 2).
StoredDocument EncodeDocument(const ModelConfig &config, KvDtype dtype,
                              const std::vector<int32_t> &tokens, std::string_view payload,
                              const DocumentMacScope &mac = {});

// OK when `mac.key` is null; otherwise DATA_LOSS (kMacFailure in the message) unless the value
// carries a MAC that verifies over `stored.bytes` under the key and scope.
absl::Status VerifyDocumentMac(const StoredDocument &stored, const DocumentKvHeader &header,
                               const DocumentMacScope &mac);
inline constexpr char kMacFailure[] = "stored document: MAC does not verify";

struct DecodedDocument {
  DocumentKvHeader header;
  std::vector<int32_t> tokens;
  std::string payload;
};

// The header alone, from a stored value's metadata, checked against the shape: what a reader
// needs before the bytes arrive (their size: num_tokens x 4 token bytes, then payload_bytes).
// Errors as DecodeDocument's.
absl::StatusOr<DocumentKvHeader> DecodeDocumentHeader(std::string_view metadata,
                                                      const ModelConfig &config, KvDtype dtype);

// DATA_LOSS when the value is malformed or its checksum fails;
// FAILED_PRECONDITION when it was written for another shape or dtype (a model
// or backend change).
absl::StatusOr<DecodedDocument> DecodeDocument(const StoredDocument &stored,
                                               const ModelConfig &config, KvDtype dtype);

}  // namespace lazyrag
