// A small streaming JSON writer (RFC 8259 string escaping, no pretty printing).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace lazyrag {

class JsonWriter {
 public:
  JsonWriter& BeginObject() { Sep(); out_ += '{'; first_.push_back(true); return *this; }
  JsonWriter& EndObject() { out_ += '}'; first_.pop_back(); return *this; }
  JsonWriter& BeginArray() { Sep(); out_ += '['; first_.push_back(true); return *this; }
  JsonWriter& EndArray() { out_ += ']'; first_.pop_back(); return *this; }
  JsonWriter& Key(std::string_view k) { Sep(); Quote(k); out_ += ':'; after_key_ = true; return *this; }
  JsonWriter& String(std::string_view s) { Sep(); Quote(s); return *this; }
  JsonWriter& Int(int64_t v) { Sep(); out_ += std::to_string(v); return *this; }
  JsonWriter& Bool(bool v) { Sep(); out_ += v ? "true" : "false"; return *this; }
  JsonWriter& Double(double v) {
    Sep();
    if (!std::isfinite(v)) { out_ += "null"; return *this; }
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    out_ += buf;
    return *this;
  }
  const std::string& str() const { return out_; }

 private:
  void Sep() {
    if (after_key_) { after_key_ = false; return; }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  void Quote(std::string_view s) {
    out_ += '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out_ += buf;
          } else {
            out_ += char(c);
          }
      }
    }
    out_ += '"';
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace lazyrag
