#include "kvstore/kvstore_handler.h"

#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/status.h"

namespace lazyrag::kvstore {

using lazyrag::v1::DeleteRequest;
using lazyrag::v1::DeleteResponse;
using lazyrag::v1::GetRequest;
using lazyrag::v1::GetResponse;
using lazyrag::v1::PutRequest;
using lazyrag::v1::PutResponse;
using lazyrag::v1::StatRequest;
using lazyrag::v1::StatResponse;

absl::StatusOr<PutResponse> KvStoreHandler::Put(MessageReader<PutRequest>& in) {
  auto result = DoPut(in);
  metrics_->CountRequest("put", result.status());
  return result;
}

absl::Status KvStoreHandler::Get(const GetRequest& request, MessageWriter<GetResponse>& out) {
  absl::Status status = DoGet(request, out);
  metrics_->CountRequest("get", status);
  return status;
}

absl::StatusOr<StatResponse> KvStoreHandler::Stat(const StatRequest& request) {
  auto result = DoStat(request);
  metrics_->CountRequest("stat", result.status());
  return result;
}

absl::StatusOr<DeleteResponse> KvStoreHandler::Delete(const DeleteRequest& request) {
  auto result = DoDelete(request);
  metrics_->CountRequest("delete", result.status());
  return result;
}

absl::StatusOr<lazyrag::v1::DescribeResponse> KvStoreHandler::Describe() const {
  lazyrag::v1::DescribeResponse response;
  response.set_local_dir(local_dir_);
  response.set_local_token(local_token_);
  return response;
}

absl::StatusOr<lazyrag::v1::GetLocalResponse> KvStoreHandler::GetLocal(
    const lazyrag::v1::GetLocalRequest& request) {
  auto result = DoGetLocal(request);
  metrics_->CountRequest("get", result.status());
  return result;
}

absl::StatusOr<PutResponse> KvStoreHandler::PutLocal(const lazyrag::v1::PutLocalRequest& request) {
  auto result = DoPutLocal(request);
  metrics_->CountRequest("put", result.status());
  return result;
}

absl::StatusOr<lazyrag::v1::GetLocalResponse> KvStoreHandler::DoGetLocal(
    const lazyrag::v1::GetLocalRequest& request) {
  if (local_dir_.empty()) {
    return absl::FailedPreconditionError("get: this shard does not serve same-host clients");
  }
  ASSIGN_OR_RETURN(const std::string key, EncodeKey(request.key()));
  ASSIGN_OR_RETURN(std::unique_ptr<ValueReader> reader, engine_->Open(key));
  if (reader->file_path().empty()) {
    return absl::FailedPreconditionError("get: this shard keeps no value files");
  }
  lazyrag::v1::GetLocalResponse response;
  LayoutToProto(reader->layout(), response.mutable_value());
  response.set_path(reader->file_path());
  const auto crcs = reader->chunk_crcs();
  response.mutable_chunk_crc32c()->Assign(crcs.begin(), crcs.end());
  metrics_->CountBytes("out", reader->layout().total_size);
  return response;
}

absl::StatusOr<PutResponse> KvStoreHandler::DoPutLocal(
    const lazyrag::v1::PutLocalRequest& request) {
  if (local_dir_.empty()) {
    return absl::FailedPreconditionError("put: this shard does not serve same-host clients");
  }
  const std::string& name = request.file();
  if (name.empty() || name.size() > 255 || name == "." || name == ".." ||
      name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("put: the file must be a plain name in incoming/");
  }
  const std::string path = absl::StrCat(local_dir_, "/incoming/", name);
  absl::Status bad;
  auto key = EncodeKey(request.header().key());
  auto layout = LayoutFromProto(request.header().value());
  if (!key.ok()) {
    bad = key.status();
  } else if (!layout.ok()) {
    bad = layout.status();
  } else if (uint64_t(request.chunk_crc32c_size()) != layout->num_chunks) {
    bad = absl::InvalidArgumentError(absl::StrCat("put: ", request.chunk_crc32c_size(),
                                                  " chunk checksums for ", layout->num_chunks,
                                                  " chunks"));
  }
  if (!bad.ok()) {
    ::unlink(path.c_str());
    return bad;
  }
  const std::vector<uint32_t> crcs(request.chunk_crc32c().begin(), request.chunk_crc32c().end());
  auto replaced = engine_->PutFile(*key, *layout, crcs, path);
  if (absl::IsDataLoss(replaced.status())) metrics_->CountCorruption("transit");
  if (!replaced.ok()) {
    return absl::Status(replaced.status().code(),
                        absl::StrCat("put: ", replaced.status().message()));
  }
  metrics_->CountBytes("in", layout->total_size);
  PutResponse response;
  response.set_stored_bytes(layout->total_size);
  response.set_replaced(*replaced);
  return response;
}

absl::StatusOr<PutResponse> KvStoreHandler::DoPut(MessageReader<PutRequest>& in) {
  PutRequest message;
  if (!in.Read(&message)) {
    const absl::Status ended = in.EndedBy();
    if (!ended.ok()) return absl::Status(ended.code(), absl::StrCat("put: ", ended.message()));
    return absl::InvalidArgumentError("put: empty stream, no header");
  }
  if (!message.has_header()) {
    return absl::InvalidArgumentError("put: the first message must be the header");
  }
  ASSIGN_OR_RETURN(const std::string key, EncodeKey(message.header().key()));
  ASSIGN_OR_RETURN(const ValueLayout layout, LayoutFromProto(message.header().value()));
  ASSIGN_OR_RETURN(std::unique_ptr<PutSession> session, engine_->BeginPut(key, layout));
  // On any return before Commit() the session is destroyed and its chunks dropped.
  uint32_t next = 0;
  while (in.Read(&message)) {
    if (message.has_header()) {
      return absl::InvalidArgumentError("put: a second header in one stream");
    }
    if (!message.has_chunk()) return absl::InvalidArgumentError("put: empty message");
    const lazyrag::v1::Chunk& chunk = message.chunk();
    if (chunk.index() != next) {
      return absl::InvalidArgumentError(absl::StrCat("put: chunk ", chunk.index(),
                                                     " arrived where chunk ", next,
                                                     " was expected (chunks must come in order)"));
    }
    if (next >= layout.num_chunks) {
      return absl::InvalidArgumentError(
          absl::StrCat("put: more chunks than the ", layout.num_chunks, " the header announced"));
    }
    if (chunk.data().size() > kMaxChunkBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("put: chunk ", next, " has ", chunk.data().size(),
                       " bytes, above the limit of ", kMaxChunkBytes));
    }
    const uint64_t want = layout.ChunkEnd(next) - layout.ChunkBegin(next);
    if (chunk.data().size() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "put: chunk ", next, " has ", chunk.data().size(), " bytes, the header says ", want));
    }
    if (Crc32c(chunk.data()) != chunk.crc32c()) {
      metrics_->CountCorruption("transit");
      return absl::DataLossError(
          absl::StrCat("put: chunk ", next, " does not match its CRC-32C (corrupted in transit)"));
    }
    RETURN_IF_ERROR(session->AddChunk(next, chunk.data(), chunk.crc32c()));
    metrics_->CountBytes("in", chunk.data().size());
    ++next;
  }
  if (next != layout.num_chunks) {
    // A client that gave up (cancelled, or its deadline passed) is not a malformed request.
    const absl::Status ended = in.EndedBy();
    if (!ended.ok()) {
      return absl::Status(ended.code(),
                          absl::StrCat("put: ", ended.message(), " after ", next, " of ",
                                       layout.num_chunks, " chunks; nothing stored"));
    }
    return absl::InvalidArgumentError(absl::StrCat("put: the stream ended after ", next, " of ",
                                                   layout.num_chunks, " chunks; nothing stored"));
  }
  ASSIGN_OR_RETURN(const bool replaced, session->Commit());
  PutResponse response;
  response.set_stored_bytes(layout.total_size);
  response.set_replaced(replaced);
  return response;
}

