// SHA-256 (FIPS 180-4). Used for document ids and model fingerprints (DESIGN section 4).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lazyrag {

using Digest256 = std::array<uint8_t, 32>;

// Incremental hasher. Not thread-safe; one instance per thread.
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t len);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  // Finishes and returns the digest; the hasher must not be updated afterwards.
  Digest256 Finish();

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_len_ = 0;
};

Digest256 Sha256Of(std::string_view data);
std::string ToHex(const Digest256& d);

}  // namespace lazyrag
