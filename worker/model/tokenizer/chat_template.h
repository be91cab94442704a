// The RAG prompt layout: [prefix(system)] [document]... [suffix(query)].
//
// lazyrag encodes every block SEPARATELY with Tokenizer::Encode(block, /*parse_special=*/true)
// and concatenates the ids, so a document tokenizes the same whatever its neighbours and its
// ids (hence its cache key) do not depend on the request. The strings below therefore end and
// start at token boundaries that every tokenizer respects: special tokens and "\n\n".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "worker/model/tokenizer_spec.h"

namespace lazyrag {

struct RagTemplate {
  enum class Kind {
    kPlain,   // "System: {system}\n" / "{text}\n\n" / "Question: {query}\nAnswer:"
    kChatML,  // <|im_start|>role\n ... <|im_end|>\n (SmolLM2, Qwen)
    kLlama3,  // <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>
  };

  Kind kind = Kind::kPlain;
  // Used by Prefix() when the caller's system prompt is empty; may itself be empty (then the
  // plain and Llama-3 layouts leave the system block out).
  std::string default_system;
  // Generation stops at any of these ids (deduplicated; may be empty for hand-made specs).
  std::vector<int32_t> stop_token_ids;

  // Chooses the layout for a tokenizer: "bytes" models -> kPlain; "<|im_start|>" in the chat
  // template or the vocabulary -> kChatML (default system prompt read from the template when it
  // holds a literal one, else SmolLM2's; stops at <|im_end|>, <|endoftext|> and eos);
  // "<|start_header_id|>" -> kLlama3 (stops at <|eot_id|>, <|eom_id|> and eos); else kPlain
  // (stops at eos).
  static RagTemplate ForSpec(const TokenizerSpec& spec);

  // The fixed text every prompt of this layout opens with, whatever the system prompt: ChatML
  // "<|im_start|>system\n", Llama-3 "<|begin_of_text|>", plain "" (none). The engine's shared
  // prefix (attention sink) when the worker runs with --shared_prefix=template.
  std::string Opening() const;
  // True when Opening() is the engine's shared prefix: Prefix() then leaves it out (the engine
  // puts it in front of every prompt itself).
  bool opening_shared = false;

  // Everything before the first document: system block and the opening of the user turn
  // (without Opening() when opening_shared).
  std::string Prefix(std::string_view system) const;
  // Prefix() with Opening(), whatever opening_shared says.
  std::string FullPrefix(std::string_view system) const;
  // One retrieved document.
  std::string Document(std::string_view text) const;
  // The question and the opening of the assistant turn.
  std::string Suffix(std::string_view query) const;
};

// SmolLM2-Instruct's built-in system prompt (from its chat template).
inline constexpr char kSmolLM2DefaultSystem[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

}  // namespace lazyrag
