#include "worker/model/tokenizer/tokenizer.h"

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/tokenizer/chat_template.h"
#include "worker/model/tokenizer/pretokenizer.h"
#include "worker/model/tokenizer/utf8.h"

namespace lazyrag {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// GPT-2's byte alphabet, written independently of tokenizer.cc: bytes that print as Latin-1
// stand for themselves, the rest take U+0100 upwards.
std::string ByteChar(int b) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool keep = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE);
      AppendUtf8(keep ? i : next++, &t[i]);
    }
    return t;
  }();
  return table[b];
}

// 256 byte tokens (ids 0..255 in byte order), then `extra`.
TokenizerSpec ByteLevelSpec(std::vector<std::string> extra, std::vector<std::string> merges,
                            std::string pre = "gpt2") {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = std::move(pre);
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(ByteChar(b));
  for (auto& e : extra) spec.tokens.push_back(std::move(e));
  spec.token_types.assign(spec.tokens.size(), 1);
  spec.merges = std::move(merges);
  return spec;
}

std::unique_ptr<Tokenizer> MustCreate(const TokenizerSpec& spec, int vocab_size = 0) {
  auto t = Tokenizer::Create(spec, vocab_size);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::vector<std::string> Pieces(const PreTokenizer& pre, std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : pre.Split(text)) out.emplace_back(p);
  return out;
}

TEST(Utf8Test, Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\x80"));              // stray continuation
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\xAF"));      // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xE4\xB8"));          // truncated
  EXPECT_EQ(Utf8SequenceLength("\xF0\x9F\x98\x80!"), 4u);
  EXPECT_EQ(DecodeUtf8("\xF0\x9F\x98\x80"), 0x1F600u);
  std::string s;
  AppendUtf8(0x1F600, &s);
  AppendUtf8(0xE9, &s);
  EXPECT_EQ(s, "\xF0\x9F\x98\x80\xC3\xA9");
}

