// The kvstore client's implementation (kvstore_client.h), shared by its two source files:
// kvstore_client.cc (placement, replicas, retries: Put, Get, Stat, Delete) and
// kvstore_client_transfers.cc (the byte paths: gRPC streams, several per value, and the
// same-host fast path). Internal: included by those files only.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_auth.h"
#include "common/grpc_channel.h"
#include "common/metrics.h"
#include "kvstore/client/kvstore_client.h"
#include "kvstore/client/value_file_io.h"
#include "kvstore/format.h"
#include "lazyrag/v1/kvstore.grpc.pb.h"

namespace lazyrag::kvstore::client_internal {

namespace pb = lazyrag::v1;

// Rendezvous weight of `shard` for `encoded_key`. Stable across processes and builds.
uint64_t RendezvousScore(std::string_view shard, std::string_view encoded_key);
pb::KvKey ToProto(const Key& key);
// Failures worth trying another replica or another round for: the shard did not answer or
// answered about itself, not about the key.
bool IsTransient(absl::StatusCode code);

class Shard {
 public:
  // `part_channels`: more channels for the streams that read parts of one value at once (each
  // its own connection: streams of one connection share its one reading thread). The channels
  // add no token: the client adds it to each call's context (grpc_auth.h, AddBearerToken).
  Shard(std::string address, std::shared_ptr<grpc::ChannelCredentials> credentials,
        int part_channels)
      : address_(std::move(address)) {
    // Reconnect quickly to a shard that comes back; each channel its own connection
    // (ServiceChannelArgs: a local subchannel pool).
    auto channel = [&] {
      return grpc::CreateCustomChannel(address_, credentials, ServiceChannelArgs(kMaxMessageBytes));
    };
    stub_ = pb::KvStore::NewStub(channel());
    for (int i = 0; i < part_channels; ++i) part_stubs_.push_back(pb::KvStore::NewStub(channel()));
  }

  const std::string& address() const { return address_; }
  pb::KvStore::Stub* stub() { return stub_.get(); }
  // The stub for part `i` of a value read over several streams.
  pb::KvStore::Stub* part_stub(int i) {
    return part_stubs_.empty() ? stub_.get() : part_stubs_[size_t(i) % part_stubs_.size()].get();
  }

  bool Healthy(absl::Time now) const {
    absl::MutexLock lock(&mu_);
    return now >= unhealthy_until_;
  }
  int consecutive_failures() const {
    absl::MutexLock lock(&mu_);
    return consecutive_failures_;
  }
  // The shard's data directory when its same-host fast path was found usable from here, ""
  // when found unusable, nullopt when not known yet.
  std::optional<std::string> local_dir() const {
    absl::MutexLock lock(&mu_);
    return local_dir_;
  }
  void set_local_dir(std::string dir) {
    absl::MutexLock lock(&mu_);
    local_dir_ = std::move(dir);
  }
  // Records how a call went: transport-level failures make the shard unhealthy for a while.
  void Record(const absl::Status& status, absl::Duration unhealthy_for) {
    absl::MutexLock lock(&mu_);
    if (IsTransient(status.code())) {
      ++consecutive_failures_;
      unhealthy_until_ = absl::Now() + unhealthy_for;
    } else {
      consecutive_failures_ = 0;
      unhealthy_until_ = absl::InfinitePast();
    }
  }

