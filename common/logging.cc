#include "common/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/json.h"

namespace lazyrag {
namespace {

LogLevel LevelFromEnv() {
  const char* env = std::getenv("LAZYRAG_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  auto level = ParseLogLevel(env);
  return level.ok() ? *level : LogLevel::kInfo;
}

std::atomic<int>& Level() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};

const char* LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "D";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarning:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "unknown";
}

// Text values with a space, a quote or nothing at all are quoted so that key=value splits.
void AppendTextValue(std::string* out, const std::string& value) {
  if (!value.empty() && value.find_first_of(" \"=\n\t") == std::string::npos) {
    out->append(value);
    return;
  }
  out->append(JsonDump(Json(value)));
}

}  // namespace

LogLevel MinLogLevel() { return static_cast<LogLevel>(Level().load(std::memory_order_relaxed)); }
void SetMinLogLevel(LogLevel level) { Level().store(static_cast<int>(level)); }
LogFormat CurrentLogFormat() {
  return static_cast<LogFormat>(g_format.load(std::memory_order_relaxed));
}
void SetLogFormat(LogFormat format) { g_format.store(static_cast<int>(format)); }

absl::StatusOr<LogLevel> ParseLogLevel(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warning") return LogLevel::kWarning;
  if (name == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level '", std::string(name), "' (debug|info|warning|error)"));
}

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log format '", std::string(name), "' (text|json)"));
}

std::string FormatIso8601Utc(std::chrono::system_clock::time_point time) {
  const auto ms = std::chrono::floor<std::chrono::milliseconds>(time.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
  const int millis = static_cast<int>(ms - static_cast<int64_t>(seconds) * 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, millis);
  return buf;
}

std::string FormatLogRecord(const LogRecord& r, LogFormat format) {
  const std::string ts = FormatIso8601Utc(r.time);
  if (format == LogFormat::kJson) {
    Json j = {{"ts", ts},
              {"level", LevelName(r.level)},
              {"src", absl::StrCat(std::string(r.file), ":", r.line)},
              {"msg", std::string(r.message)}};
    if (r.fields != nullptr) {
      for (const LogField& f : *r.fields) {
        // A raw field is JSON text already (a number); kept as a string if it is not.
        Json value = f.raw ? Json::parse(f.value, nullptr, /*allow_exceptions=*/false) : Json();
        if (!f.raw || value.is_discarded()) value = f.value;
        j[f.key] = std::move(value);
      }
    }
    return JsonDump(j);
  }
  std::string out = absl::StrCat(LevelLetter(r.level), " ", ts, " ", std::string(r.file), ":",
                                 r.line, "] ", std::string(r.message));
  if (r.fields != nullptr) {
    for (const LogField& f : *r.fields) {
      absl::StrAppend(&out, " ", f.key, "=");
      AppendTextValue(&out, f.value);
    }
  }
  return out;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level),
      file_(std::strrchr(file, '/') != nullptr ? std::strrchr(file, '/') + 1 : file),
      line_(line),
      time_(std::chrono::system_clock::now()) {}

LogMessage::~LogMessage() {
  const std::string message = stream_.str();
  LogRecord r;
  r.level = level_;
  r.time = time_;
  r.file = file_;
  r.line = line_;
  r.message = message;
  r.fields = &fields_;
  std::string s = FormatLogRecord(r, CurrentLogFormat());
  s += "\n";
  std::fwrite(s.data(), 1, s.size(), stderr);  // one write per line keeps lines whole
}

}  // namespace lazyrag
