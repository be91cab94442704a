// The command line the three server binaries share (common/binary_flags.h), against the real
// binaries: --help and --helpfull list the flags and exit 0, --version prints
// "<binary> <version> (<commit>)" and exits 0, a bad --log_level or --log_format exits 2 with a
// message, --log_format=json writes one JSON object per line, /metrics binds loopback unless
// --metrics_host says otherwise.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/build_info.h"
#include "common/testing/child_process.h"
#include "gtest/gtest.h"

namespace lazyrag {
namespace {

struct Binary {
  std::string name;
  std::string path;
  std::string own_flag;  // a flag only this binary defines
};

const std::vector<Binary>& Binaries() {
  static const auto* binaries = new std::vector<Binary>{
      {"lazyrag-kvstore", LAZYRAG_KVSTORE_BINARY, "--data_dir"},
      {"lazyrag-worker", LAZYRAG_WORKER_BINARY, "--model"},
      {"lazyrag-router", LAZYRAG_ROUTER_BINARY, "--workers"},
  };
  return *binaries;
}

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

Outcome RunBinary(const std::string& path, const std::string& args) {
  Outcome r;
  FILE* pipe = popen(absl::StrCat(path, " ", args, " 2>&1 </dev/null").c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(CommandLineTest, HelpListsTheBinarysFlagsAndExitsZero) {
  for (const Binary& b : Binaries()) {
    SCOPED_TRACE(b.name);
    for (const char* help : {"--help", "-h"}) {
      const Outcome r = RunBinary(b.path, help);
      EXPECT_EQ(r.exit_code, 0) << r.output;
      EXPECT_FALSE(absl::StrContains(r.output, "No flags matched")) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, "usage: " + b.name)) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, b.own_flag + " (default")) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, "--listen (default \"127.0.0.1:0\")")) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, "--log_level (default \"info\")")) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, "--log_format")) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, "--tls_cert (default")) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, "Flags from " + b.name.substr(8) + "/main.cc:"))
          << r.output;
      // absl's own flags only with --helpfull.
      EXPECT_FALSE(absl::StrContains(r.output, "--flagfile")) << r.output;
    }
    const Outcome full = RunBinary(b.path, "--helpfull");
    EXPECT_EQ(full.exit_code, 0) << full.output;
    EXPECT_TRUE(absl::StrContains(full.output, b.own_flag + " (default")) << full.output;
    EXPECT_TRUE(absl::StrContains(full.output, "--flagfile")) << full.output;
  }
}

TEST(CommandLineTest, VersionPrintsVersionAndCommitAndExitsZero) {
  const std::string expected_tail =
      absl::StrCat(" ", LAZYRAG_EXPECTED_VERSION, " (", LAZYRAG_EXPECTED_COMMIT, ")\n");
  EXPECT_TRUE(
      std::regex_match(std::string(LAZYRAG_EXPECTED_COMMIT), std::regex("[0-9a-f]{4,40}|unknown")))
      << LAZYRAG_EXPECTED_COMMIT;
  EXPECT_EQ(BuildVersion(), LAZYRAG_EXPECTED_VERSION);
  EXPECT_EQ(BuildCommit(), LAZYRAG_EXPECTED_COMMIT);
  for (const Binary& b : Binaries()) {
    SCOPED_TRACE(b.name);
    const Outcome r = RunBinary(b.path, "--version");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, b.name + expected_tail);
    // --version wins over flags that would stop the binary (the worker's missing --model).
    EXPECT_EQ(RunBinary(b.path, "--listen=127.0.0.1:0 --version").output, b.name + expected_tail);
  }
}

