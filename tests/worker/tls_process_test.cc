// gRPC over TLS end to end (--tls_cert, --tls_key, --tls_ca; common/tls.h): a kvstore shard, a
// worker writing documents back to it and a router in front, all serving TLS with the test
// certificate of tests/fixtures/tls. A TLS client gets answers through the router; a second
// worker reads the documents back from the kvstore over TLS; a plaintext client is refused;
// incomplete TLS flags stop a server at startup. Certificate identities (`x509:NAME` lines of
// --auth_tokens_file, common/auth.h): with mTLS, a worker that has no token reads and writes the
// kvstore by its certificate alone, a client's certificate serves its tenant only, a router
// known by its certificate forwards a client's tenant, and an unlisted certificate is
// UNAUTHENTICATED.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/tls.h"
#include "kvstore/tests/test_util.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "lazyrag/v1/kvstore.grpc.pb.h"
#include "tests/worker/worker_test_util.h"

namespace lazyrag {
namespace {

using kvstore::testing::ReadyProcess;
using kvstore::testing::TempDir;

const std::string kTlsDir = LAZYRAG_TLS_DIR;

TlsFiles TestTls() { return {kTlsDir + "/cert.pem", kTlsDir + "/key.pem", kTlsDir + "/ca.pem"}; }

std::vector<std::string> WithTls(std::vector<std::string> args) {
  const TlsFiles t = TestTls();
  args.push_back("--tls_cert=" + t.cert_file);
  args.push_back("--tls_key=" + t.key_file);
  args.push_back("--tls_ca=" + t.ca_file);
  return args;
}

std::vector<std::string> Worker(const std::string& kvstore) {
  return WithTls({LAZYRAG_WORKER_BINARY, "--listen=127.0.0.1:0", "--metrics_port=-1",
                  "--model=synthetic:tiny", "--kvstore=" + kvstore});
}

using worker_test::Reply;

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Reply Generate(const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& creds,
               const std::vector<std::string>& docs) {
  auto stub = v1::Inference::NewStub(grpc::CreateChannel(address, creds));
  v1::GenerateRequest req;
  for (const std::string& d : docs) req.add_documents()->set_text(d);
  req.set_query("Which river?");
  req.set_max_tokens(4);
  req.set_ignore_eos(true);
  return worker_test::Generate(*stub, req, /*timeout_s=*/30);
}

// Starts a worker with `args` until one answers `docs` with every document from the kvstore
// (write-back is asynchronous; 50 workers at most) and returns its answer, or the first error.
Reply AnswerFromStore(const std::vector<std::string>& args,
                      const std::shared_ptr<grpc::ChannelCredentials>& creds,
                      const std::vector<std::string>& docs) {
  Reply again;
  for (int i = 0; i < 50; ++i) {
    ReadyProcess worker;
    if (absl::Status st = worker.Start(args); !st.ok()) {
      again.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(st.message()));
      return again;
    }
    again = Generate(worker.address(), creds, docs);
    if (!again.status.ok() ||
        again.last.usage().store_document_tokens() == again.last.usage().document_tokens()) {
      return again;
    }
    worker.Stop(SIGKILL);
  }
  return again;
}

TEST(TlsProcessTest, KvstoreWorkerAndRouterSpeakTls) {
  TempDir dir;
  ReadyProcess kv;
  ASSERT_TRUE(kv.Start(WithTls({LAZYRAG_KVSTORE_BINARY, "--listen=127.0.0.1:0",
                                "--metrics_port=-1", "--sync_commits=false",
                                "--data_dir=" + dir.path() + "/kv"}))
                  .ok());
  ReadyProcess worker;
  ASSERT_TRUE(worker.Start(Worker(kv.address())).ok());
  ReadyProcess router;
  ASSERT_TRUE(router
                  .Start(WithTls({LAZYRAG_ROUTER_BINARY, "--listen=127.0.0.1:0",
                                  "--metrics_port=-1", "--workers=" + worker.address()}))
                  .ok());
  auto tls = ChannelCredentialsFor(TestTls());
  ASSERT_TRUE(tls.ok()) << tls.status();
  const std::vector<std::string> docs = {"The Vantor river freezes once a year.",
                                         "Mira Ostrova built the lighthouse."};
  Reply first = Generate(router.address(), *tls, docs);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.last.usage().completion_tokens(), 4);

