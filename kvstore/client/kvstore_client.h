// Client of a sharded, replicated kvstore: what workers (and lazyrag-cli kv) link.
//
// Placement: rendezvous (highest random weight) hashing of the canonical key over the shard
// addresses; a key lives on the first R shards of its ranking (R = replication). Writes go to
// all R; reads try them in ranking order, healthy shards first, and fall back to the next.
// Every chunk is checked against its CRC-32C before its bytes are handed out.
//
// Same-host fast path: a shard that serves same-host clients (its Describe names a data
// directory whose token file this process can read) is read and written through files there,
// with gRPC only for the control calls: a Get preads the value file straight into the
// caller's buffer (several threads for large values) and checks every chunk; a Put writes a
// file the shard adopts. Any other shard, a layer range, or a failure of the file path (the
// value file unlinked meanwhile, no permission) uses the gRPC streams; a large whole value is
// read over several of them at once (chunk ranges of one stored version, a connection each).
//
// Status contract, so a worker knows what to do:
//   NOT_FOUND        no reachable replica holds the key: compute it (and put it back).
//   UNAVAILABLE      no replica could be reached: compute it; the store is in trouble.
//   DATA_LOSS        every replica that had the key served corrupt bytes: compute it.
//   DEADLINE_EXCEEDED the call's deadline passed.
//   INVALID_ARGUMENT bad key or value (not retried).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/tls.h"

namespace lazyrag::metrics {
class Registry;
}

namespace lazyrag::kvstore {

// A key: a document's KV (worker keys) or a raw operator key (lazyrag-cli kv).
struct Key {
  static Key Document(std::string model_fingerprint, std::string cache_namespace,
                      std::string document_id);
  static Key Raw(std::string name);

  bool is_raw = false;
  std::string model_fingerprint;
  std::string cache_namespace;
  std::string document_id;
  std::string raw;
};

// What is stored besides the bytes.
struct ValueHeader {
  // Opaque to the store (a worker's document-KV header of DESIGN section 4). At most 64 KiB.
  std::string metadata;
  // Optional: byte offset where each layer starts (first 0, non-decreasing, within the value);
  // lets Get fetch a layer range.
  std::vector<uint64_t> layer_offsets;
};

// Which part of a value to fetch: layers [first_layer, first_layer + num_layers); all when
// num_layers is 0.
struct LayerSelection {
  uint32_t first_layer = 0;
  uint32_t num_layers = 0;
};

struct Value {
  ValueHeader header;
  uint64_t total_size = 0;   // of the whole stored value
  uint64_t range_begin = 0;  // `bytes` are bytes [range_begin, range_begin + bytes.size())
  std::string bytes;
};

// What GetInto found; the bytes went to the caller's buffer.
struct ValueInfo {
  ValueHeader header;
  uint64_t total_size = 0;   // of the whole stored value
  uint64_t range_begin = 0;  // the buffer holds bytes [range_begin, range_begin + range_size)
  uint64_t range_size = 0;
  bool local = false;  // read through the same-host fast path
};

// Writable memory: `size` bytes at `data`.
struct MutableBytes {
  char* data = nullptr;
  uint64_t size = 0;
};

// Where GetInto's bytes land. Called with the value's header and the byte count of the range
// before any byte is written; returns spans that, in order, hold at least `bytes` bytes (the
// range's bytes fill them one after the other) and stay valid until GetInto returns. Called
// again (the earlier spans then unused) when a replica fails and the next is read. An error
// ends the Get with that error.
using GetDestination = std::function<absl::StatusOr<std::vector<MutableBytes>>(
    const ValueHeader& header, uint64_t bytes)>;

struct KeyInfo {
  bool present = false;
  uint64_t size = 0;
  int64_t last_access_unix_ms = 0;  // most recent over the replicas
  int replicas_present = 0;
};

struct KvClientOptions {
  // Shard addresses HOST:PORT. Every client of one store must list the same shards (order
  // does not matter). Required.
  std::vector<std::string> shards;
  // Replicas per key; 0 means 2 when there are at least 2 shards, else 1. Default 0.
  int replication = 0;
  // gRPC over TLS to the shards (common/tls.h); empty: plaintext.
  TlsFiles tls;
  // The worker token sent on every call (common/auth.h); null: none (shards without
  // --auth_tokens_file).
  std::shared_ptr<BearerToken> auth_token;
  // A Put succeeds when at least this many replicas stored the value. Default 1.
  int min_write_replicas = 1;
  // Bytes per chunk, 1 .. 4 MiB. Default 2 MiB.
  uint32_t chunk_size = 2u << 20;
  // Deadline of a call (a whole Put or Get, all replicas and retries) unless the call says
  // otherwise. Default 60 s.
  absl::Duration call_timeout = absl::Seconds(60);
  // Rounds over the replicas for UNAVAILABLE-type failures, with exponential backoff between
  // rounds starting at initial_backoff, capped at max_backoff. Defaults 3, 50 ms, 1 s.
  int max_attempts = 3;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);
  // Retries wait (gRPC wait-for-ready) for a shard that was just unreachable to come back,
  // instead of failing at once while its channel is between reconnect attempts. Writes (Put,
  // Delete): all retries of one replica share a budget of reconnect_wait (default 1 s, the
  // channel's longest reconnect backoff), so a dead replica costs a Put about that much.
  // Reads: a retry round happens only when no replica answered at all, and each replica then
  // gets read_reconnect_wait (default 300 ms); the first round never waits. A Get with every
  // replica down fails after about (max_attempts - 1) * R * read_reconnect_wait + backoff.
  absl::Duration reconnect_wait = absl::Seconds(1);
  absl::Duration read_reconnect_wait = absl::Milliseconds(300);
  // After a transport failure a shard counts as unhealthy for this long: it is tried after
  // the healthy replicas. Default 2 s.
  absl::Duration unhealthy_for = absl::Seconds(2);
  // Optional, not owned: exports lazyrag_kvstore_fetch_seconds, lazyrag_kvstore_fetch_bytes_total
  // and lazyrag_kvstore_client_corruptions_total.
  metrics::Registry* registry = nullptr;
  // Use the same-host fast path with shards that offer it. Default true.
  bool local_fast_path = true;
  // Threads that read one value on the fast path (values of 64 MiB and more). Default 4.
  int local_read_threads = 4;
  // Through gRPC, a whole value of more than 16 chunks is read by one stream for its first 16
  // chunks and this many more streams for the rest (chunk ranges of one stored version, at
  // once); 1: one stream. Default 4.
  int streams_per_get = 4;
};

