// UTF-8 helpers for the tokenizer and the streaming detokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lazyrag {

// Length in bytes of the well-formed UTF-8 sequence that starts at s[0], or 0 when s is empty or
// does not start with one (stray continuation byte, overlong form, surrogate, code point above
// U+10FFFF, or a sequence cut short by the end of s).
size_t Utf8SequenceLength(std::string_view s);

// True when the whole of s is well-formed UTF-8 (RFC 3629).
bool IsValidUtf8(std::string_view s);

// Length of the longest prefix of s that does not end inside a multi-byte character: a trailing
// lead byte plus fewer continuation bytes than it announces is cut off (at most 3 bytes). Bytes
// that can never become valid (a stray continuation byte, 0xC0, 0xF8...) are not held back, so a
// streaming decoder never waits forever on garbage. Used to emit only whole characters while
// streaming tokens whose bytes split a character.
size_t Utf8CompletePrefix(std::string_view s);

// Appends the UTF-8 encoding of `code_point` (REQUIRES: a Unicode scalar value) to `out`.
void AppendUtf8(uint32_t code_point, std::string* out);

// Decodes the sequence at s[0] (REQUIRES: Utf8SequenceLength(s) > 0).
uint32_t DecodeUtf8(std::string_view s);

}  // namespace lazyrag
