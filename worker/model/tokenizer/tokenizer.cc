#include "worker/model/tokenizer/tokenizer.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/tokenizer/utf8.h"

namespace lazyrag {
namespace {

// GGUF tokenizer.ggml.token_type values.
constexpr int32_t kTypeNormal = 1;
constexpr int32_t kTypeUnknown = 2;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;
constexpr int32_t kTypeUnused = 5;

// "bytes" model layout.
constexpr int32_t kBytesFirstByteId = 3;
constexpr int kBytesVocab = kBytesFirstByteId + 256;

// Word cache bounds: words longer than this are merged every time (they are rare, and would
// let one huge input evict everything); the cache is cleared when it holds this many words.
constexpr size_t kMaxCachedWordBytes = 128;
constexpr size_t kMaxCacheEntries = size_t{1} << 17;

// GPT-2's reversible byte <-> unicode mapping: printable Latin-1 bytes map to themselves, the
// other 68 bytes (controls, space, 0x7F-0xA0, 0xAD) to U+0100.. in byte order.
std::vector<uint32_t> ByteToCodePoint() {
  std::vector<uint32_t> map(256);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[b] = printable ? b : next++;
  }
  return map;
}

// Abseil's transparent string hash takes absl::string_view, which is not std::string_view where
// Abseil is built without it (Debian's packages).
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(const TokenizerSpec& spec,
                                                             int vocab_size) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  std::fill(std::begin(t->byte_id_), std::end(t->byte_id_), -1);

