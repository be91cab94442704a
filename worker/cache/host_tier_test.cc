#include "worker/cache/host_tier.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kv_checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyrag {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<HostArena> Arena(int64_t bytes) {
  auto arena = NewHeapHostArena(bytes);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return *std::move(arena);
}

// Inserts `key` with `bytes` bytes of `fill`, committed with their checksum; returns the range.
char* Put(HostTier& tier, const std::string& key, int64_t bytes, char fill = 'x') {
  auto range = tier.BeginInsert(key, bytes, /*num_tokens=*/1, {7});
  EXPECT_TRUE(range.ok()) << key << ": " << range.status();
  if (!range.ok()) return nullptr;
  std::memset(*range, fill, bytes);
  EXPECT_TRUE(tier.CommitInsert(key, KvChecksum(*range, bytes)).ok());
  return *range;
}

// Acquires and releases at once: refreshes the entry's place in the LRU order.
void Touch(HostTier& tier, const std::string& key) {
  ASSERT_TRUE(tier.Acquire(key).has_value()) << key;
  tier.Release(key);
}

TEST(HostTierTest, EvictsTheLeastRecentlyUsedAndAcquireRefreshes) {
  HostTier tier(Arena(1024));
  for (const char* key : {"a", "b", "c", "d"}) Put(tier, key, 256);
  Touch(tier, "a");  // order now b, c, d, a
  Put(tier, "e", 256);
  EXPECT_FALSE(tier.Contains("b"));
  for (const char* key : {"a", "c", "d", "e"}) EXPECT_TRUE(tier.Contains(key)) << key;
  Touch(tier, "c");  // order now d, a, e, c; offsets a 0, e 256, c 512, d 768
  // 512 contiguous bytes: evicting d, then a, frees two separate ranges; e goes too, c stays.
  Put(tier, "f", 512);
  for (const char* key : {"d", "a", "e"}) EXPECT_FALSE(tier.Contains(key)) << key;
  EXPECT_TRUE(tier.Contains("c"));
  EXPECT_TRUE(tier.Contains("f"));
  HostTierStats stats = tier.Stats();
  EXPECT_EQ(stats.evictions, 4);
  EXPECT_EQ(stats.entries, 2);
  EXPECT_EQ(stats.used_bytes, 768);
  EXPECT_EQ(stats.capacity_bytes, 1024);
  EXPECT_EQ(stats.inserts, 6);
}

// A write-back's read pins the entry but is not a use: no hit or miss counted, LRU unchanged.
TEST(HostTierTest, AWriteBackReadIsNotAUse) {
  HostTier tier(Arena(768));
  for (const char* key : {"a", "b", "c"}) Put(tier, key, 256);
  auto ref = tier.Acquire("a", HostTier::Purpose::kWriteBack);
  ASSERT_TRUE(ref.has_value());
  EXPECT_FALSE(tier.Acquire("zz", HostTier::Purpose::kWriteBack).has_value());
  EXPECT_EQ(tier.Stats().hits, 0);
  EXPECT_EQ(tier.Stats().misses, 0);
  EXPECT_EQ(tier.Stats().pinned_entries, 1);
  tier.Release("a");
  Put(tier, "d", 256);  // "a" is still the least recently used: it goes
  EXPECT_FALSE(tier.Contains("a"));
  EXPECT_TRUE(tier.Contains("b"));
}

TEST(HostTierTest, PinnedAndPendingEntriesAreNeverEvicted) {
  HostTier tier(Arena(1024));
  Put(tier, "pinned", 512);
  ASSERT_TRUE(tier.Acquire("pinned").has_value());
  auto pending = tier.BeginInsert("pending", 512, 0, {});
  ASSERT_TRUE(pending.ok());
  auto full = tier.BeginInsert("c", 256, 0, {});
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("no room for 256 bytes"));
  EXPECT_THAT(full.status().message(), HasSubstr("1024 of 1024 bytes used"));
  EXPECT_TRUE(tier.Contains("pinned"));
  EXPECT_EQ(tier.Stats().evictions, 0);

  // Released, it is the one evictable entry; the pending one stays.
  tier.Release("pinned");
  EXPECT_TRUE(tier.BeginInsert("c", 256, 0, {}).ok());
  EXPECT_FALSE(tier.Contains("pinned"));
  EXPECT_TRUE(tier.CommitInsert("pending", 0).ok());
  HostTierStats stats = tier.Stats();
  EXPECT_EQ(stats.evictions, 1);
  EXPECT_EQ(stats.used_bytes, 768);
  EXPECT_EQ(stats.pending_entries, 1);
}