#ifdef LAZYRAG_CLI_BINARY
TEST(CommandLineTest, CliVersionAndHelpExitZero) {
  const Outcome version = RunBinary(LAZYRAG_CLI_BINARY, "--version");
  EXPECT_EQ(version.exit_code, 0) << version.output;
  EXPECT_EQ(version.output, absl::StrCat("lazyrag-cli ", LAZYRAG_EXPECTED_VERSION, " (",
                                         LAZYRAG_EXPECTED_COMMIT, ")\n"));
  const Outcome help = RunBinary(LAZYRAG_CLI_BINARY, "--help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_TRUE(absl::StrContains(help.output, "generate")) << help.output;
  EXPECT_EQ(RunBinary(LAZYRAG_CLI_BINARY, "").exit_code, 2);
}
#endif

TEST(CommandLineTest, BadLogLevelOrFormatExitsTwoWithAMessage) {
  for (const Binary& b : Binaries()) {
    SCOPED_TRACE(b.name);
    const Outcome level = RunBinary(b.path, "--log_level bogus");
    EXPECT_EQ(level.exit_code, 2) << level.output;
    EXPECT_TRUE(absl::StrContains(level.output, b.name + ": --log_level: unknown log level "
                                                         "'bogus' (debug|info|warning|error)"))
        << level.output;
    const Outcome format = RunBinary(b.path, "--log_format=xml");
    EXPECT_EQ(format.exit_code, 2) << format.output;
    EXPECT_TRUE(
        absl::StrContains(format.output, "--log_format: unknown log format 'xml' (text|json)"))
        << format.output;
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch directory removed at the end.
class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/lazyrag_cmdline_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~ScratchDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The kvstore's start-up line, in JSON and in text; --log_level=warning silences it.
TEST(CommandLineTest, StartUpLineFollowsLogFormatAndLevel) {
  ScratchDir dir;
  for (const std::string format : {"json", "text", "warning"}) {
    SCOPED_TRACE(format);
    const std::string err = absl::StrCat(dir.path(), "/stderr_", format, ".txt");
    std::vector<std::string> argv = {LAZYRAG_KVSTORE_BINARY, "--listen=127.0.0.1:0",
                                     "--metrics_port=-1", "--data_dir=" + dir.path() + "/db",
                                     "--capacity_bytes=1048576"};
    if (format == "warning") {
      argv.push_back("--log_level=warning");
    } else {
      argv.push_back("--log_format=" + format);
    }
    testing::ChildProcess p(argv);
    p.SetOutputFiles("", err);
    ASSERT_TRUE(p.Start().ok());
    auto ready = testing::WaitForReady(p, absl::Seconds(60));
    ASSERT_TRUE(ready.ok()) << ready.status();
    EXPECT_EQ(p.Stop(SIGTERM), 0);
    const std::string log = ReadFile(err);
    if (format == "json") {
      std::regex line(
          "\\{\"ts\":\"\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z\",\"level\":\"info\","
          "\"src\":\"kvstore_server\\.cc:\\d+\",\"msg\":\"lazyrag-kvstore: serving\",\"grpc\":\"" +
          ready->address + "\",\"metrics_port\":-1,\"data_dir\":\"" + dir.path() +
          "/db\",\"capacity_bytes\":1048576,\"used_bytes\":0,\"entries\":0,"
          "\"sync_commits\":true,\"tls\":false,\"local_clients\":true\\}");
      bool found = false;
      std::istringstream lines(log);
      for (std::string l; std::getline(lines, l);) {
        EXPECT_EQ(l.front(), '{') << l;  // every line is an object
        found = found || std::regex_match(l, line);
      }
      EXPECT_TRUE(found) << log;
    } else if (format == "text") {
      EXPECT_TRUE(std::regex_search(
          log, std::regex("I \\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z "
                          "kvstore_server\\.cc:\\d+\\] lazyrag-kvstore: serving grpc=" +
                          ready->address + " metrics_port=-1 data_dir=" + dir.path() +
                          "/db capacity_bytes=1048576 ")))
          << log;
    } else {
      EXPECT_FALSE(absl::StrContains(log, "serving")) << log;
    }
  }
}

// The local addresses (host byte order) that listen on TCP `port`, read from /proc/net/tcp
// (IPv4): "0100007F" is 127.0.0.1, "00000000" every interface.
std::vector<std::string> ListeningAddresses(int port) {
  std::vector<std::string> out;
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 4 || f[3] != "0A") continue;  // 0A: LISTEN
    std::vector<std::string> local = absl::StrSplit(f[1], ':');
    int p = 0;
    if (local.size() == 2 && absl::SimpleHexAtoi(local[1], &p) && p == port) {
      out.push_back(local[0]);
    }
  }
  return out;
}

// Without --metrics_host every server's /metrics listens on 127.0.0.1 only; with one it binds
// the address given (the Helm chart passes its listen address so Prometheus can scrape).
TEST(CommandLineTest, MetricsBindLoopbackUnlessMetricsHostIsGiven) {
  ScratchDir dir;
  const std::vector<std::vector<std::string>> servers = {
      {LAZYRAG_KVSTORE_BINARY, "--data_dir=" + dir.path() + "/db", "--capacity_bytes=1048576"},
      {LAZYRAG_WORKER_BINARY, "--model=synthetic:tiny", "--device=cpu", "--kv_pool_bytes=1048576"},
      {LAZYRAG_ROUTER_BINARY, "--workers=127.0.0.1:1"},
  };
  for (const auto& server : servers) {
    for (const std::string host : {"", "0.0.0.0"}) {
      SCOPED_TRACE(absl::StrCat(server[0], " --metrics_host=", host));
      std::vector<std::string> argv = server;
      argv.push_back("--listen=127.0.0.1:0");
      argv.push_back("--metrics_port=0");
      if (!host.empty()) argv.push_back("--metrics_host=" + host);
      testing::ChildProcess p(argv);
      p.SetOutputFiles("", dir.path() + "/stderr.txt");
      ASSERT_TRUE(p.Start().ok());
      auto ready = testing::WaitForReady(p, absl::Seconds(120));
      ASSERT_TRUE(ready.ok()) << ready.status();
      ASSERT_GT(ready->metrics_port, 0);
      EXPECT_EQ(ListeningAddresses(ready->metrics_port),
                std::vector<std::string>{host.empty() ? "0100007F" : "00000000"});
      EXPECT_EQ(p.Stop(SIGTERM), 0);
    }
  }
}

}  // namespace
}  // namespace lazyrag
