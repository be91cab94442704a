#include "common/json.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace lazyrag {

JsonValue JsonValue::Bool(bool b) {
  JsonValue v;
  v.value_ = b;
  return v;
}

JsonValue JsonValue::Number(double d, bool is_integer, int64_t int_value) {
  JsonValue v;
  v.value_ = d;
  v.is_integer_ = is_integer;
  v.int_value_ = is_integer ? int_value : 0;
  return v;
}

JsonValue JsonValue::String(std::string s) {
  JsonValue v;
  v.value_ = std::move(s);
  return v;
}

JsonValue JsonValue::MakeArray(Array a) {
  JsonValue v;
  v.value_ = std::move(a);
  return v;
}

JsonValue JsonValue::MakeObject(Object o) {
  JsonValue v;
  v.value_ = std::move(o);
  return v;
}

const JsonValue* JsonValue::Find(absl::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& [k, v] : object()) {
    if (k == key) return &v;
  }
  return nullptr;
}

const char* JsonValue::KindName(Kind kind) {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "bool";
    case Kind::kNumber:
      return "number";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "array";
    case Kind::kObject:
      return "object";
  }
  return "unknown";
}

namespace {

class Parser {
 public:
  Parser(absl::string_view text, const JsonParseOptions& options)
      : text_(text), options_(options) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    SkipSpace();
    JsonValue v;
    if (!ParseValue(0, &v)) return status_;
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected data after the JSON value");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("JSON: ", what, " at line ", line, " column ", col));
  }
  bool Fail(absl::string_view what) {
    status_ = Error(what);
    return false;
  }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }

  void SkipSpace() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r')) {
      ++pos_;
    }
  }

  bool Expect(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return Fail("invalid literal");
    pos_ += word.size();
    return true;
  }

  bool ParseValue(int depth, JsonValue* out) {
    if (AtEnd()) return Fail("unexpected end of input");
    switch (Peek()) {
      case 'n':
        if (!Expect("null")) return false;
        *out = JsonValue();
        return true;
      case 't':
        if (!Expect("true")) return false;
        *out = JsonValue::Bool(true);
        return true;
      case 'f':
        if (!Expect("false")) return false;
        *out = JsonValue::Bool(false);
        return true;
      case '"': {
        std::string s;
        if (!ParseString(&s)) return false;
        *out = JsonValue::String(std::move(s));
        return true;
      }
      case '[':
        return ParseArray(depth, out);
      case '{':
        return ParseObject(depth, out);
      default:
        if (Peek() == '-' || (Peek() >= '0' && Peek() <= '9')) return ParseNumber(out);
        return Fail(
            absl::StrCat("unexpected character '", absl::string_view(&text_[pos_], 1), "'"));
    }
  }

  bool ParseArray(int depth, JsonValue* out) {
    if (depth >= options_.max_depth) return Fail("nesting too deep");
    ++pos_;  // [
    JsonValue::Array items;
    SkipSpace();
    if (!AtEnd() && Peek() == ']') {
      ++pos_;
      *out = JsonValue::MakeArray(std::move(items));
      return true;
    }
    for (;;) {
      SkipSpace();
      JsonValue item;
      if (!ParseValue(depth + 1, &item)) return false;
      items.push_back(std::move(item));
      SkipSpace();
      if (AtEnd()) return Fail("unterminated array");
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      return Fail("expected ',' or ']' in array");
    }
    *out = JsonValue::MakeArray(std::move(items));
    return true;
  }

  bool ParseObject(int depth, JsonValue* out) {
    if (depth >= options_.max_depth) return Fail("nesting too deep");
    ++pos_;  // {
    JsonValue::Object members;
    SkipSpace();
    if (!AtEnd() && Peek() == '}') {
      ++pos_;
      *out = JsonValue::MakeObject(std::move(members));
      return true;
    }
    for (;;) {
      SkipSpace();
      if (AtEnd() || Peek() != '"') return Fail("expected a string key in object");
      std::string key;
      if (!ParseString(&key)) return false;
      for (const auto& m : members) {
        if (m.first == key) return Fail(absl::StrCat("duplicate key \"", key, "\""));
      }
      SkipSpace();
      if (AtEnd() || Peek() != ':') return Fail("expected ':' after object key");
      ++pos_;
      SkipSpace();
      JsonValue value;
      if (!ParseValue(depth + 1, &value)) return false;
      members.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (AtEnd()) return Fail("unterminated object");
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == '}') {
        ++pos_;
        break;
      }
      return Fail("expected ',' or '}' in object");
    }
    *out = JsonValue::MakeObject(std::move(members));
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string* s) {
    if (cp < 0x80) {
      s->push_back(char(cp));
    } else if (cp < 0x800) {
      s->push_back(char(0xC0 | (cp >> 6)));
      s->push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      s->push_back(char(0xE0 | (cp >> 12)));
      s->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(char(0x80 | (cp & 0x3F)));
    } else {
      s->push_back(char(0xF0 | (cp >> 18)));
      s->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
      s->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(char(0x80 | (cp & 0x3F)));
    }
  }

  bool ParseHex4(uint32_t* out) {
    if (text_.size() - pos_ < 4) return Fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= uint32_t(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= uint32_t(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= uint32_t(c - 'A' + 10);
      } else {
        return Fail("invalid hex digit in \\u escape");
      }
    }
    pos_ += 4;
    *out = v;
    return true;
  }

  // Validates one UTF-8 encoded code point starting at pos_ and appends it.
  bool CopyUtf8(std::string* s) {
    const auto b0 = static_cast<unsigned char>(text_[pos_]);
    int len;
    uint32_t cp;
    if (b0 < 0x80) {
      len = 1;
      cp = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2;
      cp = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3;
      cp = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4;
      cp = b0 & 0x07;
    } else {
      return Fail("invalid UTF-8 in string");
    }
    if (text_.size() - pos_ < size_t(len)) return Fail("invalid UTF-8 in string");
    for (int i = 1; i < len; ++i) {
      const auto b = static_cast<unsigned char>(text_[pos_ + i]);
      if ((b & 0xC0) != 0x80) return Fail("invalid UTF-8 in string");
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return Fail("invalid UTF-8 in string");
    }
    s->append(text_.data() + pos_, len);
    pos_ += len;
    return true;
  }

  bool ParseString(std::string* out) {
    ++pos_;  // opening quote
    for (;;) {
      if (AtEnd()) return Fail("unterminated string");
      const char c = Peek();
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in string");
      if (c != '\\') {
        if (!CopyUtf8(out)) return false;
        continue;
      }
      ++pos_;
      if (AtEnd()) return Fail("unterminated escape");
      const char e = Peek();
      ++pos_;
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp;
          if (!ParseHex4(&cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Fail("unpaired low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") return Fail("unpaired high surrogate");
            pos_ += 2;
            uint32_t lo;
            if (!ParseHex4(&lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF) return Fail("invalid low surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Fail("invalid escape in string");
      }
    }
  }

  bool ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    bool integer = true;
    if (Peek() == '-') ++pos_;
    if (AtEnd()) return Fail("truncated number");
    if (Peek() == '0') {
      ++pos_;
      if (!AtEnd() && Peek() >= '0' && Peek() <= '9') return Fail("leading zero in number");
    } else if (Peek() >= '1' && Peek() <= '9') {
      while (!AtEnd() && Peek() >= '0' && Peek() <= '9') ++pos_;
    } else {
      return Fail("invalid number");
    }
    if (!AtEnd() && Peek() == '.') {
      integer = false;
      ++pos_;
      if (AtEnd() || Peek() < '0' || Peek() > '9') return Fail("digit expected after '.'");
      while (!AtEnd() && Peek() >= '0' && Peek() <= '9') ++pos_;
    }
    if (!AtEnd() && (Peek() == 'e' || Peek() == 'E')) {
      integer = false;
      ++pos_;
      if (!AtEnd() && (Peek() == '+' || Peek() == '-')) ++pos_;
      if (AtEnd() || Peek() < '0' || Peek() > '9') return Fail("digit expected in exponent");
      while (!AtEnd() && Peek() >= '0' && Peek() <= '9') ++pos_;
    }
    const std::string literal(text_.substr(start, pos_ - start));
    errno = 0;
    char* end = nullptr;
    const double d = std::strtod(literal.c_str(), &end);
    if (end != literal.c_str() + literal.size()) return Fail("invalid number");
    if (errno == ERANGE && (d > 1.0 || d < -1.0)) return Fail("number out of range");
    int64_t i = 0;
    if (integer && !absl::SimpleAtoi(literal, &i)) integer = false;  // beyond int64
    *out = JsonValue::Number(d, integer, i);
    return true;
  }

  absl::string_view text_;
  JsonParseOptions options_;
  size_t pos_ = 0;
  absl::Status status_;
};

}  // namespace

absl::StatusOr<JsonValue> ParseJson(absl::string_view text, const JsonParseOptions& options) {
  return Parser(text, options).ParseDocument();
}

}  // namespace lazyrag
