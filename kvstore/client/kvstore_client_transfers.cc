#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "kvstore/client/kvstore_client_impl.h"

namespace lazyrag::kvstore::client_internal {

absl::Status KvClientImpl::ReadStream(Shard& shard, pb::KvStore::Stub* stub,
                                      const pb::GetRequest& request, absl::Time deadline,
                                      bool retry, const OnHeader& on_header) {
  grpc::ClientContext context;
  SetAttemptDeadline(context, deadline, retry);
  std::unique_ptr<grpc::ClientReader<pb::GetResponse>> reader = stub->Get(&context, request);
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
      // Copied, checksummed and (with an observer) shown to it in cache-sized steps; a chunk that
      // fails fails the read, and the destination is asked afresh for the next replica.
      const uint32_t crc = placed->dst->Land(placed->offset + received, data);
      if (!placed->dst->skips_crc() && crc != message.chunk().crc32c()) {
        CountCorruption();
        bad = absl::DataLossError(
            absl::StrCat("get: chunk ", next, " failed its CRC-32C check (corrupted in transit)"));
        break;
      }
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
    status =
        absl::DataLossError(absl::StrCat("get: ", received, " of ", range_size, " bytes arrived"));
  }
  if (!status.ok()) {
    status = absl::Status(status.code(), absl::StrCat(shard.address(), ": ", status.message()));
  }
  return status;
}

absl::Status KvClientImpl::GetFrom(Shard& shard, const pb::GetRequest& request, absl::Time deadline,
                                   bool retry, const GetDestination& destination,
                                   const ChunkObserver& on_chunk, bool observer_verifies,
                                   ValueInfo* out, bool split) {
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
  auto on_header = [&](const pb::GetHeader& h,
                       const ValueLayout& layout) -> absl::StatusOr<Placed> {
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
    ASSIGN_OR_RETURN(Scatter s,
                     Scatter::Of(std::move(spans), out->range_size, whole ? on_chunk : nullptr));
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
          results[t] = ReadStream(shard, shard.part_stub(t), part, deadline, retry, place);
        });
      }
    }
    return Placed{&*dst, 0};
  };
  absl::Status st = ReadStream(shard, shard.stub(), first, deadline, retry, on_header);
  for (auto& t : streams) t.join();
  for (const auto& r : results) {
    if (st.ok() && !r.ok()) st = r;
  }
  if (single) {
    pb::GetRequest whole_request = request;
    return GetFrom(shard, whole_request, deadline, retry, destination, on_chunk, observer_verifies,
                   out, /*split=*/false);
  }
  return st;
}

std::string KvClientImpl::LocalDirOf(Shard& shard, absl::Time deadline) {
  if (!options_.local_fast_path) return "";
  if (auto known = shard.local_dir(); known.has_value()) return *known;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(1))));
  AddBearerToken(context, options_.auth_token.get());
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
                                        const ChunkObserver& on_chunk, bool observer_verifies,
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
  ASSIGN_OR_RETURN(const Scatter dst,
                   Scatter::Of(std::move(spans), layout->total_size, on_chunk, observer_verifies));
  const std::vector<uint32_t> crcs(response.chunk_crc32c().begin(), response.chunk_crc32c().end());
  bool corrupt = false;
  absl::Status read =
      ReadValueFile(fd->get(), *layout, crcs, dst,
                    ThreadsFor(layout->total_size, options_.local_read_threads), &corrupt);
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

}  // namespace lazyrag::kvstore::client_internal
