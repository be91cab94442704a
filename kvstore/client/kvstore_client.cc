#include "kvstore/client/kvstore_client.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/tls.h"
#include "kvstore/client/value_file_io.h"
#include "kvstore/format.h"
#include "lazyrag/v1/kvstore.grpc.pb.h"

namespace lazyrag::kvstore {
namespace {

namespace pb = lazyrag::v1;

uint64_t Fnv1a64(std::string_view data, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// splitmix64's finalizer: spreads FNV's weak low bits over the whole word.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Rendezvous weight of `shard` for `encoded_key`. Stable across processes and builds.
uint64_t RendezvousScore(std::string_view shard, std::string_view encoded_key) {
  uint64_t h = Fnv1a64(shard);
  h = Fnv1a64(std::string_view("\0", 1), h);
  return Mix64(Fnv1a64(encoded_key, h));
}

pb::KvKey ToProto(const Key& key) {
  pb::KvKey out;
  if (key.is_raw) {
    out.set_raw(key.raw);
  } else {
    auto* d = out.mutable_document();
    d->set_model_fingerprint(key.model_fingerprint);
    d->set_cache_namespace(key.cache_namespace);
    d->set_document_id(key.document_id);
  }
  return out;
}

// Failures worth trying another replica or another round for: the shard did not answer or
// answered about itself, not about the key.
bool IsTransient(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

class Shard {
 public:
  Shard(std::string address, std::shared_ptr<grpc::ChannelCredentials> credentials)
      : address_(std::move(address)) {
    // Reconnect quickly to a shard that comes back.
    channel_ = grpc::CreateCustomChannel(address_, credentials, ServiceChannelArgs(kMaxMessageBytes));
    stub_ = pb::KvStore::NewStub(channel_);
  }

  const std::string& address() const { return address_; }
  pb::KvStore::Stub* stub() { return stub_.get(); }

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
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::KvStore::Stub> stub_;
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
      shards_.push_back(std::make_unique<Shard>(address, credentials));
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
                                    const LayerSelection& layers,
                                    const CallOptions& call) override;
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
  // Sets the deadline of one attempt on `context`.
  static void SetAttemptDeadline(grpc::ClientContext& context, absl::Time deadline, bool retry) {
    if (retry) context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(deadline));
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
  absl::Status ReadStream(Shard& shard, const pb::GetRequest& request, absl::Time deadline,
                          bool retry, const OnHeader& on_header);
  // A Get of `request` from one shard through gRPC; a whole value of more than
  // kFirstStreamChunks chunks over streams_per_get + 1 streams unless `split` is false.
  absl::Status GetFrom(Shard& shard, const pb::GetRequest& request, absl::Time deadline, bool retry,
                       const GetDestination& destination, ValueInfo* out, bool split = true);
  // The shard's data directory when the same-host fast path works with it, else "". Asks the
  // shard once (Describe, within `deadline`) and remembers the answer.
  std::string LocalDirOf(Shard& shard, absl::Time deadline);
  // The fast-path forms of GetFrom and PutTo. *fall_back is set when the file path could not be
  // used (the caller then streams through gRPC); the status is meaningful otherwise.
  absl::Status GetLocalFrom(Shard& shard, const pb::KvKey& key, absl::Time deadline, bool retry,
                            const GetDestination& destination, ValueInfo* out, bool* fall_back);
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

absl::Status KvClientImpl::PutTo(Shard& shard, const pb::KvKey& key, const pb::ValueHeader& header,
                                 std::string_view value, const std::vector<ChunkPlan>& plan,
                                 absl::Time deadline, bool retry) {
  grpc::ClientContext context;
  SetAttemptDeadline(context, deadline, retry);
  pb::PutResponse response;
  std::unique_ptr<grpc::ClientWriter<pb::PutRequest>> writer =
      shard.stub()->Put(&context, &response);
  pb::PutRequest message;
  *message.mutable_header()->mutable_key() = key;
  *message.mutable_header()->mutable_value() = header;
  bool sent = writer->Write(message);
  for (uint32_t i = 0; sent && i < plan.size(); ++i) {
    message.Clear();
    auto* chunk = message.mutable_chunk();
    chunk->set_index(i);
    chunk->set_data(value.data() + plan[i].offset, plan[i].size);
    chunk->set_crc32c(plan[i].crc);
    sent = writer->Write(message);
  }
  if (sent) writer->WritesDone();
  absl::Status status = FromGrpcStatus(writer->Finish());
  if (status.ok() && !sent) status = absl::UnavailableError("put: stream broke");
  if (!status.ok()) {
    status = absl::Status(status.code(), absl::StrCat(shard.address(), ": ", status.message()));
  }
  return status;
}

absl::Status KvClientImpl::Put(const Key& key, const ValueHeader& header, std::string_view value,
                               const CallOptions& call) {
  const absl::Time deadline = DeadlineOf(call);
  const pb::KvKey proto_key = ToProto(key);
  ASSIGN_OR_RETURN(const std::string encoded, EncodeKey(proto_key));
  pb::ValueHeader proto_header;
  proto_header.set_total_size(value.size());
  proto_header.set_chunk_size(options_.chunk_size);
  proto_header.set_num_chunks(NumChunks(value.size(), options_.chunk_size));
  proto_header.mutable_layer_offsets()->Assign(header.layer_offsets.begin(),
                                               header.layer_offsets.end());
  proto_header.set_checksum_algorithm(pb::CHECKSUM_ALGORITHM_CRC32C);
  proto_header.set_metadata(header.metadata);
  RETURN_IF_ERROR(LayoutFromProto(proto_header).status());  // same checks as the server

  std::vector<ChunkPlan> plan(proto_header.num_chunks());
  for (uint32_t i = 0; i < plan.size(); ++i) {
    plan[i].offset = uint64_t{i} * options_.chunk_size;
    plan[i].size = static_cast<uint32_t>(
        std::min<uint64_t>(options_.chunk_size, value.size() - plan[i].offset));
    plan[i].crc = Crc32c(value.substr(plan[i].offset, plan[i].size));
  }

  const std::vector<int> replicas = PlacementOf(encoded);
  std::vector<absl::Status> results(replicas.size());
  auto put_one = [&](size_t r) {
    Shard& shard = *shards_[replicas[r]];
    // Retries of this replica share one reconnect budget, so a dead replica costs a Put at
    // most about reconnect_wait.
    const absl::Time retry_deadline = std::min(deadline, absl::Now() + options_.reconnect_wait);
    absl::Status st;
    bool local = true;  // until the fast path falls back
    for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
      if (attempt > 0 && !Backoff(attempt, retry_deadline)) break;
      const absl::Time attempt_deadline = attempt > 0 ? retry_deadline : deadline;
      bool fall_back = true;
      if (const std::string dir = local ? LocalDirOf(shard, attempt_deadline) : ""; !dir.empty()) {
        st = PutLocalTo(shard, dir, proto_key, proto_header, value, plan, attempt_deadline,
                        attempt > 0, &fall_back);
        local = !fall_back;
      }
      if (fall_back) {
        st = PutTo(shard, proto_key, proto_header, value, plan, attempt_deadline, attempt > 0);
      }
      shard.Record(st, options_.unhealthy_for);
      // DATA_LOSS here means a chunk was damaged on its way: sending again may work.
      if (st.ok() || !(IsTransient(st.code()) || st.code() == absl::StatusCode::kDataLoss)) break;
    }
    results[r] = st;
  };
  std::vector<std::thread> threads;
  for (size_t r = 1; r < replicas.size(); ++r) threads.emplace_back(put_one, r);
  put_one(0);
  for (auto& t : threads) t.join();

  int stored = 0;
  std::vector<std::string> errors;
  const absl::Status* permanent = nullptr;
  for (const auto& st : results) {
    if (st.ok()) {
      ++stored;
      continue;
    }
    errors.push_back(st.ToString());
    if (!IsTransient(st.code()) && permanent == nullptr) permanent = &st;
  }
  if (stored >= std::min<int>(options_.min_write_replicas, replicas.size())) {
    return absl::OkStatus();
  }
  if (permanent != nullptr) return *permanent;
  return absl::UnavailableError(absl::StrCat("put: stored on ", stored, " of ", replicas.size(),
                                             " replicas: ", absl::StrJoin(errors, "; ")));
}

absl::Status KvClientImpl::ReadStream(Shard& shard, const pb::GetRequest& request,
                                      absl::Time deadline, bool retry, const OnHeader& on_header) {
  grpc::ClientContext context;
  SetAttemptDeadline(context, deadline, retry);
  std::unique_ptr<grpc::ClientReader<pb::GetResponse>> reader =
      shard.stub()->Get(&context, request);
  pb::GetResponse message;
  absl::Status bad;  // a problem found on our side; the stream is cancelled
  uint64_t range_size = 0, received = 0;
  if (!reader->Read(&message)) {
    // Finish() below tells why.
  } else if (!message.has_header()) {
    bad = absl::InternalError("get: reply did not start with a header");
  } else {
    const pb::GetHeader& h = message.header();
    auto layout = LayoutFromProto(h.value());
    absl::StatusOr<Placed> placed = absl::InternalError("unset");
    if (!layout.ok()) {
      bad = absl::InternalError(absl::StrCat("get: bad header: ", layout.status().message()));
    } else if (h.range_begin() > h.range_end() || h.range_end() > layout->total_size) {
      bad = absl::InternalError("get: bad range in header");
    } else if (placed = on_header(h, *layout); !placed.ok()) {
      bad = placed.status();
    }
    range_size = h.range_end() - h.range_begin();
    uint32_t next = 0;
    while (bad.ok() && reader->Read(&message)) {
      const std::string& data = message.chunk().data();
      if (!message.has_chunk() || message.chunk().index() != next ||
          received + data.size() > range_size) {
        bad = absl::InternalError(absl::StrCat("get: unexpected message after chunk ", next));
        break;
      }
      if (Crc32c(data) != message.chunk().crc32c()) {
        CountCorruption();
        bad = absl::DataLossError(absl::StrCat(
            "get: chunk ", next, " failed its CRC-32C check (corrupted in transit)"));
        break;
      }
      placed->dst->Write(placed->offset + received, data);
      received += data.size();
      ++next;
    }
  }
  if (!bad.ok()) {
    context.TryCancel();
    while (reader->Read(&message)) {
    }
  }
  absl::Status status = FromGrpcStatus(reader->Finish());
  if (!bad.ok()) status = bad;
  if (status.ok() && received != range_size) {
    status = absl::DataLossError(absl::StrCat("get: ", received, " of ", range_size,
                                              " bytes arrived"));
  }
  if (!status.ok()) {
    status = absl::Status(status.code(), absl::StrCat(shard.address(), ": ", status.message()));
  }
  return status;
}

absl::Status KvClientImpl::GetFrom(Shard& shard, const pb::GetRequest& request, absl::Time deadline,
                                   bool retry, const GetDestination& destination, ValueInfo* out,
                                   bool split) {
  const bool whole = request.num_layers() == 0 && request.first_layer() == 0;
  split = split && whole && options_.streams_per_get > 1;
  std::optional<Scatter> dst;
  // A value of more chunks than the first stream asks for, with a version: the rest is read by
  // streams_per_get more streams at once, each a chunk range of that version.
  std::vector<std::thread> streams;
  std::vector<absl::Status> results;
  bool single = false;  // the store gave no version: read again over one stream
  pb::GetRequest first = request;
  if (split) first.set_num_chunks(kFirstStreamChunks);
  auto on_header = [&](const pb::GetHeader& h, const ValueLayout& layout) -> absl::StatusOr<Placed> {
    out->header.metadata = layout.metadata;
    out->header.layer_offsets = layout.layer_offsets;
    out->total_size = layout.total_size;
    out->local = false;
    const bool more = split && layout.num_chunks > kFirstStreamChunks;
    if (more && h.version() == 0) {
      single = true;
      return absl::AbortedError("no version to split the read by");
    }
    out->range_begin = more ? 0 : h.range_begin();
    out->range_size = more ? layout.total_size : h.range_end() - h.range_begin();
    ASSIGN_OR_RETURN(std::vector<MutableBytes> spans, destination(out->header, out->range_size));
    ASSIGN_OR_RETURN(Scatter s, Scatter::Of(std::move(spans), out->range_size));
    dst = std::move(s);
    if (more) {
      const uint32_t rest = layout.num_chunks - kFirstStreamChunks;
      const int n = std::min<int>(options_.streams_per_get, int(rest));
      results.resize(n);
      for (int t = 0; t < n; ++t) {
        const uint32_t begin = kFirstStreamChunks + uint32_t(uint64_t(rest) * t / n);
        const uint32_t end = kFirstStreamChunks + uint32_t(uint64_t(rest) * (t + 1) / n);
        pb::GetRequest part = request;
        part.set_first_chunk(begin);
        part.set_num_chunks(end - begin);
        part.set_version(h.version());
        const uint64_t at = layout.ChunkBegin(begin);
        streams.emplace_back([this, &shard, &results, &dst, part, at, deadline, retry, t] {
          auto place = [&](const pb::GetHeader& ph, const ValueLayout&) -> absl::StatusOr<Placed> {
            if (ph.range_begin() != at) return absl::InternalError("get: a part at another offset");
            return Placed{&*dst, at};
          };
          results[t] = ReadStream(shard, part, deadline, retry, place);
        });
      }
    }
    return Placed{&*dst, 0};
  };
  absl::Status st = ReadStream(shard, first, deadline, retry, on_header);
  for (auto& t : streams) t.join();
  for (const auto& r : results) {
    if (st.ok() && !r.ok()) st = r;
  }
  if (single) {
    pb::GetRequest whole_request = request;
    return GetFrom(shard, whole_request, deadline, retry, destination, out, /*split=*/false);
  }
  return st;
}

std::string KvClientImpl::LocalDirOf(Shard& shard, absl::Time deadline) {
  if (!options_.local_fast_path) return "";
  if (auto known = shard.local_dir(); known.has_value()) return *known;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(1))));
  pb::DescribeResponse response;
  const absl::Status st =
      FromGrpcStatus(shard.stub()->Describe(&context, pb::DescribeRequest(), &response));
  if (!st.ok()) {
    // A shard without Describe (an older build) never offers it; any other failure is asked
    // again next time.
    if (st.code() == absl::StatusCode::kUnimplemented) shard.set_local_dir("");
    return "";
  }
  std::string dir;
  if (!response.local_dir().empty() && !response.local_token().empty() &&
      HoldsLocalToken(response.local_dir(), response.local_token())) {
    dir = response.local_dir();
  }
  shard.set_local_dir(dir);
  return dir;
}

