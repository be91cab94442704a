// Authentication, tenancy and MACs on stored KV (issue 28), on the real binaries over loopback:
// a kvstore shard, workers and a router, all with --auth_tokens_file (common/auth.h).
//   * kvstore and PeerDocuments calls need a worker identity (none: UNAUTHENTICATED, a client's:
//     PERMISSION_DENIED); Inference without a token is UNAUTHENTICATED, and so is HTTP (401).
//   * a document id resolves only in the namespace that made it (another tenant: NOT_FOUND);
//     Stats lists a client's own documents only, on the worker and through the router.
//   * the token file is reread when it changes.
//   * every refused call is counted on the refusing server's /metrics
//     (lazyrag_auth_failures_total{reason}), gRPC and HTTP, on the kvstore, worker and router.
//   * a stored value whose MAC fails (bytes changed, CRCs recomputed) is a miss: recomputed, the
//     answer unchanged, counted, and the write-back replaces it.
// The test's own calls carry their token as every lazyrag client's do: AddBearerToken on each
// call's context (common/grpc_auth.h), on channels without one.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_auth.h"
#include "common/testing/child_process.h"
#include "kvstore/client/kvstore_client.h"
#include "kvstore/tests/test_util.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "lazyrag/v1/kvstore.grpc.pb.h"
#include "lazyrag/v1/peer.grpc.pb.h"
#include "tests/worker/worker_test_util.h"

namespace lazyrag {
namespace {

using kvstore::testing::ReadyProcess;
using kvstore::testing::TempDir;
using worker_test::Reply;
using worker_test::WorkerProcess;

constexpr char kAcme[] = "acme-client-token-000001";
constexpr char kGlobex[] = "globex-client-token-0001";
constexpr char kWorker[] = "cluster-worker-token-001";
constexpr char kModel[] = "--model=synthetic:tiny";
constexpr char kUnauthenticated[] = "lazyrag_auth_failures_total{reason=\"unauthenticated\"}";
constexpr char kPermissionDenied[] = "lazyrag_auth_failures_total{reason=\"permission_denied\"}";

// The sample `name` on the /metrics of a process listening there; -2 when it cannot be read.
double MetricAt(int metrics_port, const std::string& name) {
  auto m = kvstore::testing::FetchMetrics(metrics_port);
  return m.ok() ? kvstore::testing::MetricValue(*m, name) : -2;
}

void WriteFile(const std::string& path, const std::string& text) {
  // Beside, then renamed over: a reader sees the old file or the new one, as with a Secret.
  const std::string tmp = path + ".tmp";
  { std::ofstream(tmp, std::ios::binary | std::ios::trunc) << text; }
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

// An Inference stub and the token its calls send (added to each call's context; null: none).
struct Caller {
  std::unique_ptr<v1::Inference::Stub> stub;
  std::shared_ptr<BearerToken> token;
};

// The files every process of a test shares.
class AuthProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = dir_.path() + "/tokens";
    own_token_ = dir_.path() + "/worker-token";
    mac_key_ = dir_.path() + "/mac-key";
    WriteFile(tokens_, absl::StrCat("# token tenant role\n", kAcme, " acme client\n", kGlobex,
                                    " globex client\n", kWorker, " cluster worker\n"));
    WriteFile(own_token_, absl::StrCat(kWorker, "\n"));
    WriteFile(mac_key_, "0123456789abcdef0123456789abcdef\n");
  }

  absl::Status StartKvstore() {
    return kv_.Start({LAZYRAG_KVSTORE_BINARY, "--listen=127.0.0.1:0", "--metrics_port=0",
                      "--sync_commits=false", "--data_dir=" + dir_.path() + "/kv",
                      "--auth_tokens_file=" + tokens_});
  }
  // A synthetic:tiny worker with authentication, the cluster's MAC key and `extra` flags.
  std::unique_ptr<WorkerProcess> NewWorker(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {kModel, "--auth_tokens_file=" + tokens_,
                                     "--auth_token_file=" + own_token_,
                                     "--kv_mac_key_file=" + mac_key_};
    if (kv_.running()) args.push_back("--kvstore=" + kv_.address());
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_unique<WorkerProcess>(std::move(args));
  }

