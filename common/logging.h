// Minimal leveled logging to stderr, thread-safe per line:
//   LOG_INFO << "message";
//   LOG_INFO.With("request_id", id).With("ttft_ms", 12.5) << "request finished";
// Every line carries an ISO-8601 UTC timestamp with milliseconds. Two formats (SetLogFormat):
//   text: I 2026-12-02T05:59:41.026Z worker_server.cc:57] request finished request_id=r1
//   ttft_ms=12.5 json: {"ts":"2026-12-02T05:59:41.026Z","level":"info","src":"worker_server.cc:57",
//          "msg":"request finished","request_id":"r1","ttft_ms":12.5}
// In JSON the fields are top-level keys next to ts, level, src and msg (keys a caller must not
// use); numbers and booleans stay JSON numbers and booleans, everything else is a string.
#pragma once

#include <chrono>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"

namespace lazyrag {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class LogFormat { kText = 0, kJson = 1 };

// Messages below this level are dropped. Default kInfo, or $LAZYRAG_LOG_LEVEL
// (debug|info|warning|error) when set; servers set it from --log_level.
LogLevel MinLogLevel();
void SetMinLogLevel(LogLevel level);
LogFormat CurrentLogFormat();  // default kText
void SetLogFormat(LogFormat format);

// "debug" | "info" | "warning" | "error"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(std::string_view name);
// "text" | "json"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name);

// 2026-12-02T05:59:41.026Z: UTC, milliseconds always three digits.
std::string FormatIso8601Utc(std::chrono::system_clock::time_point time);

// One key=value of a log line. `raw`: the value is a JSON number or boolean, written unquoted.
struct LogField {
  std::string key;
  std::string value;
  bool raw = false;
};

// Everything one line holds; FormatLogRecord renders it (without the final newline).
struct LogRecord {
  LogLevel level = LogLevel::kInfo;
  std::chrono::system_clock::time_point time;
  std::string_view file;  // base name
  int line = 0;
  std::string_view message;
  const std::vector<LogField>* fields = nullptr;  // may be null
};
std::string FormatLogRecord(const LogRecord& record, LogFormat format);

// One line, written to stderr with one write() when destroyed. Not thread-safe itself (it lives
// in one statement); lines from different threads never interleave.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;

  template <typename T>
  LogMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  LogMessage& operator<<(std::ostream& (*manipulator)(std::ostream&)) {
    manipulator(stream_);
    return *this;
  }
  LogMessage& operator<<(std::ios_base& (*manipulator)(std::ios_base&)) {
    manipulator(stream_);
    return *this;
  }

  // Adds a structured field (see the header comment).
  template <typename T>
  LogMessage& With(std::string_view key, const T& value) {
    if constexpr (std::is_same_v<T, bool>) {
      fields_.push_back({std::string(key), value ? "true" : "false", true});
    } else if constexpr (std::is_arithmetic_v<T>) {
      std::ostringstream s;
      s << +value;
      fields_.push_back({std::string(key), s.str(), true});
    } else {
      std::ostringstream s;
      s << value;
      fields_.push_back({std::string(key), s.str(), false});
    }
    return *this;
  }

  std::ostream& stream() { return stream_; }

 private:
  const LogLevel level_;
  const char* const file_;  // base name
  const int line_;
  const std::chrono::system_clock::time_point time_;
  std::ostringstream stream_;
  std::vector<LogField> fields_;
};

}  // namespace lazyrag

#define LAZYRAG_LOG(level)                                   \
  if (::lazyrag::LogLevel::level < ::lazyrag::MinLogLevel()) \
    ;                                                        \
  else                                                       \
    ::lazyrag::LogMessage(::lazyrag::LogLevel::level, __FILE__, __LINE__)
#define LOG_DEBUG LAZYRAG_LOG(kDebug)
#define LOG_INFO LAZYRAG_LOG(kInfo)
#define LOG_WARNING LAZYRAG_LOG(kWarning)
#define LOG_ERROR LAZYRAG_LOG(kError)
