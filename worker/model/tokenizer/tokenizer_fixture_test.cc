// Token ids of SmolLM2-135M-Instruct against tests/fixtures/smollm2_tokenizer.json, written by
// tests/fixtures/gen_tokenizer_fixtures.py from a Hugging Face `tokenizers` reference (and
// cross-checked there with llama.cpp). Needs the GGUF named by $LAZYRAG_MODEL; skips without it.
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/model_source.h"
#include "worker/model/tokenizer/chat_template.h"
#include "worker/model/tokenizer/tokenizer.h"

namespace lazyrag {
namespace {

std::string FromHex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

struct FixtureCase {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;  // Hugging Face's decode of `ids` (== text unless bytes were dropped)
};

// The hex string value of `"key": "..."` in `line`, decoded; nullopt when absent.
std::optional<std::string> HexField(const std::string& line, const std::string& key) {
  const std::string open = "\"" + key + "\": \"";
  const size_t at = line.find(open);
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + open.size();
  return FromHex(std::string_view(line).substr(begin, line.find('"', begin) - begin));
}

// The generator writes one case per line: {"text": ..., "hex": "...", "ids": [1, 2]}.
std::vector<FixtureCase> ReadFixtures(const std::string& path) {
  std::ifstream in(path);
  std::vector<FixtureCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    const std::optional<std::string> text = HexField(line, "hex");
    const size_t ids = line.find("\"ids\": [");
    if (!text.has_value() || ids == std::string::npos) continue;
    FixtureCase c;
    c.text = *text;
    c.decoded = HexField(line, "decoded_hex").value_or(c.text);
    std::string list = line.substr(ids + 8, line.find(']', ids) - ids - 8);
    for (char& ch : list) {
      if (ch == ',') ch = ' ';
    }
    std::istringstream numbers(list);
    for (int32_t id; numbers >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  return cases;
}

class SmolLM2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* model = std::getenv("LAZYRAG_MODEL");
    if (model == nullptr || *model == '\0') return;
    auto spec = LoadTokenizerSpec(model);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = new TokenizerSpec(*std::move(spec));
    auto tokenizer = Tokenizer::Create(*spec_, 0);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(tokenizer).value().release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete spec_;
    tokenizer_ = nullptr;
    spec_ = nullptr;
  }
  void SetUp() override {
    if (tokenizer_ == nullptr) GTEST_SKIP() << "LAZYRAG_MODEL is not set (path of the GGUF)";
  }

  static TokenizerSpec* spec_;
  static Tokenizer* tokenizer_;
};

TokenizerSpec* SmolLM2TokenizerTest::spec_ = nullptr;
Tokenizer* SmolLM2TokenizerTest::tokenizer_ = nullptr;

TEST_F(SmolLM2TokenizerTest, MatchesHuggingFaceFixtures) {
  const auto cases = ReadFixtures(LAZYRAG_FIXTURE_DIR "/smollm2_tokenizer.json");
  ASSERT_GE(cases.size(), 200u);
  int mismatches = 0;
  for (const FixtureCase& c : cases) {
    const std::vector<int32_t> ids = tokenizer_->Encode(c.text);
    if (ids != c.ids) ++mismatches;
    EXPECT_EQ(ids, c.ids) << "text: \"" << c.text << "\"";
    EXPECT_EQ(tokenizer_->Decode(ids), c.decoded);
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size();
}

TEST_F(SmolLM2TokenizerTest, SpecialsAndTemplate) {
  EXPECT_EQ(spec_->pre, "smollm");
  EXPECT_EQ(tokenizer_->vocab_size(), 49152);
  EXPECT_EQ(tokenizer_->TokenId("<|im_end|>"), 2);
  EXPECT_EQ(tokenizer_->TokenId("<|im_start|>"), 1);
  EXPECT_TRUE(tokenizer_->IsSpecial(2));
  EXPECT_FALSE(tokenizer_->IsSpecial(100));
  EXPECT_EQ(tokenizer_->eos_id(), 2);
  const RagTemplate t = RagTemplate::ForSpec(*spec_);
  EXPECT_EQ(t.kind, RagTemplate::Kind::kChatML);
  EXPECT_EQ(t.default_system, kSmolLM2DefaultSystem);
  EXPECT_EQ(t.stop_token_ids, (std::vector<int32_t>{0, 2}));
  const std::vector<int32_t> prefix = tokenizer_->Encode(t.Prefix(""));
  ASSERT_FALSE(prefix.empty());
  EXPECT_EQ(prefix.front(), 1);
  // Without parse_special the markers are plain text.
  EXPECT_GT(tokenizer_->Encode("<|im_end|>", false).size(), 1u);
}

TEST_F(SmolLM2TokenizerTest, InvalidUtf8) {
  // Truncated and stray sequences made of bytes the vocabulary has survive exactly.
  const std::string bytes = "ok \xE4\xB8 \x80\x80 tail\xF0\x9F";
  EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(bytes)), bytes);
  // Bytes without a token (0xFF, 0xFE never occur in UTF-8) are dropped, not crashed on.
  EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode("a\xFF\xFE b")), "a b");
}

TEST_F(SmolLM2TokenizerTest, HundredKilobytesRoundTrip) {
  std::string text;
  while (text.size() < 100 * 1024) {
    text += "Retrieval-augmented generation (RAG) 2024: ";
    text += "中文测试 café 👍🏽 def f(x):\n\treturn x\n";
  }
  EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(text)), text);
}

}  // namespace
}  // namespace lazyrag
