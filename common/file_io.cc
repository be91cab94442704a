#include "common/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lazyrag {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

absl::Status ErrnoStatus(int err, std::string_view what) {
  const std::string message = absl::StrCat(std::string(what), ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("opening ", path));
  return UniqueFd(fd);
}

absl::Status PreadAll(int fd, char* dst, size_t size, uint64_t offset) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, dst, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "reading a file");
    }
    if (n == 0) return absl::DataLossError(absl::StrCat("file ends ", size, " bytes early"));
    dst += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status PwriteAll(int fd, std::string_view data, uint64_t offset) {
  while (!data.empty()) {
    const ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "writing a file");
    }
    data.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  auto fd = OpenFile(dir, O_RDONLY | O_DIRECTORY);
  if (!fd.ok()) return fd.status();
  if (::fsync(fd->get()) != 0) return ErrnoStatus(errno, absl::StrCat("syncing ", dir));
  return absl::OkStatus();
}

}  // namespace lazyrag
