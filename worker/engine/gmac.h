// AES-256-GMAC (NIST SP 800-38D: GCM with additional data only, 96-bit IVs), the block MAC of
// document_mac.h. Implementations of the same function, equal bit for bit:
//   * kOpenSsl: libcrypto's EVP AES-256-GCM, the block as additional data.
//   * kVpclmulqdq, kVpclmulqdqAvx2: the hash key's powers H^1..H^64 computed once per key;
//     GHASH of 64 16-byte blocks per step, one reduction a step, the carry-less multiplies in
//     512-bit vectors (AVX-512 VPCLMULQDQ) or 256-bit ones (AVX2 VPCLMULQDQ: CPUs with it but
//     no AVX-512, e.g. AMD Zen 3); AES itself (H = E_K(0), E_K(J0) per message) still through
//     libcrypto. Their speed against libcrypto 3.0's GHASH: bench/README, kvstore
//     (kvstore_bench mac_pass).
// kAuto picks the widest one the CPU supports, else kOpenSsl.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace lazyrag {

enum class GmacImpl { kAuto, kOpenSsl, kVpclmulqdq, kVpclmulqdqAvx2 };

// Whether this CPU runs `impl` (kAuto and kOpenSsl everywhere; kVpclmulqdq needs AVX-512F/BW
// and VPCLMULQDQ, kVpclmulqdqAvx2 AVX2 and VPCLMULQDQ).
bool GmacImplSupported(GmacImpl impl);
// "auto", "openssl", "vpclmulqdq", "vpclmulqdq-avx2".
const char *GmacImplName(GmacImpl impl);

// What kAuto means in this process: the widest supported one unless set otherwise here (tests
// and benchmarks compare them). Thread-safe; takes effect for Gmacs created later.
void SetAutoGmacImpl(GmacImpl impl);
GmacImpl AutoGmacImpl();

// One key's GMAC. Not thread-safe: one per thread. Each message: Start, Update any number of
// times (any lengths), Finish.
class Gmac {
 public:
  static constexpr size_t kKeyBytes = 32;
  static constexpr size_t kIvBytes = 12;
  static constexpr size_t kTagBytes = 16;

  // REQUIRES: GmacImplSupported(impl).
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
