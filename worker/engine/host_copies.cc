#include "worker/engine/host_copies.h"

#include <memory>
#include <utility>

#include "common/kv_checksum.h"
#include "common/logging.h"

namespace lazyrag {

HostCopies::HostCopies(Backend *backend, HostTier *tier, DocumentFetcher *fetcher,
                       EngineMetrics *metrics, Clock *clock)
    : backend_(backend), tier_(tier), fetcher_(fetcher), metrics_(metrics), clock_(clock) {}

HostCopies::~HostCopies() {
  for (const Copy &c : inflight_) {
    absl::StatusOr<uint64_t> sum = backend_->WaitKvTransfer(c.transfer);
    Finish(c, sum.ok(), sum.ok() ? *sum : 0);
  }
}

bool HostCopies::CopyOut(const std::string &ns, const std::string &id, const DocumentRun &run,
                         const std::vector<int32_t> &tokens, bool write_back) {
  if (tier_->Contains(id)) {
    if (write_back) QueueWriteBack(ns, id, tokens);
    return true;
  }
  const int64_t bytes = backend_->KvBytes(run.num_tokens);
  absl::StatusOr<char *> dst = tier_->BeginInsert(id, bytes, run.num_tokens, tokens);
  if (!dst.ok()) {
    // ALREADY_EXISTS: being copied already (or read while erased); RESOURCE_EXHAUSTED: no room.
    return absl::IsAlreadyExists(dst.status()) && !write_back;
  }
  absl::StatusOr<KvTransferId> t = backend_->StartKvToHost(run.pages, run.num_tokens, *dst);
  if (!t.ok()) {
    LOG_WARNING << "copy of document " << id << " to the host tier failed: " << t.status();
    tier_->AbortInsert(id);
    return false;
  }
  inflight_.push_back(Copy{ns, id, tokens, *t, write_back, clock_->Now()});
  return true;
}

void HostCopies::Poll() {
  for (size_t i = 0; i < inflight_.size();) {
    absl::StatusOr<std::optional<uint64_t>> polled =
        backend_->PollKvTransfer(inflight_[i].transfer);
    if (polled.ok() && !polled->has_value()) {
      ++i;
      continue;
    }
    Copy c = std::move(inflight_[i]);
    inflight_.erase(inflight_.begin() + i);
    if (!polled.ok()) {
      LOG_WARNING << "copy of document " << c.id << " to the host tier failed: " << polled.status();
    }
    Finish(c, polled.ok(), polled.ok() ? **polled : 0);
  }
}

void HostCopies::Finish(const Copy &c, bool ok, uint64_t checksum) {
  if (!ok) {
    tier_->AbortInsert(c.id);
    return;
  }
  if (!tier_->CommitInsert(c.id, checksum).ok()) return;
  if (metrics_ != nullptr) {
    metrics_->host_demotions->Increment();
    metrics_->host_demotion_seconds->Observe(absl::ToDoubleSeconds(clock_->Now() - c.started));
  }
  if (c.write_back) QueueWriteBack(c.ns, c.id, c.tokens);
}

void HostCopies::QueueWriteBack(const std::string &ns, const std::string &id,
                                const std::vector<int32_t> &tokens) {
  if (fetcher_ == nullptr) return;
  std::optional<HostTier::Ref> ref = tier_->Acquire(id, HostTier::Purpose::kWriteBack);
  if (!ref.has_value()) return;  // evicted meanwhile: nothing to send from
  HostTier *tier = tier_;
  // Released on the write-back thread once the put is sent or skipped.
  std::shared_ptr<const void> hold(ref->data, [tier, id](const void *) { tier->Release(id); });
  const uint64_t checksum = ref->checksum;
  const std::string_view payload(ref->data, size_t(ref->bytes));
  EngineMetrics *metrics = metrics_;
  fetcher_->QueueWriteBack(ns, id, tokens, payload, std::move(hold),
                           [tier, metrics, id, payload, checksum] {
                             if (KvChecksum(payload.data(), payload.size()) == checksum) {
                               return true;
                             }
                             tier->Erase(id, /*corrupt=*/true);
                             if (metrics != nullptr) metrics->host_checksum_failures->Increment();
                             return false;
                           });
}

}  // namespace lazyrag
