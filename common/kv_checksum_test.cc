#include "common/kv_checksum.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lazyrag {
namespace {

// The expected values come from this independent Python reference:
//   M = 2**64 - 1
//   def mix(z):
//       z ^= z >> 30; z = (z * 0xBF58476D1CE4E5B9) & M
//       z ^= z >> 27; z = (z * 0x94D049BB133111EB) & M
//       return z ^ (z >> 31)
//   def h(b, first=0):
//       r = 0
//       for i in range(len(b) // 8):
//           w = int.from_bytes(b[8*i:8*i+8], 'little')
//           r ^= mix((w + (i + first + 1) * 0x9E3779B97F4A7C15) & M)
//       return r
TEST(KvChecksumTest, KnownValues) {
  EXPECT_EQ(KvChecksum(nullptr, 0), 0u);
  const char zeros[8] = {};
  // splitmix64's first output for seed 0.
  EXPECT_EQ(KvChecksum(zeros, 8), 0xe220a8397b1dcdafull);
  EXPECT_EQ(KvChecksum("lazyrag!", 8), 0x2528aa21f758616aull);  // h(b'lazyrag!')

  unsigned char ramp[16];  // h(bytes(range(16)))
  for (int i = 0; i < 16; ++i) ramp[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(KvChecksum(ramp, 16), 0xa240e34257446b3full);
  // h(bytes(range(16)), 5): the same words numbered from 5.
  EXPECT_EQ(KvChecksumRange(ramp, 16, 5), 0xfa69897abbf85af8ull);

  unsigned char mixed[64];  // h(bytes((i * 37 + 11) % 256 for i in range(64)))
  for (int i = 0; i < 64; ++i) mixed[i] = static_cast<unsigned char>((i * 37 + 11) % 256);
  EXPECT_EQ(KvChecksum(mixed, 64), 0x3ec9205c46fd9450ull);

  const std::string ones(24, '\xff');  // h(b'\xff' * 24)
  EXPECT_EQ(KvChecksum(ones.data(), ones.size()), 0x3569715c72e12f00ull);
}

TEST(KvChecksumTest, ConstexprTermsMatchTheFunction) {
  static_assert(Mix64(kKvChecksumGamma) == 0xe220a8397b1dcdafull);
  const uint64_t words[3] = {1, 0xdeadbeefcafef00dull, ~uint64_t{0}};
  uint64_t h = 0;
  for (uint64_t i = 0; i < 3; ++i) h ^= KvChecksumTerm(words[i], i);
  EXPECT_EQ(KvChecksum(words, sizeof(words)), h);
}

TEST(KvChecksumTest, RangesCombineByXor) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> words(1000);
  for (auto& w : words) w = rng();
  const uint64_t whole = KvChecksum(words.data(), words.size() * 8);
  for (size_t split : {size_t{0}, size_t{1}, size_t{499}, size_t{999}, size_t{1000}}) {
    const uint64_t a = KvChecksumRange(words.data(), split * 8, 0);
    const uint64_t b = KvChecksumRange(words.data() + split, (words.size() - split) * 8, split);
    EXPECT_EQ(a ^ b, whole) << "split at word " << split;
  }
  // Unaligned input: the words are read bytewise.
  std::vector<char> shifted(words.size() * 8 + 1);
  std::memcpy(shifted.data() + 1, words.data(), words.size() * 8);
  EXPECT_EQ(KvChecksum(shifted.data() + 1, words.size() * 8), whole);
}

TEST(KvChecksumTest, EverySingleBitFlipOfFourKibChangesIt) {
  std::mt19937_64 rng(11);
  std::vector<unsigned char> buf(4096);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const uint64_t original = KvChecksum(buf.data(), buf.size());
  for (size_t bit = 0; bit < buf.size() * 8; ++bit) {
    buf[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    ASSERT_NE(KvChecksum(buf.data(), buf.size()), original) << "bit " << bit;
    buf[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
  EXPECT_EQ(KvChecksum(buf.data(), buf.size()), original);
}

TEST(KvChecksumTest, MovedWordsChangeIt) {
  const uint64_t ab[2] = {1, 2};
  const uint64_t ba[2] = {2, 1};
  EXPECT_NE(KvChecksum(ab, 16), KvChecksum(ba, 16));
  const uint64_t twice[2] = {5, 5};  // equal words do not cancel
  EXPECT_NE(KvChecksum(twice, 16), 0u);
}

TEST(KvChecksumTest, LengthNotAMultipleOfEightIsTheCallersBug) {
#ifdef NDEBUG
  // Release builds ignore the trailing bytes.
  EXPECT_EQ(KvChecksum("lazyrag!xyz", 11), KvChecksum("lazyrag!", 8));
#else
  EXPECT_DEATH(KvChecksum("lazyrag!xyz", 11), "multiple of 8");
#endif
}

TEST(KvChecksumTest, LargeInputsSplitOverThreadsGiveTheSameValue) {
  // 32 MiB takes the multi-threaded path; 1 MiB ranges are checksummed on one thread each.
  const size_t bytes = size_t{32} << 20;
  std::vector<uint64_t> words(bytes / 8);
  std::mt19937_64 rng(3);
  for (auto& w : words) w = rng();
  uint64_t serial = 0;
  const size_t words_per_range = (size_t{1} << 20) / 8;
  for (size_t first = 0; first < words.size(); first += words_per_range) {
    serial ^= KvChecksumRange(words.data() + first, words_per_range * 8, first);
  }
  EXPECT_EQ(KvChecksum(words.data(), bytes), serial);
}

}  // namespace
}  // namespace lazyrag
