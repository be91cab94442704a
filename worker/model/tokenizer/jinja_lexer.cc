// Lexer of the Jinja subset (jinja_lexer.h).
#include "worker/model/tokenizer/jinja_lexer.h"

#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lazyrag::jinja {

absl::Status Malformed(size_t offset, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat template: ", std::string(what), " (at byte ", offset, ")"));
}

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Lexes the tokens of a tag starting at `pos` until `close` ("}}" or "%}"), optionally preceded
// by '-' or '+'. Sets *pos past the tag and *strip_after / *keep_after from the marker.
absl::Status LexTag(std::string_view src, size_t* pos, std::string_view close,
                    std::vector<Token>* out, bool* strip_after) {
  size_t i = *pos;
  while (true) {
    while (i < src.size() && IsSpace(src[i])) ++i;
    if (i >= src.size()) return Malformed(*pos, "unterminated tag");
    if ((src[i] == '-' || src[i] == '+') && src.substr(i + 1, close.size()) == close) {
      *strip_after = src[i] == '-';
      *pos = i + 1 + close.size();
      break;
    }
    if (src.substr(i, close.size()) == close) {
      *strip_after = false;
      *pos = i + close.size();
      break;
    }
    Token t;
    const char c = src[i];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      t.kind = Token::Kind::kName;
      t.text = std::string(src.substr(i, j - i));
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
      bool is_float = false;
      if (j + 1 < src.size() && src[j] == '.' &&
          std::isdigit(static_cast<unsigned char>(src[j + 1]))) {
        is_float = true;
        ++j;
        while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
      }
      const std::string digits(src.substr(i, j - i));
      if (is_float) {
        t.kind = Token::Kind::kFloat;
        t.value = std::stod(digits);
      } else {
        if (digits.size() > 18) return Malformed(i, "integer literal too long");
        t.kind = Token::Kind::kInt;
        t.value = std::stoll(digits);
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t j = i + 1;
      while (j < src.size() && src[j] != c) {
        if (src[j] == '\\' && j + 1 < src.size()) {
          const char e = src[j + 1];
          switch (e) {
            case 'n':
              s += '\n';
              break;
            case 't':
              s += '\t';
              break;
            case 'r':
              s += '\r';
              break;
            case '\\':
              s += '\\';
              break;
            case '\'':
              s += '\'';
              break;
            case '"':
              s += '"';
              break;
            default:
              s += '\\';
              s += e;
              break;
          }
          j += 2;
        } else {
          s += src[j++];
        }
      }
      if (j >= src.size()) return Malformed(i, "unterminated string literal");
      t.kind = Token::Kind::kString;
      t.value = std::move(s);
      i = j + 1;
    } else {
      static const char* kOps[] = {"//", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".",
                                   ",",  ":",  "|",  "~",  "+",  "-", "*", "/", "%", "<", ">", "="};
      t.kind = Token::Kind::kOp;
      for (const char* op : kOps) {
        if (src.substr(i, std::char_traits<char>::length(op)) == op) {
          t.text = op;
          break;
        }
      }
      if (t.text.empty())
        return Malformed(i, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      i += t.text.size();
    }
    out->push_back(std::move(t));
  }
  out->push_back(Token{});
  return absl::OkStatus();
}

}  // namespace

absl::Status Lex(std::string_view src, std::vector<Chunk>* chunks) {
  size_t pos = 0;
  bool strip_next = false;    // a `-` closed the previous tag
  bool trim_newline = false;  // trim_blocks: a block tag or comment closed the previous tag
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open != std::string_view::npos && open + 1 >= src.size()) open = std::string_view::npos;
    std::string text(
        src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && IsSpace(text[k])) ++k;
      text.erase(0, k);
    } else if (trim_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
    if (open == std::string_view::npos) {
      if (!text.empty()) chunks->push_back({Chunk::Kind::kText, std::move(text), {}, pos});
      break;
    }
    const char kind = src[open + 1];
    size_t inner = open + 2;
    const bool strip_before = inner < src.size() && src[inner] == '-';
    const bool keep_before = inner < src.size() && src[inner] == '+';
    if (strip_before || keep_before) ++inner;
    if (strip_before) {
      while (!text.empty() && IsSpace(text.back())) text.pop_back();
    } else if (!keep_before && kind != '{') {
      // lstrip_blocks: spaces and tabs from the start of the line up to a block or comment.
      size_t k = text.size();
      while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
      // Only when that whitespace starts a line: after a newline in this text, or (when the
      // whole text is whitespace) at the start of the source or of a line.
      bool strip = false;
      if (k > 0) {
        strip = text[k - 1] == '\n';
      } else {
        const size_t line_begin = open - text.size();
        strip = line_begin == 0 || src[line_begin - 1] == '\n';
      }
      if (strip) text.erase(k);
    }
    if (!text.empty()) chunks->push_back({Chunk::Kind::kText, std::move(text), {}, pos});
    strip_next = false;
    trim_newline = false;
    if (kind == '#') {
      const size_t end = src.find("#}", inner);
      if (end == std::string_view::npos) return Malformed(open, "unterminated comment");
      strip_next = end > inner && src[end - 1] == '-';
      trim_newline = true;
      pos = end + 2;
      continue;
    }
    Chunk c;
    c.kind = kind == '{' ? Chunk::Kind::kOutput : Chunk::Kind::kStatement;
    c.offset = open;
    size_t after = inner;
    bool strip_after = false;
    absl::Status s = LexTag(src, &after, kind == '{' ? "}}" : "%}", &c.tokens, &strip_after);
    if (!s.ok()) return s;
    strip_next = strip_after;
    trim_newline = kind == '%';
    chunks->push_back(std::move(c));
    pos = after;
  }
  return absl::OkStatus();
}

}  // namespace lazyrag::jinja
