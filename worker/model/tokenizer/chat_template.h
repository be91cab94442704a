// The RAG prompt layout: [prefix(system)] [document]... [suffix(query)].
//
// lazyrag encodes every block SEPARATELY and concatenates the ids, so a document tokenizes the
// same whatever its neighbours and its ids (hence its cache key) do not depend on the request.
// The blocks therefore end and start at token boundaries that every tokenizer respects: special
// tokens and "\n\n".
//
// Each block is a list of PromptPieces: text the template wrote (which may hold control tokens
// such as <|im_end|>) and text the caller sent (system prompt, documents, query), which is
// literal: a control token's text inside it is ordinary text unless the worker runs with
// --parse_special_tokens_in_text. Tokenizer::EncodePieces applies that rule.
//
// Where the model's tokenizer.chat_template (Jinja) can be rendered by JinjaTemplate, the layout
// comes from it: it is rendered once, with placeholder messages, and cut at the placeholders.
// Otherwise (no template, or one using Jinja outside the supported subset, or one whose output
// does not have the expected shape) one of the hard-coded families is used and the reason is
// logged as a warning and kept in `template_error`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/tokenizer/tokenizer.h"
#include "worker/model/tokenizer_spec.h"

namespace lazyrag {

struct RagTemplate {
  enum class Kind {
    kPlain,   // "System: {system}\n" / "{text}\n\n" / "Question: {query}\nAnswer:"
    kChatML,  // <|im_start|>role\n ... <|im_end|>\n (SmolLM2, Qwen)
    kLlama3,  // <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>
    kJinja,   // rendered from the model's own tokenizer.chat_template
  };

  Kind kind = Kind::kPlain;
  // Used by the hard-coded families when the caller's system prompt is empty; may itself be
  // empty (then the plain and Llama-3 layouts leave the system block out). Empty for kJinja,
  // whose template decides what a prompt without a system message looks like.
  std::string default_system;
  // Generation stops at any of these ids (deduplicated; may be empty for hand-made specs).
  std::vector<int32_t> stop_token_ids;
  // Why the model's chat template was not used (empty for kJinja and when the model has none).
  std::string template_error;

  // The layout (template text around the caller's text). The prefix is
  // system_open + system + system_close, or no_system when the system prompt is empty; the
  // suffix is "Question: " + query + generation.
  std::string system_open, system_close, no_system, generation;

  // Chooses the layout for a tokenizer. "bytes" models -> kPlain. Else the model's
  // chat_template when it renders (kJinja); else "<|im_start|>" in the template or the
  // vocabulary -> kChatML (default system prompt read from the template when it holds a literal
  // one, else SmolLM2's); "<|start_header_id|>" -> kLlama3; else kPlain. Stops: eos, plus
  // <|im_end|> and <|endoftext|> (ChatML), <|eot_id|> and <|eom_id|> (Llama-3), <end_of_turn>
  // (Gemma) where the vocabulary has them.
  static RagTemplate ForSpec(const TokenizerSpec& spec);

  // The layout from a Jinja chat template alone (kind kJinja, no stop tokens). `control_tokens`
  // are the texts of the vocabulary's control tokens (Opening() is cut after one of them or after
  // a newline). UNIMPLEMENTED / INVALID_ARGUMENT / FAILED_PRECONDITION from the renderer, or
  // FAILED_PRECONDITION when the output does not have the shape of a chat prompt.
  static absl::StatusOr<RagTemplate> FromJinja(std::string_view chat_template,
                                               std::string_view bos_token,
                                               std::string_view eos_token,
                                               const std::vector<std::string>& control_tokens);

  // The fixed text every prompt of this layout opens with, whatever the system prompt: ChatML
  // "<|im_start|>system\n", Llama-3 "<|begin_of_text|>", plain "" (none); for kJinja the longest
  // common start of the prefixes with and without a system prompt, cut after a control token or
  // a newline. The engine's shared prefix (attention sink) when the worker runs with
  // --shared_prefix=template.
  std::string Opening() const { return opening; }
  std::string opening;
  // False (the default): control tokens in callers' text are literal (PromptPiece); true: they
  // are recognised everywhere (the worker's --parse_special_tokens_in_text).
  bool parse_special_in_text = false;
  // True when Opening() is the engine's shared prefix: Prefix() then leaves it out (the engine
  // puts it in front of every prompt itself).
  bool opening_shared = false;

  // Everything before the first document: system block and the opening of the user turn
  // (without Opening() when opening_shared).
  std::vector<PromptPiece> PrefixPieces(std::string_view system) const;
  // One retrieved document (caller text only).
  std::vector<PromptPiece> DocumentPieces(std::string_view text) const;
  // The question and the opening of the assistant turn.
  std::vector<PromptPiece> SuffixPieces(std::string_view query) const;

  // The same blocks as plain strings (for display and tests).
  std::string Prefix(std::string_view system) const;
  // Prefix() with Opening(), whatever opening_shared says.
  std::string FullPrefix(std::string_view system) const;
  std::string Document(std::string_view text) const;
  std::string Suffix(std::string_view query) const;
};

// SmolLM2-Instruct's built-in system prompt (from its chat template).
inline constexpr char kSmolLM2DefaultSystem[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

}  // namespace lazyrag
