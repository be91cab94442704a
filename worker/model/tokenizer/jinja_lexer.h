// The lexer of the Jinja subset (jinja.h): template text and the tokens of its tags, with
// whitespace control applied. Shared by jinja_lexer.cc and jinja_parser.cc only.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/json.h"

namespace lazyrag::jinja {

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;
  Json value;  // kString, kInt, kFloat
};

// One piece of the template: text, or the tokens of a {{ }} / {% %} tag.
struct Chunk {
  enum class Kind { kText, kOutput, kStatement };
  Kind kind = Kind::kText;
  std::string text;
  std::vector<Token> tokens;  // ends with a kEnd token
  size_t offset = 0;          // in the source, for messages
};

// INVALID_ARGUMENT "chat template: WHAT (at byte OFFSET)".
absl::Status Malformed(size_t offset, std::string_view what);

// Splits `src` into chunks, applying `-` markers, trim_blocks and lstrip_blocks (Hugging Face's
// settings). INVALID_ARGUMENT for an unterminated tag, comment or string, or a character that
// starts no token.
absl::Status Lex(std::string_view src, std::vector<Chunk>* chunks);

}  // namespace lazyrag::jinja
