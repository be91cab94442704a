// The peer tier (issue 9): other workers of the same host, asked for a document before the
// kvstore. A worker that lacks a document takes it from a peer's KV pool
// (lazyrag.v1.PeerDocuments, proto/lazyrag/v1/peer.proto) when one holds it: one loopback
// stream, no RocksDB read, no recompute.
//
// PeerFirstStore is a DocumentStore: Get asks the peers in the order given (a peer that failed
// is skipped for a while), then the wrapped store (the kvstore); Put goes to the wrapped store
// only. The engine sees one store; the documents a peer served carry origin "peer".
//
// The fast path: once the engine calls EnableDeviceLeases (its backend can copy pages from
// another process's pool), the store asks each peer for its pool once (GetPool); a peer whose
// pool layout matches lends documents as DeviceLease (LeaseDocument) instead of bytes, and the
// lease is given back (ReleaseLease) from a background thread when the engine finishes it. A
// peer that cannot lend (UNIMPLEMENTED, FAILED_PRECONDITION, another layout), or whose lease
// copy failed, serves bytes (GetDocument) for bytes_only_s.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "common/tls.h"
#include "worker/cache/document_store.h"

namespace lazyrag {

namespace metrics {
class Registry;
}

struct PeerStoreOptions {
  // HOST:PORT of the peer workers (their gRPC address). Required, at least one.
  std::vector<std::string> peers;
  // gRPC over TLS to the peers (common/tls.h); empty: plaintext.
  TlsFiles tls;
  // This worker's token, sent on every call (common/auth.h); null: none.
  std::shared_ptr<BearerToken> auth_token;
  // The requester's model fingerprint; peers serving another model refuse. Required.
  std::string model_fingerprint;
  // Deadline of one GetDocument call, whole transfer included. Default 5 s (a 256 MiB
  // document streams over loopback in well under a second).
  double call_timeout_s = 5;
  // A peer that failed (unreachable, DATA_LOSS, timeout) is skipped this long. Default 2 s.
  double down_s = 2;
  // Chunk size asked of the peer; 0: the peer's default (2 MiB).
  uint32_t chunk_size = 0;
  // Fast path on or off: false ignores EnableDeviceLeases (bytes only; for measuring path 1
  // against it, or as a switch). Default true.
  bool device_leases = true;
  // Fast path: lease length asked of the peer. Default 10 s; at most 60 s. The engine does not
  // copy a lease past 80% of it (clocks of one host; the peer counts from its receipt).
  double lease_s = 10;
  // Fast path: a peer that cannot lend, or whose copy failed, serves bytes this long before it
  // is asked for its pool again. Default 60 s.
  double bytes_only_s = 60;
  // Optional, not owned, must outlive the store: lazyrag_worker_peer_fetch_total{result}
  // (hit = bytes, lease = lent in device memory), lazyrag_worker_peer_fetch_bytes_total,
  // lazyrag_worker_peer_fetch_seconds, lazyrag_worker_peer_device_copy_total{result},
  // lazyrag_worker_peer_device_copy_bytes_total.
  metrics::Registry *registry = nullptr;
};

// `inner`: the store behind the peers (kvstore service or embedded), or null for peers only
// (then Get ends in NOT_FOUND and durable() is false). INVALID_ARGUMENT for an empty
// peer list, a malformed HOST:PORT or an empty fingerprint.
absl::StatusOr<std::unique_ptr<DocumentStore>> OpenPeerFirstStore(
    const PeerStoreOptions &options, std::unique_ptr<DocumentStore> inner);

// "h1:1,h2:2" -> {"h1:1", "h2:2"}, blanks dropped. For the --peers flag.
std::vector<std::string> SplitPeerList(const std::string &spec);

}  // namespace lazyrag
