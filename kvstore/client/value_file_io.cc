#include "kvstore/client/value_file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/status.h"

namespace lazyrag::kvstore {
namespace {

// Values at least this large are moved by several threads.
constexpr uint64_t kParallelBytes = 64ull << 20;
// Bytes read (or copied), checksummed and shown to a ChunkObserver at a time: small enough to
// stay in a core's L2 cache between the three, a multiple of the workers' 256 KiB MAC block.
constexpr uint64_t kObserveStep = 512ull << 10;
// Bytes written after which the kernel is told to start writing them out.
constexpr uint64_t kWriteBehindBytes = 16ull << 20;

// Runs fn(first, last) over [0, n) cut into at most `threads` contiguous ranges, each on its
// own thread but the first; returns the first error.
absl::Status ForRanges(uint32_t n, int threads,
                       const std::function<absl::Status(uint32_t, uint32_t)>& fn) {
  threads = std::max(1, std::min<int>(threads, static_cast<int>(n)));
  if (threads <= 1) return fn(0, n);
  std::vector<absl::Status> results(threads);
  std::vector<std::thread> workers;
  auto bound = [&](int t) { return uint32_t(uint64_t(n) * t / threads); };
  for (int t = 1; t < threads; ++t) {
    workers.emplace_back([&, t] { results[t] = fn(bound(t), bound(t + 1)); });
  }
  results[0] = fn(0, bound(1));
  for (auto& w : workers) w.join();
  for (auto& r : results) {
    if (!r.ok()) return r;
  }
  return absl::OkStatus();
}

// Reads [begin, begin + size) of `fd` into the pieces of `scatter` and returns the CRC-32C of
// the bytes read (0 when the scatter skips CRCs). The bytes go in steps of kObserveStep (aligned
// to value offsets): each step is read, checksummed and shown to the observer (if any) while it
// is in the core's cache.
absl::StatusOr<uint32_t> ReadInto(int fd, const Scatter& scatter, uint64_t begin, uint64_t size) {
  uint32_t crc = 0;
  for (const MutableBytes& piece : scatter.Pieces(begin, size)) {
    for (uint64_t done = 0; done < piece.size;) {
      const uint64_t n = std::min(kObserveStep - begin % kObserveStep, piece.size - done);
      char* at = piece.data + done;
      RETURN_IF_ERROR(PreadAll(fd, at, n, begin));
      if (!scatter.skips_crc()) crc = Crc32cExtend(crc, std::string_view(at, n));
      if (scatter.observed()) scatter.Observe(begin, at, n);
      begin += n;
      done += n;
    }
  }
  return crc;
}

}  // namespace

absl::StatusOr<Scatter> Scatter::Of(std::vector<MutableBytes> spans, uint64_t bytes,
                                    ChunkObserver observer, bool observer_verifies) {
  Scatter s;
  s.skip_crc_ = observer_verifies && observer != nullptr;
  s.observer_ = std::move(observer);
  uint64_t at = 0;
  for (const MutableBytes& span : spans) {
    if (span.size == 0) continue;
    s.spans_.push_back(span);
    s.starts_.push_back(at);
    at += span.size;
  }
  if (at < bytes) {
    return absl::InternalError(
        absl::StrCat("get: the destination holds ", at, " bytes, the value ", bytes));
  }
  return s;
}

std::vector<MutableBytes> Scatter::Pieces(uint64_t begin, uint64_t size) const {
  std::vector<MutableBytes> out;
  auto it = std::upper_bound(starts_.begin(), starts_.end(), begin);
  for (size_t i = size_t(it - starts_.begin()) - 1; size > 0 && i < spans_.size(); ++i) {
    const uint64_t offset = begin - starts_[i];
    const uint64_t n = std::min(size, spans_[i].size - offset);
    out.push_back({spans_[i].data + offset, n});
    begin += n;
    size -= n;
  }
  return out;
}

void Scatter::Write(uint64_t begin, std::string_view data) const {
  for (const MutableBytes& piece : Pieces(begin, data.size())) {
    std::memcpy(piece.data, data.data(), piece.size);
    data.remove_prefix(piece.size);
  }
}

uint32_t Scatter::Land(uint64_t begin, std::string_view data) const {
  uint32_t crc = 0;
  for (const MutableBytes& piece : Pieces(begin, data.size())) {
    for (uint64_t done = 0; done < piece.size;) {
      const uint64_t n = std::min(kObserveStep - begin % kObserveStep, piece.size - done);
      char* at = piece.data + done;
      std::memcpy(at, data.data(), n);
      if (!skip_crc_) crc = Crc32cExtend(crc, std::string_view(at, n));
      if (observer_) observer_(begin, at, n);
      data.remove_prefix(n);
      begin += n;
      done += n;
    }
  }
  return crc;
}

int ThreadsFor(uint64_t bytes, int max_threads) {
  return bytes >= kParallelBytes ? std::max(1, max_threads) : 1;
}

absl::Status ReadValueFile(int fd, const ValueLayout& layout, std::span<const uint32_t> crcs,
                           const Scatter& dst, int threads, bool* corrupt) {
  std::atomic<bool> bad{false};
  absl::Status read = ForRanges(layout.num_chunks, threads, [&](uint32_t first, uint32_t last) {
    for (uint32_t i = first; i < last; ++i) {
      const uint64_t begin = layout.ChunkBegin(i), size = layout.ChunkEnd(i) - begin;
      absl::StatusOr<uint32_t> crc = ReadInto(fd, dst, begin, size);
      if (!crc.ok()) {
        return absl::Status(
            crc.status().code(),
            absl::StrCat("chunk ", i, " of the value file: ", crc.status().message()));
      }
      if (!dst.skips_crc() && *crc != crcs[i]) {
        bad = true;
        return absl::DataLossError(absl::StrCat("chunk ", i, " failed its CRC-32C check"));
      }
    }
    return absl::OkStatus();
  });
  *corrupt = bad.load();
  return read;
}

absl::Status WriteValueFile(int fd, std::string_view value, std::span<const ValueFileChunk> chunks,
                            int threads) {
  return ForRanges(uint32_t(chunks.size()), threads, [&](uint32_t first, uint32_t last) {
    uint64_t behind = first < last ? chunks[first].offset : 0;
    for (uint32_t i = first; i < last; ++i) {
      RETURN_IF_ERROR(
          PwriteAll(fd, value.substr(chunks[i].offset, chunks[i].size), chunks[i].offset));
      const uint64_t end = chunks[i].offset + chunks[i].size;
      if (end - behind >= kWriteBehindBytes) {
        (void)::sync_file_range(fd, off_t(behind), off_t(end - behind), SYNC_FILE_RANGE_WRITE);
        behind = end;
      }
    }
    return absl::OkStatus();
  });
}

bool HoldsLocalToken(const std::string& dir, const std::string& token) {
  auto fd = OpenFile(dir + "/local-token", O_RDONLY);
  if (!fd.ok()) return false;
  std::string held(token.size() + 1, '\0');
  const ssize_t n = ::pread(fd->get(), held.data(), held.size(), 0);
  return n == ssize_t(token.size()) && held.compare(0, size_t(n), token) == 0;
}

}  // namespace lazyrag::kvstore
