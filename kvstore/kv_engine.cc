#include "kvstore/kv_engine.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/status.h"

namespace lazyrag::kvstore {

absl::Status ValueReader::ReadChunkInto(uint32_t index, char* dst, uint32_t* crc32c) {
  std::string data;
  RETURN_IF_ERROR(ReadChunk(index, &data, crc32c));
  std::memcpy(dst, data.data(), data.size());
  return absl::OkStatus();
}

absl::StatusOr<bool> KvEngine::PutFile(std::string_view key, const ValueLayout& layout,
                                       std::span<const uint32_t> crcs, const std::string& path) {
  absl::Cleanup consumed = [&path] { ::unlink(path.c_str()); };
  if (crcs.size() != layout.num_chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat(crcs.size(), " chunk checksums for ", layout.num_chunks, " chunks"));
  }
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY | O_NOFOLLOW));
  ASSIGN_OR_RETURN(std::unique_ptr<PutSession> session, BeginPut(key, layout));
  std::string chunk;
  for (uint32_t i = 0; i < layout.num_chunks; ++i) {
    chunk.resize(layout.ChunkEnd(i) - layout.ChunkBegin(i));
    RETURN_IF_ERROR(PreadAll(fd.get(), chunk.data(), chunk.size(), layout.ChunkBegin(i)));
    if (Crc32c(chunk) != crcs[i]) {
      return absl::DataLossError(absl::StrCat("chunk ", i, " does not match its CRC-32C"));
    }
    RETURN_IF_ERROR(session->AddChunk(i, chunk, crcs[i]));
  }
  return session->Commit();
}

}  // namespace lazyrag::kvstore
