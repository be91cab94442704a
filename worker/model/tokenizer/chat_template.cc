#include "worker/model/tokenizer/chat_template.h"

#include <algorithm>
#include <initializer_list>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/logging.h"
#include "worker/model/tokenizer/jinja.h"

namespace lazyrag {
namespace {

// Placeholders the template is rendered with: plain ASCII that no template transforms (Python's
// str.strip() also strips control characters such as \x1f, so those would not survive `trim`).
constexpr char kSystemMark[] = "@@LAZYRAG_SYSTEM@@";
constexpr char kUserMark[] = "@@LAZYRAG_USER@@";
constexpr char kQuestion[] = "Question: ";

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

std::string Join(const std::vector<PromptPiece>& pieces) {
  std::string out;
  for (const PromptPiece& p : pieces) out += p.text;
  return out;
}

void AddPiece(std::vector<PromptPiece>* out, std::string_view text, bool template_text) {
  if (!text.empty()) out->push_back({std::string(text), template_text});
}

// The hard-coded families.
void SetFamilyLayout(RagTemplate* t) {
  switch (t->kind) {
    case RagTemplate::Kind::kChatML:
      t->system_open = "<|im_start|>system\n";
      t->system_close = "<|im_end|>\n<|im_start|>user\n";
      t->generation = "<|im_end|>\n<|im_start|>assistant\n";
      t->opening = "<|im_start|>system\n";
      break;
    case RagTemplate::Kind::kLlama3:
      t->system_open = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n";
      t->system_close = "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n";
      t->generation = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
      t->opening = "<|begin_of_text|>";
      t->no_system = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n";
      break;
    case RagTemplate::Kind::kPlain:
    case RagTemplate::Kind::kJinja:
      t->system_open = "System: ";
      t->system_close = "\n";
      t->generation = "\nAnswer:";
      t->opening = "";
      t->no_system = "";
      break;
  }
  if (!t->default_system.empty()) {
    t->no_system = Concat({t->system_open, t->default_system, t->system_close});
  }
}

// Renders `messages`; splits the output around the marks, which must each appear once, in order.
absl::StatusOr<std::vector<std::string>> RenderSplit(const JinjaTemplate& t, const Json& context,
                                                     const std::vector<std::string>& marks) {
  auto out = t.Render(context);
  if (!out.ok()) return out.status();
  std::vector<std::string> parts;
  size_t at = 0;
  for (const std::string& m : marks) {
    const size_t found = out->find(m, at);
    if (found == std::string::npos || out->find(m, found + m.size()) != std::string::npos) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chat template: the rendered prompt does not hold each message exactly once in order"));
    }
    parts.push_back(out->substr(at, found - at));
    at = found + m.size();
  }
  parts.push_back(out->substr(at));
  return parts;
}

Json Context(Json messages, std::string_view bos, std::string_view eos) {
  return {{"messages", std::move(messages)},
          {"add_generation_prompt", true},
          {"bos_token", std::string(bos)},
          {"eos_token", std::string(eos)}};
}

}  // namespace

absl::StatusOr<RagTemplate> RagTemplate::FromJinja(std::string_view chat_template,
                                                   std::string_view bos_token,
                                                   std::string_view eos_token,
                                                   const std::vector<std::string>& control_tokens) {
  auto parsed = JinjaTemplate::Parse(chat_template);
  if (!parsed.ok()) return parsed.status();
  const JinjaTemplate& jt = **parsed;
  const Json user_only = Json::array({{{"role", "user"}, {"content", kUserMark}}});
  // With a system message; templates without a system role (Gemma) refuse it, and then the
  // system prompt opens the user's message instead.
  auto with_system =
      RenderSplit(jt,
                  Context(Json::array({{{"role", "system"}, {"content", kSystemMark}},
                                       {{"role", "user"}, {"content", kUserMark}}}),
                          bos_token, eos_token),
                  {kSystemMark, kUserMark});
  if (!with_system.ok()) {
    with_system = RenderSplit(
        jt,
        Context(Json::array({{{"role", "user"},
                              {"content", absl::StrCat(kSystemMark, "\n\n", kUserMark)}}}),
                bos_token, eos_token),
        {kSystemMark, kUserMark});
  }
  if (!with_system.ok()) return with_system.status();
  auto without = RenderSplit(jt, Context(user_only, bos_token, eos_token), {kUserMark});
  if (!without.ok()) return without.status();
  RagTemplate t;
  t.kind = Kind::kJinja;
  t.system_open = (*with_system)[0];
  t.system_close = (*with_system)[1];
  t.generation = (*with_system)[2];
  t.no_system = (*without)[0];
  if ((*without)[1] != t.generation) {
    return absl::FailedPreconditionError(
        "chat template: the assistant turn's opening depends on the system prompt");
  }
  if (t.generation.empty()) {
    return absl::FailedPreconditionError("chat template: no generation prompt after the user turn");
  }
  // Opening: the common start of both prefixes, cut after a control token or a newline.
  size_t common = 0;
  while (common < t.system_open.size() && common < t.no_system.size() &&
         t.system_open[common] == t.no_system[common]) {
    ++common;
  }
  const std::string& s = t.system_open;
  size_t cut = common;
  for (; cut > 0; --cut) {
    if (s[cut - 1] == '\n') break;
    bool after_control = false;
    for (const std::string& c : control_tokens) {
      if (!c.empty() && c.size() <= cut && s.compare(cut - c.size(), c.size(), c) == 0) {
        after_control = true;
        break;
      }
    }
    if (after_control) break;
  }
  t.opening = s.substr(0, cut);
  return t;
}

