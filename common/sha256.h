// SHA-256 (FIPS 180-4). Used for document ids, prefix-cache page ids and model fingerprints
// (DESIGN section 4). OpenSSL's implementation (libcrypto, which gRPC already links): it uses
// the CPU's SHA extensions where present, about 10x the portable C++ it replaced (numbers in
// bench/HISTORY.md).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lazyrag {

using Digest256 = std::array<uint8_t, 32>;

// Incremental hasher. Not thread-safe; one instance per thread. Copyable (the copy continues
// from the same state).
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t len);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  // Finishes and returns the digest; the hasher must not be updated afterwards.
  Digest256 Finish();

 private:
  // OpenSSL's SHA256_CTX (112 bytes), kept opaque so that this header needs no OpenSSL.
  alignas(8) unsigned char ctx_[128];
};

Digest256 Sha256Of(std::string_view data);
std::string ToHex(const Digest256& d);

}  // namespace lazyrag
