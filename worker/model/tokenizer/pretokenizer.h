// Pre-tokenization: splits text into the "words" that byte-level BPE merges within.
//
// A PreTokenizer is a sequence of PCRE2 (UTF + UCP, JIT when available) patterns applied in
// turn: each stage splits every piece of the previous stage into its matches and the text
// between matches ("isolated" splitting, nothing is dropped), so the concatenation of the
// pieces is always the input.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lazyrag {

class PreTokenizer {
 public:
  // Builds the pre-tokenizer for a GGUF `tokenizer.ggml.pre` value. Supported:
  //   "gpt2"                       GPT-2 ByteLevel regex
  //   "smollm" (also "starcoder", "refact", "codeshell")
  //                                every digit alone, then the GPT-2 regex
  //   "llama-bpe" (also "llama3")  Llama-3 regex (case-insensitive contractions, 1-3 digits)
  // Anything else: INVALID_ARGUMENT. "default" and "" map to "gpt2".
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(std::string_view pre);

  // Builds one from explicit patterns (tests; other pre types). INVALID_ARGUMENT with the PCRE2
  // message when a pattern does not compile.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromPatterns(
      const std::vector<std::string>& patterns);

  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits `text` (REQUIRES: valid UTF-8; callers split invalid bytes off first) into non-empty
  // pieces that view `text`. Thread-safe.
  std::vector<std::string_view> Split(std::string_view text) const;

 private:
  struct Stage;
  PreTokenizer() = default;
  void SplitStage(const Stage& stage, std::string_view piece,
                  std::vector<std::string_view>* out) const;

  std::vector<std::unique_ptr<Stage>> stages_;
};

}  // namespace lazyrag
