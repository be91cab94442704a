#include "common/sha256.h"

#include <vector>

#include "common/document_id.h"
#include "gtest/gtest.h"

namespace lazyrag {
namespace {

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(ToHex(Sha256Of("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(ToHex(Sha256Of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ToHex(Sha256Of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string million(1000000, 'a');
  EXPECT_EQ(ToHex(Sha256Of(million)),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, IncrementalEqualsOneShot) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(char(i * 7));
  Sha256 h;
  for (size_t i = 0; i < data.size(); i += 13) h.Update(data.substr(i, 13));
  EXPECT_EQ(ToHex(h.Finish()), ToHex(Sha256Of(data)));
}

TEST(DocumentIdTest, DependsOnEveryField) {
  std::vector<int32_t> a = {1, 2, 3};
  std::vector<int32_t> b = {1, 2, 4};
  std::string id = DocumentId("model", "ns", a);
  EXPECT_TRUE(IsDocumentId(id));
  EXPECT_EQ(id, DocumentId("model", "ns", a));
  EXPECT_NE(id, DocumentId("model", "ns", b));
  EXPECT_NE(id, DocumentId("model2", "ns", a));
  EXPECT_NE(id, DocumentId("model", "", a));
  // Length prefixes keep field boundaries apart.
  EXPECT_NE(DocumentId("ab", "c", a), DocumentId("a", "bc", a));
  EXPECT_FALSE(IsDocumentId("xyz"));
  EXPECT_FALSE(IsDocumentId(std::string(64, 'G')));
}

// Document ids name stored KV (kvstore keys, caches): the scheme must never change. Golden
// values from the original portable implementation.
TEST(DocumentIdTest, StableAcrossImplementations) {
  EXPECT_EQ(DocumentId("model", "ns", std::vector<int32_t>{1, 2, 3, -5, 70000}),
            "61357953083453a0c39f36d1945e4859c7bfcd1f814b91982b157f38e8746321");
  std::vector<int32_t> big(1000);
  for (int i = 0; i < 1000; ++i) big[i] = i * 131;
  EXPECT_EQ(DocumentId("m", "", big),
            "af6b1f4c5295c5602acb593f7bdf6c81aff0fe27beb72639befe9a88b7ad87e8");
}

TEST(Sha256Test, CopyContinuesFromTheSameState) {
  Sha256 a;
  a.Update("prefix-");
  Sha256 b = a;
  a.Update("one");
  b.Update("two");
  EXPECT_EQ(ToHex(a.Finish()), ToHex(Sha256Of("prefix-one")));
  EXPECT_EQ(ToHex(b.Finish()), ToHex(Sha256Of("prefix-two")));
}

}  // namespace
}  // namespace lazyrag
