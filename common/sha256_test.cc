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

}  // namespace
}  // namespace lazyrag
