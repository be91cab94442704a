#include "worker/engine/document_mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "worker/engine/gmac.h"

namespace lazyrag {
namespace {

struct Piece {
  const char *data;
  uint64_t size;
};

// One GMAC per thread, made for a key on first use (and again only when another key, or another
// implementation for tests and benchmarks, comes): the key schedule and the hash key's powers
// are not redone per block.
class GmacContext {
 public:
  void Tag(const uint8_t *key, const std::array<uint8_t, kMacNonceBytes> &nonce, uint32_t block,
           const Piece *pieces, size_t n, uint8_t out[16]) {
    const GmacImpl impl = AutoGmacImpl();
    if (gmac_ == nullptr || gmac_->impl() != impl ||
        std::memcmp(key, key_.data(), key_.size()) != 0) {
      gmac_ = std::make_unique<Gmac>(key, impl);
      std::memcpy(key_.data(), key, key_.size());
    }
    uint8_t iv[Gmac::kIvBytes];
    std::memcpy(iv, nonce.data(), kMacNonceBytes);
    iv[8] = uint8_t(block >> 24);
    iv[9] = uint8_t(block >> 16);
    iv[10] = uint8_t(block >> 8);
    iv[11] = uint8_t(block);
    gmac_->Start(iv);
    for (size_t i = 0; i < n; ++i) {
      gmac_->Update(reinterpret_cast<const uint8_t *>(pieces[i].data), pieces[i].size);
    }
    gmac_->Finish(out);
  }

 private:
  std::unique_ptr<Gmac> gmac_;
  std::array<uint8_t, 32> key_{};
};

GmacContext &ThreadGmac() {
  thread_local GmacContext ctx;
  return ctx;
}

uint64_t BlockCount(uint64_t total) { return (total + kMacBlockBytes - 1) / kMacBlockBytes; }

void AppendLengthPrefixed(std::string *out, std::string_view s) {
  const uint64_t n = s.size();
  out->append(reinterpret_cast<const char *>(&n), sizeof(n));
  out->append(s.data(), s.size());
}

MacTag FinalTag(const DocumentMacKey &key, const std::array<uint8_t, kMacNonceBytes> &nonce,
                const DocumentMacBinding &b, const std::vector<std::array<uint8_t, 16>> &tags,
                uint64_t total_bytes) {
  std::string msg = "lazyrag.document_kv.mac.v1";
  AppendLengthPrefixed(&msg, b.header);
  AppendLengthPrefixed(&msg, b.model_fingerprint);
  AppendLengthPrefixed(&msg, b.cache_namespace);
  AppendLengthPrefixed(&msg, b.document_id);
  msg.append(reinterpret_cast<const char *>(nonce.data()), nonce.size());
  msg.append(reinterpret_cast<const char *>(&total_bytes), sizeof(total_bytes));
  for (const auto &t : tags) msg.append(reinterpret_cast<const char *>(t.data()), t.size());
  MacTag out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.hmac_key(), 32, reinterpret_cast<const uint8_t *>(msg.data()), msg.size(),
       out.data(), &len);
  return out;
}

// The pieces of value bytes [begin, end) in `spans`.
std::vector<Piece> PiecesOf(const std::vector<ByteSpan> &spans, uint64_t begin, uint64_t end) {
  std::vector<Piece> out;
  uint64_t at = 0;
  for (const ByteSpan &s : spans) {
    const uint64_t lo = std::max(begin, at), hi = std::min(end, at + s.size);
    if (lo < hi) out.push_back({s.data + (lo - at), hi - lo});
    at += s.size;
    if (at >= end) break;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const DocumentMacKey>> DocumentMacKey::FromFile(
    const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::InvalidArgumentError(absl::StrCat("--kv_mac_key_file ", path, ": cannot read"));
  std::stringstream s;
  s << in.rdbuf();
  std::string secret = s.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.size() < 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_mac_key_file ", path, ": ", secret.size(),
                     " bytes; a key needs at least 32 (e.g. openssl rand -hex 32)"));
  }
  return FromSecret(secret);
}

