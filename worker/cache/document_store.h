// The store tier behind the KV pool (DESIGN sections 3 and 6):
// position-agnostic document KV kept by (model fingerprint, cache namespace,
// document id), surviving worker restarts. The engine looks documents up in the
// pool, then here, then computes them. Implementations: the kvstore service
// through its client library, or the RocksDB engine in-process
// (OpenDocumentStore below). Tests pass in-memory or failing stores.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "common/tls.h"

namespace lazyrag {

struct PeerPoolHandle;  // worker/backend/backend.h

// A document lent in device memory instead of bytes (the peer tier's fast path, issue 9): its
// pages stay pinned in a peer worker's KV pool until Finish (or the lease's expiry), and the
// engine copies them into its own pages with Backend::CopyPagesFromPeer. Only stores that were
// given EnableDeviceLeases hand these out. Thread-compatible: one owner at a time.
class DeviceLease {
 public:
  // Releases the lease when Finish was not called (as Finish(CANCELLED)).
  virtual ~DeviceLease() = default;
  // The peer's pool, to pass to Backend::CopyPagesFromPeer.
  virtual const PeerPoolHandle &pool() const = 0;
  // The document's pages in the peer's pool, in document order.
  virtual const std::vector<int32_t> &pages() const = 0;
  // The document's token ids (checked by the store to hash to the id asked for).
  virtual const std::vector<int32_t> &tokens() const = 0;
  // False once the peer may have unpinned the pages (the lease expired, with a margin): the
  // pages must not be read then, and a copy that ended after it must be thrown away.
  virtual bool Valid() const = 0;
  // Ends the lease (the peer unpins; asynchronous, never blocks on the network) and reports how
  // the copy went: OK counts a device transfer; an error other than CANCELLED makes the store
  // serve bytes from that peer for a while instead. Idempotent.
  virtual void Finish(const absl::Status &copy_status) = 0;
};

// One stored document. `metadata` is the small header
// (worker/engine/document_codec.h), `bytes` the token ids and KV payload. Both
// are opaque to the store.
struct StoredDocument {
  std::string metadata;
  std::string bytes;
  // Where a Get found it: "" = the store itself (the kvstore); "peer" = another
  // worker's KV pool (worker/peer/peer_store.h). Not stored; metrics only.
  std::string origin;
  // Set instead of metadata and bytes when a peer lent the document in device memory (only
  // after EnableDeviceLeases). The engine copies it, then calls Finish.
  std::shared_ptr<DeviceLease> lease = nullptr;
};

// Writable memory: `size` bytes at `data`.
struct ByteSpan {
  char *data = nullptr;
  uint64_t size = 0;
};

// Where DocumentStore::GetInto puts a document's bytes: called with the stored metadata and
// the value's byte count before any byte arrives; returns spans that, in order, hold at least
// that many bytes (filled one after the other) and stay valid until GetInto returns. May be
// called again when a replica fails. An error ends GetInto with it.
using DocumentSink = std::function<absl::StatusOr<std::vector<ByteSpan>>(
    const std::string &metadata, uint64_t bytes)>;

// `size` bytes of a value at value offset `offset` are in place and checked (GetInto).
using ChunkObserver = std::function<void(uint64_t offset, const char *data, uint64_t size)>;

// Thread-safe: the engine calls Get from its fetch thread and Put from its
// write-back thread.
class DocumentStore {
 public:
  virtual ~DocumentStore() = default;
  // For logs, e.g. "embedded:/var/lib/lazyrag" or "kvstore:h1:7000,h2:7000".
  virtual std::string name() const = 0;
  // NOT_FOUND when absent. Any other error (UNAVAILABLE, DATA_LOSS,
  // DEADLINE_EXCEEDED) means the store could not serve it: the caller computes
  // the document instead.
  virtual absl::StatusOr<StoredDocument> Get(const std::string &cache_namespace,
                                             const std::string &document_id) = 0;
  // Get from the durable store itself (not its front tiers) into the caller's memory, every
  // chunk checked against its checksum on the way; returns the metadata. Errors as Get.
  // UNIMPLEMENTED when the store cannot (the caller then uses Get). Default: UNIMPLEMENTED.
  // `on_chunk` (may be null): told of each chunk once it is in the spans (kvstore::ChunkObserver:
  // value offset and bytes, from the reading threads), so that the caller can fold its own
  // per-chunk work into that pass; a store may not report some or all chunks (the caller then
  // does that work on the spans afterwards). A caller that passes it verifies every byte itself
  // (the workers' MAC, stronger than a CRC), so a store may skip its own checksum of the chunks
  // it reports.
  virtual absl::StatusOr<std::string> GetInto(const std::string &cache_namespace,
                                              const std::string &document_id,
                                              const DocumentSink &sink,
                                              const ChunkObserver &on_chunk = nullptr) {
    (void)cache_namespace;
    (void)document_id;
    (void)sink;
    (void)on_chunk;
    return absl::UnimplementedError("document store: no GetInto");
  }
  // Stores (or replaces) the document.
  virtual absl::Status Put(const std::string &cache_namespace, const std::string &document_id,
                           const StoredDocument &document) = 0;
  // Get from the tiers in front of the durable store only (peer workers' pools,
  // worker/peer/peer_store.h), never from the durable store itself. It stays on the store
  // because only the store knows its tiers; when to skip the durable one (it failed a moment
  // ago, or recomputing is predicted cheaper than reading it) is the engine's policy
  // (worker/engine/document_fetcher.h). Default: UNAVAILABLE (no such tier).
  virtual absl::StatusOr<StoredDocument> GetFromFrontTiers(const std::string &cache_namespace,
                                                           const std::string &document_id) {
    (void)cache_namespace;
    (void)document_id;
    return absl::UnavailableError("document store: no front tier");
  }
  // Whether the store keeps the document (on every replica), without reading it: the engine
  // asks when it recomputes a document without fetching it (the store predicted slower than
  // recomputing), so as not to write back what the store already holds. Default:
  // UNIMPLEMENTED (the engine then writes back).
  virtual absl::StatusOr<bool> Contains(const std::string &cache_namespace,
                                        const std::string &document_id) {
    (void)cache_namespace;
    (void)document_id;
    return absl::UnimplementedError("document store: no existence check");
  }
  // Whether Put keeps documents: false for a store of peers only (nothing behind them), whose
  // Put is a no-op. A property of the store; the engine uses it not to export computed
  // documents for a write-back that would keep nothing.
  virtual bool durable() const { return true; }
  // Called once by the engine, before any Get, when its backend can copy pages from another
  // worker's pool (Backend::ExportPoolHandle succeeded): `local` is its own pool. From then on
  // a tier that can (peer workers whose pool layout matches) may answer Get with a lease.
  // Default: ignored (bytes only).
  virtual void EnableDeviceLeases(const PeerPoolHandle &local) { (void)local; }
};

struct DocumentStoreOptions {
  // "embedded:DIR" (RocksDB in-process, DIR created when missing) or
  // "HOST:PORT[,HOST:PORT...]" (kvstore shards). Required.
  std::string spec;
  // Part of every key: KV of one model is never served to another. Required.
  std::string model_fingerprint;
  // Embedded store only: byte capacity (LRU eviction beyond it). Default 16
  // GiB.
  uint64_t embedded_capacity_bytes = 16ull << 30;
  // Remote store only: deadline of one Get (on a request's path: past it the document is
  // computed instead). Default 10 s.
  double call_timeout_s = 10;
  // Remote store only: deadline of one Put. Puts are the engine's background write-backs; a
  // large document (268 MB for 2,048 tokens of an 8B model) on a busy store can take longer
  // than a read may, and a Put past its deadline is abandoned. Default 60 s.
  double put_timeout_s = 60;
  // Remote store only: copies of every document over the shards, 1 .. shards; 0: the kvstore
  // client's default (2 with at least 2 shards, else 1). Every worker of one store must use
  // the same value (it decides where a key is looked up).
  int replication = 0;
  // Remote store only: gRPC over TLS to the shards (common/tls.h); empty: plaintext.
  TlsFiles tls;
  // Remote store only: this worker's token, sent on every call (common/auth.h); null: none.
  std::shared_ptr<BearerToken> auth_token;
};

// INVALID_ARGUMENT for a malformed spec; UNAVAILABLE when the embedded database
// cannot be opened (e.g. another process holds it).
absl::StatusOr<std::unique_ptr<DocumentStore>> OpenDocumentStore(
    const DocumentStoreOptions &options);

}  // namespace lazyrag