  if (spec.model == "bytes") {
    if (vocab_size == 0) vocab_size = kBytesVocab;
    if (vocab_size < kBytesVocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("byte tokenizer needs vocab_size >= ", kBytesVocab, ", got ", vocab_size));
    }
    t->bytes_model_ = true;
    t->vocab_size_ = vocab_size;
    t->bos_id_ = spec.bos_id >= 0 && spec.bos_id < kBytesFirstByteId ? spec.bos_id : 0;
    t->eos_id_ = spec.eos_id >= 0 && spec.eos_id < kBytesFirstByteId ? spec.eos_id : 1;
    // The specials' names come from the spec when it has them (BytesTokenizerSpec() says
    // "<bos>", "<eos>", "<pad>"); the byte tokens are always the raw bytes.
    t->token_text_ = {"<s>", "</s>", "<pad>"};
    for (int32_t id = 0; id < kBytesFirstByteId && id < static_cast<int32_t>(spec.tokens.size());
         ++id) {
      if (!spec.tokens[id].empty()) t->token_text_[id] = spec.tokens[id];
    }
    t->token_bytes_ = t->token_text_;
    t->special_.assign(kBytesVocab, 0);
    for (int b = 0; b < 256; ++b) {
      t->token_text_.push_back(std::string(1, static_cast<char>(b)));
      t->token_bytes_.push_back(t->token_text_.back());
      t->byte_id_[b] = kBytesFirstByteId + b;
    }
    for (int32_t id = 0; id < kBytesFirstByteId; ++id) {
      t->special_[id] = 1;
      t->specials_.push_back({t->token_text_[id], id, /*control=*/true});
    }
  } else if (spec.model == "gpt2") {
    const auto n = static_cast<int64_t>(spec.tokens.size());
    if (n == 0) return absl::InvalidArgumentError("gpt2 tokenizer has no tokens");
    if (vocab_size == 0) vocab_size = static_cast<int>(n);
    if (vocab_size < n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vocab_size ", vocab_size, " is smaller than the tokenizer's ", n, " tokens"));
    }
    if (!spec.token_types.empty() && static_cast<int64_t>(spec.token_types.size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("token_types has ", spec.token_types.size(), " entries for ", n, " tokens"));
    }
    for (int32_t id : {spec.bos_id, spec.eos_id, spec.unk_id, spec.pad_id}) {
      if (id < -1 || id >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("special token id ", id, " out of range [0, ", n, ")"));
      }
    }
    ASSIGN_OR_RETURN(t->pre_, PreTokenizer::Create(spec.pre));
    t->vocab_size_ = vocab_size;
    t->bos_id_ = spec.bos_id;
    t->eos_id_ = spec.eos_id;
    // Llama 3's tokenizer.json sets "ignore_merges": a word that is itself a token is emitted
    // whole (llama.cpp does the same for this pre type).
    t->ignore_merges_ = spec.pre == "llama-bpe" || spec.pre == "llama3";

    const std::vector<uint32_t> byte_to_cp = ByteToCodePoint();
    absl::flat_hash_map<uint32_t, uint8_t> cp_to_byte;
    for (int b = 0; b < 256; ++b) cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);

    t->token_text_ = spec.tokens;
    t->token_bytes_.resize(n);
    t->special_.assign(n, 0);
    t->id_by_text_.reserve(n);
    for (int32_t id = 0; id < n; ++id) {
      const std::string& text = spec.tokens[id];
      const int32_t type = spec.token_types.empty() ? kTypeNormal : spec.token_types[id];
      t->id_by_text_.try_emplace(text, id);  // duplicates: the lowest id wins
      if (type == kTypeControl || type == kTypeUserDefined || type == kTypeUnknown) {
        t->token_bytes_[id] = text;
        if (type == kTypeControl) t->special_[id] = 1;
        if (type != kTypeUnknown && !text.empty()) {
          t->specials_.push_back({text, id, /*control=*/type == kTypeControl});
        }
        continue;
      }
      if (type == kTypeUnused) continue;
      // Byte-level text: map every alphabet character back to its byte; a character outside
      // the alphabet (not produced by GPT-2 converters) is kept as its own UTF-8.
      std::string bytes;
      std::string_view rest = text;
      while (!rest.empty()) {
        size_t len = Utf8SequenceLength(rest);
        if (len == 0) {
          bytes.push_back(rest[0]);
          rest.remove_prefix(1);
          continue;
        }
        auto it = cp_to_byte.find(DecodeUtf8(rest));
        if (it != cp_to_byte.end()) {
          bytes.push_back(static_cast<char>(it->second));
        } else {
          bytes.append(rest.substr(0, len));
        }
        rest.remove_prefix(len);
      }
      t->token_bytes_[id] = std::move(bytes);
    }
    for (int b = 0; b < 256; ++b) {
      AppendUtf8(byte_to_cp[b], &t->byte_text_[b]);
      auto it = t->id_by_text_.find(t->byte_text_[b]);
      if (it != t->id_by_text_.end()) t->byte_id_[b] = it->second;
    }
    t->merges_.reserve(spec.merges.size());
    std::string merged;
    for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
      const std::string& m = spec.merges[rank];
      const size_t space = m.find(' ', 1);
      if (space == std::string::npos) continue;
      const std::string_view left(m.data(), space);
      const std::string_view right(m.data() + space + 1, m.size() - space - 1);
      auto l = t->id_by_text_.find(AbslView(left));
      auto r = t->id_by_text_.find(AbslView(right));
      merged.assign(left);
      merged.append(right);
      auto out = t->id_by_text_.find(merged);
      // A merge whose parts or result are not tokens can never fire; skip it.
      if (l == t->id_by_text_.end() || r == t->id_by_text_.end() || out == t->id_by_text_.end()) {
        continue;
      }
      t->merges_.try_emplace(PairKey(l->second, r->second),
                             MergeResult{static_cast<int32_t>(rank), out->second});
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported tokenizer model \"", spec.model, "\" (gpt2, bytes)"));
  }

  // Longest first, so that the first match in a bucket is the longest one.
  std::stable_sort(
      t->specials_.begin(), t->specials_.end(),
      [](const Special& a, const Special& b) { return a.text.size() > b.text.size(); });
  for (size_t i = 0; i < t->specials_.size(); ++i) {
    const auto first = static_cast<unsigned char>(t->specials_[i].text[0]);
    t->specials_by_first_byte_[first].push_back(static_cast<int32_t>(i));
  }
  return t;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<std::pair<size_t, size_t>> ranges;
  if (parse_special) ranges.push_back({0, text.size()});
  return EncodeWithRanges(text, ranges);
}

std::vector<int32_t> Tokenizer::EncodePieces(const std::vector<PromptPiece>& pieces,
                                             bool parse_special_in_text) const {
  std::string text;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const PromptPiece& p : pieces) {
    const size_t begin = text.size();
    text += p.text;
    if (!p.template_text && !parse_special_in_text) continue;
    if (!ranges.empty() && ranges.back().second == begin) {
      ranges.back().second = text.size();  // adjacent pieces form one range
    } else {
      ranges.push_back({begin, text.size()});
    }
  }
  return EncodeWithRanges(text, ranges);
}

