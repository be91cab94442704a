#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace lazyrag {
namespace {

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  // RFC 3720 appendix B.4.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, 0);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
}

TEST(Crc32cTest, ExtendMatchesWholeAndPortableMatchesFast) {
  std::mt19937 rng(7);
  std::string data(10007, 0);
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t whole = Crc32c(data);
  EXPECT_EQ(internal::Crc32cExtendPortable(0, data), whole);
  for (size_t split : {0ul, 1ul, 7ul, 8ul, 4096ul, 10006ul, 10007ul}) {
    std::string_view a(data.data(), split), b(data.data() + split, data.size() - split);
    EXPECT_EQ(Crc32cExtend(Crc32c(a), b), whole) << split;
    EXPECT_EQ(internal::Crc32cExtendPortable(internal::Crc32cExtendPortable(0, a), b), whole);
  }
  data[5000] ^= 1;
  EXPECT_NE(Crc32c(data), whole);
}

// The fast path checksums three 4 KiB streams at once: lengths around multiples of 12 KiB, odd
// start addresses and a continued CRC all agree with the table-driven path.
TEST(Crc32cTest, InterleavedStreamsMatchPortable) {
  std::mt19937 rng(11);
  std::string data(3 * 12288 + 100, 0);
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t len : {12287ul, 12288ul, 12289ul, 24576ul, 36863ul, 36864ul, 36964ul}) {
    for (size_t start : {0ul, 1ul, 3ul}) {
      if (start + len > data.size()) continue;
      std::string_view v(data.data() + start, len);
      EXPECT_EQ(Crc32c(v), internal::Crc32cExtendPortable(0, v)) << len << " at " << start;
      EXPECT_EQ(Crc32cExtend(0x12345678u, v), internal::Crc32cExtendPortable(0x12345678u, v));
    }
  }
}

}  // namespace
}  // namespace lazyrag
