#include "kvstore/tests/test_util.h"

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"

namespace lazyrag::kvstore::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(base != nullptr ? base : "/tmp", "/lazyrag_kv_XXXXXX");
  char* made = mkdtemp(templ.data());
  path_ = made != nullptr ? made : "";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

absl::Status FlipByte(const std::string& path, uint64_t offset) {
  if (::chmod(path.c_str(), 0600) != 0) return ErrnoStatus(errno, "chmod " + path);
  absl::Status status;
  {
    auto fd = OpenFile(path, O_RDWR);
    if (!fd.ok()) return fd.status();
    char byte = 0;
    status = PreadAll(fd->get(), &byte, 1, offset);
    byte ^= 0x20;
    if (status.ok()) status = PwriteAll(fd->get(), std::string_view(&byte, 1), offset);
  }
  (void)::chmod(path.c_str(), 0400);
  return status;
}

std::string PatternBytes(uint64_t size, uint64_t seed) {
  std::string out(size, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, 8);
  }
  for (; i < size; ++i) out[i] = static_cast<char>(seed + i * 31);
  return out;
}

KvStoreProcess::KvStoreProcess(std::string binary, std::string data_dir,
                               std::vector<std::string> extra_args)
    : binary_(std::move(binary)),
      data_dir_(std::move(data_dir)),
      extra_args_(std::move(extra_args)) {}

KvStoreProcess::~KvStoreProcess() {
  if (running()) Kill();
}

absl::Status ReadyProcess::Start(std::vector<std::string> argv) {
  if (running()) return absl::FailedPreconditionError("already running");
  process_ = std::make_unique<lazyrag::testing::ChildProcess>(std::move(argv));
  if (absl::Status st = process_->Start(); !st.ok()) return st;
  // Generous: a worker loads its model first; ctest's per-test timeout bounds it anyway.
  absl::StatusOr<lazyrag::testing::ReadyLine> ready =
      lazyrag::testing::WaitForReady(*process_, absl::Minutes(10));
  if (!ready.ok()) {
    process_->Kill();
    return absl::UnavailableError(ready.status().message());
  }
  address_ = ready->address;
  metrics_port_ = ready->metrics_port;
  return absl::OkStatus();
}

void ReadyProcess::Stop(int signal) {
  if (running()) process_->Stop(signal, absl::Minutes(1));
}

absl::Status KvStoreProcess::Start() {
  if (running()) return absl::FailedPreconditionError("already running");
  std::vector<std::string> args = {binary_, absl::StrCat("--listen=127.0.0.1:", grpc_port_),
                                   absl::StrCat("--data_dir=", data_dir_),
                                   absl::StrCat("--metrics_port=", metrics_port_),
                                   "--metrics_host=127.0.0.1"};
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  if (absl::Status st = process_.Start(std::move(args)); !st.ok()) return st;
  const std::string& address = process_.address();
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) {
    Stop(9);
    return absl::InternalError(absl::StrCat("bad address in the ready line: '", address, "'"));
  }
  // Kept so that Restart() comes back on the same ports.
  grpc_port_ = port;
  metrics_port_ = process_.metrics_port();
  return absl::OkStatus();
}

void KvStoreProcess::Stop(int signal) { process_.Stop(signal); }

int RunProcess(const std::vector<std::string>& argv_in, const std::string& stdout_file) {
  std::vector<std::string> copy = argv_in;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    if (!stdout_file.empty()) {
      int fd = open(stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDOUT_FILENO);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return -WTERMSIG(status);
}

absl::StatusOr<std::string> FetchMetrics(int port) {
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) return absl::UnavailableError("metrics fetch failed");
  return res->body;
}

double MetricValue(const std::string& exposition, const std::string& name_and_labels) {
  std::istringstream in(exposition);
  std::string line;
  const std::string prefix = name_and_labels + " ";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      double v = 0;
      if (absl::SimpleAtod(line.substr(prefix.size()), &v)) return v;
    }
  }
  return -1;
}

}  // namespace lazyrag::kvstore::testing
