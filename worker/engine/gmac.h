// AES-256-GMAC (NIST SP 800-38D: GCM with additional data only, 96-bit IVs), the block MAC of
// document_mac.h. Two implementations of the same function, equal bit for bit:
//   * kOpenSsl: libcrypto's EVP AES-256-GCM, the block as additional data.
//   * kVpclmulqdq: the hash key's powers H^1..H^64 computed once per key; GHASH of 64 16-byte
//     blocks per step with 512-bit carry-less multiplies (AVX-512 VPCLMULQDQ), one reduction a
//     step; AES itself (H = E_K(0), E_K(J0) per message) still through libcrypto. About twice
//     libcrypto 3.0's GHASH a core, as fast as CRC-32C (bench/README, kvstore).
// kAuto picks kVpclmulqdq where the CPU supports it, else kOpenSsl.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace lazyrag {

enum class GmacImpl { kAuto, kOpenSsl, kVpclmulqdq };

// Whether this CPU runs GmacImpl::kVpclmulqdq (AVX-512F/BW and VPCLMULQDQ).
bool CpuHasVpclmulqdqGmac();

// What kAuto means in this process: kVpclmulqdq where supported unless set otherwise here
// (tests and benchmarks compare the two). Thread-safe; takes effect for Gmacs created later.
void SetAutoGmacImpl(GmacImpl impl);
GmacImpl AutoGmacImpl();

// One key's GMAC. Not thread-safe: one per thread. Each message: Start, Update any number of
// times (any lengths), Finish.
class Gmac {
 public:
  static constexpr size_t kKeyBytes = 32;
  static constexpr size_t kIvBytes = 12;
  static constexpr size_t kTagBytes = 16;

  // REQUIRES: impl is not kVpclmulqdq unless CpuHasVpclmulqdqGmac().
  explicit Gmac(const uint8_t key[kKeyBytes], GmacImpl impl = GmacImpl::kAuto);
  ~Gmac();
  Gmac(const Gmac &) = delete;
  Gmac &operator=(const Gmac &) = delete;

  // The implementation in use (never kAuto).
  GmacImpl impl() const { return impl_; }

  // Starts a message under `iv`. The (key, iv) pair must never tag two different messages.
  void Start(const uint8_t iv[kIvBytes]);
  void Update(const uint8_t *data, size_t size);
  void Finish(uint8_t tag[kTagBytes]);

  struct State;

 private:
  GmacImpl impl_;
  std::unique_ptr<State> state_;
};

}  // namespace lazyrag