absl::Status KvStoreHandler::DoGet(const GetRequest& request, MessageWriter<GetResponse>& out) {
  ASSIGN_OR_RETURN(const std::string key, EncodeKey(request.key()));
  const bool by_chunks = request.first_chunk() != 0 || request.num_chunks() != 0;
  if (by_chunks && (request.first_layer() != 0 || request.num_layers() != 0)) {
    return absl::InvalidArgumentError("get: a chunk range and a layer range in one request");
  }
  if (by_chunks && request.num_chunks() == 0) {
    return absl::InvalidArgumentError("get: first_chunk set but num_chunks is 0");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ValueReader> reader, engine_->Open(key));
  if (request.version() != 0 && reader->version() != request.version()) {
    return absl::AbortedError("get: the key holds another version now (replaced or evicted)");
  }
  const ValueLayout& layout = reader->layout();
  ByteRange range;
  if (by_chunks) {
    if (request.first_chunk() >= layout.num_chunks) {
      return absl::OutOfRangeError(
          absl::StrCat("get: chunk ", request.first_chunk(), " of ", layout.num_chunks));
    }
    const uint32_t last = static_cast<uint32_t>(std::min<uint64_t>(
        uint64_t{request.first_chunk()} + request.num_chunks(), layout.num_chunks));
    range = {layout.ChunkBegin(request.first_chunk()), layout.ChunkEnd(last - 1)};
  } else {
    ASSIGN_OR_RETURN(range, LayerRange(layout, request.first_layer(), request.num_layers()));
  }
  GetResponse reply;
  auto* header = reply.mutable_header();
  LayoutToProto(layout, header->mutable_value());
  header->set_range_begin(range.begin);
  header->set_range_end(range.end);
  header->set_version(reader->version());
  if (!out.Write(reply)) return absl::CancelledError("get: the client went away");

  std::string partial;
  uint32_t crc = 0;
  uint32_t out_index = 0;
  if (range.end > range.begin) {
    const uint32_t first = static_cast<uint32_t>(range.begin / layout.chunk_size);
    const uint32_t last = static_cast<uint32_t>((range.end - 1) / layout.chunk_size);
    for (uint32_t i = first; i <= last; ++i) {
      auto* chunk = reply.mutable_chunk();  // its buffer is reused from chunk to chunk
      chunk->set_index(out_index++);
      const uint64_t chunk_begin = layout.ChunkBegin(i), chunk_end = layout.ChunkEnd(i);
      if (range.begin <= chunk_begin && chunk_end <= range.end) {
        // Read into the message; the writer's checksum travels on unchanged: end to end.
        std::string* data = chunk->mutable_data();
        data->resize(chunk_end - chunk_begin);
        RETURN_IF_ERROR(reader->ReadChunkInto(i, data->data(), &crc));
        chunk->set_crc32c(crc);
      } else {
        // Verified against the stored checksum by the read; the slice gets its own.
        RETURN_IF_ERROR(reader->ReadChunk(i, &partial, &crc));
        const uint64_t begin = std::max(range.begin, chunk_begin) - chunk_begin;
        const uint64_t end = std::min(range.end, chunk_end) - chunk_begin;
        chunk->set_data(partial.substr(begin, end - begin));
        chunk->set_crc32c(Crc32c(chunk->data()));
      }
      metrics_->CountBytes("out", chunk->data().size());
      if (!out.Write(reply)) return absl::CancelledError("get: the client went away");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StatResponse> KvStoreHandler::DoStat(const StatRequest& request) {
  if (request.keys_size() == 0) return absl::InvalidArgumentError("stat: no keys");
  if (static_cast<size_t>(request.keys_size()) > kMaxStatKeys) {
    return absl::InvalidArgumentError(
        absl::StrCat("stat: ", request.keys_size(), " keys, at most ", kMaxStatKeys));
  }
  StatResponse response;
  for (const auto& k : request.keys()) {
    ASSIGN_OR_RETURN(const std::string key, EncodeKey(k));
    ASSIGN_OR_RETURN(const KeyStat stat, engine_->Stat(key));
    auto* s = response.add_stats();
    s->set_present(stat.present);
    s->set_size(stat.size);
    s->set_last_access_unix_ms(stat.last_access_unix_ms);
  }
  return response;
}

absl::StatusOr<DeleteResponse> KvStoreHandler::DoDelete(const DeleteRequest& request) {
  ASSIGN_OR_RETURN(const std::string key, EncodeKey(request.key()));
  ASSIGN_OR_RETURN(const bool existed, engine_->Delete(key));
  DeleteResponse response;
  response.set_existed(existed);
  return response;
}

}  // namespace lazyrag::kvstore
