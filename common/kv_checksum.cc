#include "common/kv_checksum.h"

#include <atomic>
#include <cassert>
#include <cstring>

#include "absl/base/config.h"
#include "common/parallel.h"

namespace lazyrag {
namespace {

#if !defined(ABSL_IS_LITTLE_ENDIAN)
#error "KvChecksum reads words with memcpy and assumes a little-endian host"
#endif

// Below this many words (8 MiB) one thread checksums faster than a hand-off to the pool.
constexpr int64_t kMinWordsPerThread = int64_t{1} << 20;

uint64_t ChecksumWords(const char* data, int64_t begin, int64_t end, uint64_t first_word_index) {
  uint64_t h = 0;
  for (int64_t i = begin; i < end; ++i) {
    uint64_t word;
    std::memcpy(&word, data + 8 * i, sizeof(word));
    h ^= KvChecksumTerm(word, first_word_index + static_cast<uint64_t>(i));
  }
  return h;
}

}  // namespace

uint64_t KvChecksumRange(const void* data, size_t bytes, uint64_t first_word_index) {
  assert(bytes % 8 == 0 && "KvChecksum: bytes must be a multiple of 8");
  const char* p = static_cast<const char*>(data);
  const int64_t words = static_cast<int64_t>(bytes / 8);
  if (words < 2 * kMinWordsPerThread) return ChecksumWords(p, 0, words, first_word_index);
  std::atomic<uint64_t> h{0};
  ParallelFor(words, kMinWordsPerThread, [&](int64_t begin, int64_t end) {
    h.fetch_xor(ChecksumWords(p, begin, end, first_word_index), std::memory_order_relaxed);
  });
  return h.load(std::memory_order_relaxed);
}

}  // namespace lazyrag
