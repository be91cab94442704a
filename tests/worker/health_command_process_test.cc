// lazyrag-cli health (the Helm chart's readiness/startup probe under TLS): SERVING from a
// kvstore shard over TLS with the test certificate, and failures (exit 1) for a plaintext check
// of a TLS server, a wrong CA name, a closed port; exit 2 for bad usage.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/testing/child_process.h"
#include "kvstore/tests/test_util.h"

namespace lazyrag {
namespace {

using kvstore::testing::ReadyProcess;
using kvstore::testing::TempDir;

const std::string kTlsDir = LAZYRAG_TLS_DIR;

struct Outcome {
  int exit_code;
  std::string line;  // first stdout line ("" when none)
};

Outcome Health(std::vector<std::string> args) {
  args.insert(args.begin(), {LAZYRAG_CLI_BINARY, "health"});
  lazyrag::testing::ChildProcess p(args);
  if (!p.Start().ok()) return {-1, ""};
  auto line = p.WaitForLine("", absl::Seconds(30));
  return {p.Wait(absl::Seconds(30)), line.ok() ? *line : ""};
}

std::vector<std::string> TlsFlags() {
  return {"--tls_ca=" + kTlsDir + "/ca.pem", "--tls_cert=" + kTlsDir + "/cert.pem",
          "--tls_key=" + kTlsDir + "/key.pem"};
}

TEST(HealthCommandTest, ChecksATlsServer) {
  TempDir dir;
  ReadyProcess kv;
  std::vector<std::string> argv = {LAZYRAG_KVSTORE_BINARY, "--listen=127.0.0.1:0",
                                   "--metrics_port=-1", "--sync_commits=false",
                                   "--data_dir=" + dir.path() + "/kv"};
  for (const std::string& f : TlsFlags()) argv.push_back(f);
  ASSERT_TRUE(kv.Start(argv).ok());
  const std::string port = kv.address().substr(kv.address().rfind(':') + 1);

  std::vector<std::string> ok = {"--target=localhost:" + port, "--timeout_s=10"};
  for (const std::string& f : TlsFlags()) ok.push_back(f);
  const Outcome serving = Health(ok);
  EXPECT_EQ(serving.exit_code, 0);
  EXPECT_EQ(serving.line, "SERVING");

  // The CA alone verifies the server, but the server requires a client certificate
  // (--tls_require_client_cert, on by default with TLS): refused.
  EXPECT_EQ(Health({"--target=127.0.0.1:" + port, "--tls_ca=" + kTlsDir + "/ca.pem",
                    "--tls_server_name=localhost", "--timeout_s=10"})
                .exit_code,
            1);
  {
    // A shard that does not require one (--tls_require_client_cert=false) takes the CA alone.
    TempDir dir2;
    ReadyProcess open_kv;
    std::vector<std::string> argv2 = {LAZYRAG_KVSTORE_BINARY,
                                      "--listen=127.0.0.1:0",
                                      "--metrics_port=-1",
                                      "--sync_commits=false",
                                      "--tls_require_client_cert=false",
                                      "--data_dir=" + dir2.path() + "/kv"};
    for (const std::string& f : TlsFlags()) argv2.push_back(f);
    ASSERT_TRUE(open_kv.Start(argv2).ok());
    const std::string port2 = open_kv.address().substr(open_kv.address().rfind(':') + 1);
    EXPECT_EQ(Health({"--target=127.0.0.1:" + port2, "--tls_ca=" + kTlsDir + "/ca.pem",
                      "--tls_server_name=localhost", "--timeout_s=10"})
                  .exit_code,
              0);
  }
  // The certificate does not name this server.
  std::vector<std::string> wrong_name = ok;
  wrong_name.push_back("--tls_server_name=lazyrag-worker.example");
  EXPECT_EQ(Health(wrong_name).exit_code, 1);
  // Plaintext against a TLS server.
  EXPECT_EQ(Health({"--target=localhost:" + port, "--timeout_s=3"}).exit_code, 1);

  kv.Stop(15);
  EXPECT_EQ(Health(ok).exit_code, 1);  // nobody listens any more
}

TEST(HealthCommandTest, BadUsageExitsTwo) {
  EXPECT_EQ(Health({}).exit_code, 2);  // no --target
  EXPECT_EQ(Health({"--target=localhost:1", "--nosuch=1"}).exit_code, 2);
  EXPECT_EQ(Health({"--target=localhost:1", "--tls_cert=x"}).exit_code, 2);
  EXPECT_EQ(Health({"--target=localhost:1", "--timeout_s=-1"}).exit_code, 2);
  EXPECT_EQ(Health({"--target"}).exit_code, 2);
  // Unreadable TLS files: a clear failure, not a crash.
  EXPECT_EQ(Health({"--target=localhost:1", "--tls_ca=/nonexistent.pem"}).exit_code, 1);
}

}  // namespace
}  // namespace lazyrag
