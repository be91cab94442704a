// The checksum of a document's KV bytes (its transport form, Backend::ExportKv's layout) in the
// host-memory tier. The GPU computes it fused with its copies; this is the CPU reference and the
// definition both sides follow.
//
// Words w_i are the i-th little-endian uint64 of the bytes (i from 0). The checksum is
//   h = XOR over i of Mix64(w_i + (i + 1) * kKvChecksumGamma)   (arithmetic mod 2^64)
// with Mix64 splitmix64's finalizer. XOR makes the combination order-free, so a kernel may reduce
// the terms in any order and split the bytes into ranges anywhere (KvChecksumRange). Mix64 is a
// bijection, so any change of a single word (in particular any single flipped bit) changes h; the
// index in each term makes moved words count. The empty input has checksum 0.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lazyrag {

inline constexpr uint64_t kKvChecksumGamma = 0x9E3779B97F4A7C15ull;

// splitmix64's finalizer (a bijection on uint64).
constexpr uint64_t Mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

// The term of word `word` at word index `index` (0-based over the whole input).
constexpr uint64_t KvChecksumTerm(uint64_t word, uint64_t index) {
  return Mix64(word + (index + 1) * kKvChecksumGamma);
}

// The XOR of the terms of `data`'s words, numbered from `first_word_index`: the part of the
// checksum of a larger input whose word `first_word_index` is `data`'s first word. So for `a`
// of a_words words, KvChecksum(a ++ b) == KvChecksumRange(a, 0) ^ KvChecksumRange(b, a_words).
// REQUIRES: bytes % 8 == 0 (a caller's bug otherwise: debug builds assert, release builds ignore
// the trailing bytes); `data` needs no alignment. Large inputs are split over the worker threads
// of common/parallel.h. Thread-safe.
uint64_t KvChecksumRange(const void* data, size_t bytes, uint64_t first_word_index);

// The checksum of `bytes` bytes at `data`. REQUIRES: bytes % 8 == 0. Thread-safe.
inline uint64_t KvChecksum(const void* data, size_t bytes) {
  return KvChecksumRange(data, bytes, 0);
}

}  // namespace lazyrag