RagTemplate RagTemplate::ForSpec(const TokenizerSpec& spec) {
  RagTemplate t;
  std::vector<int32_t> stops;
  if (spec.model == "bytes") {
    t.kind = Kind::kPlain;
    stops.push_back(spec.eos_id >= 0 ? spec.eos_id : 1);  // Tokenizer's "bytes" eos is 1
  } else {
    if (HasToken(spec, "<|im_start|>")) {
      t.kind = Kind::kChatML;
      t.default_system = ChatMLDefaultSystem(spec.chat_template);
      if (t.default_system.empty()) t.default_system = kSmolLM2DefaultSystem;
    } else if (HasToken(spec, "<|start_header_id|>")) {
      t.kind = Kind::kLlama3;
    }
    for (const char* stop :
         {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>"}) {
      AddStop(spec, stop, &stops);
    }
  }
  if (spec.model != "bytes" && spec.eos_id >= 0) stops.push_back(spec.eos_id);
  std::sort(stops.begin(), stops.end());
  stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
  SetFamilyLayout(&t);
  if (spec.model != "bytes" && !spec.chat_template.empty()) {
    auto text = [&](int32_t id) {
      return id >= 0 && id < static_cast<int32_t>(spec.tokens.size()) ? spec.tokens[id]
                                                                      : std::string();
    };
    std::vector<std::string> controls;
    for (size_t i = 0; i < spec.tokens.size() && i < spec.token_types.size(); ++i) {
      if (spec.token_types[i] == 3) controls.push_back(spec.tokens[i]);
    }
    absl::StatusOr<RagTemplate> jinja =
        FromJinja(spec.chat_template, text(spec.bos_id), text(spec.eos_id), controls);
    if (jinja.ok()) {
      jinja->stop_token_ids = std::move(stops);
      return *std::move(jinja);
    }
    t.template_error = std::string(jinja.status().message());
    LOG_WARNING << "the model's chat template is not used (" << t.template_error
                << "); falling back to the built-in "
                << (t.kind == Kind::kChatML   ? "ChatML"
                    : t.kind == Kind::kLlama3 ? "Llama-3"
                                              : "plain")
                << " layout";
  }
  t.stop_token_ids = std::move(stops);
  return t;
}

std::vector<PromptPiece> RagTemplate::PrefixPieces(std::string_view system) const {
  std::vector<PromptPiece> out;
  if (system.empty()) {
    AddPiece(&out, no_system, true);
  } else {
    AddPiece(&out, system_open, true);
    AddPiece(&out, system, false);
    AddPiece(&out, system_close, true);
  }
  if (opening_shared && !out.empty() && out[0].template_text &&
      out[0].text.compare(0, opening.size(), opening) == 0) {
    out[0].text.erase(0, opening.size());
    if (out[0].text.empty()) out.erase(out.begin());
  }
  return out;
}

std::vector<PromptPiece> RagTemplate::DocumentPieces(std::string_view text) const {
  return {{Concat({text, "\n\n"}), false}};
}

std::vector<PromptPiece> RagTemplate::SuffixPieces(std::string_view query) const {
  std::vector<PromptPiece> out;
  AddPiece(&out, Concat({kQuestion, query}), false);
  AddPiece(&out, generation, true);
  return out;
}

std::string RagTemplate::Prefix(std::string_view system) const {
  return Join(PrefixPieces(system));
}

std::string RagTemplate::FullPrefix(std::string_view system) const {
  RagTemplate copy = *this;
  copy.opening_shared = false;
  return Join(copy.PrefixPieces(system));
}

std::string RagTemplate::Document(std::string_view text) const {
  return Join(DocumentPieces(text));
}

std::string RagTemplate::Suffix(std::string_view query) const { return Join(SuffixPieces(query)); }

}  // namespace lazyrag