absl::Status KvClientImpl::GetLocalFrom(Shard& shard, const pb::KvKey& key, absl::Time deadline,
                                        bool retry, const GetDestination& destination,
                                        ValueInfo* out, bool* fall_back) {
  *fall_back = false;
  grpc::ClientContext context;
  SetAttemptDeadline(context, deadline, retry);
  pb::GetLocalRequest request;
  *request.mutable_key() = key;
  pb::GetLocalResponse response;
  absl::Status st = FromGrpcStatus(shard.stub()->GetLocal(&context, request, &response));
  if (st.code() == absl::StatusCode::kFailedPrecondition ||
      st.code() == absl::StatusCode::kUnimplemented) {
    *fall_back = true;
    return st;
  }
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(shard.address(), ": ", st.message()));
  auto layout = LayoutFromProto(response.value());
  if (!layout.ok() || uint64_t(response.chunk_crc32c_size()) != layout->num_chunks) {
    return absl::InternalError(absl::StrCat(shard.address(), ": get: bad fast-path reply"));
  }
  auto fd = OpenFile(response.path(), O_RDONLY);
  if (!fd.ok()) {
    // Unlinked since (replaced or evicted), or not readable from here: stream it instead.
    *fall_back = true;
    return fd.status();
  }
  out->header.metadata = layout->metadata;
  out->header.layer_offsets = layout->layer_offsets;
  out->total_size = layout->total_size;
  out->range_begin = 0;
  out->range_size = layout->total_size;
  out->local = true;
  ASSIGN_OR_RETURN(std::vector<MutableBytes> spans, destination(out->header, layout->total_size));
  ASSIGN_OR_RETURN(const Scatter dst, Scatter::Of(std::move(spans), layout->total_size));
  const std::vector<uint32_t> crcs(response.chunk_crc32c().begin(), response.chunk_crc32c().end());
  bool corrupt = false;
  absl::Status read = ReadValueFile(fd->get(), *layout, crcs, dst,
                                    ThreadsFor(layout->total_size, options_.local_read_threads),
                                    &corrupt);
  if (corrupt) {
    CountCorruption();
    // Streamed instead: the shard then reads the damaged chunk itself, answers DATA_LOSS and
    // counts it (and a value that changed since is served whole).
    *fall_back = true;
  }
  if (!read.ok()) {
    read = absl::Status(read.code(), absl::StrCat(shard.address(), ": get: ", read.message()));
  }
  return read;
}

