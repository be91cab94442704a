#include "common/json.h"

#include <string>

#include "gtest/gtest.h"

namespace lazyrag {
namespace {

TEST(JsonTest, ParsesEveryKind) {
  auto v = ParseJson(
      R"( {"a": [1, -2.5, 3e2, true, false, null], "s": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00",
                         "big": 9007199254740993, "o": {}} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  const JsonValue* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->array().size(), 6u);
  EXPECT_TRUE(a->array()[0].is_integer());
  EXPECT_EQ(a->array()[0].int_value(), 1);
  EXPECT_FALSE(a->array()[1].is_integer());
  EXPECT_EQ(a->array()[1].number(), -2.5);
  EXPECT_EQ(a->array()[2].number(), 300.0);
  EXPECT_FALSE(a->array()[2].is_integer());
  EXPECT_TRUE(a->array()[3].bool_value());
  EXPECT_FALSE(a->array()[4].bool_value());
  EXPECT_TRUE(a->array()[5].is_null());
  EXPECT_EQ(v->Find("s")->string_value(), "x\"\\/\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(v->Find("big")->int_value(), 9007199254740993);
  EXPECT_TRUE(v->Find("o")->is_object());
  EXPECT_EQ(v->Find("missing"), nullptr);
  EXPECT_EQ(a->Find("x"), nullptr);
}

TEST(JsonTest, RejectsInvalidDocuments) {
  for (const char* bad : {"",
                          " ",
                          "[1,]",
                          "{\"a\":1,}",
                          "[1 2]",
                          "{\"a\" 1}",
                          "{a:1}",
                          "01",
                          "-",
                          "1.",
                          ".5",
                          "1e",
                          "+1",
                          "NaN",
                          "Infinity",
                          "tru",
                          "nul",
                          "\"abc",
                          "\"\\x\"",
                          "\"\\ud800\"",
                          "\"\\udc00\"",
                          "\"a\nb\"",
                          "\"\xff\"",
                          "\"\xC0\x80\"",
                          "[1] 2",
                          "{\"a\":1,\"a\":2}",
                          "1e999",
                          "// c\n1",
                          "[",
                          "{",
                          "{\"a\":"}) {
    auto v = ParseJson(bad);
    EXPECT_FALSE(v.ok()) << "accepted: " << bad;
    if (!v.ok()) {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(v.status().message().find("line"), std::string::npos);
    }
  }
}

TEST(JsonTest, ErrorPositionAndDepthLimit) {
  auto v = ParseJson("{\n  \"a\": [1,\n  x]}");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("line 3 column 3"), std::string::npos) << v.status();
  std::string deep(100000, '[');
  auto d = ParseJson(deep);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("too deep"), std::string::npos);
  JsonParseOptions o;
  o.max_depth = 2;
  EXPECT_TRUE(ParseJson("[[1]]", o).ok());
  EXPECT_FALSE(ParseJson("[[[1]]]", o).ok());
}

TEST(JsonTest, NumbersBeyondInt64AreDoubles) {
  auto v = ParseJson("[18446744073709551616, -9223372036854775808, 1E+2, -0]");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->array()[0].is_integer());
  EXPECT_EQ(v->array()[0].number(), 18446744073709551616.0);
  EXPECT_TRUE(v->array()[1].is_integer());
  EXPECT_EQ(v->array()[1].int_value(), INT64_MIN);
  EXPECT_EQ(v->array()[2].number(), 100.0);
  EXPECT_TRUE(v->array()[3].is_integer());
}

}  // namespace
}  // namespace lazyrag
