// Child processes for the tests and benchmarks that run the lazyrag binaries (kvstore,
// worker, router) on loopback: fork/exec, their "ready" line, signals, free ports. One
// implementation for the kvstore, worker and router process tests and kvstore_bench.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lazyrag::testing {

// A free TCP port on 127.0.0.1 (bound and released; another process could take it meanwhile,
// which loopback tests accept). 0 when none could be bound.
int PickFreePort();

// A child process (argv[0] found on PATH unless it holds a slash). Stdout is piped back when
// `capture_stdout` (read it with WaitForLine; the child must not write much more than the
// lines waited for), else it goes to the file given by SetOutputFiles or to /dev/null; stderr
// is inherited unless SetOutputFiles names a file for it. The destructor kills the child
// (SIGKILL) if it still runs.
class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> argv, bool capture_stdout = true);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Before Start: where stdout (when not captured) and stderr go; "" keeps the default.
  void SetOutputFiles(std::string stdout_path, std::string stderr_path);

  absl::Status Start();
  // The first stdout line that starts with `prefix` ("" : the next line). DEADLINE_EXCEEDED
  // after `timeout`, UNAVAILABLE when the process closed its stdout (exited) first.
  absl::StatusOr<std::string> WaitForLine(const std::string& prefix, absl::Duration timeout);
  // Sends `signal`, waits up to `timeout` for the exit, then SIGKILLs. Returns the exit code,
  // or -signal when killed by one; -1000 when not running.
  int Stop(int signal, absl::Duration timeout = absl::Seconds(10));
  void Kill() { Stop(9); }
  // Waits for the exit (no signal sent); -1000 on timeout or when not running.
  int Wait(absl::Duration timeout);
  // Whether the child has not exited (reaps it when it has).
  bool Alive();
  bool running() const { return pid_ > 0; }
  const std::string& binary() const { return argv_[0]; }

 private:
  std::vector<std::string> argv_;
  const bool capture_stdout_;
  std::string stdout_path_, stderr_path_;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffered_;
};

// The line a lazyrag server prints on stdout once it serves (common/server_main.h):
// "NAME ready grpc=HOST:PORT metrics=PORT".
struct ReadyLine {
  std::string address;  // HOST:PORT
  int metrics_port = 0;
};
// Reads the child's next stdout line and parses it as the ready line; UNAVAILABLE when the
// child exits or prints something else first, DEADLINE_EXCEEDED after `timeout`.
absl::StatusOr<ReadyLine> WaitForReady(ChildProcess& process, absl::Duration timeout);

// The value of `key=` in a "... key=value ..." line ("" when absent).
std::string FieldOf(const std::string& line, const std::string& key);

}  // namespace lazyrag::testing
