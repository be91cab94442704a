#include "worker/model/tokenizer/utf8.h"

namespace lazyrag {
namespace {

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Number of bytes announced by a lead byte, 0 for bytes that cannot start a sequence.
size_t AnnouncedLength(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

// Allowed range of the second byte after lead byte c (tightened for E0, ED, F0, F4 so that
// overlong forms, surrogates and code points above U+10FFFF are rejected).
void SecondByteRange(unsigned char c, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (c == 0xE0) *lo = 0xA0;
  if (c == 0xED) *hi = 0x9F;
  if (c == 0xF0) *lo = 0x90;
  if (c == 0xF4) *hi = 0x8F;
}

}  // namespace

size_t Utf8SequenceLength(std::string_view s) {
  if (s.empty()) return 0;
  const auto c = static_cast<unsigned char>(s[0]);
  const size_t n = AnnouncedLength(c);
  if (n == 0 || s.size() < n) return 0;
  if (n == 1) return 1;
  unsigned char lo, hi;
  SecondByteRange(c, &lo, &hi);
  const auto c1 = static_cast<unsigned char>(s[1]);
  if (c1 < lo || c1 > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (!IsContinuation(static_cast<unsigned char>(s[i]))) return 0;
  }
  return n;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = Utf8SequenceLength(s.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t Utf8CompletePrefix(std::string_view s) {
  // Look at the last (up to) 3 bytes for a lead byte whose sequence is still open.
  const size_t size = s.size();
  for (size_t back = 1; back <= 3 && back <= size; ++back) {
    const auto c = static_cast<unsigned char>(s[size - back]);
    if (IsContinuation(c)) continue;
    const size_t n = AnnouncedLength(c);
    if (n <= back) return size;  // ASCII, invalid lead, or a complete sequence.
    // The sequence is open: hold it back only if what has arrived so far can still be valid.
    std::string_view tail = s.substr(size - back);
    if (back >= 2) {
      unsigned char lo, hi;
      SecondByteRange(c, &lo, &hi);
      const auto c1 = static_cast<unsigned char>(tail[1]);
      if (c1 < lo || c1 > hi) return size;
    }
    return size - back;
  }
  return size;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t DecodeUtf8(std::string_view s) {
  const auto c = static_cast<unsigned char>(s[0]);
  const size_t n = AnnouncedLength(c);
  if (n <= 1) return c;
  uint32_t cp = c & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
  return cp;
}

}  // namespace lazyrag
