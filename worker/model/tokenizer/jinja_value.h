// Values of the Jinja subset (jinja.h): JSON plus Jinja's "undefined", with the Python
// semantics chat templates rely on (truthiness, str(), ==, iteration, len, strip). Shared by
// jinja_value.cc and jinja_render.cc only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/json.h"

namespace lazyrag::jinja {

struct Value {
  bool undefined = false;
  Json j;
};

inline Value Undefined() { return Value{true, Json()}; }
inline Value Of(Json j) { return Value{false, std::move(j)}; }

// INVALID_ARGUMENT "chat template: WHAT".
absl::Status TypeError(std::string_view what);
// UNIMPLEMENTED "chat template: WHAT is not supported".
absl::Status Unsupported(std::string_view what);

// Python's bool(): false for undefined, none, false, 0, empty strings, lists and dicts.
bool Truthy(const Value& v);
// Python's str() as Jinja prints it: "" for undefined, None/True/False, lists and dicts as
// Python writes them.
std::string Str(const Value& v);
// ==: numbers by value, undefined only equal to undefined, else JSON equality.
bool Equal(const Value& a, const Value& b);
// Items of an iterable: list elements, dict keys, string characters (UTF-8 code points);
// nothing for undefined; INVALID_ARGUMENT for other kinds.
absl::StatusOr<std::vector<Json>> Items(const Value& v);
// len(): code points of a string, items of a list or dict, 0 otherwise.
int64_t Length(const Value& v);
// str.strip / lstrip / rstrip: `args[0]` (a string) is the set of characters to strip, else
// ASCII white space as Python counts it (\x1c-\x1f included; non-ASCII white space is kept).
std::string StripChars(const std::string& s, bool left, bool right, const std::vector<Value>& args);

}  // namespace lazyrag::jinja
