#include "kvstore/value_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/logging.h"

namespace lazyrag::kvstore {
namespace {

constexpr char kStagingSuffix[] = ".part";

absl::Status MakeDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("creating ", dir));
  }
  return absl::OkStatus();
}

std::string GenName(uint64_t gen) {
  char name[17];
  std::snprintf(name, sizeof(name), "%016" PRIx64, gen);
  return name;
}

// The generation a name in values/ stands for; false for any other name.
bool ParseGenName(std::string_view name, uint64_t* gen) {
  if (name.size() != 16) return false;
  uint64_t v = 0;
  for (char c : name) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | uint64_t(d);
  }
  *gen = v;
  return true;
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, absl::StrCat("listing ", dir));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(d);
  return names;
}

}  // namespace

absl::StatusOr<ValueFiles> ValueFiles::Open(const std::string& data_dir) {
  ValueFiles files(data_dir + "/values", data_dir + "/incoming");
  if (auto st = MakeDir(files.values_dir_); !st.ok()) return st;
  if (auto st = MakeDir(files.incoming_dir_); !st.ok()) return st;
  return files;
}

std::string ValueFiles::PathOf(uint64_t gen) const {
  return absl::StrCat(values_dir_, "/", GenName(gen));
}

std::string ValueFiles::StagingPathOf(uint64_t gen) const {
  return absl::StrCat(values_dir_, "/", GenName(gen), kStagingSuffix);
}

absl::StatusOr<UniqueFd> ValueFiles::CreateStaging(uint64_t gen) const {
  return OpenFile(StagingPathOf(gen), O_WRONLY | O_CREAT | O_EXCL, 0600);
}

void ValueFiles::RemoveStaging(uint64_t gen) const {
  const std::string path = StagingPathOf(gen);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    LOG_WARNING << "kvstore: removing " << path << ": " << std::strerror(errno);
  }
}

absl::Status ValueFiles::Publish(int fd, const std::string& path, uint64_t gen, bool sync) const {
  if (sync && ::fdatasync(fd) != 0) return ErrnoStatus(errno, absl::StrCat("syncing ", path));
  // Read-only from now on: a value file never changes.
  (void)::fchmod(fd, 0400);
  const std::string final_path = PathOf(gen);
  if (::rename(path.c_str(), final_path.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("renaming ", path, " to ", final_path));
  }
  if (sync) return SyncDirectory(values_dir_);
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> ValueFiles::OpenForRead(uint64_t gen) const {
  return OpenFile(PathOf(gen), O_RDONLY);
}

void ValueFiles::Remove(uint64_t gen) const {
  const std::string path = PathOf(gen);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    LOG_WARNING << "kvstore: removing " << path << ": " << std::strerror(errno);
  }
}

absl::StatusOr<uint64_t> ValueFiles::RemoveUnreferenced(
    const std::function<bool(uint64_t)>& live) const {
  uint64_t removed = 0;
  auto remove = [&](const std::string& path) {
    if (::unlink(path.c_str()) == 0) {
      ++removed;
    } else if (errno != ENOENT) {
      LOG_WARNING << "kvstore: removing " << path << ": " << std::strerror(errno);
    }
  };
  auto values = ListDir(values_dir_);
  if (!values.ok()) return values.status();
  for (const std::string& name : *values) {
    uint64_t gen = 0;
    if (ParseGenName(name, &gen) && live(gen)) continue;
    remove(absl::StrCat(values_dir_, "/", name));
  }
  auto incoming = ListDir(incoming_dir_);
  if (!incoming.ok()) return incoming.status();
  for (const std::string& name : *incoming) remove(absl::StrCat(incoming_dir_, "/", name));
  return removed;
}

absl::StatusOr<std::vector<uint64_t>> ValueFiles::Generations() const {
  auto names = ListDir(values_dir_);
  if (!names.ok()) return names.status();
  std::vector<uint64_t> gens;
  for (const std::string& name : *names) {
    uint64_t gen = 0;
    if (ParseGenName(name, &gen)) gens.push_back(gen);
  }
  return gens;
}