 private:
  const std::string address_;
  std::unique_ptr<pb::KvStore::Stub> stub_;
  std::vector<std::unique_ptr<pb::KvStore::Stub>> part_stubs_;
  mutable absl::Mutex mu_;
  int consecutive_failures_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time unhealthy_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::optional<std::string> local_dir_ ABSL_GUARDED_BY(mu_);
};

// Chunks the first stream of a gRPC get asks for; the rest of a larger value is read by
// KvClientOptions::streams_per_get more streams at once.
constexpr uint32_t kFirstStreamChunks = 16;

struct ChunkPlan {
  uint64_t offset;
  uint32_t size;
  uint32_t crc;
};

class KvClientImpl final : public KvClient {
 public:
  KvClientImpl(KvClientOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(std::move(options)) {
    for (const auto& address : options_.shards) {
      shards_.push_back(
          std::make_unique<Shard>(address, credentials, std::max(0, options_.streams_per_get)));
    }
    if (options_.registry != nullptr) {
      fetch_seconds_ = &options_.registry
                            ->AddHistogram("lazyrag_kvstore_fetch_seconds",
                                           "Time to fetch a value from the kvstore (successful "
                                           "gets, all replicas and retries).",
                                           metrics::ExponentialBuckets(0.001, 2, 16))
                            .Add();
      fetch_bytes_ = &options_.registry
                          ->AddCounter("lazyrag_kvstore_fetch_bytes_total",
                                       "Value bytes fetched from the kvstore.")
                          .Add();
      corruptions_ = &options_.registry
                          ->AddCounter("lazyrag_kvstore_client_corruptions_total",
                                       "Chunks received from the kvstore that failed their "
                                       "CRC-32C check (discarded).")
                          .Add();
    }
  }

  absl::Status Put(const Key& key, const ValueHeader& header, std::string_view value,
                   const CallOptions& call) override;
  absl::StatusOr<Value> Get(const Key& key, const LayerSelection& layers,
                            const CallOptions& call) override;
  absl::StatusOr<ValueInfo> GetInto(const Key& key, const GetDestination& destination,
                                    const LayerSelection& layers, const CallOptions& call) override;
  absl::StatusOr<std::vector<KeyInfo>> Stat(std::span<const Key> keys,
                                            const CallOptions& call) override;
  absl::StatusOr<bool> Delete(const Key& key, const CallOptions& call) override;

  absl::StatusOr<std::vector<int>> Placement(const Key& key) const override {
    ASSIGN_OR_RETURN(const std::string encoded, EncodeKey(ToProto(key)));
    return PlacementOf(encoded);
  }

  std::vector<ShardHealth> Health() const override {
    std::vector<ShardHealth> out;
    const absl::Time now = absl::Now();
    for (const auto& s : shards_) {
      out.push_back({s->address(), s->Healthy(now), s->consecutive_failures()});
    }
    return out;
  }

 private:
  std::vector<int> PlacementOf(const std::string& encoded) const {
    std::vector<std::pair<uint64_t, int>> scored;
    for (size_t i = 0; i < shards_.size(); ++i) {
      scored.emplace_back(RendezvousScore(shards_[i]->address(), encoded), static_cast<int>(i));
    }
    std::sort(scored.begin(), scored.end(), std::greater<>());
    std::vector<int> out;
    for (int r = 0; r < options_.replication; ++r) out.push_back(scored[r].second);
    return out;
  }
  // Placement with healthy shards first (stable).
  std::vector<int> ReadOrder(const std::string& encoded) const {
    std::vector<int> order = PlacementOf(encoded);
    const absl::Time now = absl::Now();
    std::stable_partition(order.begin(), order.end(),
                          [&](int i) { return shards_[i]->Healthy(now); });
    return order;
  }
  absl::Time DeadlineOf(const CallOptions& call) const {
    return absl::Now() +
           (call.timeout > absl::ZeroDuration() ? call.timeout : options_.call_timeout);
  }
  // Sleeps before round `attempt` (>= 1); false when the deadline would pass first.
  bool Backoff(int attempt, absl::Time deadline) const {
    absl::Duration d = options_.initial_backoff;
    for (int i = 1; i < attempt && d < options_.max_backoff; ++i) d *= 2;
    d = std::min(d, options_.max_backoff);
    static thread_local std::mt19937 rng(std::random_device{}());
    d = d / 2 + d * (std::uniform_real_distribution<double>(0, 0.5)(rng));
    if (absl::Now() + d >= deadline) return false;
    absl::SleepFor(d);
    return true;
  }
  void CountCorruption() {
    if (corruptions_ != nullptr) corruptions_->Increment();
  }

  // `retry`: a later attempt, which waits (until `deadline`) for a shard that was just
  // unreachable to come back instead of failing at once.
  absl::Status PutTo(Shard& shard, const pb::KvKey& key, const pb::ValueHeader& header,
                     std::string_view value, const std::vector<ChunkPlan>& plan,
                     absl::Time deadline, bool retry);
  // Sets the deadline of one attempt on `context` and adds the client's bearer token.
  void SetAttemptDeadline(grpc::ClientContext& context, absl::Time deadline, bool retry) const {
    if (retry) context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(deadline));
    AddBearerToken(context, options_.auth_token.get());
  }
  // Where a stream's bytes go: the destination and the value offset of its first byte.
  struct Placed {
    const Scatter* dst = nullptr;
    uint64_t offset = 0;
  };
  using OnHeader =
      std::function<absl::StatusOr<Placed>(const pb::GetHeader& header, const ValueLayout& layout)>;
  // One Get stream: its header goes to `on_header`, which says where its chunks go; each chunk
  // is checked against its CRC-32C. Errors carry the shard's address.
  absl::Status ReadStream(Shard& shard, pb::KvStore::Stub* stub, const pb::GetRequest& request,
                          absl::Time deadline, bool retry, const OnHeader& on_header);
  // A Get of `request` from one shard through gRPC; a whole value of more than
  // kFirstStreamChunks chunks over streams_per_get + 1 streams unless `split` is false.
  absl::Status GetFrom(Shard& shard, const pb::GetRequest& request, absl::Time deadline, bool retry,
                       const GetDestination& destination, const ChunkObserver& on_chunk,
                       bool observer_verifies, ValueInfo* out, bool split = true);
  // The shard's data directory when the same-host fast path works with it, else "". Asks the
  // shard once (Describe, within `deadline`) and remembers the answer.
  std::string LocalDirOf(Shard& shard, absl::Time deadline);
  // The fast-path forms of GetFrom and PutTo. *fall_back is set when the file path could not be
  // used (the caller then streams through gRPC); the status is meaningful otherwise.
  absl::Status GetLocalFrom(Shard& shard, const pb::KvKey& key, absl::Time deadline, bool retry,
                            const GetDestination& destination, const ChunkObserver& on_chunk,
                            bool observer_verifies, ValueInfo* out, bool* fall_back);
  absl::Status PutLocalTo(Shard& shard, const std::string& dir, const pb::KvKey& key,
                          const pb::ValueHeader& header, std::string_view value,
                          const std::vector<ChunkPlan>& plan, absl::Time deadline, bool retry,
                          bool* fall_back);

  const KvClientOptions options_;
  std::vector<std::unique_ptr<Shard>> shards_;
  metrics::Histogram* fetch_seconds_ = nullptr;
  metrics::Counter* fetch_bytes_ = nullptr;
  metrics::Counter* corruptions_ = nullptr;
};

}  // namespace lazyrag::kvstore::client_internal