absl::Status KvClientImpl::PutLocalTo(Shard& shard, const std::string& dir, const pb::KvKey& key,
                                      const pb::ValueHeader& header, std::string_view value,
                                      const std::vector<ChunkPlan>& plan, absl::Time deadline,
                                      bool retry, bool* fall_back) {
  *fall_back = false;
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}());
  const std::string name =
      absl::StrCat(::getpid(), "-", counter.fetch_add(1), "-", absl::Hex(rng()), ".in");
  const std::string path = absl::StrCat(dir, "/incoming/", name);
  {
    auto fd = OpenFile(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (!fd.ok()) {
      *fall_back = true;  // no write access here: stream it instead
      return fd.status();
    }
    std::vector<ValueFileChunk> chunks;
    for (const ChunkPlan& c : plan) chunks.push_back({c.offset, c.size});
    absl::Status written = WriteValueFile(fd->get(), value, chunks,
                                          ThreadsFor(value.size(), options_.local_read_threads));
    if (!written.ok()) {
      ::unlink(path.c_str());
      *fall_back = true;
      return written;
    }
  }
  pb::PutLocalRequest request;
  *request.mutable_header()->mutable_key() = key;
  *request.mutable_header()->mutable_value() = header;
  request.set_file(name);
  for (const ChunkPlan& c : plan) request.add_chunk_crc32c(c.crc);
  grpc::ClientContext context;
  SetAttemptDeadline(context, deadline, retry);
  pb::PutResponse response;
  absl::Status st = FromGrpcStatus(shard.stub()->PutLocal(&context, request, &response));
  ::unlink(path.c_str());  // consumed by the shard; gone already unless the call never arrived
  if (st.code() == absl::StatusCode::kFailedPrecondition ||
      st.code() == absl::StatusCode::kUnimplemented) {
    *fall_back = true;
  }
  if (!st.ok()) st = absl::Status(st.code(), absl::StrCat(shard.address(), ": ", st.message()));
  return st;
}

