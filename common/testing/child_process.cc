#include "common/testing/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace lazyrag::testing {

int PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

namespace {
// How the child ended, read without reaping it (a later Wait or Stop still returns its code);
// "still running" when it has not within 2 s.
std::string HowItEnded(pid_t pid) {
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (pid > 0) {
    siginfo_t info{};
    if (waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) {
      return info.si_code == CLD_EXITED ? absl::StrCat("exit code ", info.si_status)
                                        : absl::StrCat("killed by signal ", info.si_status);
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return "still running";
}
}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv, bool capture_stdout)
    : argv_(std::move(argv)), capture_stdout_(capture_stdout) {
  if (argv_.empty()) argv_.push_back("");
}

ChildProcess::~ChildProcess() {
  if (running()) Kill();
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

void ChildProcess::SetOutputFiles(std::string stdout_path, std::string stderr_path) {
  stdout_path_ = std::move(stdout_path);
  stderr_path_ = std::move(stderr_path);
}

absl::Status ChildProcess::Start() {
  if (running()) return absl::FailedPreconditionError("already running");
  if (stdout_fd_ >= 0) {
    close(stdout_fd_);
    stdout_fd_ = -1;
  }
  buffered_.clear();
  int fds[2] = {-1, -1};
  if (capture_stdout_ && pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  // Everything the child needs is prepared before fork(): the parent has threads.
  std::vector<char*> argv;
  for (std::string& a : argv_) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int out =
      capture_stdout_ ? fds[1]
                      : open(stdout_path_.empty() ? "/dev/null" : stdout_path_.c_str(),
                             O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = stderr_path_.empty()
                      ? -1
                      : open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = fork();
  if (pid < 0) {
    if (capture_stdout_) close(fds[0]);
    if (out >= 0) close(out);
    if (err >= 0) close(err);
    return absl::InternalError("fork");
  }
  if (pid == 0) {
    if (out >= 0) dup2(out, STDOUT_FILENO);
    if (err >= 0) dup2(err, STDERR_FILENO);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  if (out >= 0) close(out);  // the pipe's write end too
  if (err >= 0) close(err);
  if (capture_stdout_) stdout_fd_ = fds[0];
  pid_ = pid;
  return absl::OkStatus();
}

absl::StatusOr<std::string> ChildProcess::WaitForLine(const std::string& prefix,
                                                      absl::Duration timeout) {
  if (stdout_fd_ < 0) return absl::FailedPreconditionError("stdout not captured");
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    size_t newline;
    while ((newline = buffered_.find('\n')) != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      if (line.rfind(prefix, 0) == 0) return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("no line '", prefix, "' from ", argv_[0]));
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    const int rc = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (rc <= 0) continue;
    char buf[4096];
    const ssize_t n = read(stdout_fd_, buf, sizeof(buf));
    if (n <= 0) {
      // Usually the child ended: say how, so that a crash reads as one.
      return absl::UnavailableError(absl::StrCat(argv_[0], " closed stdout before '", prefix,
                                                 "' (after '", buffered_.substr(0, 200), "'; ",
                                                 HowItEnded(pid_), ")"));
    }
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

bool ChildProcess::Alive() {
  if (!running()) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

int ChildProcess::Wait(absl::Duration timeout) {
  if (!running()) return -1000;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
    if (absl::Now() >= deadline) return -1000;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

int ChildProcess::Stop(int signal, absl::Duration timeout) {
  if (!running()) return -1000;
  kill(pid_, signal);
  int code = Wait(timeout);
  if (code == -1000 && running()) {
    kill(pid_, SIGKILL);
    code = Wait(absl::Seconds(10));
  }
  return code;
}

absl::StatusOr<ReadyLine> WaitForReady(ChildProcess& process, absl::Duration timeout) {
  absl::StatusOr<std::string> line = process.WaitForLine("", timeout);
  if (!line.ok()) return line.status();
  ReadyLine ready;
  ready.address = FieldOf(*line, "grpc");
  if (line->find(" ready ") == std::string::npos || ready.address.empty() ||
      !absl::SimpleAtoi(FieldOf(*line, "metrics"), &ready.metrics_port)) {
    return absl::UnavailableError(
        absl::StrCat(process.binary(), " did not start: '", line->substr(0, 512), "'"));
  }
  return ready;
}

std::string FieldOf(const std::string& line, const std::string& key) {
  const std::string needle = key + "=";
  size_t at = line.find(needle);
  while (at != std::string::npos && at > 0 && line[at - 1] != ' ') at = line.find(needle, at + 1);
  if (at == std::string::npos) return "";
  const size_t start = at + needle.size();
  const size_t end = line.find(' ', start);
  return line.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace lazyrag::testing
