#include "worker/engine/gmac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lazyrag {
namespace {

std::atomic<GmacImpl> auto_impl{GmacImpl::kAuto};

}  // namespace

bool GmacImplSupported(GmacImpl impl) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx2") &&
                           __builtin_cpu_supports("vpclmulqdq");
  static const bool avx512 =
      avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  switch (impl) {
    case GmacImpl::kAuto:
    case GmacImpl::kOpenSsl:
      return true;
    case GmacImpl::kVpclmulqdqAvx2:
      return avx2;
    case GmacImpl::kVpclmulqdq:
      return avx512;
  }
  return false;
#else
  return impl == GmacImpl::kAuto || impl == GmacImpl::kOpenSsl;
#endif
}

const char *GmacImplName(GmacImpl impl) {
  switch (impl) {
    case GmacImpl::kAuto:
      return "auto";
    case GmacImpl::kOpenSsl:
      return "openssl";
    case GmacImpl::kVpclmulqdqAvx2:
      return "vpclmulqdq-avx2";
    case GmacImpl::kVpclmulqdq:
      return "vpclmulqdq";
  }
  return "?";
}

void SetAutoGmacImpl(GmacImpl impl) { auto_impl.store(impl); }

GmacImpl AutoGmacImpl() {
  const GmacImpl set = auto_impl.load();
  if (set != GmacImpl::kAuto) return set;
  for (GmacImpl impl : {GmacImpl::kVpclmulqdq, GmacImpl::kVpclmulqdqAvx2}) {
    if (GmacImplSupported(impl)) return impl;
  }
  return GmacImpl::kOpenSsl;
}

namespace {

// 16-byte blocks per 512-bit vector.
constexpr int kLanes = 4;
// 512-bit vectors per GHASH step: 16 x 4 = 64 blocks (1 KiB) share one reduction.
constexpr int kVectors = 16;
constexpr size_t kStepBytes = size_t{16} * kLanes * kVectors;

}  // namespace

// Field elements are kept "reflected": a 16-byte GCM block byte-reversed and read as a
// little-endian 128-bit integer, so that bit 127 is the coefficient of x^0 and bit 0 that of
// x^127 (GCM's bit order), and a carry-less multiply of two of them yields the reflected
// product shifted right by one bit.
struct Gmac::State {
  // powers[j] lane q = H^(64 - 4j - q), reflected (what block 4j + q of a step is multiplied
  // by); h1 = H.
  alignas(64) uint8_t powers[kVectors][64] = {};
  alignas(16) uint8_t h1[16] = {};
  alignas(16) uint8_t x[16] = {};  // the running hash, reflected
  uint8_t pending[16] = {};        // bytes of a block not yet whole
  size_t pending_bytes = 0;
  uint64_t message_bytes = 0;
  uint8_t encrypted_j0[16] = {};  // E_K(IV || 0^31 || 1), XORed into the tag
  EVP_CIPHER_CTX *ecb = nullptr;  // not kOpenSsl: AES-256 of single blocks
  EVP_CIPHER_CTX *gcm = nullptr;  // kOpenSsl only
};