absl::StatusOr<Value> KvClientImpl::Get(const Key& key, const LayerSelection& layers,
                                        const CallOptions& call) {
  Value value;
  auto info = GetInto(
      key,
      [&value](const ValueHeader&, uint64_t bytes) -> absl::StatusOr<std::vector<MutableBytes>> {
        value.bytes.resize(bytes);
        return std::vector<MutableBytes>{{value.bytes.data(), bytes}};
      },
      layers, call);
  if (!info.ok()) return info.status();
  value.header = std::move(info->header);
  value.total_size = info->total_size;
  value.range_begin = info->range_begin;
  return value;
}

absl::StatusOr<ValueInfo> KvClientImpl::GetInto(const Key& key, const GetDestination& destination,
                                                const LayerSelection& layers,
                                                const CallOptions& call) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = DeadlineOf(call);
  pb::GetRequest request;
  *request.mutable_key() = ToProto(key);
  request.set_first_layer(layers.first_layer);
  request.set_num_layers(layers.num_layers);
  ASSIGN_OR_RETURN(const std::string encoded, EncodeKey(request.key()));
  const bool whole = layers.num_layers == 0 && layers.first_layer == 0;

  absl::Status last;
  for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
    if (attempt > 0 && !Backoff(attempt, deadline)) break;
    bool answered = false;  // some replica answered about the key
    absl::Status not_found, data_loss;
    for (int index : ReadOrder(encoded)) {
      if (absl::Now() >= deadline) return absl::DeadlineExceededError("get: deadline passed");
      Shard& shard = *shards_[index];
      ValueInfo value;
      const absl::Time attempt_deadline =
          attempt > 0 ? std::min(deadline, absl::Now() + options_.read_reconnect_wait) : deadline;
      absl::Status st;
      bool fall_back = true;
      if (whole && !LocalDirOf(shard, attempt_deadline).empty()) {
        st = GetLocalFrom(shard, request.key(), attempt_deadline, attempt > 0, destination, &value,
                          &fall_back);
      }
      if (fall_back) {
        st = GetFrom(shard, request, attempt_deadline, attempt > 0, destination, &value);
      }
      shard.Record(st, options_.unhealthy_for);
      if (st.ok()) {
        if (fetch_seconds_ != nullptr) {
          fetch_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start));
          fetch_bytes_->Increment(static_cast<double>(value.range_size));
        }
        return value;
      }
      if (st.code() == absl::StatusCode::kNotFound) {
        answered = true;
        not_found = st;
      } else if (st.code() == absl::StatusCode::kDataLoss) {
        answered = true;
        data_loss = st;
      } else if (!IsTransient(st.code())) {
        return st;  // bad request: the same everywhere
      }
      last = st;
    }
    if (answered) return !not_found.ok() ? not_found : data_loss;
  }
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("get: deadline passed; last: ", last.message()));
  }
  return absl::UnavailableError(absl::StrCat("get: no replica reachable; last: ", last.message()));
}