TEST(HostTierTest, NothingIsEvictedWhenEvictingCannotMakeRoom) {
  HostTier tier(Arena(1024));
  Put(tier, "free", 256);    // [0, 256), evictable
  Put(tier, "pinned", 256);  // [256, 512)
  ASSERT_TRUE(tier.Acquire("pinned").has_value());
  ASSERT_TRUE(tier.BeginInsert("pending", 512, 0, {}).ok());  // [512, 1024)
  // Evicting "free" leaves 256 contiguous bytes: not enough, so it stays.
  auto big = tier.BeginInsert("big", 512, 0, {});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(tier.Contains("free"));
  EXPECT_EQ(tier.Stats().evictions, 0);
  tier.Release("pinned");
}

TEST(HostTierTest, UsedBytesNeverExceedCapacityAndRangesAreAligned) {
  HostTier tier(Arena(4096));
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    const int64_t bytes = 8 * (1 + static_cast<int64_t>(rng() % 200));  // 8 .. 1600
    char* range = Put(tier, absl::StrCat("k", i), bytes);
    ASSERT_NE(range, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(range) % 256, 0u);
    HostTierStats stats = tier.Stats();
    ASSERT_LE(stats.used_bytes, stats.capacity_bytes);
    EXPECT_EQ(stats.used_bytes % 256, 0);
  }
  // An 8-byte document takes a whole 256-byte range; Acquire reports its own size.
  HostTier small(Arena(1024));
  Put(small, "tiny", 8);
  EXPECT_EQ(small.Stats().used_bytes, 256);
  auto ref = small.Acquire("tiny");
  ASSERT_TRUE(ref.has_value());
  EXPECT_EQ(ref->bytes, 8);
  small.Release("tiny");
}

TEST(HostTierTest, FreeRangesCoalesceSoALargerDocumentFits) {
  HostTier tier(Arena(1024));
  char* a = Put(tier, "a", 256);
  Put(tier, "b", 256);
  Put(tier, "c", 256);
  Put(tier, "d", 256);
  ASSERT_TRUE(tier.Acquire("a").has_value());
  ASSERT_TRUE(tier.Acquire("d").has_value());
  // b and c are evicted (least recently used first); their ranges merge into one of 512 bytes.
  auto e = tier.BeginInsert("e", 512, 0, {});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(*e, a + 256);
  EXPECT_EQ(tier.Stats().evictions, 2);
  tier.AbortInsert("e");
  tier.Release("a");
  tier.Release("d");

  // Freed out of order (with no, one and two free neighbours), the whole arena is one range.
  tier.Erase("d", false);
  tier.Erase("a", false);
  EXPECT_EQ(tier.Stats().used_bytes, 0);
  auto whole = tier.BeginInsert("whole", 1024, 0, {});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole, a);
  tier.AbortInsert("whole");

  for (const char* key : {"p", "q", "r", "s"}) Put(tier, key, 256);
  tier.Erase("p", false);
  tier.Erase("r", false);
  tier.Erase("q", false);  // joins p's range before it and r's after it
  tier.Erase("s", false);
  EXPECT_EQ(tier.Stats().evictions, 2);  // no eviction needed below
  EXPECT_TRUE(tier.BeginInsert("whole", 1024, 0, {}).ok());
  EXPECT_EQ(tier.Stats().evictions, 2);
}

