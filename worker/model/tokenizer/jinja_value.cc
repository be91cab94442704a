#include "worker/model/tokenizer/jinja_value.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lazyrag::jinja {
namespace {

// Python's str() (top) or repr() (inside a list or dict) of a JSON value.
std::string Repr(const Json& j, bool top);

// What Python's str.strip() strips in the ASCII range (it also strips \x1c-\x1f). Non-ASCII
// white space (U+0085, U+00A0, U+2000...) is kept: a difference from Python.
constexpr char kPythonAsciiSpace[] = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f";

}  // namespace

absl::Status TypeError(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template: ", std::string(what)));
}
absl::Status Unsupported(std::string_view what) {
  return absl::UnimplementedError(
      absl::StrCat("chat template: ", std::string(what), " is not supported"));
}

bool Truthy(const Value& v) {
  if (v.undefined) return false;
  const Json& j = v.j;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>() != 0;
  if (j.is_number()) return j.get<double>() != 0;
  if (j.is_string() || j.is_array() || j.is_object()) return !j.empty();
  return true;
}

// Python's str() of a value, as Jinja prints it.
std::string Str(const Value& v) {
  if (v.undefined) return "";
  return Repr(v.j, /*top=*/true);
}

namespace {

std::string Repr(const Json& j, bool top) {
  if (j.is_string()) {
    if (top) return j.get<std::string>();
    return absl::StrCat("'", j.get<std::string>(), "'");
  }
  if (j.is_null()) return "None";
  if (j.is_boolean()) return j.get<bool>() ? "True" : "False";
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  if (j.is_number()) {
    const double d = j.get<double>();
    if (d == std::floor(d) && std::fabs(d) < 1e16)
      return absl::StrCat(static_cast<int64_t>(d), ".0");
    return JsonDump(j);
  }
  std::string out = j.is_array() ? "[" : "{";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) out += ", ";
    first = false;
    if (j.is_object()) absl::StrAppend(&out, "'", it.key(), "': ");
    out += Repr(*it, false);
  }
  return out + (j.is_array() ? "]" : "}");
}

}  // namespace

bool Equal(const Value& a, const Value& b) {
  if (a.undefined || b.undefined) return a.undefined == b.undefined;
  if (a.j.is_number() && b.j.is_number()) return a.j.get<double>() == b.j.get<double>();
  return a.j == b.j;
}

// Items of an iterable: list elements, dict keys, string characters (UTF-8 code points).
absl::StatusOr<std::vector<Json>> Items(const Value& v) {
  std::vector<Json> out;
  if (v.undefined) return out;  // Jinja iterates an undefined value as empty
  if (v.j.is_array()) return std::vector<Json>(v.j.begin(), v.j.end());
  if (v.j.is_object()) {
    for (auto it = v.j.begin(); it != v.j.end(); ++it) out.push_back(it.key());
    return out;
  }
  if (v.j.is_string()) {
    const std::string& s = v.j.get_ref<const std::string&>();
    for (size_t i = 0; i < s.size();) {
      size_t n = 1;
      while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
      out.push_back(s.substr(i, n));
      i += n;
    }
    return out;
  }
  return TypeError(absl::StrCat("'", v.j.type_name(), "' is not iterable"));
}

int64_t Length(const Value& v) {
  if (v.undefined) return 0;
  if (v.j.is_string()) {
    auto items = Items(v);
    return items.ok() ? static_cast<int64_t>(items->size()) : 0;
  }
  if (v.j.is_array() || v.j.is_object()) return static_cast<int64_t>(v.j.size());
  return 0;
}

std::string StripChars(const std::string& s, bool left, bool right,
                       const std::vector<Value>& args) {
  const std::string chars =
      args.empty() || !args[0].j.is_string() ? kPythonAsciiSpace : args[0].j.get<std::string>();
  size_t b = 0, e = s.size();
  if (left) b = s.find_first_not_of(chars);
  if (b == std::string::npos) return "";
  if (right) e = s.find_last_not_of(chars) + 1;
  return s.substr(b, e - b);
}

}  // namespace lazyrag::jinja