#if defined(__x86_64__)
namespace {

// The 128-bit helpers need PCLMULQDQ and SSE4.1; each step function adds its vector width (a
// 128-bit step, PCLMULQDQ alone, ran at 0.6x libcrypto's GHASH and is not kept: HISTORY).
#define LAZYRAG_GHASH_TARGET __attribute__((target("pclmul,sse4.1")))
#define LAZYRAG_GHASH_256 __attribute__((target("avx2,vpclmulqdq,pclmul")))
#define LAZYRAG_GHASH_512 __attribute__((target("avx2,avx512f,avx512bw,vpclmulqdq,pclmul")))

LAZYRAG_GHASH_TARGET inline __m128i Reflect(__m128i v) {
  return _mm_shuffle_epi8(v, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// The reflected product whose carry-less 256-bit form is [hi:lo] (the sum of any number of
// carry-less products of reflected elements), reduced modulo g = x^128 + x^7 + x^2 + x + 1.
LAZYRAG_GHASH_TARGET inline __m128i Reduce(__m128i lo, __m128i hi) {
  // Shift [hi:lo] left by one bit: now bit 255 - k holds x^k. hi holds x^0..x^127, lo the
  // coefficients of x^128 * L(x) with L reflected.
  hi = _mm_xor_si128(_mm_or_si128(_mm_slli_epi64(hi, 1), _mm_slli_si128(_mm_srli_epi64(hi, 63), 8)),
                     _mm_srli_si128(_mm_srli_epi64(lo, 63), 8));
  lo = _mm_or_si128(_mm_slli_epi64(lo, 1), _mm_slli_si128(_mm_srli_epi64(lo, 63), 8));
  // x^128 = r(x) = 1 + x + x^2 + x^7 (mod g), and multiplying by x^j is a right shift by j.
  // L * r = A + x^128 * B, B (degree < 7) being the bits the shifts by 1, 2 and 7 drop; B sits
  // at the top of L << 127, << 126, << 121 (all from L's low 64-bit lane). B * r drops nothing,
  // so L * r = L' * r with the dropped bits ignored, where L' = L + B.
  const __m128i b =
      _mm_slli_si128(_mm_xor_si128(_mm_xor_si128(_mm_slli_epi64(lo, 63), _mm_slli_epi64(lo, 62)),
                                   _mm_slli_epi64(lo, 57)),
                     8);
  lo = _mm_xor_si128(lo, b);
  // lo >> j for j = 1, 2, 7 (128-bit shifts: each lane's own bits, and the high lane's low
  // bits into the low lane's top).
  __m128i r = lo;
  r = _mm_xor_si128(
      r, _mm_xor_si128(_mm_srli_epi64(lo, 1), _mm_srli_si128(_mm_slli_epi64(lo, 63), 8)));
  r = _mm_xor_si128(
      r, _mm_xor_si128(_mm_srli_epi64(lo, 2), _mm_srli_si128(_mm_slli_epi64(lo, 62), 8)));
  r = _mm_xor_si128(
      r, _mm_xor_si128(_mm_srli_epi64(lo, 7), _mm_srli_si128(_mm_slli_epi64(lo, 57), 8)));
  return _mm_xor_si128(hi, r);
}

// The 256-bit carry-less product of a and b as (lo, hi), added into *lo, *hi.
LAZYRAG_GHASH_TARGET inline void MultiplyAdd(__m128i a, __m128i b, __m128i *lo, __m128i *hi) {
  const __m128i mid =
      _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10));
  *lo = _mm_xor_si128(*lo, _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x00), _mm_slli_si128(mid, 8)));
  *hi = _mm_xor_si128(*hi, _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x11), _mm_srli_si128(mid, 8)));
}

LAZYRAG_GHASH_TARGET inline __m128i Multiply(__m128i a, __m128i b) {
  __m128i lo = _mm_setzero_si128(), hi = _mm_setzero_si128();
  MultiplyAdd(a, b, &lo, &hi);
  return Reduce(lo, hi);
}

// The XOR of a 512-bit vector's four 128-bit lanes.
LAZYRAG_GHASH_512 inline __m128i XorLanes(__m512i v) {
  const __m256i y = _mm256_xor_si256(_mm512_maskz_extracti64x4_epi64(0xFF, v, 0),
                                     _mm512_maskz_extracti64x4_epi64(0xFF, v, 1));
  return _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
}

LAZYRAG_GHASH_TARGET void ComputePowers(Gmac::State *s, const uint8_t h[16]) {
  const __m128i h1 = Reflect(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h)));
  _mm_store_si128(reinterpret_cast<__m128i *>(s->h1), h1);
  __m128i power[kLanes * kVectors + 1];
  power[1] = h1;
  for (int i = 2; i <= kLanes * kVectors; ++i) power[i] = Multiply(power[i - 1], h1);
  for (int j = 0; j < kVectors; ++j) {
    for (int q = 0; q < kLanes; ++q) {
      _mm_store_si128(reinterpret_cast<__m128i *>(s->powers[j] + 16 * q),
                      power[kLanes * kVectors - kLanes * j - q]);
    }
  }
}

// The reduction of a step's summed products: lo and hi halves plus the middle terms.
LAZYRAG_GHASH_TARGET inline __m128i ReduceStep(__m128i lo, __m128i hi, __m128i mid) {
  return Reduce(_mm_xor_si128(lo, _mm_slli_si128(mid, 8)),
                _mm_xor_si128(hi, _mm_srli_si128(mid, 8)));
}

// Blocks one at a time (fewer than a step's): X = (X + B) * H.
LAZYRAG_GHASH_TARGET __m128i HashTail(const Gmac::State *s, __m128i x, const uint8_t *p,
                                      size_t size) {
  const __m128i h1 = _mm_load_si128(reinterpret_cast<const __m128i *>(s->h1));
  for (; size >= 16; size -= 16, p += 16) {
    x = Multiply(_mm_xor_si128(x, Reflect(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)))),
                 h1);
  }
  return x;
}

// Each HashBlocks* folds `size` bytes (a multiple of 16) into the running hash: X = (X + B_1) *
// H^n + B_2 * H^(n-1) + ... + B_n * H per step of 64 blocks, one reduction a step; the same
// products summed in 512- or 256-bit vectors.
LAZYRAG_GHASH_512 void HashBlocks512(Gmac::State *s, const uint8_t *p, size_t size) {
  __m128i x = _mm_load_si128(reinterpret_cast<const __m128i *>(s->x));
  const __m512i reflect = _mm512_maskz_broadcast_i32x4(
      0xFFFF, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  for (; size >= kStepBytes; size -= kStepBytes, p += kStepBytes) {
    __m512i lo = _mm512_setzero_si512(), hi = lo, mid = lo;
    for (int j = 0; j < kVectors; ++j) {
      __m512i d = _mm512_shuffle_epi8(_mm512_loadu_si512(p + 64 * j), reflect);
      if (j == 0) d = _mm512_xor_si512(d, _mm512_zextsi128_si512(x));
      const __m512i h = _mm512_load_si512(s->powers[j]);
      lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(d, h, 0x00));
      hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(d, h, 0x11));
      mid = _mm512_xor_si512(mid, _mm512_xor_si512(_mm512_clmulepi64_epi128(d, h, 0x01),
                                                   _mm512_clmulepi64_epi128(d, h, 0x10)));
    }
    x = ReduceStep(XorLanes(lo), XorLanes(hi), XorLanes(mid));
  }
  _mm_store_si128(reinterpret_cast<__m128i *>(s->x), HashTail(s, x, p, size));
}

// The XOR of a 256-bit vector's two 128-bit lanes.
LAZYRAG_GHASH_256 inline __m128i XorLanes(__m256i v) {
  return _mm_xor_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

LAZYRAG_GHASH_256 void HashBlocks256(Gmac::State *s, const uint8_t *p, size_t size) {
  __m128i x = _mm_load_si128(reinterpret_cast<const __m128i *>(s->x));
  const __m256i reflect = _mm256_broadcastsi128_si256(
      _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  for (; size >= kStepBytes; size -= kStepBytes, p += kStepBytes) {
    __m256i lo = _mm256_setzero_si256(), hi = lo, mid = lo;
    for (int j = 0; j < 2 * kVectors; ++j) {
      __m256i d = _mm256_shuffle_epi8(
          _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + 32 * j)), reflect);
      if (j == 0) d = _mm256_xor_si256(d, _mm256_inserti128_si256(_mm256_setzero_si256(), x, 0));
      const __m256i h =
          _mm256_load_si256(reinterpret_cast<const __m256i *>(s->powers[j / 2] + 32 * (j % 2)));
      lo = _mm256_xor_si256(lo, _mm256_clmulepi64_epi128(d, h, 0x00));
      hi = _mm256_xor_si256(hi, _mm256_clmulepi64_epi128(d, h, 0x11));
      mid = _mm256_xor_si256(mid, _mm256_xor_si256(_mm256_clmulepi64_epi128(d, h, 0x01),
                                                   _mm256_clmulepi64_epi128(d, h, 0x10)));
    }
    x = ReduceStep(XorLanes(lo), XorLanes(hi), XorLanes(mid));
  }
  _mm_store_si128(reinterpret_cast<__m128i *>(s->x), HashTail(s, x, p, size));
}

void HashBlocks(GmacImpl impl, Gmac::State *s, const uint8_t *p, size_t size) {
  switch (impl) {
    case GmacImpl::kVpclmulqdq:
      return HashBlocks512(s, p, size);
    default:
      return HashBlocks256(s, p, size);
  }
}

LAZYRAG_GHASH_TARGET void ReflectedToBytes(const uint8_t x[16], uint8_t out[16]) {
  _mm_storeu_si128(reinterpret_cast<__m128i *>(out),
                   Reflect(_mm_load_si128(reinterpret_cast<const __m128i *>(x))));
}

#undef LAZYRAG_GHASH_TARGET
#undef LAZYRAG_GHASH_256
#undef LAZYRAG_GHASH_512

}  // namespace
#else
namespace {
void ComputePowers(Gmac::State *, const uint8_t *) {}
void HashBlocks(GmacImpl, Gmac::State *, const uint8_t *, size_t) {}
void ReflectedToBytes(const uint8_t *, uint8_t *) {}
}  // namespace
#endif

