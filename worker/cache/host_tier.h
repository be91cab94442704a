// The host-memory tier (DESIGN section 6 and 11): whole documents' KV in host memory, between
// the GPU pool and the peers / kvstore. A document evicted from the pool is demoted into it (one
// device-to-host copy at bus speed) and promoted back by one host-to-device copy.
//
// Checksums: the writer computes KvChecksum (common/kv_checksum.h) of the bytes it copies in and
// passes it to CommitInsert; the tier stores it but does not read the bytes. The READER verifies:
// after Acquire, KvChecksum(ref.data, ref.bytes) (or the GPU's checksum fused with its copy) must
// equal ref.checksum; on a mismatch it calls Erase(key, /*corrupt=*/true), then Release(key), and
// takes the document from the next tier.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace lazyrag {

// Host memory the backend copies to and from at bus speed (pinned for CUDA). One arena.
// Implementations own the memory and free it on destruction.
class HostArena {
 public:
  virtual ~HostArena() = default;
  // Base of `size()` bytes, 256-byte aligned; valid for the arena's lifetime.
  virtual char* data() = 0;
  // In bytes.
  virtual int64_t size() const = 0;
};

// Plain (pageable) memory of `bytes` bytes, 256-byte aligned, not zeroed: the CPU backend's arena
// and tests'. INVALID_ARGUMENT when bytes <= 0; RESOURCE_EXHAUSTED when it cannot be allocated.
absl::StatusOr<std::unique_ptr<HostArena>> NewHeapHostArena(int64_t bytes);

struct HostTierStats {
  // The arena's usable bytes: from its first 256-byte aligned byte, rounded down to 256.
  int64_t capacity_bytes = 0;
  // Bytes of the ranges held (each entry's bytes rounded up to 256): ready, pending, and erased
  // entries still pinned. Never above capacity_bytes.
  int64_t used_bytes = 0;
  int entries = 0;                // ready entries (what Contains and Acquire see)
  int pinned_entries = 0;         // ready entries with at least one Acquire not yet Released
  int pending_entries = 0;        // reserved by BeginInsert, not yet committed or aborted
  int64_t evictions = 0;          // ready entries evicted to make room (LRU)
  int64_t inserts = 0;            // successful CommitInserts
  int64_t hits = 0;               // Acquires that returned an entry
  int64_t misses = 0;             // Acquires that returned nullopt
  int64_t checksum_failures = 0;  // ready entries removed by Erase(key, /*corrupt=*/true)
};

// Whole documents' KV in host memory: key -> one contiguous range of the arena holding the
// document's transport form (Backend::ExportKv's layout), its token count, token ids and
// checksum. Least recently used unreferenced ready entries are evicted to make room; an entry
// being written (pending) or read (referenced) is never evicted or moved.
//
// Ranges start at 256-byte aligned offsets and take whole multiples of 256 bytes; free ranges are
// kept in offset order and coalesce with their neighbours, new ranges are placed first fit.
//
// Lifecycle of an entry: BeginInsert (pending: the writer copies into the range) -> CommitInsert
// (ready: visible to Acquire, evictable while unpinned) or AbortInsert (gone). A ready entry
// leaves by eviction or Erase; an erased entry still pinned keeps its range until its last
// Release, and its key cannot be inserted again until then.
//
// Thread-safe (one mutex; no call blocks on anything but it). Pointers returned by BeginInsert
// and Acquire stay valid until the matching CommitInsert / AbortInsert or Release.
class HostTier {
 public:
  // A null arena gives a tier of capacity 0. An arena whose base is not 256-byte aligned is used
  // from its first aligned byte.
  explicit HostTier(std::unique_ptr<HostArena> arena);
  // REQUIRES: no pending entry and no pin outstanding (their pointers die with the arena).
  ~HostTier() = default;

  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Reserves `bytes` for a document being demoted, evicting least recently used unreferenced
  // ready entries until a contiguous range fits, and returns the range's start (256-byte aligned,
  // `bytes` bytes writable). The entry is pending (invisible to Acquire, never evicted) until
  // CommitInsert or AbortInsert. `num_tokens`: the document's token count; `tokens`: its token
  // ids (num_tokens of them, or empty when the caller does not keep them), returned by Acquire.
  // Eviction follows the LRU order, not the layout, so entries not bordering the range it finally
  // takes may go too. Nothing is evicted when no range would fit even after evicting every
  // evictable entry.
  // INVALID_ARGUMENT: empty key, bytes <= 0, bytes % 8 != 0, num_tokens < 0, or tokens neither
  // empty nor num_tokens long.
  // ALREADY_EXISTS: the key is present (pending or ready), or was erased and is still being read.
  // RESOURCE_EXHAUSTED: bytes > capacity, or no range can be freed (the rest is pending or
  // pinned).
  absl::StatusOr<char*> BeginInsert(const std::string& key, int64_t bytes, int32_t num_tokens,
                                    std::vector<int32_t> tokens);
  // The copy into the range finished with `checksum` (KvChecksum of the bytes): visible from now,
  // and the most recently used entry. NOT_FOUND when no pending entry has the key.
  absl::Status CommitInsert(const std::string& key, uint64_t checksum);
  // The copy failed or was given up: the range is freed. No-op when no pending entry has the key.
  void AbortInsert(const std::string& key);

