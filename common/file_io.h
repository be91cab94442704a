// POSIX file descriptors with ownership, and whole-range reads and writes that report errno as
// a status. What the kvstore's value files and its same-host clients share.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lazyrag {

// Owns one file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// An error status for a failed system call: the errno's kind (ENOENT -> NOT_FOUND, ENOSPC ->
// RESOURCE_EXHAUSTED, EACCES/EPERM -> PERMISSION_DENIED, else INTERNAL) and "what: strerror".
absl::Status ErrnoStatus(int err, std::string_view what);

// open(2) with O_CLOEXEC added. `what` names the file in errors.
absl::StatusOr<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode = 0600);
// Reads exactly `size` bytes at `offset` (retrying short reads and EINTR); DATA_LOSS when the
// file ends first.
absl::Status PreadAll(int fd, char* dst, size_t size, uint64_t offset);
// Writes exactly `data` at `offset` (retrying short writes and EINTR).
absl::Status PwriteAll(int fd, std::string_view data, uint64_t offset);
// fsync(2) of a directory, so that names created or renamed in it survive a machine crash.
absl::Status SyncDirectory(const std::string& dir);

}  // namespace lazyrag