  static std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
    return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  }
  // `token` as a BearerToken; "": null (no token sent).
  static std::shared_ptr<BearerToken> Token(const std::string& token) {
    return token.empty() ? nullptr : BearerToken::Fixed(token);
  }
  static Caller Inference(const std::string& address, const std::string& token) {
    return {v1::Inference::NewStub(Channel(address)), Token(token)};
  }

  TempDir dir_;
  std::string tokens_, own_token_, mac_key_;
  ReadyProcess kv_;
};

v1::GenerateRequest TextRequest(const std::string& text, const std::string& ns = "") {
  v1::GenerateRequest r;
  r.add_documents()->set_text(text);
  r.set_query("Which river freezes?");
  r.set_max_tokens(8);
  r.set_ignore_eos(true);
  r.set_cache_namespace(ns);
  return r;
}

v1::GenerateRequest IdRequest(const std::string& id, const std::string& ns = "") {
  v1::GenerateRequest r = TextRequest("unused", ns);
  r.clear_documents();
  r.add_documents()->set_id(id);
  return r;
}

Reply Generate(const Caller& caller, const v1::GenerateRequest& request) {
  return worker_test::Generate(*caller.stub, request, /*timeout_s=*/60, caller.token.get());
}

grpc::StatusCode StatsCode(const Caller& caller, v1::StatsResponse* out = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  AddBearerToken(ctx, caller.token.get());
  v1::StatsRequest req;
  v1::StatsResponse resp;
  grpc::StatusCode code = caller.stub->Stats(&ctx, req, &resp).error_code();
  if (out != nullptr) *out = resp;
  return code;
}

bool Lists(const v1::StatsResponse& s, const std::string& id) {
  for (const std::string& r : s.resident_document_ids()) {
    if (r == id) return true;
  }
  return false;
}

