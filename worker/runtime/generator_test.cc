#include "worker/runtime/generator.h"

#include <cstdlib>

#include "gtest/gtest.h"
#include "worker/runtime/runtime.h"

namespace lazyrag {
namespace {

TEST(StopStringMatcherTest, HoldsBackPrefixesAndCutsAtStop) {
  StopStringMatcher m({"END", "\n\n"});
  bool stopped = false;
  EXPECT_EQ(m.Feed("Hello E", &stopped), "Hello ");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(m.Feed("N", &stopped), "");
  EXPECT_EQ(m.Feed("X wor", &stopped), "ENX wor");
  EXPECT_EQ(m.Feed("ld\n", &stopped), "ld");
  EXPECT_EQ(m.Feed("\nmore", &stopped), "");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(m.text(), "Hello ENX world");
}

TEST(StopStringMatcherTest, ReleasesOnlyWholeUtf8Characters) {
  StopStringMatcher m({});
  bool stopped = false;
  std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(m.Feed(euro.substr(0, 1), &stopped), "");
  EXPECT_EQ(m.Feed(euro.substr(1, 1), &stopped), "");
  EXPECT_EQ(m.Feed(euro.substr(2) + "a", &stopped), euro + "a");
}

std::unique_ptr<Runtime> Tiny() {
  RuntimeOptions o;
  o.model = "synthetic:tiny";
  o.kv_pool_bytes = 8 << 20;
  auto rt = CreateRuntime(o);
  EXPECT_TRUE(rt.ok()) << rt.status();
  return rt.ok() ? std::move(*rt) : nullptr;
}

GenerateRequest Request(std::vector<std::string> docs, std::string query, AttentionMode mode) {
  GenerateRequest r;
  for (auto& d : docs) r.documents.push_back({d, ""});
  r.query = query;
  r.mode = mode;
  r.max_tokens = 8;
  r.ignore_eos = true;
  return r;
}

TEST(GeneratorTest, NewOrderIsServedFromThePoolWithTheSameOutputAsAFreshWorker) {
  auto rt = Tiny();
  ASSERT_NE(rt, nullptr);
  std::vector<std::string> docs = {"The capital of Zubrowka is Lutz.", "Blue whales eat krill.",
                                   "Paris hosts the Louvre."};
  auto first = rt->generator->Generate(Request(docs, "What eats krill?", AttentionMode::kLazy));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->usage.cached_document_tokens, 0);
  std::vector<std::string> reordered = {docs[2], docs[0], docs[1]};
  auto second = rt->generator->Generate(Request(reordered, "What eats krill?", AttentionMode::kLazy));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->usage.cached_document_tokens, second->usage.document_tokens);
  auto fresh = Tiny();
  auto cold = fresh->generator->Generate(Request(reordered, "What eats krill?", AttentionMode::kLazy));
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ(second->token_ids, cold->token_ids);
  // Only the query block is computed: the prefix block and the documents come from the pool.
  auto prompt = rt->generator->BuildPrompt(Request(reordered, "What eats krill?", AttentionMode::kLazy), nullptr);
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(second->usage.computed_tokens, int64_t(prompt->suffix.size()));
  EXPECT_EQ(cold->usage.computed_tokens, prompt->total_tokens());
  // Documents by id.
  GenerateRequest by_id = Request({}, "What eats krill?", AttentionMode::kLazy);
  for (const std::string& id : second->document_ids) by_id.documents.push_back({"", id});
  auto third = rt->generator->Generate(by_id);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->token_ids, second->token_ids);
}

TEST(GeneratorTest, BadInputGetsClearStatus) {
  auto rt = Tiny();
  ASSERT_NE(rt, nullptr);
  auto code = [&](const GenerateRequest& r) { return rt->generator->Generate(r).status().code(); };
  using C = absl::StatusCode;
  EXPECT_EQ(code(Request({"doc"}, "", AttentionMode::kLazy)), C::kInvalidArgument);
  EXPECT_EQ(code(Request({"doc\xff"}, "q", AttentionMode::kLazy)), C::kInvalidArgument);
  EXPECT_EQ(code(Request({"doc"}, "q\xc3", AttentionMode::kLazy)), C::kInvalidArgument);
  GenerateRequest r = Request({"doc"}, "q", AttentionMode::kLazy);
  r.documents.push_back({"", std::string(64, 'a')});
  EXPECT_EQ(code(r), C::kNotFound);
  r.documents.back().id = "nope";
  EXPECT_EQ(code(r), C::kInvalidArgument);
  r = Request({"doc"}, "q", AttentionMode::kLazy);
  r.max_tokens = 0;
  EXPECT_EQ(code(r), C::kInvalidArgument);
  r.max_tokens = 1 << 30;
  EXPECT_EQ(code(r), C::kInvalidArgument);
  r.max_tokens = 4;
  r.sampling.temperature = -1;
  EXPECT_EQ(code(r), C::kInvalidArgument);
  r.sampling.temperature = 0;
  r.documents.assign(1, {std::string(5000, 'x'), ""});  // more tokens than the context
  EXPECT_EQ(code(r), C::kInvalidArgument);
}

// The real model: LAZY and MATERIALIZE give the same greedy answer.
TEST(GeneratorTest, SmolLM2LazyAndMaterializeAgree) {
  const char* path = std::getenv("LAZYRAG_MODEL");
  if (path == nullptr) GTEST_SKIP() << "LAZYRAG_MODEL not set";
  RuntimeOptions o;
  o.model = path;
  auto rt = CreateRuntime(o);
  ASSERT_TRUE(rt.ok()) << rt.status();
  std::vector<std::string> docs = {"Kestrel Bay's lighthouse was painted green in 1911.",
                                   "The Vantor river freezes every February.",
                                   "Mira Ostrova invented the folding telescope."};
  auto lazy = (*rt)->generator->Generate(Request(docs, "Who invented the folding telescope?", AttentionMode::kLazy));
  auto mat = (*rt)->generator->Generate(Request(docs, "Who invented the folding telescope?", AttentionMode::kMaterialize));
  ASSERT_TRUE(lazy.ok() && mat.ok());
  EXPECT_EQ(lazy->token_ids, mat->token_ids);
  EXPECT_EQ(mat->usage.cached_document_tokens, mat->usage.document_tokens);
}

}  // namespace
}  // namespace lazyrag