TEST(Utf8Test, CompletePrefix) {
  EXPECT_EQ(Utf8CompletePrefix(""), 0u);
  EXPECT_EQ(Utf8CompletePrefix("abc"), 3u);
  EXPECT_EQ(Utf8CompletePrefix("a\xE4\xB8\xAD"), 4u);
  EXPECT_EQ(Utf8CompletePrefix("a\xE4\xB8"), 1u);
  EXPECT_EQ(Utf8CompletePrefix("a\xE4"), 1u);
  EXPECT_EQ(Utf8CompletePrefix("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(Utf8CompletePrefix("a\xF0\x9F\x98\x80"), 5u);
  // Garbage is never held back: it can not become a character.
  EXPECT_EQ(Utf8CompletePrefix("a\x80"), 2u);
  EXPECT_EQ(Utf8CompletePrefix("a\xFF"), 2u);
  EXPECT_EQ(Utf8CompletePrefix("a\xE0\x80"), 3u);  // E0 80 is overlong whatever follows
  // Streaming: emitting the complete prefix of the accumulated bytes never splits a character.
  const std::string text = "h\xC3\xA9llo \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD";
  std::string pending, emitted;
  for (char c : text) {
    pending.push_back(c);
    const size_t n = Utf8CompletePrefix(pending);
    EXPECT_TRUE(IsValidUtf8(pending.substr(0, n)));
    emitted += pending.substr(0, n);
    pending.erase(0, n);
  }
  EXPECT_EQ(pending, "");
  EXPECT_EQ(emitted, text);
}

TEST(PreTokenizerTest, Gpt2) {
  auto pre = PreTokenizer::Create("gpt2");
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_THAT(Pieces(**pre, "Hello world's 123  x \n"),
              ElementsAre("Hello", " world", "'s", " 123", " ", " x", " \n"));
  // U+0085 (NEL) is White_Space for Hugging Face and llama.cpp, unlike PCRE2's own \\s.
  EXPECT_THAT(Pieces(**pre, "a\u00A0\u0085b"), ElementsAre("a", "\u00A0", "\u0085", "b"));
  EXPECT_THAT(Pieces(**pre, "x!!  "), ElementsAre("x", "!!", "  "));
}

TEST(PreTokenizerTest, SmolLMSplitsEveryDigit) {
  auto pre = PreTokenizer::Create("smollm");
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_THAT(Pieces(**pre, "year 2024!"), ElementsAre("year", " ", "2", "0", "2", "4", "!"));
  // Arabic-Indic digits are \p{N} too.
  EXPECT_THAT(Pieces(**pre, "\u0661\u0662"), ElementsAre("\u0661", "\u0662"));
}

TEST(PreTokenizerTest, Llama3) {
  auto pre = PreTokenizer::Create("llama-bpe");
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_THAT(Pieces(**pre, "I'M 1234567 ok\n\n  x"),
              ElementsAre("I", "'M", " ", "123", "456", "7", " ok", "\n\n", " ", " x"));
  EXPECT_THAT(Pieces(**pre, "(hello)\n"), ElementsAre("(hello", ")\n"));
}

TEST(PreTokenizerTest, Errors) {
  auto unknown = PreTokenizer::Create("qwen2-unknown");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("qwen2-unknown"));
  auto bad = PreTokenizer::FromPatterns({"(unclosed"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PreTokenizerTest, LongWhitespaceRunDoesNotFail) {
  auto pre = PreTokenizer::Create("gpt2");
  ASSERT_TRUE(pre.ok());
  const std::string text = std::string(200000, ' ') + "x";
  auto pieces = Pieces(**pre, text);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].size(), 199999u);
  EXPECT_EQ(pieces[1], " x");
}

TEST(TokenizerTest, MergesApplyInRankOrder) {
  const int a = 'a', b = 'b', c = 'c';
  const int ab = 256, bc = 257, abc = 258;
  {
    auto t = MustCreate(ByteLevelSpec({"ab", "bc", "abc"}, {"b c", "a b", "a bc"}));
    EXPECT_THAT(t->Encode("abc"), ElementsAre(abc));
    EXPECT_THAT(t->Encode("ab"), ElementsAre(ab));
    EXPECT_THAT(t->Encode("bcb"), ElementsAre(bc, b));
  }
  {
    // "ab c" is not a merge here, so once "a b" wins the word stays split.
    auto t = MustCreate(ByteLevelSpec({"ab", "bc", "abc"}, {"a b", "b c", "a bc"}));
    EXPECT_THAT(t->Encode("abc"), ElementsAre(ab, c));
    EXPECT_THAT(t->Encode("cba"), ElementsAre(c, b, a));
  }
}

TEST(TokenizerTest, EqualRanksMergeLeftmostFirst) {
  auto t = MustCreate(ByteLevelSpec({"aa", "aaaa"}, {"a a", "aa aa"}));
  EXPECT_THAT(t->Encode("aaa"), ElementsAre(256, 'a'));
  EXPECT_THAT(t->Encode("aaaaa"), ElementsAre(257, 'a'));
}

TEST(TokenizerTest, SpaceIsByteLevelAndWordsDoNotMergeAcrossPieces) {
  // "Ġ" is the byte-level character of ' '.
  auto t = MustCreate(ByteLevelSpec({"\u0120b", "b\u0120"}, {"\u0120 b", "b \u0120"}));
  EXPECT_THAT(t->Encode("a b"), ElementsAre('a', 256));
  // "b " is split by the pre-tokenizer into "b", " " so "b Ġ" never fires.
  EXPECT_THAT(t->Encode("b "), ElementsAre('b', 32));
}

TEST(TokenizerTest, SpecialTokensLongestFirstAndOptional) {
  TokenizerSpec spec = ByteLevelSpec({"<|end|>", "<|end|>x", "<user>"}, {});
  spec.token_types[256] = 3;  // control
  spec.token_types[257] = 3;  // control, longer
  spec.token_types[258] = 4;  // user-defined: always matched
  spec.eos_id = 256;
  auto t = MustCreate(spec);
  EXPECT_THAT(t->Encode("a<|end|>xb"), ElementsAre('a', 257, 'b'));
  EXPECT_THAT(t->Encode("<|end|><|end|>"), ElementsAre(256, 256));
  EXPECT_THAT(t->Encode("<|end|", true), ElementsAre('<', '|', 'e', 'n', 'd', '|'));
  EXPECT_THAT(t->Encode("<|end|>", false), ElementsAre('<', '|', 'e', 'n', 'd', '|', '>'));
  EXPECT_THAT(t->Encode("<user>", false), ElementsAre(258));
  EXPECT_TRUE(t->IsSpecial(256));
  EXPECT_FALSE(t->IsSpecial(258));
  EXPECT_FALSE(t->IsSpecial('a'));
  EXPECT_EQ(t->TokenId("<|end|>"), 256);
  EXPECT_EQ(t->TokenId("nope"), std::nullopt);
  EXPECT_EQ(t->TokenBytes(256), "<|end|>");
  EXPECT_EQ(t->TokenBytes(32), " ");
  EXPECT_EQ(t->eos_id(), 256);
  EXPECT_EQ(t->bos_id(), -1);
  const std::string text = "x <|end|>x<user> y";
  EXPECT_EQ(t->Decode(t->Encode(text)), text);
}

TEST(TokenizerTest, RoundTripsArbitraryBytes) {
  auto t =
      MustCreate(ByteLevelSpec({"\u0120t", "he", "\u0120the", "\xC3\xA4\xC2\xB8"},
                               {"\u0120 t", "h e", "\u0120t he", "\xC3\xA4 \xC2\xB8"}, "smollm"));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int len = rng() % 40;
    for (int i = 0; i < len; ++i) {
      switch (rng() % 4) {
        case 0:
          s.push_back(static_cast<char>(rng() % 256));
          break;  // often invalid UTF-8
        case 1:
          s += " the";
          break;
        case 2:
          s += "\xE4\xB8\xAD";
          break;
        default:
          s.push_back("ab1 \n\t'"[rng() % 7]);
          break;
      }
    }
    EXPECT_EQ(t->Decode(t->Encode(s)), s) << trial;
  }
  EXPECT_THAT(t->Encode(" the"), ElementsAre(258));
  EXPECT_TRUE(t->Encode("").empty());
}