TEST(HostTierTest, AlreadyExistsWhilePendingReadyOrErasedButRead) {
  HostTier tier(Arena(1024));
  ASSERT_TRUE(tier.BeginInsert("k", 256, 0, {}).ok());
  auto again = tier.BeginInsert("k", 256, 0, {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("key k is already being inserted"));
  ASSERT_TRUE(tier.CommitInsert("k", 0).ok());
  again = tier.BeginInsert("k", 256, 0, {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("key k is already present"));

  ASSERT_TRUE(tier.Acquire("k").has_value());
  tier.Erase("k", false);
  again = tier.BeginInsert("k", 256, 0, {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("erased and is still being read"));
  tier.Release("k");
  EXPECT_TRUE(tier.BeginInsert("k", 256, 0, {}).ok());
  EXPECT_EQ(tier.Stats().used_bytes, 256);
}

TEST(HostTierTest, AbortInsertFreesTheRange) {
  HostTier tier(Arena(1024));
  ASSERT_TRUE(tier.BeginInsert("k", 1024, 0, {}).ok());
  EXPECT_EQ(tier.Stats().pending_entries, 1);
  EXPECT_FALSE(tier.Acquire("k").has_value());  // pending: a miss
  EXPECT_FALSE(tier.Contains("k"));
  tier.AbortInsert("k");
  HostTierStats stats = tier.Stats();
  EXPECT_EQ(stats.used_bytes, 0);
  EXPECT_EQ(stats.pending_entries, 0);
  EXPECT_EQ(stats.misses, 1);
  absl::Status commit = tier.CommitInsert("k", 0);
  EXPECT_EQ(commit.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(commit.message(), HasSubstr("no pending insert of key k"));
  EXPECT_TRUE(tier.BeginInsert("other", 1024, 0, {}).ok());

  tier.AbortInsert("absent");  // no-ops
  HostTier ready(Arena(1024));
  Put(ready, "r", 256);
  ready.AbortInsert("r");
  EXPECT_TRUE(ready.Contains("r"));
  EXPECT_EQ(ready.CommitInsert("r", 0).code(), absl::StatusCode::kNotFound);
}

TEST(HostTierTest, ErasingAPinnedEntryDefersTheFreeToItsLastRelease) {
  HostTier tier(Arena(1024));
  Put(tier, "k", 1024, 'z');
  auto first = tier.Acquire("k");
  auto second = tier.Acquire("k");
  ASSERT_TRUE(first.has_value() && second.has_value());
  tier.Erase("k", /*corrupt=*/true);
  EXPECT_FALSE(tier.Contains("k"));
  EXPECT_FALSE(tier.Acquire("k").has_value());
  HostTierStats stats = tier.Stats();
  EXPECT_EQ(stats.entries, 0);
  EXPECT_EQ(stats.used_bytes, 1024);
  EXPECT_EQ(stats.checksum_failures, 1);
  EXPECT_EQ(tier.BeginInsert("other", 256, 0, {}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(first->data[1023], 'z');  // still the reader's
  tier.Release("k");
  EXPECT_EQ(tier.Stats().used_bytes, 1024);
  tier.Release("k");
  EXPECT_EQ(tier.Stats().used_bytes, 0);
  tier.Release("k");  // no pin left: no-op
  EXPECT_TRUE(tier.BeginInsert("other", 1024, 0, {}).ok());
  EXPECT_EQ(tier.Stats().evictions, 0);
}

TEST(HostTierTest, EraseFreesAnUnpinnedEntryAndLeavesPendingOnesToTheirWriter) {
  HostTier tier(Arena(1024));
  Put(tier, "ready", 512);
  ASSERT_TRUE(tier.BeginInsert("pending", 512, 0, {}).ok());
  tier.Erase("ready", /*corrupt=*/false);
  tier.Erase("pending", /*corrupt=*/true);
  tier.Erase("absent", /*corrupt=*/true);
  HostTierStats stats = tier.Stats();
  EXPECT_EQ(stats.used_bytes, 512);
  EXPECT_EQ(stats.entries, 0);
  EXPECT_EQ(stats.pending_entries, 1);
  EXPECT_EQ(stats.checksum_failures, 0);
  EXPECT_TRUE(tier.CommitInsert("pending", 0).ok());
  EXPECT_TRUE(tier.Contains("pending"));
}

TEST(HostTierTest, AcquireReturnsTheEntryAndCountsHitsAndMisses) {
  HostTier tier(Arena(1024));
  auto range = tier.BeginInsert("k", 16, 3, {1, 2, 3});
  ASSERT_TRUE(range.ok());
  ASSERT_TRUE(tier.CommitInsert("k", 0x1234).ok());
  auto ref = tier.Acquire("k");
  ASSERT_TRUE(ref.has_value());
  EXPECT_EQ(ref->data, *range);
  EXPECT_EQ(ref->bytes, 16);
  EXPECT_EQ(ref->num_tokens, 3);
  EXPECT_EQ(ref->checksum, 0x1234u);
  EXPECT_EQ(ref->tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(tier.Stats().pinned_entries, 1);
  tier.Release("k");
  EXPECT_FALSE(tier.Acquire("absent").has_value());
  HostTierStats stats = tier.Stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.pinned_entries, 0);
  EXPECT_EQ(stats.inserts, 1);
}

TEST(HostTierTest, BadInputsAreRejectedWithClearStatuses) {
  HostTier tier(Arena(1024));
  struct Case {
    std::string key;
    int64_t bytes;
    int32_t num_tokens;
    std::vector<int32_t> tokens;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"k", 0, 0, {}, absl::StatusCode::kInvalidArgument, "positive multiple of 8, got 0"},
      {"k", -8, 0, {}, absl::StatusCode::kInvalidArgument, "positive multiple of 8, got -8"},
      {"k", 12, 0, {}, absl::StatusCode::kInvalidArgument, "positive multiple of 8, got 12"},
      {"", 8, 0, {}, absl::StatusCode::kInvalidArgument, "empty key"},
      {"k", 8, -1, {}, absl::StatusCode::kInvalidArgument, "negative num_tokens -1"},
      {"k", 8, 3, {1, 2}, absl::StatusCode::kInvalidArgument, "2 token ids for num_tokens 3"},
      {"k",
       1032,
       0,
       {},
       absl::StatusCode::kResourceExhausted,
       "1032 bytes exceed the capacity of 1024 bytes"},
      {"k",
       std::numeric_limits<int64_t>::max() - 7,
       0,
       {},
       absl::StatusCode::kResourceExhausted,
       "exceed the capacity"},
  };
  for (const Case& c : cases) {
    auto range = tier.BeginInsert(c.key, c.bytes, c.num_tokens, c.tokens);
    EXPECT_EQ(range.status().code(), c.code) << c.message;
    EXPECT_THAT(range.status().message(), HasSubstr(c.message));
  }
  HostTierStats stats = tier.Stats();
  EXPECT_EQ(stats.used_bytes, 0);
  EXPECT_EQ(stats.pending_entries, 0);
  // At the capacity exactly, and with the token ids left out, it fits.
  EXPECT_TRUE(tier.BeginInsert("k", 1024, 5, {}).ok());

  for (int64_t bytes : {int64_t{0}, int64_t{-1}}) {
    auto arena = NewHeapHostArena(bytes);
    EXPECT_EQ(arena.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(arena.status().message(), HasSubstr("size must be positive"));
  }
  auto huge = NewHeapHostArena(std::numeric_limits<int64_t>::max() / 2);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(huge.status().message(), HasSubstr("cannot allocate"));
}

// An arena over a vector whose base can be shifted off the 256-byte alignment.
class ShiftedArena : public HostArena {
 public:
  ShiftedArena(int64_t size, int64_t shift) : memory_(size + 512), size_(size) {
    auto address = reinterpret_cast<uintptr_t>(memory_.data());
    data_ = memory_.data() + (256 - address % 256) % 256 + shift;
  }
  char* data() override { return data_; }
  int64_t size() const override { return size_; }

 private:
  std::vector<char> memory_;
  char* data_;
  int64_t size_;
};

TEST(HostTierTest, AnUnalignedArenaIsUsedFromItsFirstAlignedByte) {
  HostTier tier(std::make_unique<ShiftedArena>(1024, 8));
  EXPECT_EQ(tier.Stats().capacity_bytes, 768);
  auto range = tier.BeginInsert("k", 768, 0, {});
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*range) % 256, 0u);

  HostTier none(nullptr);
  EXPECT_EQ(none.Stats().capacity_bytes, 0);
  EXPECT_EQ(none.BeginInsert("k", 8, 0, {}).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(HostTierTest, TheReaderDetectsCorruptionByTheChecksum) {
  HostTier tier(Arena(4096));
  std::mt19937_64 rng(9);
  std::vector<uint64_t> kv(512);  // 4 KiB of "KV"
  for (auto& w : kv) w = rng();
  auto range = tier.BeginInsert("doc", 4096, 2, {10, 11});
  ASSERT_TRUE(range.ok());
  std::memcpy(*range, kv.data(), 4096);
  ASSERT_TRUE(tier.CommitInsert("doc", KvChecksum(kv.data(), 4096)).ok());

  auto ref = tier.Acquire("doc");
  ASSERT_TRUE(ref.has_value());
  EXPECT_EQ(KvChecksum(ref->data, ref->bytes), ref->checksum);  // intact
  tier.Release("doc");

  (*range)[1234] ^= 0x10;  // the arena's byte goes bad
  ref = tier.Acquire("doc");
  ASSERT_TRUE(ref.has_value());
  EXPECT_NE(KvChecksum(ref->data, ref->bytes), ref->checksum);
  tier.Erase("doc", /*corrupt=*/true);  // what the engine does on a mismatch
  tier.Release("doc");
  EXPECT_FALSE(tier.Contains("doc"));
  HostTierStats stats = tier.Stats();
  EXPECT_EQ(stats.checksum_failures, 1);
  EXPECT_EQ(stats.used_bytes, 0);
}

// Threads insert, read, erase and abort random keys. Each document's bytes are a fill derived
// from its key and length, so a reader whose range was handed to another writer sees a checksum
// mismatch.
TEST(HostTierTest, ConcurrentUseKeepsTheInvariants) {
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 3000;
  constexpr int kKeys = 24;
  HostTier tier(Arena(16 * 1024));
  std::atomic<int64_t> commits{0}, acquires{0}, bad_reads{0}, over_capacity{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      for (int op = 0; op < kOpsPerThread; ++op) {
        const std::string key = absl::StrCat("doc", rng() % kKeys);
        const int choice = static_cast<int>(rng() % 10);
        if (choice < 4) {
          const int64_t bytes = 8 * (1 + static_cast<int64_t>(rng() % 768));  // up to 6 KiB
          auto range = tier.BeginInsert(key, bytes, 0, {});
          if (!range.ok()) continue;  // present, or no room right now
          std::memset(*range, static_cast<char>(key.back() + bytes), bytes);
          if (choice == 0) {
            tier.AbortInsert(key);
          } else if (tier.CommitInsert(key, KvChecksum(*range, bytes)).ok()) {
            ++commits;
          }
        } else if (choice < 9) {
          ++acquires;
          auto ref = tier.Acquire(key);
          if (!ref.has_value()) continue;
          if (KvChecksum(ref->data, ref->bytes) != ref->checksum) ++bad_reads;
          if (choice == 8 && op % 7 == 0) tier.Erase(key, /*corrupt=*/true);
          tier.Release(key);
        } else {
          tier.Erase(key, /*corrupt=*/true);
        }
        HostTierStats stats = tier.Stats();
        if (stats.used_bytes > stats.capacity_bytes) ++over_capacity;
      }
    });
  }
  for (auto& thread : threads) thread.join();

  EXPECT_EQ(bad_reads.load(), 0);
  EXPECT_EQ(over_capacity.load(), 0);
  HostTierStats stats = tier.Stats();
  EXPECT_EQ(stats.pending_entries, 0);
  EXPECT_EQ(stats.pinned_entries, 0);
  EXPECT_EQ(stats.inserts, commits.load());
  EXPECT_EQ(stats.hits + stats.misses, acquires.load());
  EXPECT_GT(stats.hits, 0);
  EXPECT_GT(stats.evictions, 0);
  // Every committed entry is still there, evicted, or erased (counted as a checksum failure).
  EXPECT_EQ(stats.entries, stats.inserts - stats.evictions - stats.checksum_failures);
  EXPECT_LE(stats.used_bytes, stats.capacity_bytes);
  for (int k = 0; k < kKeys; ++k) tier.Erase(absl::StrCat("doc", k), false);
  stats = tier.Stats();
  EXPECT_EQ(stats.entries, 0);
  EXPECT_EQ(stats.used_bytes, 0);
  // Everything freed has coalesced back into one range.
  EXPECT_TRUE(tier.BeginInsert("whole", stats.capacity_bytes, 0, {}).ok());
}

}  // namespace
}  // namespace lazyrag
