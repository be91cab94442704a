// Text <-> token ids for the models lazyrag serves.
//
// Two kinds, chosen by TokenizerSpec::model:
//   "gpt2"   byte-level BPE as in GPT-2 / Hugging Face `tokenizers` / llama.cpp: special tokens
//            are cut out of the text first (longest match), the rest is pre-tokenized by the
//            regexes of TokenizerSpec::pre, every piece is mapped to the GPT-2 byte-to-unicode
//            alphabet and merged by merge rank. No prefix space; no BOS is added.
//   "bytes"  the synthetic-model fallback: id = 3 + byte; ids 0, 1, 2 are control tokens
//            (bos, eos, pad) named by spec.tokens[0..2] when given, else "<s>", "</s>",
//            "<pad>"; ids 259..vocab_size-1 exist but decode to "". bos/eos are 0/1 unless
//            the spec names another of ids 0..2.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/model/tokenizer/pretokenizer.h"
#include "worker/model/tokenizer_spec.h"

namespace lazyrag {

// A piece of a prompt. Template text may hold control tokens (<|im_start|>, <|eot_id|>); any
// other text (documents, queries, system prompts: what callers send) is literal by default.
struct PromptPiece {
  std::string text;
  bool template_text = false;
};

// Thread-safe: every const method may be called concurrently (the word cache has a mutex).
class Tokenizer {
 public:
  // `vocab_size` is the number of rows of the model's embedding: ids in [0, vocab_size) are
  // valid, ids past the tokenizer's own tokens decode to "". 0 means "the spec's token count".
  // INVALID_ARGUMENT for: unknown model or pre-tokenizer, vocab_size smaller than the token
  // list (or than 259 for "bytes"), token_types of the wrong length, bos/eos/unk/pad out of
  // range, an empty "gpt2" vocabulary. Duplicate token texts are allowed (the lowest id is the
  // one TokenId and the merges see); merges whose parts or result are not tokens are ignored.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(const TokenizerSpec& spec,
                                                           int vocab_size = 0);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. With parse_special, the text of every control token (and always of
  // every user-defined token) is recognised literally, leftmost and longest first; without it
  // control tokens are ordinary text. Never adds BOS/EOS. Any bytes are accepted: invalid UTF-8
  // sequences are split off and byte-encoded. A byte whose byte-level character is not in the
  // vocabulary is dropped, as Hugging Face's BPE does without an unk token (SmolLM2 has no
  // token for 0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5-0xFF). So
  // Decode(Encode(s)) == s exactly when every byte of s has a token: always for "bytes" and full
  // GPT-2 alphabets; for SmolLM2, for all text without those control characters and without
  // code points U+40000..U+BFFFF (lead bytes F1, F2).
  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const;

  // Token ids of the concatenated pieces, as Encode would give for the whole text, except that a
  // control token is recognised only where its text lies entirely inside a template piece (or
  // anywhere, with parse_special_in_text). So "<|im_end|>" inside a document is ordinary text and
  // cannot end the turn. User-defined tokens are recognised everywhere, as in Encode.
  std::vector<int32_t> EncodePieces(const std::vector<PromptPiece>& pieces,
                                    bool parse_special_in_text = false) const;

  // Concatenated TokenBytes of `ids`: exact bytes, possibly invalid UTF-8 when the ids end
  // inside a character. Ids outside [0, vocab_size) contribute nothing.
  std::string Decode(std::span<const int32_t> ids) const;

  // Raw bytes of one token (a special token's text for control/user-defined tokens; "" for
  // unused tokens and for ids out of range). For streaming; see Utf8CompletePrefix.
  std::string TokenBytes(int32_t id) const;

  int32_t bos_id() const { return bos_id_; }  // -1 when the model has none
  int32_t eos_id() const { return eos_id_; }  // -1 when the model has none
  int vocab_size() const { return vocab_size_; }

  // Id of a token by its exact text in the vocabulary (e.g. "<|im_end|>"), if any.
  std::optional<int32_t> TokenId(std::string_view token_text) const;

  // True for control tokens (and for "bytes", ids 0..2).
  bool IsSpecial(int32_t id) const;

 private:
  struct Special {
    std::string text;
    int32_t id;
    bool control;  // matched only with parse_special
  };
  struct MergeResult {
    int32_t rank;
    int32_t id;
  };

  Tokenizer() = default;

  // Appends the ids of one pre-tokenized word (raw bytes), through the cache.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  // BPE over the byte-level symbols of `word`, no cache.
  void MergeWord(std::string_view word, std::vector<int32_t>* out) const;
  // Encode, with control tokens recognised only inside the [begin, end) byte ranges of
  // `special_ranges` (sorted, disjoint).
  std::vector<int32_t> EncodeWithRanges(
      std::string_view text, const std::vector<std::pair<size_t, size_t>>& special_ranges) const;
  // Pre-tokenizes and encodes text that contains no special token.
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) const;

  bool bytes_model_ = false;
  int vocab_size_ = 0;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool ignore_merges_ = false;  // emit a word that is itself a token without merging

  std::vector<std::string> token_text_;   // id -> vocabulary text
  std::vector<std::string> token_bytes_;  // id -> decoded raw bytes
  std::vector<uint8_t> special_;          // id -> 1 if control
  absl::flat_hash_map<std::string, int32_t> id_by_text_;
  int32_t byte_id_[256];        // byte -> id of its single-character token, -1 if absent
  std::string byte_text_[256];  // byte -> its byte-level alphabet character (UTF-8)
  // (left id << 32 | right id) -> rank and merged id.
  absl::flat_hash_map<uint64_t, MergeResult> merges_;
  // Specials sorted by length, longest first, bucketed by first byte.
  std::vector<Special> specials_;
  std::vector<int32_t> specials_by_first_byte_[256];
  std::unique_ptr<PreTokenizer> pre_;

  // Word -> ids. Bounded: cleared when it reaches kMaxCacheEntries.
  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace lazyrag