TEST(TokenizerTest, BytesWithoutATokenAreDroppedBeforeMerging) {
  TokenizerSpec spec = ByteLevelSpec({"!!"}, {"! !"});
  spec.tokens[4] = "unused-4";  // byte 0x04 has no token now
  auto t = MustCreate(spec);
  EXPECT_THAT(t->Encode("!\x04!"), ElementsAre(256));
  EXPECT_EQ(t->Decode(t->Encode("a\x04"
                                "b")),
            "ab");
}

TEST(TokenizerTest, Llama3EmitsWholeWordTokensWithoutMerging) {
  // "xyz" is a token but no merge path builds it: only llama-bpe's ignore_merges finds it.
  EXPECT_THAT(MustCreate(ByteLevelSpec({"xyz"}, {}, "llama-bpe"))->Encode("xyz"), ElementsAre(256));
  EXPECT_THAT(MustCreate(ByteLevelSpec({"xyz"}, {}, "gpt2"))->Encode("xyz"),
              ElementsAre('x', 'y', 'z'));
}

TEST(TokenizerTest, VocabPaddingAndOutOfRangeIds) {
  auto t = MustCreate(ByteLevelSpec({}, {}), 300);
  EXPECT_EQ(t->vocab_size(), 300);
  const std::vector<int32_t> ids = {'h', 280, -5, 1000, 'i'};
  EXPECT_EQ(t->Decode(ids), "hi");
  EXPECT_EQ(t->TokenBytes(299), "");
}