// Told about the bytes of a GetInto as they land in the destination: `data` holds `size` bytes
// of the value at byte `offset`, in steps of at most 512 KiB aligned to value offsets (a step
// never crosses from one destination span into the next), each right after it was read and
// checksummed, while it is in the reading core's cache. Called from the threads that read the
// value, concurrently for disjoint ranges. A chunk whose CRC-32C then fails fails the read from
// that replica; the destination is asked again for the next one, so a caller that starts its
// per-value state afresh in the destination callback sees each byte of the final read once.
using ChunkObserver = std::function<void(uint64_t offset, const char* data, uint64_t size)>;

struct CallOptions {
  // Overrides KvClientOptions::call_timeout when nonzero.
  absl::Duration timeout = absl::ZeroDuration();
  // GetInto of a whole value only (no layer range): see ChunkObserver. Lets a caller fold its
  // own per-chunk work (a worker's MAC) into the pass that checks the chunks, while their bytes
  // are in cache. Null: none.
  ChunkObserver on_chunk;
  // With on_chunk: the caller verifies every byte itself, with something stronger than a CRC
  // (a worker's MAC), so the client does not compute the chunks' CRC-32C on the way in and
  // on_chunk is told of each chunk as soon as it is in place. A corrupt chunk is then the
  // caller's finding (the shard neither hears of it nor drops the value; the caller's
  // write-back replaces it).
  bool on_chunk_verifies = false;
};

struct ShardHealth {
  std::string address;
  bool healthy = true;
  int consecutive_failures = 0;
};

// Thread-safe: one client is shared by all threads of a worker.
class KvClient {
 public:
  static absl::StatusOr<std::unique_ptr<KvClient>> Create(KvClientOptions options);
  virtual ~KvClient() = default;

  // Stores `value` under `key` on the key's replicas, replacing any earlier value.
  virtual absl::Status Put(const Key& key, const ValueHeader& header, std::string_view value,
                           const CallOptions& call = {}) = 0;
  virtual absl::StatusOr<Value> Get(const Key& key, const LayerSelection& layers = {},
                                    const CallOptions& call = {}) = 0;
  // The same, into the caller's buffer (`destination`), without an intermediate copy.
  virtual absl::StatusOr<ValueInfo> GetInto(const Key& key, const GetDestination& destination,
                                            const LayerSelection& layers = {},
                                            const CallOptions& call = {}) = 0;
  // One KeyInfo per key, in order. UNAVAILABLE when some key had no reachable replica.
  virtual absl::StatusOr<std::vector<KeyInfo>> Stat(std::span<const Key> keys,
                                                    const CallOptions& call = {}) = 0;
  // Deletes from every replica; returns whether any held it. UNAVAILABLE if a replica could
  // not be reached (the key may survive there).
  virtual absl::StatusOr<bool> Delete(const Key& key, const CallOptions& call = {}) = 0;

  // Shard indices (into options.shards) holding `key`, in read order before health.
  virtual absl::StatusOr<std::vector<int>> Placement(const Key& key) const = 0;
  virtual std::vector<ShardHealth> Health() const = 0;
};

// "a,b,c" -> {"a","b","c"} (empty items dropped).
std::vector<std::string> SplitShardList(std::string_view list);

}  // namespace lazyrag::kvstore