namespace {

void EncryptBlock(EVP_CIPHER_CTX *ecb, const uint8_t in[16], uint8_t out[16]) {
  int len = 0;
  EVP_EncryptUpdate(ecb, out, &len, in, 16);
}

}  // namespace

Gmac::Gmac(const uint8_t key[kKeyBytes], GmacImpl impl)
    : impl_(impl == GmacImpl::kAuto ? AutoGmacImpl() : impl), state_(std::make_unique<State>()) {
  if (impl_ == GmacImpl::kOpenSsl) {
    state_->gcm = EVP_CIPHER_CTX_new();
    EVP_EncryptInit_ex(state_->gcm, EVP_aes_256_gcm(), nullptr, key, nullptr);
    return;
  }
  state_->ecb = EVP_CIPHER_CTX_new();
  EVP_EncryptInit_ex(state_->ecb, EVP_aes_256_ecb(), nullptr, key, nullptr);
  EVP_CIPHER_CTX_set_padding(state_->ecb, 0);
  const uint8_t zero[16] = {};
  uint8_t h[16];
  EncryptBlock(state_->ecb, zero, h);
  ComputePowers(state_.get(), h);
  OPENSSL_cleanse(h, sizeof(h));
}

Gmac::~Gmac() {
  EVP_CIPHER_CTX_free(state_->ecb);
  EVP_CIPHER_CTX_free(state_->gcm);
  OPENSSL_cleanse(state_.get(), sizeof(State));
}

void Gmac::Start(const uint8_t iv[kIvBytes]) {
  State &s = *state_;
  if (impl_ == GmacImpl::kOpenSsl) {
    EVP_EncryptInit_ex(s.gcm, nullptr, nullptr, nullptr, iv);
    return;
  }
  uint8_t j0[16] = {};
  std::memcpy(j0, iv, kIvBytes);
  j0[15] = 1;
  EncryptBlock(s.ecb, j0, s.encrypted_j0);
  std::memset(s.x, 0, sizeof(s.x));
  s.pending_bytes = 0;
  s.message_bytes = 0;
}

void Gmac::Update(const uint8_t *data, size_t size) {
  State &s = *state_;
  if (impl_ == GmacImpl::kOpenSsl) {
    int len = 0;  // the bytes are additional data only: GMAC
    for (size_t done = 0; done < size;) {
      const int n = int(std::min<size_t>(size - done, size_t{1} << 30));
      EVP_EncryptUpdate(s.gcm, nullptr, &len, data + done, n);
      done += size_t(n);
    }
    return;
  }
  s.message_bytes += size;
  if (s.pending_bytes > 0) {
    const size_t n = std::min(size, 16 - s.pending_bytes);
    std::memcpy(s.pending + s.pending_bytes, data, n);
    s.pending_bytes += n;
    data += n;
    size -= n;
    if (s.pending_bytes < 16) return;
    HashBlocks(impl_, &s, s.pending, 16);
    s.pending_bytes = 0;
  }
  const size_t whole = size & ~size_t{15};
  HashBlocks(impl_, &s, data, whole);
  std::memcpy(s.pending, data + whole, size - whole);
  s.pending_bytes = size - whole;
}

void Gmac::Finish(uint8_t tag[kTagBytes]) {
  State &s = *state_;
  if (impl_ == GmacImpl::kOpenSsl) {
    int len = 0;
    uint8_t none[16];
    EVP_EncryptFinal_ex(s.gcm, none, &len);
    EVP_CIPHER_CTX_ctrl(s.gcm, EVP_CTRL_GCM_GET_TAG, int(kTagBytes), tag);
    return;
  }
  if (s.pending_bytes > 0) {  // the last partial block, zero-padded
    std::memset(s.pending + s.pending_bytes, 0, 16 - s.pending_bytes);
    HashBlocks(impl_, &s, s.pending, 16);
  }
  // The lengths block: the additional data's bit length, then the ciphertext's (0), big-endian.
  uint8_t lengths[16] = {};
  const uint64_t bits = s.message_bytes * 8;
  for (int i = 0; i < 8; ++i) lengths[7 - i] = uint8_t(bits >> (8 * i));
  HashBlocks(impl_, &s, lengths, 16);
  ReflectedToBytes(s.x, tag);
  for (size_t i = 0; i < kTagBytes; ++i) tag[i] ^= s.encrypted_j0[i];
}

}  // namespace lazyrag
