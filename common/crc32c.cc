#include "common/crc32c.h"

#include <array>
#include <cstring>

namespace lazyrag {
namespace {

constexpr uint32_t kReflectedPoly = 0x82F63B78u;

// kTables[k][b]: CRC of byte b followed by k zero bytes (slicing-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1) ? kReflectedPoly : 0);
    t[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

uint32_t ExtendPortable(uint32_t crc, const uint8_t* p, size_t n) {
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian hosts only (x86-64, aarch64)
    word ^= crc;
    crc = kTables[7][word & 0xFF] ^ kTables[6][(word >> 8) & 0xFF] ^
          kTables[5][(word >> 16) & 0xFF] ^ kTables[4][(word >> 24) & 0xFF] ^
          kTables[3][(word >> 32) & 0xFF] ^ kTables[2][(word >> 40) & 0xFF] ^
          kTables[1][(word >> 48) & 0xFF] ^ kTables[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xFF];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t ExtendSse42Serial(uint32_t crc, const uint8_t* p,
                                                             size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

// Bytes per stream of the interleaved loop: three streams of this many bytes are checksummed at
// once, because the crc32 instruction's latency is three times its issue interval.
constexpr size_t kStreamBytes = 4096;

// The CRC register after kStreamBytes zero bytes, as a linear map of the register before:
// kShift[k][b] is the image of byte b at byte position k.
struct ShiftTables {
  uint32_t t[4][256];
};

__attribute__((target("sse4.2"))) ShiftTables MakeShiftTables() {
  static const uint8_t zeros[kStreamBytes] = {};
  uint32_t basis[32];
  for (int bit = 0; bit < 32; ++bit) basis[bit] = ExtendSse42Serial(1u << bit, zeros, kStreamBytes);
  ShiftTables s{};
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int i = 0; i < 8; ++i) {
        if (b & (1u << i)) v ^= basis[8 * k + i];
      }
      s.t[k][b] = v;
    }
  }
  return s;
}

inline uint32_t Shift(const ShiftTables& s, uint32_t crc) {
  return s.t[0][crc & 0xFF] ^ s.t[1][(crc >> 8) & 0xFF] ^ s.t[2][(crc >> 16) & 0xFF] ^
         s.t[3][crc >> 24];
}

// Three streams of kStreamBytes at a time, combined by shifting (the register is linear in its
// start value), then the tail serially.
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* p, size_t n) {
  static const ShiftTables shift = MakeShiftTables();
  while (n >= 3 * kStreamBytes) {
    uint64_t a = crc, b = 0, c = 0;
    const uint8_t* pa = p;
    const uint8_t* pb = p + kStreamBytes;
    const uint8_t* pc = p + 2 * kStreamBytes;
    for (size_t i = 0; i < kStreamBytes; i += 8) {
      uint64_t wa, wb, wc;
      std::memcpy(&wa, pa + i, 8);
      std::memcpy(&wb, pb + i, 8);
      std::memcpy(&wc, pc + i, 8);
      a = __builtin_ia32_crc32di(a, wa);
      b = __builtin_ia32_crc32di(b, wb);
      c = __builtin_ia32_crc32di(c, wc);
    }
    crc = Shift(shift, Shift(shift, static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(c);
    p += 3 * kStreamBytes;
    n -= 3 * kStreamBytes;
  }
  return ExtendSse42Serial(crc, p, n);
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, std::string_view data) {
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  crc = ~crc;
#if defined(__x86_64__)
  if (HaveSse42()) return ~ExtendSse42(crc, p, data.size());
#endif
  return ~ExtendPortable(crc, p, data.size());
}

namespace internal {
uint32_t Crc32cExtendPortable(uint32_t crc, std::string_view data) {
  return ~ExtendPortable(~crc, reinterpret_cast<const uint8_t*>(data.data()), data.size());
}
}  // namespace internal

}  // namespace lazyrag