absl::StatusOr<std::vector<KeyInfo>> KvClientImpl::Stat(std::span<const Key> keys,
                                                        const CallOptions& call) {
  const absl::Time deadline = DeadlineOf(call);
  std::vector<KeyInfo> out(keys.size());
  std::vector<int> answered(keys.size(), 0);
  // Per shard: indices of the keys it holds a replica of.
  std::vector<std::vector<size_t>> by_shard(shards_.size());
  std::vector<pb::KvKey> proto_keys;
  for (size_t i = 0; i < keys.size(); ++i) {
    proto_keys.push_back(ToProto(keys[i]));
    ASSIGN_OR_RETURN(const std::string encoded, EncodeKey(proto_keys.back()));
    for (int s : PlacementOf(encoded)) by_shard[s].push_back(i);
  }
  absl::Status last;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const auto& idx = by_shard[s];
    for (size_t begin = 0; begin < idx.size(); begin += kMaxStatKeys) {
      const size_t end = std::min(idx.size(), begin + kMaxStatKeys);
      pb::StatRequest request;
      for (size_t j = begin; j < end; ++j) *request.add_keys() = proto_keys[idx[j]];
      pb::StatResponse response;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      absl::Status st = FromGrpcStatus(shards_[s]->stub()->Stat(&context, request, &response));
      shards_[s]->Record(st, options_.unhealthy_for);
      if (st.ok() && response.stats_size() != static_cast<int>(end - begin)) {
        st = absl::InternalError("stat: reply has the wrong number of entries");
      }
      if (!st.ok()) {
        if (!IsTransient(st.code())) return st;
        last = absl::Status(st.code(), absl::StrCat(shards_[s]->address(), ": ", st.message()));
        continue;
      }
      for (size_t j = begin; j < end; ++j) {
        const pb::KeyStat& ks = response.stats(static_cast<int>(j - begin));
        KeyInfo& info = out[idx[j]];
        ++answered[idx[j]];
        if (!ks.present()) continue;
        info.present = true;
        info.size = ks.size();
        info.last_access_unix_ms = std::max(info.last_access_unix_ms, ks.last_access_unix_ms());
        ++info.replicas_present;
      }
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (answered[i] == 0) {
      return absl::UnavailableError(
          absl::StrCat("stat: no replica of key ", i, " reachable; last: ", last.message()));
    }
  }
  return out;
}