  // A pinned ready entry. `data` points into the arena and stays valid until Release(key).
  struct Ref {
    const char* data = nullptr;
    int64_t bytes = 0;  // as given to BeginInsert
    int32_t num_tokens = 0;
    uint64_t checksum = 0;  // as given to CommitInsert; the reader verifies it
    std::vector<int32_t> tokens;
  };
  // Why an entry is read: a promotion (a use: counted as a hit or a miss, and the entry becomes
  // the most recently used) or the tier's own write-back of it to the store (neither).
  enum class Purpose { kPromotion, kWriteBack };
  // Pins a ready entry for reading; nullopt when absent or pending. Each Acquire that returns an
  // entry needs one Release.
  std::optional<Ref> Acquire(const std::string& key, Purpose purpose = Purpose::kPromotion);
  // Drops one pin taken by Acquire (of the entry, or of the erased entry still being read under
  // the key). No-op when the key holds no pin.
  void Release(const std::string& key);
  // Removes a ready entry (a checksum failure on promotion, or the data is known bad): invisible
  // to Acquire and Contains at once; its range is freed now if unpinned, else at its last
  // Release. Counts a checksum failure when `corrupt`. No-op when no ready entry has the key
  // (a pending entry belongs to its writer until CommitInsert or AbortInsert).
  void Erase(const std::string& key, bool corrupt);
  // Whether a ready entry has the key (pending and erased ones are not counted).
  bool Contains(const std::string& key) const;
  HostTierStats Stats() const;

 private:
  struct Entry {
    int64_t offset = 0;       // into the usable arena, a multiple of 256
    int64_t range_bytes = 0;  // bytes rounded up to 256
    int64_t bytes = 0;
    int32_t num_tokens = 0;
    std::vector<int32_t> tokens;
    uint64_t checksum = 0;
    bool ready = false;  // false while pending
    int pins = 0;        // Acquires not yet Released (ready or erased entries only)
    std::list<std::string>::iterator lru;  // valid while ready
  };

  // First fit: the offset of a free range of `range_bytes`, taken off the free list; nullopt
  // when none is large enough.
  std::optional<int64_t> TakeFreeRange(int64_t range_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns [offset, offset + range_bytes) to the free list, merged with adjacent free ranges.
  void FreeRange(int64_t offset, int64_t range_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a range of `range_bytes` would fit once every evictable entry were evicted.
  bool FitsAfterEvictingAll(int64_t range_bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the least recently used unpinned ready entry; false when there is none.
  bool EvictOne() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<HostArena> arena_;
  char* base_ = nullptr;        // the arena's first 256-byte aligned byte
  int64_t capacity_bytes_ = 0;  // usable bytes from base_, a multiple of 256

  mutable absl::Mutex mu_;
  // Ready and pending entries by key.
  std::unordered_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Erased entries still pinned, by key; a key is never in both maps.
  std::unordered_map<std::string, Entry> erased_ ABSL_GUARDED_BY(mu_);
  // Ready entries' keys, front = least recently used (pinned ones stay in place, skipped by
  // eviction).
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);
  // Free ranges: offset -> length in bytes; disjoint, never adjacent (coalesced).
  std::map<int64_t, int64_t> free_ ABSL_GUARDED_BY(mu_);
  int64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_entries_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t inserts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t checksum_failures_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazyrag
