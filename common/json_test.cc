#include "common/json.h"

#include <cstdint>
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
  const Json* a = JsonMember(*v, "a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->size(), 6u);
  EXPECT_TRUE((*a)[0].is_number_integer());
  EXPECT_EQ((*a)[0].get<int64_t>(), 1);
  EXPECT_FALSE((*a)[1].is_number_integer());
  EXPECT_EQ((*a)[1].get<double>(), -2.5);
  EXPECT_EQ((*a)[2].get<double>(), 300.0);
  EXPECT_FALSE((*a)[2].is_number_integer());
  EXPECT_TRUE((*a)[3].get<bool>());
  EXPECT_FALSE((*a)[4].get<bool>());
  EXPECT_TRUE((*a)[5].is_null());
  EXPECT_EQ(JsonMember(*v, "s")->get<std::string>(), "x\"\\/\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(JsonMember(*v, "big")->get<int64_t>(), 9007199254740993);
  EXPECT_TRUE(JsonMember(*v, "o")->is_object());
  EXPECT_EQ(JsonMember(*v, "missing"), nullptr);
  EXPECT_EQ(JsonMember(*a, "x"), nullptr);
  // Members keep document order.
  auto o = ParseJson(R"({"z": 1, "a": 2})");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->begin().key(), "z");
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
                          "{\"o\":{\"a\":1,\"b\":{},\"a\":2}}",
                          "1e999",
                          "// c\n1",
                          "[",
                          "{",
                          "{\"a\":"}) {
    auto v = ParseJson(bad);
    EXPECT_FALSE(v.ok()) << "accepted: " << bad;
    if (!v.ok()) {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(v.status().message().find("line"), std::string::npos) << v.status();
    }
  }
  // The same key in two different objects is fine.
  EXPECT_TRUE(ParseJson(R"([{"a":1},{"a":2}])").ok());
  EXPECT_TRUE(ParseJson(R"({"a":{"a":1}})").ok());
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
  EXPECT_EQ(JsonNestingDepth(R"({"a": "[[[[", "b": [{}]})"), 3);
}

TEST(JsonTest, NumbersBeyondInt64AreDoubles) {
  auto v = ParseJson("[18446744073709551616, -9223372036854775808, 1E+2, -0]");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE((*v)[0].is_number_integer());
  EXPECT_EQ((*v)[0].get<double>(), 18446744073709551616.0);
  EXPECT_TRUE((*v)[1].is_number_integer());
  EXPECT_EQ((*v)[1].get<int64_t>(), INT64_MIN);
  EXPECT_EQ((*v)[2].get<double>(), 100.0);
  EXPECT_TRUE((*v)[3].is_number_integer());
}

TEST(JsonTest, DumpEscapesAndReplacesInvalidUtf8) {
  Json j = {{"s", std::string("a\"b\\c\n\x01\xC3\xA9")}, {"bad", std::string("x\xff")}};
  EXPECT_EQ(JsonDump(j), "{\"s\":\"a\\\"b\\\\c\\n\\u0001\xC3\xA9\",\"bad\":\"x\xEF\xBF\xBD\"}");
  auto back = ParseJson(JsonDump(j));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(JsonMember(*back, "s")->get<std::string>(), "a\"b\\c\n\x01\xC3\xA9");
}

}  // namespace
}  // namespace lazyrag
