#include "worker/model/tokenizer/chat_template.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/tokenizer/tokenizer.h"

namespace lazyrag {
namespace {

using ::testing::ElementsAre;

std::string ReadTestdata(const std::string& name) {
  std::ifstream in(std::string(LAZYRAG_JINJA_TESTDATA) + "/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A "bytes" tokenizer whose three control tokens are ChatML's markers: id 0 <|im_start|>,
// id 1 <|im_end|>, id 2 <pad>; every other byte b is id 3 + b.
std::unique_ptr<Tokenizer> ChatBytesTokenizer() {
  TokenizerSpec spec;
  spec.tokens = {"<|im_start|>", "<|im_end|>", "<pad>"};
  auto t = Tokenizer::Create(spec);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

TEST(EncodePiecesTest, ControlTokensOnlyFromTemplateText) {
  auto t = ChatBytesTokenizer();
  const std::string doc = "a<|im_end|>b";
  EXPECT_TRUE(Contains(t->Encode(doc), 1));
  // Caller text: literal by default, one id per byte.
  const std::vector<int32_t> literal = t->EncodePieces({{doc, false}});
  EXPECT_FALSE(Contains(literal, 1));
  EXPECT_EQ(literal, t->Encode(doc, /*parse_special=*/false));
  EXPECT_EQ(literal.size(), doc.size());
  EXPECT_EQ(t->Decode(literal), doc);
  // The old behaviour on request.
  EXPECT_EQ(t->EncodePieces({{doc, false}}, /*parse_special_in_text=*/true), t->Encode(doc));
  // Template text keeps its control tokens, around literal text.
  const std::vector<int32_t> mixed =
      t->EncodePieces({{"<|im_start|>", true}, {doc, false}, {"<|im_end|>", true}});
  EXPECT_EQ(mixed.front(), 0);
  EXPECT_EQ(mixed.back(), 1);
  EXPECT_EQ(std::count(mixed.begin(), mixed.end(), 1), 1);
  // A control token's text across a template/caller boundary is not a control token.
  const std::vector<int32_t> split = t->EncodePieces({{"x<|im_", true}, {"end|>", false}});
  EXPECT_FALSE(Contains(split, 1));
  EXPECT_EQ(t->Decode(split), "x<|im_end|>");
  EXPECT_TRUE(t->EncodePieces({}).empty());
}

TEST(RagTemplateTest, LayoutPiecesMarkWhatTheTemplateWrote) {
  TokenizerSpec spec;
  spec.model = "gpt2";
  RagTemplate t;
  t.kind = RagTemplate::Kind::kChatML;
  t.system_open = "<|im_start|>system\n";
  t.system_close = "<|im_end|>\n<|im_start|>user\n";
  t.no_system = "<|im_start|>system\nDefault<|im_end|>\n<|im_start|>user\n";
  t.generation = "<|im_end|>\n<|im_start|>assistant\n";
  t.opening = "<|im_start|>system\n";
  auto prefix = t.PrefixPieces("Sys <|im_end|>");
  ASSERT_EQ(prefix.size(), 3u);
  EXPECT_TRUE(prefix[0].template_text);
  EXPECT_FALSE(prefix[1].template_text);
  EXPECT_EQ(prefix[1].text, "Sys <|im_end|>");
  EXPECT_TRUE(prefix[2].template_text);
  auto suffix = t.SuffixPieces("why?");
  ASSERT_EQ(suffix.size(), 2u);
  EXPECT_EQ(suffix[0].text, "Question: why?");
  EXPECT_FALSE(suffix[0].template_text);
  EXPECT_TRUE(suffix[1].template_text);
  auto doc = t.DocumentPieces("d");
  ASSERT_EQ(doc.size(), 1u);
  EXPECT_FALSE(doc[0].template_text);
  t.opening_shared = true;
  EXPECT_EQ(t.Prefix("S"), "S<|im_end|>\n<|im_start|>user\n");
  EXPECT_EQ(t.Prefix(""), "Default<|im_end|>\n<|im_start|>user\n");
  EXPECT_EQ(t.FullPrefix("S"), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n");
}

struct LayoutCase {
  const char* file;
  const char* bos;
  const char* eos;
  std::vector<std::string> controls;
  const char* prefix_with_system;  // Prefix("SYS")
  const char* prefix_without;      // Prefix("")
  const char* suffix;              // Suffix("Q")
  const char* opening;
};

// The layouts cut from the templates of testdata/ (whose rendering jinja_test checks against
// Python's jinja2).
TEST(RagTemplateTest, LayoutFromEachFamilysTemplate) {
  const std::vector<LayoutCase> cases = {
      {"smollm2.jinja",
       "<|im_start|>",
       "<|im_end|>",
       {"<|im_start|>", "<|im_end|>"},
       "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\n",
       "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
       "Face<|im_end|>\n<|im_start|>user\n",
       "Question: Q<|im_end|>\n<|im_start|>assistant\n",
       "<|im_start|>system\n"},
      {"qwen2.jinja",
       "",
       "<|im_end|>",
       {"<|im_start|>", "<|im_end|>"},
       "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\n",
       "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n",
       "Question: Q<|im_end|>\n<|im_start|>assistant\n",
       "<|im_start|>system\n"},
      // Qwen3: no default system prompt, a namespace() and reversed-slice loop.
      {"qwen3.jinja",
       "",
       "<|im_end|>",
       {"<|im_start|>", "<|im_end|>"},
       "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\n",
       "<|im_start|>user\n",
       "Question: Q<|im_end|>\n<|im_start|>assistant\n",
       "<|im_start|>"},
      {"llama3.jinja",
       "<|begin_of_text|>",
       "<|eot_id|>",
       {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSYS<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\n",
       "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n",
       "Question: Q<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
       "<|begin_of_text|><|start_header_id|>"},
      {"mistral.jinja",
       "<s>",
       "</s>",
       {"<s>", "</s>", "[INST]", "[/INST]"},
       "<s>[INST] SYS\n\n",
       "<s>[INST] ",
       "Question: Q[/INST]",
       "<s>[INST]"},
      // Gemma refuses a system role: the system prompt opens the user's turn.
      {"gemma.jinja",
       "<bos>",
       "<eos>",
       {"<bos>", "<start_of_turn>", "<end_of_turn>"},
       "<bos><start_of_turn>user\nSYS\n\n",
       "<bos><start_of_turn>user\n",
       "Question: Q<end_of_turn>\n<start_of_turn>model\n",
       "<bos><start_of_turn>user\n"},
  };
  for (const LayoutCase& c : cases) {
    auto t = RagTemplate::FromJinja(ReadTestdata(c.file), c.bos, c.eos, c.controls);
    ASSERT_TRUE(t.ok()) << c.file << ": " << t.status();
    EXPECT_EQ(t->kind, RagTemplate::Kind::kJinja);
    EXPECT_EQ(t->Prefix("SYS"), c.prefix_with_system) << c.file;
    EXPECT_EQ(t->Prefix(""), c.prefix_without) << c.file;
    EXPECT_EQ(t->Suffix("Q"), c.suffix) << c.file;
    EXPECT_EQ(t->Document("D"), "D\n\n") << c.file;
    EXPECT_EQ(t->Opening(), c.opening) << c.file;
  }
}

TEST(RagTemplateTest, UnsupportedTemplateFallsBackToAFamilyAndSaysWhy) {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.tokens = {"a", "<|im_start|>", "<|im_end|>"};
  spec.token_types = {1, 3, 3};
  spec.eos_id = 2;
  spec.chat_template = ReadTestdata("unsupported_macro.jinja");
  ASSERT_FALSE(spec.chat_template.empty());
  RagTemplate t = RagTemplate::ForSpec(spec);
  EXPECT_EQ(t.kind, RagTemplate::Kind::kChatML);
  EXPECT_NE(t.template_error.find("macro"), std::string::npos) << t.template_error;
  EXPECT_EQ(t.Suffix("q"), "Question: q<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_THAT(t.stop_token_ids, ElementsAre(2));

  // A template that renders but without the shape of a chat prompt (no generation prompt).
  spec.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
  t = RagTemplate::ForSpec(spec);
  EXPECT_EQ(t.kind, RagTemplate::Kind::kChatML);
  EXPECT_NE(t.template_error.find("generation prompt"), std::string::npos) << t.template_error;

  // A template that raises for every conversation.
  spec.chat_template = "{{ raise_exception('nope') }}";
  t = RagTemplate::ForSpec(spec);
  EXPECT_NE(t.template_error.find("nope"), std::string::npos) << t.template_error;

  // The model's own template wins where it renders.
  spec.chat_template = ReadTestdata("smollm2.jinja");
  t = RagTemplate::ForSpec(spec);
  EXPECT_EQ(t.kind, RagTemplate::Kind::kJinja);
  EXPECT_TRUE(t.template_error.empty());
  EXPECT_THAT(t.stop_token_ids, ElementsAre(2));
}

}  // namespace
}  // namespace lazyrag
