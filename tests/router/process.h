// Child processes and loopback helpers for the router's integration tests.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lazyrag::router::testing {

// A free TCP port on 127.0.0.1 (bound and released; another process could take it meanwhile,
// which loopback tests accept).
int PickFreePort();

// A child process. Stdout is piped back when `capture_stdout` (read it with WaitForLine; the
// child must not write much more than that line), else it goes to /dev/null; stderr is
// inherited. The destructor kills it (SIGKILL) if it still runs.
class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> argv, bool capture_stdout = true);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  absl::Status Start();
  // The first stdout line that starts with `prefix`. DEADLINE_EXCEEDED after `timeout`,
  // UNAVAILABLE when the process closed its stdout (exited) first.
  absl::StatusOr<std::string> WaitForLine(const std::string& prefix, absl::Duration timeout);
  // Sends `signal`, waits up to `timeout` for the exit, then SIGKILLs. Returns the exit code,
  // or -signal when killed by one.
  int Stop(int signal, absl::Duration timeout = absl::Seconds(10));
  void Kill() { Stop(9); }
  // Waits for the exit (no signal sent); -1000 on timeout.
  int Wait(absl::Duration timeout);
  bool running() const { return pid_ > 0; }

 private:
  std::vector<std::string> argv_;
  const bool capture_stdout_;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffered_;
};

// The value of `key=` in a "... key=value ..." line ("" when absent).
std::string FieldOf(const std::string& line, const std::string& key);

}  // namespace lazyrag::router::testing
