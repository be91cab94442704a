// Stored document KV authenticated by the workers (DESIGN section 11): a MAC over a stored
// value's header, its kvstore key and every byte, under a cluster key that only workers hold
// (--kv_mac_key_file). kvstore shards never see the key, so a value put by anyone else (a
// shard, or a client that reached one) fails the check: the worker treats it as a miss,
// recomputes and writes the recomputed document back over it.
//
// Construction. The value's bytes are cut into kMacBlockBytes blocks; block i's tag is
// AES-256-GMAC(K1, IV = nonce || be32(i), block) (gmac.h: GHASH with 512-bit carry-less
// multiplies where the CPU has them, else libcrypto's; the same tags either way); the value's
// tag is HMAC-SHA256(K2, domain || header || key || nonce || block count || block tags). The
// nonce is 64 random bits per encode, so a (K1, IV) pair is never reused for two messages in
// practice (GMAC's requirement). Blocks are independent, so the reader folds them into the pass
// that lands the bytes, on the threads that read them, while they are in cache
// (DocumentMacCheck::Observe, fed by kvstore::CallOptions::on_chunk, which then also skips the
// client's CRC-32C: the MAC replaces it); the few blocks no step covered whole are hashed at
// Finish.
// K1 and K2 are SHA-256 of the key file's bytes under two labels.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cache/document_store.h"

namespace lazyrag {

inline constexpr uint64_t kMacBlockBytes = 256 << 10;
inline constexpr size_t kMacNonceBytes = 8;
inline constexpr size_t kMacTagBytes = 32;
using MacTag = std::array<uint8_t, kMacTagBytes>;

// The cluster key. Immutable; thread-safe.
class DocumentMacKey {
 public:
  // The key file's bytes (at least 32; e.g. `openssl rand -hex 32`). INVALID_ARGUMENT when it
  // cannot be read or is shorter.
  static absl::StatusOr<std::shared_ptr<const DocumentMacKey>> FromFile(const std::string &path);
  // REQUIRES: secret.size() >= 32.
  static std::shared_ptr<const DocumentMacKey> FromSecret(std::string_view secret);

  const uint8_t *gmac_key() const { return gmac_key_.data(); }
  const uint8_t *hmac_key() const { return hmac_key_.data(); }

 private:
  std::array<uint8_t, 32> gmac_key_{};
  std::array<uint8_t, 32> hmac_key_{};
};

// What a value's MAC binds besides its bytes: the stored header words and the kvstore key.
struct DocumentMacBinding {
  std::string_view header;  // the metadata before the nonce and tag
  std::string_view model_fingerprint;
  std::string_view cache_namespace;
  std::string_view document_id;
};

// A fresh random nonce.
std::array<uint8_t, kMacNonceBytes> NewMacNonce();

// The tag of `bytes` (the whole value, contiguous).
MacTag ComputeDocumentMac(const DocumentMacKey &key,
                          const std::array<uint8_t, kMacNonceBytes> &nonce,
                          const DocumentMacBinding &binding, std::string_view bytes);

// Checks one value as it arrives. Observe() may be called from several threads at once for
// disjoint ranges; Finish() after the bytes are all in `spans` and no Observe() is running.
class DocumentMacCheck {
 public:
  DocumentMacCheck(const DocumentMacKey *key, const std::array<uint8_t, kMacNonceBytes> &nonce,
                   uint64_t total_bytes);
  // [offset, offset + size) of the value is at `data`: tags the blocks it holds whole.
  void Observe(uint64_t offset, const char *data, uint64_t size);
  // Tags the blocks Observe did not, reading them from `spans` (the value's bytes, in order),
  // and compares the value's tag with `expected` in constant time.
  bool Finish(const std::vector<ByteSpan> &spans, const DocumentMacBinding &binding,
              const MacTag &expected);
  // Bytes tagged by Observe (the rest were tagged at Finish; benchmarks, tests).
  uint64_t observed_bytes() const { return observed_bytes_.load(); }

 private:
  const DocumentMacKey *const key_;
  const std::array<uint8_t, kMacNonceBytes> nonce_;
  const uint64_t total_bytes_;
  std::vector<std::array<uint8_t, 16>> block_tags_;
  std::unique_ptr<std::atomic<uint8_t>[]> block_done_;
  std::atomic<uint64_t> observed_bytes_{0};
};

}  // namespace lazyrag
