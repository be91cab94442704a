#include "worker/cache/host_tier.h"

#include <algorithm>
#include <cstdint>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lazyrag {
namespace {

constexpr int64_t kAlignment = 256;

int64_t RoundUp(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

class HeapHostArena final : public HostArena {
 public:
  HeapHostArena(char* data, int64_t size) : data_(data), size_(size) {}
  ~HeapHostArena() override { ::operator delete(data_, std::align_val_t(kAlignment)); }
  HeapHostArena(const HeapHostArena&) = delete;
  HeapHostArena& operator=(const HeapHostArena&) = delete;

  char* data() override { return data_; }
  int64_t size() const override { return size_; }

 private:
  char* const data_;
  const int64_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HostArena>> NewHeapHostArena(int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host arena: size must be positive, got ", bytes, " bytes"));
  }
  void* data =
      ::operator new(static_cast<size_t>(bytes), std::align_val_t(kAlignment), std::nothrow);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host arena: cannot allocate ", bytes, " bytes"));
  }
  return std::make_unique<HeapHostArena>(static_cast<char*>(data), bytes);
}

HostTier::HostTier(std::unique_ptr<HostArena> arena) : arena_(std::move(arena)) {
  if (arena_ != nullptr && arena_->data() != nullptr && arena_->size() > 0) {
    const auto address = reinterpret_cast<uintptr_t>(arena_->data());
    const int64_t skip = static_cast<int64_t>((kAlignment - address % kAlignment) % kAlignment);
    base_ = arena_->data() + skip;
    capacity_bytes_ = std::max<int64_t>(0, arena_->size() - skip) / kAlignment * kAlignment;
  }
  absl::MutexLock lock(&mu_);
  if (capacity_bytes_ > 0) free_.emplace(0, capacity_bytes_);
}

absl::StatusOr<char*> HostTier::BeginInsert(const std::string& key, int64_t bytes,
                                            int32_t num_tokens, std::vector<int32_t> tokens) {
  if (key.empty()) return absl::InvalidArgumentError("host tier: empty key");
  if (bytes <= 0 || bytes % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host tier: bytes must be a positive multiple of 8, got ", bytes, " for key ", key));
  }
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host tier: negative num_tokens ", num_tokens, " for key ", key));
  }
  if (!tokens.empty() && tokens.size() != static_cast<size_t>(num_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat("host tier: ", tokens.size(),
                                                   " token ids for num_tokens ", num_tokens,
                                                   " (key ", key, ")"));
  }
  if (bytes > capacity_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("host tier: ", bytes,
                                                     " bytes exceed the capacity of ",
                                                     capacity_bytes_, " bytes (key ", key, ")"));
  }
  const int64_t range_bytes = RoundUp(bytes);  // no overflow: bytes <= capacity_bytes_

  absl::MutexLock lock(&mu_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    return absl::AlreadyExistsError(absl::StrCat("host tier: key ", key, " is already ",
                                                 it->second.ready ? "present" : "being inserted"));
  }
  if (erased_.contains(key)) {
    return absl::AlreadyExistsError(
        absl::StrCat("host tier: key ", key, " was erased and is still being read"));
  }
  std::optional<int64_t> offset = TakeFreeRange(range_bytes);
  if (!offset.has_value()) {
    if (!FitsAfterEvictingAll(range_bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "host tier: no room for ", bytes, " bytes (key ", key, "): ", used_bytes_, " of ",
          capacity_bytes_, " bytes used, the rest held by entries being written or read"));
    }
    // Terminates with a range: once every evictable entry is gone the range fits.
    while (!offset.has_value() && EvictOne()) offset = TakeFreeRange(range_bytes);
    if (!offset.has_value()) {
      return absl::InternalError(absl::StrCat("host tier: no range of ", range_bytes,
                                              " bytes after evicting every evictable entry"));
    }
  }
  Entry& entry = entries_[key];
  entry.offset = *offset;
  entry.range_bytes = range_bytes;
  entry.bytes = bytes;
  entry.num_tokens = num_tokens;
  entry.tokens = std::move(tokens);
  used_bytes_ += range_bytes;
  ++pending_entries_;
  return base_ + entry.offset;
}