  // The worker wrote the documents back over TLS: a second worker reads them from the kvstore.
  Reply again = AnswerFromStore(Worker(kv.address()), *tls, docs);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_GT(again.last.usage().document_tokens(), 0);
  EXPECT_EQ(again.last.usage().store_document_tokens(), again.last.usage().document_tokens());

  // No TLS, no answer.
  Reply plain = Generate(router.address(), grpc::InsecureChannelCredentials(), docs);
  EXPECT_FALSE(plain.status.ok());
  EXPECT_EQ(plain.messages, 0);

  // TLS that trusts the server but presents no client certificate: refused (mTLS required by
  // default, --tls_require_client_cert).
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ReadFileOrDie(TestTls().ca_file);
  for (const std::string& address : {router.address(), worker.address()}) {
    Reply anonymous = Generate(address, grpc::SslCredentials(no_cert), docs);
    EXPECT_FALSE(anonymous.status.ok()) << address;
    EXPECT_EQ(anonymous.messages, 0);
  }
}

// The fixtures of tests/fixtures/tls/identities: NAME.pem, NAME-key.pem and their CA.
const std::string kIdentitiesDir = kTlsDir + "/identities";
TlsFiles IdentityTls(const std::string& name) {
  return {kIdentitiesDir + "/" + name + ".pem", kIdentitiesDir + "/" + name + "-key.pem",
          kIdentitiesDir + "/ca.pem"};
}
std::vector<std::string> WithIdentity(const std::string& name, std::vector<std::string> args) {
  const TlsFiles t = IdentityTls(name);
  args.push_back("--tls_cert=" + t.cert_file);
  args.push_back("--tls_key=" + t.key_file);
  args.push_back("--tls_ca=" + t.ca_file);
  return args;
}

// A kvstore Stat of one absent key, made with the certificate of `name`.
grpc::Status StatAs(const std::string& address, const std::string& name) {
  auto creds = ChannelCredentialsFor(IdentityTls(name));
  if (!creds.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "no credentials");
  auto stub = v1::KvStore::NewStub(grpc::CreateChannel(address, *creds));
  v1::StatRequest req;
  req.add_keys()->set_raw("absent-key");
  v1::StatResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return stub->Stat(&ctx, req, &resp);
}

