#include "worker/model/tokenizer/chat_template.h"

#include <algorithm>
#include <initializer_list>

namespace lazyrag {
namespace {

bool HasToken(const TokenizerSpec& spec, std::string_view text) {
  return spec.chat_template.find(text) != std::string::npos ||
         std::find(spec.tokens.begin(), spec.tokens.end(), text) != spec.tokens.end();
}

void AddStop(const TokenizerSpec& spec, std::string_view text, std::vector<int32_t>* stops) {
  auto it = std::find(spec.tokens.begin(), spec.tokens.end(), text);
  if (it != spec.tokens.end()) stops->push_back(static_cast<int32_t>(it - spec.tokens.begin()));
}

// The literal default system prompt of a ChatML Jinja template, e.g. from
//   '<|im_start|>system\nYou are ...<|im_end|>\n'
// (newline written either as a real newline or as the two characters \n). Empty when the
// template builds it from expressions or has none.
std::string ChatMLDefaultSystem(std::string_view tmpl) {
  for (std::string_view open : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    const size_t start = tmpl.find(open);
    if (start == std::string_view::npos) continue;
    const size_t body = start + open.size();
    const size_t end = tmpl.find("<|im_end|>", body);
    if (end == std::string_view::npos) continue;
    std::string_view text = tmpl.substr(body, end - body);
    if (text.empty() || text.find_first_of("{}'\"+\\") != std::string_view::npos) continue;
    return std::string(text);
  }
  return "";
}

// absl::StrCat does not take std::string_view where Abseil is built without it (Debian).
std::string Concat(std::initializer_list<std::string_view> parts) {
  std::string out;
  size_t size = 0;
  for (std::string_view p : parts) size += p.size();
  out.reserve(size);
  for (std::string_view p : parts) out.append(p);
  return out;
}

}  // namespace

RagTemplate RagTemplate::ForSpec(const TokenizerSpec& spec) {
  RagTemplate t;
  std::vector<int32_t> stops;
  if (spec.model == "bytes") {
    t.kind = Kind::kPlain;
    stops.push_back(spec.eos_id >= 0 ? spec.eos_id : 1);  // Tokenizer's "bytes" eos is 1
  } else if (HasToken(spec, "<|im_start|>")) {
    t.kind = Kind::kChatML;
    t.default_system = ChatMLDefaultSystem(spec.chat_template);
    if (t.default_system.empty()) t.default_system = kSmolLM2DefaultSystem;
    AddStop(spec, "<|im_end|>", &stops);
    AddStop(spec, "<|endoftext|>", &stops);
  } else if (HasToken(spec, "<|start_header_id|>")) {
    t.kind = Kind::kLlama3;
    AddStop(spec, "<|eot_id|>", &stops);
    AddStop(spec, "<|eom_id|>", &stops);
  }
  if (spec.model != "bytes" && spec.eos_id >= 0) stops.push_back(spec.eos_id);
  std::sort(stops.begin(), stops.end());
  stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
  t.stop_token_ids = std::move(stops);
  return t;
}

std::string RagTemplate::Opening() const {
  switch (kind) {
    case Kind::kChatML:
      return "<|im_start|>system\n";
    case Kind::kLlama3:
      return "<|begin_of_text|>";
    case Kind::kPlain:
      return "";
  }
  return "";
}

std::string RagTemplate::Prefix(std::string_view system) const {
  std::string full = FullPrefix(system);
  const std::string opening = Opening();
  if (opening_shared && full.compare(0, opening.size(), opening) == 0) {
    return full.substr(opening.size());
  }
  return full;
}

std::string RagTemplate::FullPrefix(std::string_view system) const {
  if (system.empty()) system = default_system;
  switch (kind) {
    case Kind::kChatML:
      return Concat({"<|im_start|>system\n", system, "<|im_end|>\n<|im_start|>user\n"});
    case Kind::kLlama3:
      if (system.empty()) {
        return "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n";
      }
      return Concat({"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n", system,
                     "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"});
    case Kind::kPlain:
      if (system.empty()) return "";
      return Concat({"System: ", system, "\n"});
  }
  return "";
}

std::string RagTemplate::Document(std::string_view text) const { return Concat({text, "\n\n"}); }

std::string RagTemplate::Suffix(std::string_view query) const {
  switch (kind) {
    case Kind::kChatML:
      return Concat({"Question: ", query, "<|im_end|>\n<|im_start|>assistant\n"});
    case Kind::kLlama3:
      return Concat(
          {"Question: ", query, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"});
    case Kind::kPlain:
      return Concat({"Question: ", query, "\nAnswer:"});
  }
  return "";
}

}  // namespace lazyrag