absl::StatusOr<bool> KvClientImpl::Delete(const Key& key, const CallOptions& call) {
  const absl::Time deadline = DeadlineOf(call);
  pb::DeleteRequest request;
  *request.mutable_key() = ToProto(key);
  ASSIGN_OR_RETURN(const std::string encoded, EncodeKey(request.key()));
  bool existed = false;
  std::vector<std::string> failures;
  for (int s : PlacementOf(encoded)) {
    const absl::Time retry_deadline = std::min(deadline, absl::Now() + options_.reconnect_wait);
    absl::Status st;
    for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
      if (attempt > 0 && !Backoff(attempt, retry_deadline)) break;
      pb::DeleteResponse response;
      grpc::ClientContext context;
      SetAttemptDeadline(context, attempt > 0 ? retry_deadline : deadline, attempt > 0);
      st = FromGrpcStatus(shards_[s]->stub()->Delete(&context, request, &response));
      shards_[s]->Record(st, options_.unhealthy_for);
      if (st.ok()) existed = existed || response.existed();
      if (!IsTransient(st.code())) break;
    }
    if (!st.ok()) {
      if (!IsTransient(st.code())) return st;
      failures.push_back(absl::StrCat(shards_[s]->address(), ": ", st.message()));
    }
  }
  if (!failures.empty()) {
    return absl::UnavailableError(
        absl::StrCat("delete: replicas not reached: ", absl::StrJoin(failures, "; ")));
  }
  return existed;
}

}  // namespace

