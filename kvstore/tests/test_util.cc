#include "kvstore/tests/test_util.h"

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

absl::Status ReadyProcess::Start(std::vector<std::string> args) {
  if (running()) return absl::FailedPreconditionError("already running");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  // Everything the child needs is prepared before fork(): the parent has threads.
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork");
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  pid_ = pid;
  stdout_fd_ = fds[0];
  // Read the ready line (the only thing the server writes to stdout).
  std::string line;
  char c;
  while (line.size() < 512 && read(stdout_fd_, &c, 1) == 1 && c != '\n') line.push_back(c);
  const std::string grpc_tag = "grpc=", metrics_tag = " metrics=";
  size_t g = line.find(grpc_tag), m = line.find(metrics_tag);
  if (line.find("ready") == std::string::npos || g == std::string::npos || m == std::string::npos ||
      !absl::SimpleAtoi(line.substr(m + metrics_tag.size()), &metrics_port_)) {
    Stop(9);
    return absl::UnavailableError(absl::StrCat(args[0], " did not start: '", line, "'"));
  }
  address_ = line.substr(g + grpc_tag.size(), m - g - grpc_tag.size());
  return absl::OkStatus();
}

void ReadyProcess::Stop(int signal) {
  if (!running()) return;
  kill(pid_, signal);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  close(stdout_fd_);
  stdout_fd_ = -1;
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