std::vector<int32_t> Tokenizer::EncodeWithRanges(
    std::string_view text, const std::vector<std::pair<size_t, size_t>>& special_ranges) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  size_t segment = 0;  // start of the ordinary text not yet encoded
  size_t i = 0;
  size_t range = 0;  // first range that does not end at or before i
  while (i < text.size() && !specials_.empty()) {
    while (range < special_ranges.size() && special_ranges[range].second <= i) ++range;
    const bool in_range = range < special_ranges.size() && special_ranges[range].first <= i;
    const std::vector<int32_t>& bucket =
        specials_by_first_byte_[static_cast<unsigned char>(text[i])];
    const Special* found = nullptr;
    for (int32_t index : bucket) {
      const Special& s = specials_[index];
      if (s.control && (!in_range || i + s.text.size() > special_ranges[range].second)) continue;
      if (text.substr(i, s.text.size()) == s.text) {
        found = &s;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    EncodeOrdinary(text.substr(segment, i - segment), &out);
    out.push_back(found->id);
    i += found->text.size();
    segment = i;
  }
  EncodeOrdinary(text.substr(segment), &out);
  return out;
}

void Tokenizer::EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  if (bytes_model_) {
    for (char c : text) out->push_back(kBytesFirstByteId + static_cast<unsigned char>(c));
    return;
  }
  // Valid runs go through the pre-tokenizer; each maximal run of invalid bytes is one word.
  size_t i = 0;
  while (i < text.size()) {
    size_t valid_end = i;
    while (valid_end < text.size()) {
      if (static_cast<unsigned char>(text[valid_end]) < 0x80) {
        ++valid_end;
        continue;
      }
      const size_t len = Utf8SequenceLength(text.substr(valid_end));
      if (len == 0) break;
      valid_end += len;
    }
    if (valid_end > i) {
      for (std::string_view word : pre_->Split(text.substr(i, valid_end - i))) {
        EncodeWord(word, out);
      }
    }
    size_t invalid_end = valid_end;
    while (invalid_end < text.size() && static_cast<unsigned char>(text[invalid_end]) >= 0x80 &&
           Utf8SequenceLength(text.substr(invalid_end)) == 0) {
      ++invalid_end;
    }
    if (invalid_end > valid_end) EncodeWord(text.substr(valid_end, invalid_end - valid_end), out);
    i = invalid_end;
  }
}

void Tokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.size() == 1 || word.size() > kMaxCachedWordBytes) {
    MergeWord(word, out);
    return;
  }
  const std::string key(word);
  {
    absl::ReaderMutexLock lock(&cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out->size();
  MergeWord(word, out);
  std::vector<int32_t> ids(out->begin() + before, out->end());
  absl::MutexLock lock(&cache_mu_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.try_emplace(key, std::move(ids));
}

void Tokenizer::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  // Symbols form a doubly linked list over the word's bytes; a merge absorbs the right symbol
  // into the left one. Candidate merges wait in a min-heap by (rank, position of the left
  // symbol); a popped candidate is stale when either symbol has changed since it was pushed.
  if (ignore_merges_) {
    std::string text;
    for (char c : word) text += byte_text_[static_cast<unsigned char>(c)];
    auto it = id_by_text_.find(text);
    if (it != id_by_text_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  // A byte without a token (SmolLM2 lacks 0x04, 0xF1, 0xFF, ...) is dropped before merging,
  // so its neighbours may merge: what Hugging Face's BPE does without an unk token. (llama.cpp
  // instead keeps it as a barrier and drops it afterwards.)
  std::vector<int32_t> id;
  id.reserve(word.size());
  for (char c : word) {
    const int32_t b = byte_id_[static_cast<unsigned char>(c)];
    if (b >= 0) id.push_back(b);
  }
  const int n = static_cast<int>(id.size());
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int left;
    int32_t left_id;
    int32_t right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int left) {
    if (left < 0) return;
    const int right = next[left];
    if (right < 0) return;
    auto it = merges_.find(PairKey(id[left], id[right]));
    if (it == merges_.end()) return;
    heap.push({it->second.rank, left, id[left], id[right]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int right = next[c.left];
    if (id[c.left] != c.left_id || right < 0 || id[right] != c.right_id) continue;
    id[c.left] = merges_.find(PairKey(c.left_id, c.right_id))->second.id;
    id[right] = -2;  // dead
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  for (int i = 0; i >= 0 && i < n; i = next[i]) out->push_back(id[i]);
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < static_cast<int32_t>(token_bytes_.size())) out += token_bytes_[id];
  }
  return out;
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(token_bytes_.size())) return "";
  return token_bytes_[id];
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view token_text) const {
  if (bytes_model_) {
    for (int32_t id = 0; id < kBytesFirstByteId; ++id) {
      if (token_text_[id] == token_text) return id;
    }
    if (token_text.size() == 1) {
      return kBytesFirstByteId + static_cast<unsigned char>(token_text[0]);
    }
    return std::nullopt;
  }
  auto it = id_by_text_.find(AbslView(token_text));
  if (it == id_by_text_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(special_.size()) && special_[id] != 0;
}

}  // namespace lazyrag
