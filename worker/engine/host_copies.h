// Documents copied from the KV pool to the host-memory tier (worker/cache/host_tier.h, DESIGN
// section 6): right after they are computed (so the kvstore write-back reads the host copy
// instead of the scheduler thread exporting to pageable memory) and when they are evicted from
// the pool without one. Each copy is queued on the backend's transfer stream
// (Backend::StartKvToHost, which also checksums it) and the pool pages may be reused at once;
// Poll commits the copies that finished and hands their write-backs to the fetcher.
// Scheduler thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "worker/backend/backend.h"
#include "worker/cache/document_table.h"
#include "worker/cache/host_tier.h"
#include "worker/engine/clock.h"
#include "worker/engine/document_fetcher.h"
#include "worker/engine/engine_metrics.h"

namespace lazyrag {

class HostCopies {
 public:
  // Not owned; must outlive this. `fetcher` and `metrics` may be null.
  HostCopies(Backend *backend, HostTier *tier, DocumentFetcher *fetcher, EngineMetrics *metrics,
             Clock *clock);
  ~HostCopies();  // waits for the copies in flight and commits them

  // Copies a resident document's run to the tier unless it holds the document already; with
  // `write_back`, its kvstore write-back is queued from the host copy once that is complete.
  // False when the tier cannot take it (no room, or the copy could not be queued): the caller
  // then exports the document itself for a write-back.
  bool CopyOut(const std::string &cache_namespace, const std::string &id, const DocumentRun &run,
               const std::vector<int32_t> &tokens, bool write_back);
  // Commits the copies that finished.
  void Poll();
  // Whether copies are in flight (the scheduler then polls soon instead of sleeping).
  bool busy() const { return !inflight_.empty(); }

 private:
  struct Copy {
    std::string ns, id;
    std::vector<int32_t> tokens;
    KvTransferId transfer = 0;
    bool write_back = false;
    absl::Time started;
  };
  // The copy finished with `checksum` (or failed: `ok` false).
  void Finish(const Copy &c, bool ok, uint64_t checksum);
  // Queues the write-back of the tier's copy of `id` (pinned until it is sent).
  void QueueWriteBack(const std::string &ns, const std::string &id,
                      const std::vector<int32_t> &tokens);

  Backend *const backend_;
  HostTier *const tier_;
  DocumentFetcher *const fetcher_;
  EngineMetrics *const metrics_;
  Clock *const clock_;
  std::vector<Copy> inflight_;
};

}  // namespace lazyrag
