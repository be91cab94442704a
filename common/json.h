// A small strict JSON (RFC 8259) parser producing a value tree. Used for Hugging Face
// config.json / safetensors headers and other small documents; not for multi-megabyte streams.
//
// Strictness: one value per document (surrounding whitespace allowed), no comments, no trailing
// commas, no NaN/Infinity, no leading zeros, strings must be valid UTF-8 without raw control
// characters, \u escapes must form valid surrogate pairs, duplicate object keys are an error.
// Errors are INVALID_ARGUMENT with the line and column of the problem.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lazyrag {

class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<JsonValue>;
  // Members in document order.
  using Object = std::vector<std::pair<std::string, JsonValue>>;

  JsonValue() = default;  // null
  static JsonValue Bool(bool b);
  // `is_integer`: the literal had no fraction or exponent and fits int64 (then `int_value` is
  // exact even beyond 2^53).
  static JsonValue Number(double d, bool is_integer = false, int64_t int_value = 0);
  static JsonValue String(std::string s);
  static JsonValue MakeArray(Array a);
  static JsonValue MakeObject(Object o);

  Kind kind() const { return static_cast<Kind>(value_.index()); }
  bool is_null() const { return kind() == Kind::kNull; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_number() const { return kind() == Kind::kNumber; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_array() const { return kind() == Kind::kArray; }
  bool is_object() const { return kind() == Kind::kObject; }
  bool is_integer() const { return is_number() && is_integer_; }

  // REQUIRES: the matching kind (checked with the is_* functions first).
  bool bool_value() const { return std::get<bool>(value_); }
  double number() const { return std::get<double>(value_); }
  int64_t int_value() const { return int_value_; }  // REQUIRES: is_integer()
  const std::string& string_value() const { return std::get<std::string>(value_); }
  const Array& array() const { return std::get<Array>(value_); }
  const Object& object() const { return std::get<Object>(value_); }

  // Object member named `key`, or null when this is not an object or has no such member.
  const JsonValue* Find(absl::string_view key) const;

  static const char* KindName(Kind kind);

 private:
  std::variant<std::monostate, bool, double, std::string, Array, Object> value_;
  bool is_integer_ = false;
  int64_t int_value_ = 0;
};

struct JsonParseOptions {
  int max_depth = 256;  // nesting of arrays/objects
};

absl::StatusOr<JsonValue> ParseJson(absl::string_view text, const JsonParseOptions& options = {});

}  // namespace lazyrag