Key Key::Document(std::string model_fingerprint, std::string cache_namespace,
                  std::string document_id) {
  Key key;
  key.model_fingerprint = std::move(model_fingerprint);
  key.cache_namespace = std::move(cache_namespace);
  key.document_id = std::move(document_id);
  return key;
}

Key Key::Raw(std::string name) {
  Key key;
  key.is_raw = true;
  key.raw = std::move(name);
  return key;
}

std::vector<std::string> SplitShardList(std::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view item :
       absl::StrSplit(absl::string_view(list.data(), list.size()), ',', absl::SkipWhitespace())) {
    out.emplace_back(item);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<KvClient>> KvClient::Create(KvClientOptions options) {
  if (options.shards.empty()) return absl::InvalidArgumentError("kvstore client: no shards");
  std::vector<std::string> sorted = options.shards;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError("kvstore client: a shard is listed twice");
  }
  const int n = static_cast<int>(options.shards.size());
  if (options.replication == 0) options.replication = n >= 2 ? 2 : 1;
  if (options.replication < 1 || options.replication > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvstore client: replication ", options.replication, " with ", n, " shards"));
  }
  if (options.chunk_size == 0 || options.chunk_size > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvstore client: chunk_size must be 1..", kMaxChunkBytes));
  }
  options.min_write_replicas = std::clamp(options.min_write_replicas, 1, options.replication);
  options.max_attempts = std::max(1, options.max_attempts);
  auto credentials = ChannelCredentialsFor(options.tls);
  if (!credentials.ok()) return credentials.status();
  return std::make_unique<KvClientImpl>(std::move(options), std::move(*credentials));
}

}  // namespace lazyrag::kvstore
