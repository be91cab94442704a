// Helpers for kvstore tests: temporary directories, deterministic bytes, and real server
// processes on loopback ports.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/testing/child_process.h"

namespace lazyrag::kvstore::testing {

// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// `size` pseudo-random bytes determined by `seed`.
std::string PatternBytes(uint64_t size, uint64_t seed);

// Flips one bit of the byte at `offset` of the file at `path` (a stored value file, read-only:
// made writable for the change and read-only again), as a failing disk would.
absl::Status FlipByte(const std::string& path, uint64_t offset);

// A lazyrag server child process (kvstore, worker, router) that prints one line
// "NAME ready grpc=HOST:PORT metrics=PORT" on stdout once serving (common/server_main.h);
// stderr is inherited.
class ReadyProcess {
 public:
  ReadyProcess() = default;
  ReadyProcess(const ReadyProcess&) = delete;
  ReadyProcess& operator=(const ReadyProcess&) = delete;
  ~ReadyProcess() { Stop(9); }

  // Starts argv[0] with argv, then waits for the ready line. UNAVAILABLE (and the child
  // killed) when it exits or prints something else first.
  absl::Status Start(std::vector<std::string> argv);
  // Sends `signal` and waits for the process to exit (SIGKILL after a minute); no-op when
  // not running.
  void Stop(int signal);
  bool running() const { return process_ != nullptr && process_->running(); }
  const std::string& address() const { return address_; }  // HOST:PORT of the ready line
  int metrics_port() const { return metrics_port_; }

 private:
  std::unique_ptr<lazyrag::testing::ChildProcess> process_;
  std::string address_;
  int metrics_port_ = 0;
};

// A lazyrag-kvstore child process. Start() waits for its "ready" line; the gRPC and metrics
// ports it reports are kept, so Restart() brings it back on the same ones.
class KvStoreProcess {
 public:
  // `binary`: path of lazyrag-kvstore. `extra_args` are appended (e.g. --capacity_bytes=N).
  KvStoreProcess(std::string binary, std::string data_dir,
                 std::vector<std::string> extra_args = {});
  ~KvStoreProcess();  // SIGKILL if still running

  absl::Status Start();  // first start: picks free ports
  absl::Status Restart() { return Start(); }
  // Sends `signal` and waits for the process to exit.
  void Stop(int signal);
  void Kill() { Stop(9); }
  bool running() const { return process_.running(); }

  const std::string& address() const { return process_.address(); }  // 127.0.0.1:PORT
  int metrics_port() const { return metrics_port_; }
  const std::string& data_dir() const { return data_dir_; }

 private:
  const std::string binary_;
  const std::string data_dir_;
  const std::vector<std::string> extra_args_;
  ReadyProcess process_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
};

// Runs `argv` to completion; returns its exit code (or -signal). Stdout goes to `stdout_file`
// when not empty.
int RunProcess(const std::vector<std::string>& argv, const std::string& stdout_file = "");

// GET http://127.0.0.1:PORT/metrics.
absl::StatusOr<std::string> FetchMetrics(int port);
// The value of the sample line `name_and_labels` (e.g. `lazyrag_kvstore_entries` or
// `x_total{a="b"}`) in an exposition text; -1 when missing.
double MetricValue(const std::string& exposition, const std::string& name_and_labels);

}  // namespace lazyrag::kvstore::testing
