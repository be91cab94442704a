// Minimal leveled logging to stderr: LOG_INFO << "..."; thread-safe per line.
#pragma once

#include <sstream>
#include <string_view>

namespace lazyrag {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below this level are dropped. Default kInfo; LAZYRAG_LOG_LEVEL=debug|info|warning|error.
LogLevel MinLogLevel();
void SetMinLogLevel(LogLevel level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace lazyrag

#define LAZYRAG_LOG(level)                                   \
  if (::lazyrag::LogLevel::level < ::lazyrag::MinLogLevel()) \
    ;                                                        \
  else                                                       \
    ::lazyrag::LogMessage(::lazyrag::LogLevel::level, __FILE__, __LINE__).stream()
#define LOG_DEBUG LAZYRAG_LOG(kDebug)
#define LOG_INFO LAZYRAG_LOG(kInfo)
#define LOG_WARNING LAZYRAG_LOG(kWarning)
#define LOG_ERROR LAZYRAG_LOG(kError)