TEST(TokenizerTest, CreateErrors) {
  TokenizerSpec unknown_model = ByteLevelSpec({}, {});
  unknown_model.model = "sentencepiece";
  EXPECT_EQ(Tokenizer::Create(unknown_model, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::Create(ByteLevelSpec({}, {}, "no-such-pre"), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::Create(ByteLevelSpec({}, {}), 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  TokenizerSpec bad_types = ByteLevelSpec({}, {});
  bad_types.token_types.pop_back();
  EXPECT_EQ(Tokenizer::Create(bad_types, 0).status().code(), absl::StatusCode::kInvalidArgument);
  TokenizerSpec bad_eos = ByteLevelSpec({}, {});
  bad_eos.eos_id = 9999;
  EXPECT_EQ(Tokenizer::Create(bad_eos, 0).status().code(), absl::StatusCode::kInvalidArgument);
  TokenizerSpec empty;
  empty.model = "gpt2";
  EXPECT_EQ(Tokenizer::Create(empty, 0).status().code(), absl::StatusCode::kInvalidArgument);
  TokenizerSpec bytes;
  EXPECT_EQ(Tokenizer::Create(bytes, 100).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, BytesFallback) {
  TokenizerSpec spec;  // model = "bytes"
  auto t = MustCreate(spec, 512);
  EXPECT_EQ(t->vocab_size(), 512);
  EXPECT_EQ(t->bos_id(), 0);
  EXPECT_EQ(t->eos_id(), 1);
  EXPECT_THAT(t->Encode("hi"), ElementsAre(3 + 'h', 3 + 'i'));
  EXPECT_THAT(t->Encode("a</s>"), ElementsAre(3 + 'a', 1));
  EXPECT_EQ(t->Encode("</s>", false).size(), 4u);
  EXPECT_EQ(t->TokenId("<pad>"), 2);
  EXPECT_TRUE(t->IsSpecial(0));
  EXPECT_FALSE(t->IsSpecial(3));
  const std::vector<int32_t> ids = {3 + 'o', 300, 511, 3 + 'k'};
  EXPECT_EQ(t->Decode(ids), "ok");
  const std::string bytes("\x00\xFF\xC3(", 4);
  EXPECT_EQ(t->Decode(t->Encode(bytes)), bytes);
}

TEST(TokenizerTest, ConcurrentEncodeIsConsistent) {
  auto t =
      MustCreate(ByteLevelSpec({"\u0120t", "he", "\u0120the"}, {"\u0120 t", "h e", "\u0120t he"}));
  std::string text;
  for (int i = 0; i < 2000; ++i) text += " the w" + std::to_string(i % 97);
  const std::vector<int32_t> expected = t->Encode(text);
  std::vector<std::thread> threads;
  std::vector<bool> same(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { same[i] = t->Encode(text) == expected; });
  }
  for (auto& th : threads) th.join();
  for (bool s : same) EXPECT_TRUE(s);
}

TEST(RagTemplateTest, ChatML) {
  TokenizerSpec spec = ByteLevelSpec({"<|im_start|>", "<|im_end|>", "<|endoftext|>"}, {});
  spec.eos_id = 257;
  spec.chat_template =
      "{{ '<|im_start|>system\nYou are a test bot<|im_end|>\n' }}{{'<|im_start|>' + role }}";
  RagTemplate t = RagTemplate::ForSpec(spec);
  EXPECT_EQ(t.kind, RagTemplate::Kind::kChatML);
  EXPECT_EQ(t.Prefix(""), "<|im_start|>system\nYou are a test bot<|im_end|>\n<|im_start|>user\n");
  EXPECT_EQ(t.Prefix("Be brief."), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n");
  EXPECT_EQ(t.Document("doc"), "doc\n\n");
  EXPECT_EQ(t.Suffix("why?"), "Question: why?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_THAT(t.stop_token_ids, ElementsAre(257, 258));

  spec.chat_template = "";
  EXPECT_EQ(RagTemplate::ForSpec(spec).Prefix(""), std::string("<|im_start|>system\n") +
                                                       kSmolLM2DefaultSystem +
                                                       "<|im_end|>\n<|im_start|>user\n");
}

TEST(RagTemplateTest, Llama3) {
  TokenizerSpec spec = ByteLevelSpec({"<|begin_of_text|>", "<|start_header_id|>",
                                      "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"},
                                     {}, "llama-bpe");
  spec.eos_id = 260;
  RagTemplate t = RagTemplate::ForSpec(spec);
  EXPECT_EQ(t.kind, RagTemplate::Kind::kLlama3);
  EXPECT_EQ(t.Prefix("S"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n");
  EXPECT_EQ(t.Suffix("q"),
            "Question: q<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_THAT(t.stop_token_ids, ElementsAre(259, 260));
}

TEST(RagTemplateTest, PlainForBytes) {
  TokenizerSpec spec;
  RagTemplate t = RagTemplate::ForSpec(spec);
  EXPECT_EQ(t.kind, RagTemplate::Kind::kPlain);
  EXPECT_EQ(t.Prefix("Be nice."), "System: Be nice.\n");
  EXPECT_EQ(t.Prefix(""), "");
  EXPECT_EQ(t.Document("text"), "text\n\n");
  EXPECT_EQ(t.Suffix("q?"), "Question: q?\nAnswer:");
  EXPECT_THAT(t.stop_token_ids, ElementsAre(1));
}

}  // namespace
}  // namespace lazyrag
