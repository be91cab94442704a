#include "common/sha256.h"

// The SHA256_Init/Update/Final family is deprecated in OpenSSL 3 in favour of EVP, but it is
// still shipped, allocation-free and runs the same accelerated block function; EVP would add a
// heap context and a provider fetch to every one of the many small hashes (prefix page ids).
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

namespace lazyrag {
namespace {

SHA256_CTX* Ctx(unsigned char* storage) { return reinterpret_cast<SHA256_CTX*>(storage); }

}  // namespace

static_assert(sizeof(SHA256_CTX) <= 128 && alignof(SHA256_CTX) <= 8, "Sha256::ctx_ too small");

Sha256::Sha256() { SHA256_Init(Ctx(ctx_)); }

void Sha256::Update(const void* data, size_t len) {
  if (len > 0) SHA256_Update(Ctx(ctx_), data, len);
}

Digest256 Sha256::Finish() {
  Digest256 out;
  SHA256_Final(out.data(), Ctx(ctx_));
  return out;
}

Digest256 Sha256Of(std::string_view data) {
  Sha256 h;
  h.Update(data);
  return h.Finish();
}

std::string ToHex(const Digest256& d) {
  static const char* kHex = "0123456789abcdef";
  std::string s(64, '0');
  for (int i = 0; i < 32; ++i) {
    s[2 * i] = kHex[d[i] >> 4];
    s[2 * i + 1] = kHex[d[i] & 15];
  }
  return s;
}

}  // namespace lazyrag
