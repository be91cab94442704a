// ttft_bench's rows for a document fetched from a lazyrag-kvstore shard on the same host: into
// pinned host memory (the same-host fast path), with the workers' MAC check, from a shard with
// authentication on, and on into the document's pool pages; four fetches at once.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "bench/bench_stats.h"
#include "worker/backend/backend.h"
#include "worker/engine/engine.h"

namespace lazyrag::bench {

// A document's KV fetched from a lazyrag-kvstore shard on this host.
struct KvstoreFetch {
  Stats to_pinned;      // KvClient::GetInto into pinned host memory
  Stats to_pinned_mac;  // the same with the workers' MAC check instead of the CRC-32C pass
  // The same from a second shard with --auth_tokens_file, a worker token sent (the three
  // fetches take turns going first).
  Stats to_pinned_auth;
  Stats to_pool;  // the plain fetch, then StartKvFromHost into the document's pages (end to end)
  double four_gbps = 0;  // four concurrent fetches into pinned memory, total GB/s (median of 3)
  bool local = false;    // served through the same-host fast path
  uint64_t mac_observed_bytes = 0;  // of the MAC'd fetch, tagged while landing (rest: at Finish)
};

// Starts `binary` as a shard and a second one with --auth_tokens_file in a temporary directory,
// stores `kv` (the document's KV in transport form, KvChecksum `checksum`) in both and times the
// fetches into `out`. The fetched bytes are compared with `kv` (DATA_LOSS otherwise).
absl::Status MeasureKvstoreFetch(const std::string& binary, Backend& backend,
                                 const Engine::PinnedDocument& doc, const std::string& kv,
                                 uint64_t checksum, KvstoreFetch* out);

}  // namespace lazyrag::bench