absl::Status HostTier::CommitInsert(const std::string& key, uint64_t checksum) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.ready) {
    return absl::NotFoundError(absl::StrCat("host tier: no pending insert of key ", key));
  }
  Entry& entry = it->second;
  entry.checksum = checksum;
  entry.ready = true;
  entry.lru = lru_.insert(lru_.end(), key);
  --pending_entries_;
  ++inserts_;
  return absl::OkStatus();
}

void HostTier::AbortInsert(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.ready) return;
  FreeRange(it->second.offset, it->second.range_bytes);
  --pending_entries_;
  entries_.erase(it);
}

std::optional<HostTier::Ref> HostTier::Acquire(const std::string& key, Purpose purpose) {
  absl::MutexLock lock(&mu_);
  const bool use = purpose == Purpose::kPromotion;
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.ready) {
    if (use) ++misses_;
    return std::nullopt;
  }
  Entry& entry = it->second;
  ++entry.pins;
  if (use) {
    ++hits_;
    lru_.splice(lru_.end(), lru_, entry.lru);
  }
  return Ref{base_ + entry.offset, entry.bytes, entry.num_tokens, entry.checksum, entry.tokens};
}

void HostTier::Release(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    if (it->second.pins > 0) --it->second.pins;
    return;
  }
  auto it = erased_.find(key);
  if (it == erased_.end()) return;
  if (--it->second.pins == 0) {
    FreeRange(it->second.offset, it->second.range_bytes);
    erased_.erase(it);
  }
}

void HostTier::Erase(const std::string& key, bool corrupt) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.ready) return;
  if (corrupt) ++checksum_failures_;
  lru_.erase(it->second.lru);
  if (it->second.pins == 0) {
    FreeRange(it->second.offset, it->second.range_bytes);
  } else {
    erased_.emplace(key, std::move(it->second));
  }
  entries_.erase(it);
}

bool HostTier::Contains(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.ready;
}

HostTierStats HostTier::Stats() const {
  absl::MutexLock lock(&mu_);
  HostTierStats stats;
  stats.capacity_bytes = capacity_bytes_;
  stats.used_bytes = used_bytes_;
  for (const auto& [key, entry] : entries_) {
    if (!entry.ready) continue;
    ++stats.entries;
    if (entry.pins > 0) ++stats.pinned_entries;
  }
  stats.pending_entries = pending_entries_;
  stats.evictions = evictions_;
  stats.inserts = inserts_;
  stats.hits = hits_;
  stats.misses = misses_;
  stats.checksum_failures = checksum_failures_;
  return stats;
}

std::optional<int64_t> HostTier::TakeFreeRange(int64_t range_bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const auto [offset, length] = *it;
    if (length < range_bytes) continue;
    free_.erase(it);
    if (length > range_bytes) free_.emplace(offset + range_bytes, length - range_bytes);
    return offset;
  }
  return std::nullopt;
}

void HostTier::FreeRange(int64_t offset, int64_t range_bytes) {
  used_bytes_ -= range_bytes;
  int64_t end = offset + range_bytes;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == end) {
    end += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second = end - prev->first;
      return;
    }
  }
  free_.emplace_hint(next, offset, end - offset);
}

bool HostTier::FitsAfterEvictingAll(int64_t range_bytes) const {
  // The ranges no eviction can free: pending entries, pinned ready entries, erased ones still
  // pinned. The gaps between them are what evicting everything else would leave.
  std::vector<std::pair<int64_t, int64_t>> held;
  for (const auto& [key, entry] : entries_) {
    if (!entry.ready || entry.pins > 0) held.emplace_back(entry.offset, entry.range_bytes);
  }
  for (const auto& [key, entry] : erased_) held.emplace_back(entry.offset, entry.range_bytes);
  std::sort(held.begin(), held.end());
  int64_t gap_start = 0;
  for (const auto& [offset, length] : held) {
    if (offset - gap_start >= range_bytes) return true;
    gap_start = offset + length;
  }
  return capacity_bytes_ - gap_start >= range_bytes;
}

bool HostTier::EvictOne() {
  for (auto lru_it = lru_.begin(); lru_it != lru_.end(); ++lru_it) {
    auto it = entries_.find(*lru_it);
    if (it->second.pins > 0) continue;
    FreeRange(it->second.offset, it->second.range_bytes);
    lru_.erase(lru_it);
    entries_.erase(it);
    ++evictions_;
    return true;
  }
  return false;
}

}  // namespace lazyrag
