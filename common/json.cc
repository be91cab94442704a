#include "common/json.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace lazyrag {
namespace {

// Line and column (1-based) of byte `offset` of `text`.
std::string Position(absl::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return absl::StrCat("line ", line, " column ", column);
}

// nlohmann's what() without its "[json.exception.parse_error.101] parse error at ...: " head.
std::string Reason(const char* what) {
  std::string s(what);
  const size_t colon = s.find(": ");
  if (s.rfind("[json.exception.", 0) == 0 && colon != std::string::npos) return s.substr(colon + 2);
  const size_t bracket = s.find("] ");
  if (bracket != std::string::npos) return s.substr(bracket + 2);
  return s;
}

}  // namespace

int JsonNestingDepth(absl::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

absl::StatusOr<Json> ParseJson(absl::string_view text, const JsonParseOptions& options) {
  if (JsonNestingDepth(text) > options.max_depth) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON: nesting too deep (more than ", options.max_depth, " levels)"));
  }
  // The parser reports keys through the callback; one key set per open object catches duplicates
  // (nlohmann itself keeps the last value silently).
  std::vector<absl::flat_hash_set<std::string>> keys;
  std::string duplicate;
  Json::parser_callback_t callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    Json j = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                         /*ignore_comments=*/false);
    if (!duplicate.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid JSON: duplicate object key \"", duplicate, "\" (line 1 column 1)"));
    }
    return j;
  } catch (const Json::parse_error& e) {
    // e.byte is the 1-based offset of the last byte read.
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid JSON at ", Position(text, e.byte > 0 ? e.byte - 1 : 0), ": ", Reason(e.what())));
  } catch (const Json::exception& e) {
    // Number overflow (1e999) and the like carry no position.
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON (line 1 column 1): ", Reason(e.what())));
  }
}

std::optional<int64_t> JsonInt64(const Json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  return std::nullopt;
}

const Json* JsonMember(const Json& object, absl::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(std::string(key.data(), key.size()));
  return it == object.end() ? nullptr : &*it;
}

std::string JsonDump(const Json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

}  // namespace lazyrag
