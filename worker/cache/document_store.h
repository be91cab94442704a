// The store tier behind the KV pool (DESIGN sections 3 and 6):
// position-agnostic document KV kept by (model fingerprint, cache namespace,
// document id), surviving worker restarts. The engine looks documents up in the
// pool, then here, then computes them. Implementations: the kvstore service
// through its client library, or the RocksDB engine in-process
// (OpenDocumentStore below). Tests pass in-memory or failing stores.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace lazyrag {

// One stored document. `metadata` is the small header
// (worker/engine/document_codec.h), `bytes` the token ids and KV payload. Both
// are opaque to the store.
struct StoredDocument {
  std::string metadata;
  std::string bytes;
  // Where a Get found it: "" = the store itself (the kvstore); "peer" = another
  // worker's KV pool (worker/peer/peer_store.h). Not stored; metrics only.
  std::string origin;
};

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
  // Stores (or replaces) the document.
  virtual absl::Status Put(const std::string &cache_namespace, const std::string &document_id,
                           const StoredDocument &document) = 0;
  // Get for a caller that marked this store down after a failure (it skips the
  // store for a while): a store with cheap tiers in front of the slow one (peer
  // workers, worker/peer/peer_store.h) still asks those. Default: UNAVAILABLE.
  virtual absl::StatusOr<StoredDocument> GetWhileDown(const std::string &cache_namespace,
                                                      const std::string &document_id) {
    (void)cache_namespace;
    (void)document_id;
    return absl::UnavailableError("document store marked down");
  }
  // false when Put would keep nothing (peers only, no kvstore behind them): the
  // engine then skips exporting computed documents for write-back.
  virtual bool accepts_writes() const { return true; }
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
  // Remote store only: deadline of one Get or Put. Default 10 s.
  double call_timeout_s = 10;
};

// INVALID_ARGUMENT for a malformed spec; UNAVAILABLE when the embedded database
// cannot be opened (e.g. another process holds it).
absl::StatusOr<std::unique_ptr<DocumentStore>> OpenDocumentStore(
    const DocumentStoreOptions &options);

}  // namespace lazyrag