std::shared_ptr<const DocumentMacKey> DocumentMacKey::FromSecret(std::string_view secret) {
  auto key = std::make_shared<DocumentMacKey>();
  Sha256 g;
  g.Update("lazyrag.document_kv.gmac_key");
  g.Update(secret);
  key->gmac_key_ = g.Finish();
  Sha256 h;
  h.Update("lazyrag.document_kv.hmac_key");
  h.Update(secret);
  key->hmac_key_ = h.Finish();
  return key;
}

std::array<uint8_t, kMacNonceBytes> NewMacNonce() {
  std::array<uint8_t, kMacNonceBytes> nonce{};
  RAND_bytes(nonce.data(), int(nonce.size()));
  return nonce;
}

MacTag ComputeDocumentMac(const DocumentMacKey &key,
                          const std::array<uint8_t, kMacNonceBytes> &nonce,
                          const DocumentMacBinding &binding, std::string_view bytes) {
  const uint64_t blocks = BlockCount(bytes.size());
  std::vector<std::array<uint8_t, 16>> tags(blocks);
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t begin = b * kMacBlockBytes;
    const Piece piece{bytes.data() + begin,
                      std::min<uint64_t>(kMacBlockBytes, bytes.size() - begin)};
    ThreadGmac().Tag(key.gmac_key(), nonce, uint32_t(b), &piece, 1, tags[b].data());
  }
  return FinalTag(key, nonce, binding, tags, bytes.size());
}

DocumentMacCheck::DocumentMacCheck(const DocumentMacKey *key,
                                   const std::array<uint8_t, kMacNonceBytes> &nonce,
                                   uint64_t total_bytes)
    : key_(key),
      nonce_(nonce),
      total_bytes_(total_bytes),
      block_tags_(BlockCount(total_bytes)),
      block_done_(new std::atomic<uint8_t>[BlockCount(total_bytes)]) {
  for (size_t b = 0; b < block_tags_.size(); ++b) block_done_[b].store(0);
}

void DocumentMacCheck::Observe(uint64_t offset, const char *data, uint64_t size) {
  const uint64_t end = std::min(offset + size, total_bytes_);
  uint64_t b = (offset + kMacBlockBytes - 1) / kMacBlockBytes;  // first block starting inside
  for (; b < block_tags_.size(); ++b) {
    const uint64_t begin = b * kMacBlockBytes;
    const uint64_t block_end = std::min(begin + kMacBlockBytes, total_bytes_);
    if (block_end > end) break;  // not whole in this range: left to Finish (or another call)
    const Piece piece{data + (begin - offset), block_end - begin};
    ThreadGmac().Tag(key_->gmac_key(), nonce_, uint32_t(b), &piece, 1, block_tags_[b].data());
    block_done_[b].store(1, std::memory_order_release);
    observed_bytes_.fetch_add(block_end - begin, std::memory_order_relaxed);
  }
}

bool DocumentMacCheck::Finish(const std::vector<ByteSpan> &spans, const DocumentMacBinding &binding,
                              const MacTag &expected) {
  for (uint64_t b = 0; b < block_tags_.size(); ++b) {
    if (block_done_[b].load(std::memory_order_acquire)) continue;
    const uint64_t begin = b * kMacBlockBytes;
    const uint64_t end = std::min(begin + kMacBlockBytes, total_bytes_);
    std::vector<Piece> pieces = PiecesOf(spans, begin, end);
    ThreadGmac().Tag(key_->gmac_key(), nonce_, uint32_t(b), pieces.data(), pieces.size(),
                     block_tags_[b].data());
  }
  const MacTag tag = FinalTag(*key_, nonce_, binding, block_tags_, total_bytes_);
  return CRYPTO_memcmp(tag.data(), expected.data(), tag.size()) == 0;
}

}  // namespace lazyrag
