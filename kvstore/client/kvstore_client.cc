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
#include "kvstore/client/kvstore_client_impl.h"
#include "kvstore/client/value_file_io.h"
#include "kvstore/format.h"
#include "lazyrag/v1/kvstore.grpc.pb.h"

namespace lazyrag::kvstore {
namespace client_internal {
namespace {

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

}  // namespace

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
        st = GetLocalFrom(shard, request.key(), attempt_deadline, attempt > 0, destination,
                          whole ? call.on_chunk : nullptr, call.on_chunk_verifies, &value,
                          &fall_back);
      }
      if (fall_back) {
        st = GetFrom(shard, request, attempt_deadline, attempt > 0, destination,
                     whole ? call.on_chunk : nullptr, call.on_chunk_verifies, &value);
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
      AddBearerToken(context, options_.auth_token.get());
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

}  // namespace client_internal

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
  return std::make_unique<client_internal::KvClientImpl>(std::move(options),
                                                         std::move(*credentials));
}

}  // namespace lazyrag::kvstore
