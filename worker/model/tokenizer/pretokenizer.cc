#include "worker/model/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace lazyrag {
namespace {

// Unicode White_Space, which is what Hugging Face tokenizers (Oniguruma) and llama.cpp mean by
// \s. PCRE2's own \s under UCP leaves out U+0085, so the patterns spell the class out.
#define LAZYRAG_WS "\\t-\\r\\x{85}\\p{Z}"

// GPT-2 ByteLevel: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" LAZYRAG_WS "\\p{L}\\p{N}]+|[" LAZYRAG_WS
    "]+(?![^" LAZYRAG_WS "])|[" LAZYRAG_WS "]+";

// Every digit on its own (Hugging Face pre_tokenizers.Digits(individual_digits=True)).
constexpr char kDigitPattern[] = "\\p{N}";

// Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
constexpr char kLlama3Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" LAZYRAG_WS
    "\\p{L}\\p{N}]+[\\r\\n]*|[" LAZYRAG_WS "]*[\\r\\n]+|[" LAZYRAG_WS "]+(?![^" LAZYRAG_WS
    "])|[" LAZYRAG_WS "]+";

#undef LAZYRAG_WS

std::string Pcre2Error(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return absl::StrCat(code);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

// One compiled pattern. pcre2_code is immutable after compilation and safe to share between
// threads; match data is per call.
struct PreTokenizer::Stage {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Stage() { pcre2_code_free(code); }
};

PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view pre) {
  if (pre.empty() || pre == "default" || pre == "gpt2") return FromPatterns({kGpt2Pattern});
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell") {
    return FromPatterns({kDigitPattern, kGpt2Pattern});
  }
  if (pre == "llama-bpe" || pre == "llama3") return FromPatterns({kLlama3Pattern});
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported tokenizer pre-tokenizer \"", std::string(pre),
                   "\" (supported: gpt2, smollm, starcoder, refact, codeshell, llama-bpe)"));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromPatterns(
    const std::vector<std::string>& patterns) {
  std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
  for (const std::string& pattern : patterns) {
    auto stage = std::make_unique<Stage>();
    int error = 0;
    PCRE2_SIZE offset = 0;
    stage->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (stage->code == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("pre-tokenizer pattern does not compile at ",
                                                     offset, ": ", Pcre2Error(error)));
    }
    // JIT is an optimisation only: without it (unsupported platform) matching still works.
    stage->jit = pcre2_jit_compile(stage->code, PCRE2_JIT_COMPLETE) == 0;
    pre->stages_.push_back(std::move(stage));
  }
  return pre;
}

void PreTokenizer::SplitStage(const Stage& stage, std::string_view piece,
                              std::vector<std::string_view>* out) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(stage.code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t pos = 0;      // where the next search starts
  size_t emitted = 0;  // end of what has been pushed to `out`
  while (pos < piece.size()) {
    // The input is valid UTF-8 (checked by the caller), so skip PCRE2's own check.
    int rc = pcre2_match(stage.code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Pathological input for the JIT stack: the interpreter keeps its frames on the heap.
      rc = pcre2_match(stage.code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       md, nullptr);
    }
    if (rc < 0) break;  // no further match (or a resource error): the rest is one piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0];
    const size_t end = ov[1];
    if (end <= start) {
      // Empty match (none of the built-in patterns can produce one): step over one character.
      pos = start + 1;
      while (pos < piece.size() && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > emitted) out->push_back(piece.substr(emitted, start - emitted));
    out->push_back(piece.substr(start, end - start));
    emitted = pos = end;
  }
  if (emitted < piece.size()) out->push_back(piece.substr(emitted));
  pcre2_match_data_free(md);
}

std::vector<std::string_view> PreTokenizer::Split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const auto& stage : stages_) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (std::string_view piece : pieces) SplitStage(*stage, piece, &next);
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace lazyrag
