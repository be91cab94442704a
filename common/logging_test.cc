#include "common/logging.h"

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lazyrag {
namespace {

using std::chrono::milliseconds;
using std::chrono::system_clock;

system_clock::time_point At(int64_t epoch_ms) {
  return system_clock::time_point(milliseconds(epoch_ms));
}

TEST(LoggingTest, TimestampIsIso8601UtcWithPaddedMilliseconds) {
  EXPECT_EQ(FormatIso8601Utc(At(0)), "1970-01-01T00:00:00.000Z");
  // 2026-12-02T05:59:41.026Z: the milliseconds keep their leading zero.
  EXPECT_EQ(FormatIso8601Utc(At(1796191181026)), "2026-12-02T05:59:41.026Z");
  EXPECT_EQ(FormatIso8601Utc(At(1796191181999)), "2026-12-02T05:59:41.999Z");
  EXPECT_EQ(FormatIso8601Utc(At(951782400007)), "2000-02-29T00:00:00.007Z");
  // Before the epoch the milliseconds still count forward within the second.
  EXPECT_EQ(FormatIso8601Utc(At(-1)), "1969-12-31T23:59:59.999Z");
  // Sub-millisecond parts are truncated, never rounded up into the next second.
  EXPECT_EQ(FormatIso8601Utc(At(1999) + std::chrono::microseconds(999)),
            "1970-01-01T00:00:01.999Z");
}

TEST(LoggingTest, TextLineHasLevelTimestampSourceMessageAndFields) {
  std::vector<LogField> fields = {{"request_id", "r-1", false},
                                  {"ttft_ms", "12.5", true},
                                  {"status", "DEADLINE EXCEEDED", false},
                                  {"empty", "", false}};
  LogRecord r;
  r.level = LogLevel::kWarning;
  r.time = At(1796191181026);
  r.file = "worker.cc";
  r.line = 42;
  r.message = "request finished";
  r.fields = &fields;
  EXPECT_EQ(FormatLogRecord(r, LogFormat::kText),
            "W 2026-12-02T05:59:41.026Z worker.cc:42] request finished request_id=r-1 "
            "ttft_ms=12.5 status=\"DEADLINE EXCEEDED\" empty=\"\"");
}

TEST(LoggingTest, JsonLineIsOneObjectWithTsLevelMsgAndFields) {
  std::vector<LogField> fields = {
      {"request_id", "a\"b", false}, {"prompt_tokens", "17", true}, {"ok", "true", true}};
  LogRecord r;
  r.level = LogLevel::kInfo;
  r.time = At(1796191181026);
  r.file = "x.cc";
  r.line = 7;
  r.message = "two\nlines";
  r.fields = &fields;
  EXPECT_EQ(FormatLogRecord(r, LogFormat::kJson),
            "{\"ts\":\"2026-12-02T05:59:41.026Z\",\"level\":\"info\",\"src\":\"x.cc:7\","
            "\"msg\":\"two\\nlines\",\"request_id\":\"a\\\"b\",\"prompt_tokens\":17,\"ok\":true}");
  r.fields = nullptr;
  r.level = LogLevel::kError;
  EXPECT_EQ(FormatLogRecord(r, LogFormat::kJson),
            "{\"ts\":\"2026-12-02T05:59:41.026Z\",\"level\":\"error\",\"src\":\"x.cc:7\","
            "\"msg\":\"two\\nlines\"}");
}

TEST(LoggingTest, ParsesLevelsAndFormats) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("info"), LogLevel::kInfo);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("error"), LogLevel::kError);
  auto bad = ParseLogLevel("bogus");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bogus"), std::string::npos);
  EXPECT_NE(bad.status().message().find("debug|info|warning|error"), std::string::npos);
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_FALSE(ParseLogFormat("xml").ok());
}

// The macro's line goes to stderr in the current format, fields typed by their C++ type.
TEST(LoggingTest, MacroWritesOneLineWithFieldsToStderr) {
  const LogLevel saved = MinLogLevel();
  SetMinLogLevel(LogLevel::kInfo);
  SetLogFormat(LogFormat::kJson);
  ::testing::internal::CaptureStderr();
  LOG_INFO.With("id", std::string("r9")).With("n", 3).With("ms", 1.5).With("hit", false)
      << "done " << 42;
  LOG_DEBUG << "dropped";
  const std::string json = ::testing::internal::GetCapturedStderr();
  SetLogFormat(LogFormat::kText);
  ::testing::internal::CaptureStderr();
  LOG_WARNING.With("id", "r9") << "plain";
  const std::string text = ::testing::internal::GetCapturedStderr();
  SetMinLogLevel(saved);

  EXPECT_TRUE(std::regex_match(
      json, std::regex("\\{\"ts\":\"\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z\","
                       "\"level\":\"info\",\"src\":\"logging_test\\.cc:\\d+\",\"msg\":\"done 42\","
                       "\"id\":\"r9\",\"n\":3,\"ms\":1\\.5,\"hit\":false\\}\n")))
      << json;
  EXPECT_TRUE(
      std::regex_match(text, std::regex("W \\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z "
                                        "logging_test\\.cc:\\d+\\] plain id=r9\n")))
      << text;
}

}  // namespace
}  // namespace lazyrag