TEST_F(AuthProcessTest, KvstoreAndPeersTakeOnlyWorkerIdentities) {
  ASSERT_TRUE(StartKvstore().ok());
  EXPECT_EQ(MetricAt(kv_.metrics_port(), kUnauthenticated), 0);
  EXPECT_EQ(MetricAt(kv_.metrics_port(), kPermissionDenied), 0);
  auto stat = [&](const std::string& token) {
    auto stub = v1::KvStore::NewStub(Channel(kv_.address()));
    grpc::ClientContext ctx;
    AddBearerToken(ctx, Token(token).get());
    v1::StatRequest req;
    v1::KvKey* key = req.add_keys();
    key->set_raw("k");
    v1::StatResponse resp;
    return stub->Stat(&ctx, req, &resp);
  };
  EXPECT_EQ(stat("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stat("not-a-known-token-at-all").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stat(kAcme).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  grpc::Status worker_stat = stat(kWorker);
  EXPECT_TRUE(worker_stat.ok()) << worker_stat.error_message();
  // No token and an unknown one; a client's token.
  EXPECT_EQ(MetricAt(kv_.metrics_port(), kUnauthenticated), 2);
  EXPECT_EQ(MetricAt(kv_.metrics_port(), kPermissionDenied), 1);

  auto worker = NewWorker();
  ASSERT_TRUE(worker->Start().ok());
  auto pool = [&](const std::string& token) {
    auto stub = v1::PeerDocuments::NewStub(Channel(worker->address()));
    grpc::ClientContext ctx;
    AddBearerToken(ctx, Token(token).get());
    v1::PeerPoolRequest req;
    v1::PeerPool resp;
    return stub->GetPool(&ctx, req, &resp).error_code();
  };
  EXPECT_EQ(pool(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(pool(kAcme), grpc::StatusCode::PERMISSION_DENIED);
  const grpc::StatusCode as_worker = pool(kWorker);
  EXPECT_NE(as_worker, grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(as_worker, grpc::StatusCode::PERMISSION_DENIED);
  {
    auto stub = v1::PeerDocuments::NewStub(Channel(worker->address()));
    grpc::ClientContext ctx;  // no token
    v1::PeerGetRequest req;
    req.set_document_id(std::string(64, 'a'));
    auto reader = stub->GetDocument(&ctx, req);
    v1::PeerGetResponse m;
    EXPECT_FALSE(reader->Read(&m));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }

  // Inference takes client tokens; the worker writes the document back with its own token.
  Reply anonymous = Generate(Inference(worker->address(), ""), TextRequest("The Vantor river."));
  EXPECT_EQ(anonymous.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(anonymous.messages, 0);
  Reply a = Generate(Inference(worker->address(), kAcme), TextRequest("The Vantor river."));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  const std::string put_ok = "lazyrag_kvstore_requests_total{op=\"put\",result=\"ok\"}";
  for (int i = 0; i < 100 && worker->Metric(put_ok) < 1; ++i)
    absl::SleepFor(absl::Milliseconds(50));
  EXPECT_GE(worker->Metric(put_ok), 1) << worker->Metrics();
  // The worker refused GetPool, GetDocument and Generate without a token, GetPool with a
  // client's; the kvstore refused none of the worker's own calls.
  EXPECT_EQ(worker->Metric(kUnauthenticated), 3) << worker->Metrics();
  EXPECT_EQ(worker->Metric(kPermissionDenied), 1);
  EXPECT_EQ(MetricAt(kv_.metrics_port(), kUnauthenticated), 2);
  EXPECT_EQ(MetricAt(kv_.metrics_port(), kPermissionDenied), 1);
}

TEST_F(AuthProcessTest, TenantsSeeOnlyTheirOwnDocuments) {
  ASSERT_TRUE(StartKvstore().ok());
  auto worker = NewWorker({"--public_namespaces=shared"});
  ASSERT_TRUE(worker->Start().ok());
  ReadyProcess router;
  ASSERT_TRUE(router
                  .Start({LAZYRAG_ROUTER_BINARY, "--listen=127.0.0.1:0", "--metrics_port=0",
                          "--workers=" + worker->address(), "--auth_tokens_file=" + tokens_,
                          "--auth_token_file=" + own_token_, "--public_namespaces=shared"})
                  .ok());
  const std::string text = "Mira Ostrova kept the lighthouse on the Vantor river.";
  Reply made = Generate(Inference(router.address(), kAcme), TextRequest(text, "docs"));
  ASSERT_TRUE(made.status.ok()) << made.status.error_message();
  ASSERT_EQ(made.last.document_ids_size(), 1);
  const std::string id = made.last.document_ids(0);

  // Its tenant names it by id, through the router and on the worker.
  for (const std::string& at : {router.address(), worker->address()}) {
    Reply again = Generate(Inference(at, kAcme), IdRequest(id, "docs"));
    EXPECT_TRUE(again.status.ok()) << at << ": " << again.status.error_message();
    EXPECT_EQ(again.text, made.text);
    // Another tenant, even naming the same namespace, does not find it.
    Reply other = Generate(Inference(at, kGlobex), IdRequest(id, "docs"));
    EXPECT_EQ(other.status.error_code(), grpc::StatusCode::NOT_FOUND) << at;
    EXPECT_EQ(other.messages, 0);
    Reply other_ns = Generate(Inference(at, kGlobex), IdRequest(id, "acme/docs"));
    EXPECT_EQ(other_ns.status.error_code(), grpc::StatusCode::NOT_FOUND) << at;
  }
  // The same text in another tenant is another document.
  Reply globex = Generate(Inference(router.address(), kGlobex), TextRequest(text, "docs"));
  ASSERT_TRUE(globex.status.ok()) << globex.status.error_message();
  EXPECT_NE(globex.last.document_ids(0), id);

  // Stats: each client sees its own documents; the router's worker identity sees all.
  for (const std::string& at : {router.address(), worker->address()}) {
    v1::StatsResponse acme, other;
    ASSERT_EQ(StatsCode(Inference(at, kAcme), &acme), grpc::StatusCode::OK);
    ASSERT_EQ(StatsCode(Inference(at, kGlobex), &other), grpc::StatusCode::OK);
    EXPECT_TRUE(Lists(acme, id)) << at;
    EXPECT_FALSE(Lists(other, id)) << at;
    EXPECT_TRUE(Lists(other, globex.last.document_ids(0))) << at;
    EXPECT_FALSE(Lists(acme, globex.last.document_ids(0))) << at;
    EXPECT_EQ(StatsCode(Inference(at, "")), grpc::StatusCode::UNAUTHENTICATED) << at;
  }
  v1::StatsResponse all;
  ASSERT_EQ(StatsCode(Inference(worker->address(), kWorker), &all), grpc::StatusCode::OK);
  EXPECT_TRUE(Lists(all, id));
  EXPECT_TRUE(Lists(all, globex.last.document_ids(0)));
  // One Stats call without a token each; the router's own calls to the worker carry its token.
  EXPECT_EQ(MetricAt(router.metrics_port(), kUnauthenticated), 1);
  EXPECT_EQ(MetricAt(router.metrics_port(), kPermissionDenied), 0);
  EXPECT_EQ(worker->Metric(kUnauthenticated), 1) << worker->Metrics();

  // A public namespace is shared: one tenant's id resolves for another there.
  Reply shared = Generate(Inference(router.address(), kAcme), TextRequest(text, "shared"));
  ASSERT_TRUE(shared.status.ok()) << shared.status.error_message();
  Reply by_other = Generate(Inference(router.address(), kGlobex),
                            IdRequest(shared.last.document_ids(0), "shared"));
  EXPECT_TRUE(by_other.status.ok()) << by_other.status.error_message();
}

TEST_F(AuthProcessTest, HttpNeedsAToken) {
  const int port = lazyrag::testing::PickFreePort();
  auto worker = NewWorker({absl::StrCat("--http_listen=127.0.0.1:", port)});
  ASSERT_TRUE(worker->Start().ok());
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(60, 0);
  const std::string body =
      R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}],
          "documents": [{"text": "The Vantor river freezes every January."}]})";
  httplib::Result none = http.Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401) << none->body;
  EXPECT_NE(none->body.find("\"error\""), std::string::npos) << none->body;
  httplib::Result bad =
      http.Post("/v1/chat/completions", {{"Authorization", "Bearer not-a-known-token-at-all"}},
                body, "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 401) << bad->body;
  EXPECT_EQ(worker->Metric(kUnauthenticated), 2) << worker->Metrics();
  httplib::Result good =
      http.Post("/v1/chat/completions", {{"Authorization", absl::StrCat("Bearer ", kAcme)}}, body,
                "application/json");
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200) << good->body;
}

TEST_F(AuthProcessTest, TokenFileIsReloadedWhenItChanges) {
  auto worker = NewWorker();
  ASSERT_TRUE(worker->Start().ok());
  auto acme = Inference(worker->address(), kAcme);
  const std::string newcomer = "initech-client-token-001";
  auto initech = Inference(worker->address(), newcomer);
  EXPECT_EQ(StatsCode(acme), grpc::StatusCode::OK);
  EXPECT_EQ(StatsCode(initech), grpc::StatusCode::UNAUTHENTICATED);
  // Rotated: acme's token is gone, initech's is new.
  WriteFile(tokens_, absl::StrCat(newcomer, " initech client\n", kWorker, " cluster worker\n"));
  grpc::StatusCode code = grpc::StatusCode::UNAUTHENTICATED;
  for (int i = 0; i < 100 && code != grpc::StatusCode::OK; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    code = StatsCode(initech);
  }
  EXPECT_EQ(code, grpc::StatusCode::OK);
  EXPECT_EQ(StatsCode(acme), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(worker->Metric("lazyrag_auth_token_reloads_total{result=\"ok\"}"), 1);
  // A broken edit keeps the tokens it had.
  WriteFile(tokens_, "this is not a token file\n");
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_EQ(StatsCode(initech), grpc::StatusCode::OK);
  EXPECT_EQ(worker->Metric("lazyrag_auth_token_reloads_total{result=\"error\"}"), 1);
  EXPECT_EQ(worker->Metric("lazyrag_auth_token_reloads_total{result=\"ok\"}"), 1);
}

TEST_F(AuthProcessTest, PoisonedValueIsMissedRecomputedAndReplaced) {
  ASSERT_TRUE(StartKvstore().ok());
  const std::string text = "The Vantor river freezes every January, said Mira Ostrova.";
  auto first = NewWorker();
  ASSERT_TRUE(first->Start().ok());
  Reply made = Generate(Inference(first->address(), kAcme), TextRequest(text));
  ASSERT_TRUE(made.status.ok()) << made.status.error_message();
  const std::string id = made.last.document_ids(0);
  v1::StatsResponse stats;
  ASSERT_EQ(StatsCode(Inference(first->address(), kWorker), &stats), grpc::StatusCode::OK);

  // The stored value, read as a worker would (acme's namespace is "acme/").
  kvstore::KvClientOptions co;
  co.shards = {kv_.address()};
  co.auth_token = BearerToken::Fixed(kWorker);
  auto client = kvstore::KvClient::Create(co);
  ASSERT_TRUE(client.ok()) << client.status();
  const kvstore::Key key = kvstore::Key::Document(stats.model_fingerprint(), "acme/", id);
  absl::StatusOr<kvstore::Value> stored = absl::NotFoundError("not yet");
  for (int i = 0; i < 100 && !stored.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    stored = (*client)->Get(key);
  }
  ASSERT_TRUE(stored.ok()) << stored.status();
  first->Stop(SIGKILL);

  // Poisoned: KV bytes changed, put back with fresh chunk CRCs (as anyone reaching a shard can).
  // Read by a worker without a host tier (Get, then the MAC over the value) and by one with it
  // (GetInto into pinned host memory, the MAC folded into the landing pass).
  std::unique_ptr<WorkerProcess> third;
  for (bool host_tier : {false, true}) {
    SCOPED_TRACE(host_tier ? "host tier" : "no host tier");
    const std::vector<std::string> tier = {host_tier ? "--host_cache_bytes=268435456"
                                                     : "--host_cache_bytes=0"};
    auto current = (*client)->Get(key);
    ASSERT_TRUE(current.ok()) << current.status();
    std::string poisoned = current->bytes;
    for (size_t i = poisoned.size() / 2; i < poisoned.size(); i += 97) poisoned[i] ^= 0x5a;
    ASSERT_TRUE((*client)->Put(key, current->header, poisoned).ok());

    // A fresh worker misses it (MAC), recomputes: the same answer, nothing served from the store.
    auto second = NewWorker(tier);
    ASSERT_TRUE(second->Start().ok());
    Reply again = Generate(Inference(second->address(), kAcme), TextRequest(text));
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_EQ(again.text, made.text);
    EXPECT_EQ(again.tokens, made.tokens);
    EXPECT_EQ(again.last.usage().store_document_tokens(), 0);
    EXPECT_EQ(second->Metric("lazyrag_kvstore_mac_failures_total"), 1) << second->Metrics();

    // ... and writes the recomputed document back over it: the next fresh worker reads it.
    bool replaced = false;
    for (int i = 0; i < 100 && !replaced; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
      auto now = (*client)->Get(key);
      replaced = now.ok() && now->bytes != poisoned;
    }
    ASSERT_TRUE(replaced);
    second->Stop(SIGKILL);
    third = NewWorker(tier);
    ASSERT_TRUE(third->Start().ok());
    Reply fetched = Generate(Inference(third->address(), kAcme), TextRequest(text));
    ASSERT_TRUE(fetched.status.ok()) << fetched.status.error_message();
    EXPECT_EQ(fetched.text, made.text);
    EXPECT_EQ(fetched.last.usage().store_document_tokens(), fetched.last.usage().document_tokens());
    EXPECT_EQ(third->Metric("lazyrag_kvstore_mac_failures_total"), 0);
    third->Stop(SIGKILL);
  }

  // A value stripped of its MAC (a plain CRC-32C header, as a worker without the key writes) is
  // not accepted either.
  auto plain = (*client)->Get(key);
  ASSERT_TRUE(plain.ok());
  kvstore::ValueHeader stripped = plain->header;
  stripped.metadata.resize(44);
  stripped.metadata[36] = 1;  // checksum algorithm 1: CRC-32C only
  ASSERT_TRUE((*client)->Put(key, stripped, plain->bytes).ok());
  auto fourth = NewWorker();
  ASSERT_TRUE(fourth->Start().ok());
  Reply last = Generate(Inference(fourth->address(), kAcme), TextRequest(text));
  ASSERT_TRUE(last.status.ok()) << last.status.error_message();
  EXPECT_EQ(last.text, made.text);
  EXPECT_EQ(last.last.usage().store_document_tokens(), 0);
  EXPECT_EQ(fourth->Metric("lazyrag_kvstore_mac_failures_total"), 1);
}

}  // namespace
}  // namespace lazyrag