namespace {
constexpr uint64_t kTrailerMagic = 0x31525456414c5a4cull;  // "LZLAVTR1" little-endian
constexpr size_t kTrailerTail = 16;

void PutU32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
uint32_t GetU32(const char* p) {
  const auto* u = reinterpret_cast<const uint8_t*>(p);
  return uint32_t{u[0]} | (uint32_t{u[1]} << 8) | (uint32_t{u[2]} << 16) | (uint32_t{u[3]} << 24);
}
}  // namespace

absl::Status WriteTrailer(int fd, uint64_t at, std::string_view key, std::string_view record) {
  std::string body;
  PutU32(static_cast<uint32_t>(key.size()), &body);
  body.append(key);
  body.append(record);
  std::string out = body;
  PutU32(static_cast<uint32_t>(body.size()), &out);
  PutU32(Crc32c(body), &out);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(kTrailerMagic >> (8 * i)));
  return PwriteAll(fd, out, at);
}

absl::StatusOr<Trailer> ReadTrailer(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "stat of a value file");
  const uint64_t size = uint64_t(st.st_size);
  if (size < kTrailerTail) return absl::DataLossError("value file without a trailer");
  char tail[kTrailerTail];
  if (auto s = PreadAll(fd, tail, kTrailerTail, size - kTrailerTail); !s.ok()) return s;
  uint64_t magic = 0;
  for (int i = 7; i >= 0; --i) magic = (magic << 8) | static_cast<uint8_t>(tail[8 + i]);
  const uint32_t body_size = GetU32(tail), crc = GetU32(tail + 4);
  if (magic != kTrailerMagic || body_size < 4 || body_size > size - kTrailerTail ||
      body_size > (1u << 20)) {
    return absl::DataLossError("value file without a valid trailer");
  }
  std::string body(body_size, '\0');
  if (auto s = PreadAll(fd, body.data(), body_size, size - kTrailerTail - body_size); !s.ok()) {
    return s;
  }
  if (Crc32c(body) != crc) return absl::DataLossError("value file trailer fails its CRC-32C");
  const uint32_t key_size = GetU32(body.data());
  if (key_size > body_size - 4) return absl::DataLossError("value file trailer malformed");
  Trailer t;
  t.key = body.substr(4, key_size);
  t.record = body.substr(4 + key_size);
  return t;
}

absl::Status VerifyValueFile(int fd, const ValueLayout& layout, std::span<const uint32_t> crcs) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "stat of a value file");
  if (uint64_t(st.st_size) != layout.total_size) {  // as handed over: no trailer yet
    return absl::DataLossError(
        absl::StrCat("value file has ", st.st_size, " bytes, ", layout.total_size, " expected"));
  }
  if (crcs.size() != layout.num_chunks) {
    return absl::DataLossError(
        absl::StrCat(crcs.size(), " chunk checksums for ", layout.num_chunks, " chunks"));
  }
  if (layout.total_size == 0) return absl::OkStatus();
  void* map = ::mmap(nullptr, layout.total_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) return ErrnoStatus(errno, "mapping a value file");
  (void)::madvise(map, layout.total_size, MADV_SEQUENTIAL);
  const char* base = static_cast<const char*>(map);
  absl::Status status;
  for (uint32_t i = 0; i < layout.num_chunks && status.ok(); ++i) {
    const std::string_view chunk(base + layout.ChunkBegin(i),
                                 layout.ChunkEnd(i) - layout.ChunkBegin(i));
    if (Crc32c(chunk) != crcs[i]) {
      status = absl::DataLossError(absl::StrCat("chunk ", i, " does not match its CRC-32C"));
    }
  }
  ::munmap(map, layout.total_size);
  return status;
}

}  // namespace lazyrag::kvstore
