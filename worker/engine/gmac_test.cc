// gmac.h: the VPCLMULQDQ implementation gives libcrypto's AES-256-GMAC tag bit for bit, for
// messages of any length (whole 1 KiB steps, single blocks, a partial last block, empty),
// however the bytes are split across Update calls, for several keys and IVs and for messages
// tagged one after another on one Gmac; a changed byte, IV or key changes the tag.
#include "worker/engine/gmac.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <vector>

namespace lazyrag {
namespace {

using Tag = std::array<uint8_t, Gmac::kTagBytes>;

// AES-256-GCM through EVP with the message as additional data: the reference, independent of
// gmac.cc.
Tag Reference(const uint8_t *key, const uint8_t *iv, const std::string &message) {
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, key, iv);
  int len = 0;
  if (!message.empty()) {
    EVP_EncryptUpdate(ctx, nullptr, &len, reinterpret_cast<const uint8_t *>(message.data()),
                      int(message.size()));
  }
  uint8_t none[16];
  EVP_EncryptFinal_ex(ctx, none, &len);
  Tag tag{};
  EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, int(tag.size()), tag.data());
  EVP_CIPHER_CTX_free(ctx);
  return tag;
}

// The tag from `gmac`, the message fed in pieces of random sizes up to `max_piece`.
Tag Tagged(Gmac &gmac, const uint8_t *iv, const std::string &message, size_t max_piece,
           std::mt19937 &random) {
  gmac.Start(iv);
  for (size_t at = 0; at < message.size();) {
    const size_t n = std::min<size_t>(message.size() - at, 1 + random() % max_piece);
    gmac.Update(reinterpret_cast<const uint8_t *>(message.data()) + at, n);
    at += n;
  }
  Tag tag{};
  gmac.Finish(tag.data());
  return tag;
}

std::string RandomBytes(size_t n, std::mt19937 &random) {
  std::string s(n, '\0');
  for (char &c : s) c = char(random());
  return s;
}

class GmacTest : public ::testing::TestWithParam<GmacImpl> {
 protected:
  void SetUp() override {
    if (!GmacImplSupported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run " << GmacImplName(GetParam());
    }
  }
};

TEST_P(GmacTest, AgreesWithLibcryptoForAnyLengthAndSplit) {
  std::mt19937 random(7);
  const std::vector<size_t> lengths = {0,    1,     15,     16,     17,     63,
                                       64,   1023,  1024,   1025,   2048,   4095,
                                       4096, 12345, 262144, 262143, 262145, 300001};
  for (int k = 0; k < 3; ++k) {
    uint8_t key[Gmac::kKeyBytes];
    for (uint8_t &b : key) b = uint8_t(random());
    Gmac gmac(key, GetParam());
    EXPECT_EQ(gmac.impl(), GetParam());
    for (size_t length : lengths) {
      const std::string message = RandomBytes(length, random);
      uint8_t iv[Gmac::kIvBytes];
      for (uint8_t &b : iv) b = uint8_t(random());
      const Tag want = Reference(key, iv, message);
      for (size_t max_piece : {size_t{1} << 20, size_t{4096}, size_t{37}, size_t{1}}) {
        if (max_piece == 1 && length > 5000) continue;
        EXPECT_EQ(Tagged(gmac, iv, message, max_piece, random), want)
            << "key " << k << ", " << length << " bytes, pieces up to " << max_piece;
      }
    }
  }
}

TEST_P(GmacTest, AnyChangeChangesTheTag) {
  std::mt19937 random(11);
  uint8_t key[Gmac::kKeyBytes];
  for (uint8_t &b : key) b = uint8_t(random());
  uint8_t iv[Gmac::kIvBytes] = {1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 9};
  std::string message = RandomBytes(5000, random);
  Gmac gmac(key, GetParam());
  const Tag tag = Tagged(gmac, iv, message, 1 << 20, random);
  for (size_t at : {size_t{0}, size_t{1023}, size_t{1024}, size_t{4999}}) {
    std::string changed = message;
    changed[at] ^= 0x01;
    EXPECT_NE(Tagged(gmac, iv, changed, 1 << 20, random), tag) << "byte " << at;
  }
  EXPECT_NE(Tagged(gmac, iv, message + std::string(1, '\0'), 1 << 20, random), tag);
  iv[11] ^= 1;
  EXPECT_NE(Tagged(gmac, iv, message, 1 << 20, random), tag);
  iv[11] ^= 1;
  key[0] ^= 1;
  Gmac other(key, GetParam());
  EXPECT_NE(Tagged(other, iv, message, 1 << 20, random), tag);
}

INSTANTIATE_TEST_SUITE_P(Impls, GmacTest,
                         ::testing::Values(GmacImpl::kOpenSsl, GmacImpl::kVpclmulqdq,
                                           GmacImpl::kVpclmulqdqAvx2),
                         [](const ::testing::TestParamInfo<GmacImpl> &info) {
                           std::string name = GmacImplName(info.param);
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

TEST(GmacAutoTest, PicksTheWidestTheCpuHasUnlessSet) {
  const uint8_t key[Gmac::kKeyBytes] = {};
  GmacImpl widest = GmacImpl::kOpenSsl;
  for (GmacImpl impl : {GmacImpl::kVpclmulqdqAvx2, GmacImpl::kVpclmulqdq}) {
    if (GmacImplSupported(impl)) widest = impl;
  }
  EXPECT_EQ(Gmac(key).impl(), widest);
  SetAutoGmacImpl(GmacImpl::kOpenSsl);
  EXPECT_EQ(Gmac(key).impl(), GmacImpl::kOpenSsl);
  SetAutoGmacImpl(GmacImpl::kAuto);
  EXPECT_EQ(AutoGmacImpl(), Gmac(key).impl());
}

}  // namespace
}  // namespace lazyrag
