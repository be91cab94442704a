// MACs on stored document KV (document_mac.h, document_codec.h): a value signed by one worker
// verifies for another holding the key; any change of its bytes, header or key, another cluster
// key, or a missing MAC fails; the check folded into chunk reads (Observe, several threads, any
// chunk boundaries and spans) agrees with the one-pass computation; both GMAC implementations
// agree.
#include "worker/engine/document_mac.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "worker/engine/document_codec.h"
#include "worker/engine/gmac.h"

namespace lazyrag {
namespace {

ModelConfig Config() {
  ModelConfig c;
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rope_theta = 10000.0f;
  return c;
}

// A stored document of `tokens` tokens with random KV (fp32), signed under `scope`.
StoredDocument Signed(int tokens, const DocumentMacScope& scope, uint32_t seed = 1) {
  const ModelConfig c = Config();
  std::vector<int32_t> ids(tokens);
  for (int i = 0; i < tokens; ++i) ids[i] = i % c.vocab_size;
  std::string payload(DocumentPayloadBytes(c, KvDtype::kFloat32, tokens), '\0');
  std::mt19937 random(seed);
  for (char& ch : payload) ch = char(random());
  return EncodeDocument(c, KvDtype::kFloat32, ids, payload, scope);
}

absl::Status Verify(const StoredDocument& d, const DocumentMacScope& scope) {
  auto header = DecodeDocumentHeader(d.metadata, Config(), KvDtype::kFloat32);
  if (!header.ok()) return header.status();
  return VerifyDocumentMac(d, *header, scope);
}

class DocumentMacTest : public ::testing::Test {
 protected:
  std::shared_ptr<const DocumentMacKey> key_ =
      DocumentMacKey::FromSecret("0123456789abcdef0123456789abcdef");
  DocumentMacScope Scope(std::string_view ns = "acme/", std::string_view id = "d1") const {
    return DocumentMacScope{key_.get(), "fp", ns, id};
  }
};

TEST_F(DocumentMacTest, SignedValueVerifiesAndDecodes) {
  StoredDocument d = Signed(700, Scope());  // 700 tokens: 2.9 MB, 11 blocks, a short last one
  auto header = DecodeDocumentHeader(d.metadata, Config(), KvDtype::kFloat32);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_TRUE(header->has_mac);
  EXPECT_TRUE(Verify(d, Scope()).ok());
  EXPECT_TRUE(DecodeDocument(d, Config(), KvDtype::kFloat32).ok());
  // Without a key nothing is checked (and a MAC'd value decodes as before).
  EXPECT_TRUE(Verify(d, DocumentMacScope{}).ok());
}

TEST_F(DocumentMacTest, AnyChangeFails) {
  const StoredDocument d = Signed(700, Scope());
  StoredDocument flipped = d;
  flipped.bytes[flipped.bytes.size() / 2] ^= 0x01;
  EXPECT_EQ(Verify(flipped, Scope()).code(), absl::StatusCode::kDataLoss);
  StoredDocument tokens_changed = d;
  tokens_changed.bytes[0] ^= 0x01;
  EXPECT_FALSE(Verify(tokens_changed, Scope()).ok());
  StoredDocument tag_changed = d;
  tag_changed.metadata.back() ^= 0x01;
  EXPECT_FALSE(Verify(tag_changed, Scope()).ok());
  StoredDocument crc_changed = d;  // header words are bound too
  crc_changed.metadata[40] ^= 0x01;
  EXPECT_FALSE(Verify(crc_changed, Scope()).ok());
  // Copied under another key (namespace or id), or checked with another cluster key.
  EXPECT_FALSE(Verify(d, Scope("globex/", "d1")).ok());
  EXPECT_FALSE(Verify(d, Scope("acme/", "d2")).ok());
  auto other = DocumentMacKey::FromSecret("another key of at least 32 bytes!!");
  EXPECT_FALSE(Verify(d, DocumentMacScope{other.get(), "fp", "acme/", "d1"}).ok());
  // A value without a MAC (written without a key, or by a shard) is not accepted with one.
  const StoredDocument plain = Signed(700, DocumentMacScope{});
  absl::Status st = Verify(plain, Scope());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find(kMacFailure), std::string::npos) << st;
}

TEST_F(DocumentMacTest, ObservedChunksAgreeWithOnePass) {
  const StoredDocument d = Signed(1000, Scope());
  auto header = DecodeDocumentHeader(d.metadata, Config(), KvDtype::kFloat32);
  ASSERT_TRUE(header.ok());
  // The bytes land in two spans (token ids, then KV), as a fetch into the host tier does.
  std::string tokens = d.bytes.substr(0, 4000), kv = d.bytes.substr(4000);
  const std::vector<ByteSpan> spans = {{tokens.data(), tokens.size()}, {kv.data(), kv.size()}};
  for (uint64_t chunk : {uint64_t(2) << 20, uint64_t(1) << 20, uint64_t(3000001)}) {
    DocumentMacCheck check(key_.get(), header->mac_nonce, d.bytes.size());
    std::vector<std::thread> readers;
    for (int t = 0; t < 3; ++t) {
      readers.emplace_back([&, t] {
        for (uint64_t at = t * chunk; at < d.bytes.size(); at += 3 * chunk) {
          const uint64_t n = std::min<uint64_t>(chunk, d.bytes.size() - at);
          // Piece by piece over the span boundary, as kvstore::Scatter reports it.
          for (uint64_t p = at; p < at + n;) {
            const bool first = p < tokens.size();
            const uint64_t span_end = first ? tokens.size() : d.bytes.size();
            const uint64_t m = std::min(at + n, span_end) - p;
            const char* data = first ? tokens.data() + p : kv.data() + (p - tokens.size());
            check.Observe(p, data, m);
            p += m;
          }
        }
      });
    }
    for (auto& r : readers) r.join();
    if (chunk % kMacBlockBytes == 0) {
      EXPECT_GT(check.observed_bytes(), d.bytes.size() / 2);
    }
    EXPECT_TRUE(check.Finish(spans, MacBindingOf(d.metadata, Scope()), header->mac_tag))
        << "chunk " << chunk;
  }
  // Nothing observed: Finish hashes every block itself.
  DocumentMacCheck none(key_.get(), header->mac_nonce, d.bytes.size());
  EXPECT_TRUE(none.Finish(spans, MacBindingOf(d.metadata, Scope()), header->mac_tag));
  // A byte changed in the landed spans fails.
  DocumentMacCheck bad(key_.get(), header->mac_nonce, d.bytes.size());
  kv[kv.size() - 1] ^= 1;
  EXPECT_FALSE(bad.Finish(spans, MacBindingOf(d.metadata, Scope()), header->mac_tag));
}

// Each GMAC implementation (gmac.h) checks what the others signed (the stored format does not
// depend on it), and fails a value with one byte flipped in any block, whether the block was
// hashed as it landed (Observe) or at Finish.
TEST_F(DocumentMacTest, EveryGmacVerifiesTheOthersAndCatchesAFlipInEveryBlock) {
  std::vector<GmacImpl> impls;
  for (GmacImpl impl : {GmacImpl::kOpenSsl, GmacImpl::kVpclmulqdq, GmacImpl::kVpclmulqdqAvx2}) {
    if (GmacImplSupported(impl)) impls.push_back(impl);
  }
  for (GmacImpl signer : impls) {
    SetAutoGmacImpl(signer);
    const StoredDocument d = Signed(700, Scope());  // 11 blocks, a short last one
    for (GmacImpl checker : impls) {
      SetAutoGmacImpl(checker);
      EXPECT_TRUE(Verify(d, Scope()).ok());
      auto header = DecodeDocumentHeader(d.metadata, Config(), KvDtype::kFloat32);
      ASSERT_TRUE(header.ok());
      for (uint64_t block = 0; block * kMacBlockBytes < d.bytes.size(); ++block) {
        std::string bytes = d.bytes;
        const uint64_t at =
            std::min<uint64_t>(block * kMacBlockBytes + 12345 * (block + 1), bytes.size() - 1);
        bytes[at] ^= 0x40;
        const std::vector<ByteSpan> spans = {{bytes.data(), bytes.size()}};
        for (bool observed : {false, true}) {
          DocumentMacCheck check(key_.get(), header->mac_nonce, bytes.size());
          if (observed) check.Observe(0, bytes.data(), bytes.size());
          EXPECT_FALSE(check.Finish(spans, MacBindingOf(d.metadata, Scope()), header->mac_tag))
              << "block " << block << ", byte " << at << (observed ? ", observed" : "");
        }
      }
    }
  }
  SetAutoGmacImpl(GmacImpl::kAuto);
}

TEST(DocumentMacKeyTest, FileNeedsThirtyTwoBytes) {
  EXPECT_EQ(DocumentMacKey::FromFile("/nonexistent/key").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazyrag
