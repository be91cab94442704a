// JSON for lazyrag: nlohmann::json (Debian's nlohmann-json3-dev) behind a parse function that
// returns a status instead of throwing. Used for Hugging Face config.json / safetensors headers,
// the OpenAI HTTP API, fixtures, logs and benchmark output.
//
// ParseJson is strict RFC 8259: one value per document (surrounding whitespace allowed), no
// comments, no trailing commas, no NaN/Infinity, no leading zeros, strings must be valid UTF-8
// without raw control characters, \u escapes must form valid surrogate pairs, numbers must fit a
// double, duplicate object keys are an error. Errors are INVALID_ARGUMENT with the line and
// column of the problem; no exception leaves this file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lazyrag {

// Objects keep their members in document order. Integers that fit int64 (or uint64) are stored
// exactly (`is_number_integer()`); other numbers are doubles.
using Json = nlohmann::ordered_json;

struct JsonParseOptions {
  int max_depth = 256;  // nesting of arrays/objects; deeper documents are refused before parsing
};

absl::StatusOr<Json> ParseJson(absl::string_view text, const JsonParseOptions& options = {});

// The deepest nesting of arrays and objects in `text` (strings skipped; no validation), so that a
// hostile document is refused before anything is built from it.
int JsonNestingDepth(absl::string_view text);

// The value of an integer literal that fits int64 (no fraction or exponent), else nullopt.
std::optional<int64_t> JsonInt64(const Json& j);

// Member `key` of `object`, or null when `object` is not an object or has no such member.
const Json* JsonMember(const Json& object, absl::string_view key);

// Compact text of `j`; bytes that are not UTF-8 are replaced by U+FFFD instead of throwing.
std::string JsonDump(const Json& j);

}  // namespace lazyrag
