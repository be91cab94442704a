// What a tokenizer is built from: read from a GGUF file's tokenizer.ggml.* metadata (or made up
// for synthetic models, which use the byte-level fallback).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lazyrag {

struct TokenizerSpec {
  // "gpt2": byte-level BPE (GPT-2 byte-to-unicode alphabet, ranked merges).
  // "bytes": synthetic fallback, token id = 3 + byte value, specials 0..2.
  std::string model = "bytes";
  std::string pre;                      // tokenizer.ggml.pre, e.g. "smollm", "llama-bpe", "gpt2"
  std::vector<std::string> tokens;      // id -> token text (byte-level alphabet for "gpt2")
  std::vector<int32_t> token_types;     // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  std::vector<std::string> merges;      // "left right", rank = index
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  std::string chat_template;            // tokenizer.chat_template (Jinja text, informational)
};

}  // namespace lazyrag