TEST(TlsProcessTest, CertificateIdentitiesNeedNoTokens) {
  TempDir dir;
  const std::string tokens = dir.path() + "/tokens";
  {
    std::ofstream(tokens) << "x509:lazyrag-worker cluster worker\nx509:acme-client acme client\n";
  }
  ReadyProcess kv;
  ASSERT_TRUE(kv.Start(WithIdentity("server", {LAZYRAG_KVSTORE_BINARY, "--listen=127.0.0.1:0",
                                                "--metrics_port=-1", "--sync_commits=false",
                                                "--data_dir=" + dir.path() + "/kv",
                                                "--auth_tokens_file=" + tokens}))
                  .ok());
  // The worker's certificate is a worker; the client's is not; an unlisted one is nobody.
  grpc::Status as_worker = StatAs(kv.address(), "worker");
  EXPECT_TRUE(as_worker.ok()) << as_worker.error_message();
  grpc::Status as_client = StatAs(kv.address(), "client");
  EXPECT_EQ(as_client.error_code(), grpc::StatusCode::PERMISSION_DENIED) << as_client.error_message();
  grpc::Status unlisted = StatAs(kv.address(), "server");
  EXPECT_EQ(unlisted.error_code(), grpc::StatusCode::UNAUTHENTICATED) << unlisted.error_message();

  // A worker with no --auth_token_file writes documents back by its certificate; a second one
  // reads them. Clients reach the workers by their own certificate.
  auto worker_args = [&] {
    return WithIdentity("worker", {LAZYRAG_WORKER_BINARY, "--listen=127.0.0.1:0",
                                   "--metrics_port=-1", "--model=synthetic:tiny",
                                   "--kvstore=" + kv.address(), "--auth_tokens_file=" + tokens});
  };
  ReadyProcess worker;
  ASSERT_TRUE(worker.Start(worker_args()).ok());
  auto client = ChannelCredentialsFor(IdentityTls("client"));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<std::string> docs = {"The Vantor river freezes once a year.",
                                         "Mira Ostrova built the lighthouse."};
  Reply first = Generate(worker.address(), *client, docs);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  Reply again = AnswerFromStore(worker_args(), *client, docs);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_GT(again.last.usage().document_tokens(), 0);
  EXPECT_EQ(again.last.usage().store_document_tokens(), again.last.usage().document_tokens());
  // An unlisted certificate gets no answer from a worker either.
  auto unlisted_creds = ChannelCredentialsFor(IdentityTls("server"));
  ASSERT_TRUE(unlisted_creds.ok());
  Reply refused = Generate(worker.address(), *unlisted_creds, docs);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // A router known by the worker certificate and sending no token (the chart's
  // auth.workerIdentity certificate) forwards the client's request: the worker takes it as the
  // cluster's own and the tenant it names, so the client's documents are the ones in the pool.
  ReadyProcess router;
  ASSERT_TRUE(router
                  .Start(WithIdentity(
                      "worker", {LAZYRAG_ROUTER_BINARY, "--listen=127.0.0.1:0", "--metrics_port=-1",
                                 "--workers=" + worker.address(), "--auth_tokens_file=" + tokens}))
                  .ok());
  Reply routed = Generate(router.address(), *client, docs);
  ASSERT_TRUE(routed.status.ok()) << routed.status.error_message();
  EXPECT_GT(routed.last.usage().document_tokens(), 0);
  EXPECT_EQ(routed.last.usage().pool_document_tokens(), routed.last.usage().document_tokens());
  Reply routed_unlisted = Generate(router.address(), *unlisted_creds, docs);
  EXPECT_EQ(routed_unlisted.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(TlsProcessTest, IncompleteTlsFlagsStopTheServer) {
  ReadyProcess worker;
  const absl::Status st =
      worker.Start({LAZYRAG_WORKER_BINARY, "--listen=127.0.0.1:0", "--metrics_port=-1",
                    "--model=synthetic:tiny", "--tls_cert=" + TestTls().cert_file});
  EXPECT_FALSE(st.ok()) << "a worker with --tls_cert alone started";
  TempDir dir;
  ReadyProcess kv;
  EXPECT_FALSE(kv.Start({LAZYRAG_KVSTORE_BINARY, "--listen=127.0.0.1:0", "--metrics_port=-1",
                         "--data_dir=" + dir.path() + "/kv", "--tls_cert=/nonexistent.pem",
                         "--tls_key=/nonexistent.pem", "--tls_ca=/nonexistent.pem"})
                  .ok());
}

TEST(TlsFilesTest, CredentialsNeedAllThreeReadableFiles) {
  EXPECT_TRUE(ChannelCredentialsFor({}).ok());  // plaintext
  EXPECT_TRUE(ServerCredentialsFor(TestTls()).ok());
  TlsFiles missing = TestTls();
  missing.ca_file.clear();
  auto st = ChannelCredentialsFor(missing);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("--tls_ca"), std::string::npos) << st.status();
  TlsFiles unreadable = TestTls();
  unreadable.key_file = kTlsDir + "/absent.pem";
  EXPECT_EQ(ServerCredentialsFor(unreadable).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazyrag
