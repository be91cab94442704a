// Issue 9 (peer tier), against real processes on loopback: a worker that lacks a document
// takes it from a peer worker's pool (lazyrag.v1.PeerDocuments) instead of computing it or
// reading the kvstore; a peer that is down means the kvstore, then compute; bad --peers
// refuses to start. CPU workers cannot lend their pool (the fast path, GetPool / LeaseDocument:
// UNIMPLEMENTED), so documents travel as bytes (path 1); the GPU-to-GPU path is
// peer_gpu_process_test.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kvstore/tests/test_util.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "tests/worker/worker_test_util.h"
#include "lazyrag/v1/peer.grpc.pb.h"

namespace lazyrag {
namespace {

using kvstore::testing::FetchMetrics;
using kvstore::testing::KvStoreProcess;
using kvstore::testing::MetricValue;
using kvstore::testing::ReadyProcess;
using kvstore::testing::TempDir;

const char kModel[] = "synthetic:tiny";

using worker_test::Generate;
using worker_test::Reply;

// A synthetic:tiny worker with extra flags.
class WorkerProcess : public worker_test::WorkerProcess {
 public:
  explicit WorkerProcess(std::vector<std::string> args)
      : worker_test::WorkerProcess(WithModel(std::move(args))) {}

 private:
  static std::vector<std::string> WithModel(std::vector<std::string> args) {
    args.insert(args.begin(), std::string("--model=") + kModel);
    return args;
  }
};

std::string DocText(int i) {
  return absl::StrCat("Peer document ", i, ": the ferry ", i * 3 % 7, " crosses lake ", i * 11 % 13,
                      " twice a day, carrying ", i + 4, " carts of apples.");
}

v1::GenerateRequest Request(const std::vector<int> &docs, const std::string &query) {
  v1::GenerateRequest r;
  for (int d : docs) r.add_documents()->set_text(DocText(d));
  r.set_query(query);
  r.set_max_tokens(10);
  r.set_ignore_eos(true);
  return r;
}

const std::string kModelLabel = std::string("{model=\"") + kModel + "\"}";
std::string Tier(const char *tier) {
  return absl::StrCat("lazyrag_doc_cache_hits_total{model=\"", kModel, "\",tier=\"", tier, "\"}");
}

TEST(PeerProcessTest, WorkerTakesDocumentsFromAPeerInsteadOfComputingOrTheKvstore) {
  TempDir dir;
  KvStoreProcess kv(LAZYRAG_KVSTORE_BINARY, dir.path() + "/kv", {"--sync_commits=false"});
  ASSERT_TRUE(kv.Start().ok());
  WorkerProcess b({});  // holds the documents; no kvstore
  ASSERT_TRUE(b.Start().ok());
  Reply warm = Generate(b.stub(), Request({0, 1, 2}, "Which ferry carries apples?"));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();

  WorkerProcess a({"--peers=" + b.address(), "--kvstore=" + kv.address()});
  ASSERT_TRUE(a.Start().ok());
  const v1::GenerateRequest req = Request({2, 0, 1}, "How often does the ferry cross?");
  Reply got = Generate(a.stub(), req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const v1::Usage &u = got.last.usage();
  EXPECT_GT(u.document_tokens(), 0);
  EXPECT_EQ(u.store_document_tokens(), u.document_tokens());
  EXPECT_EQ(u.cached_document_tokens(), u.document_tokens());
  EXPECT_EQ(a.Metric("lazyrag_doc_computed_total" + kModelLabel), 0);
  EXPECT_EQ(a.Metric(Tier("peer")), 3);
  EXPECT_EQ(a.Metric(Tier("store")), 0);
  // Three documents, plus the system-prompt block when the template has one.
  const double hits = a.Metric("lazyrag_worker_peer_fetch_total{result=\"hit\"}");
  EXPECT_GE(hits, 3);
  EXPECT_GT(a.Metric("lazyrag_worker_peer_fetch_bytes_total"), 0);
  // CPU backends: no device leases, path 1 only.
  EXPECT_EQ(a.Metric("lazyrag_worker_peer_fetch_total{result=\"lease\"}"), 0);
  EXPECT_EQ(a.Metric("lazyrag_worker_peer_device_copy_total{result=\"ok\"}"), 0);
  EXPECT_EQ(b.Metric("lazyrag_worker_peer_leases_total{result=\"granted\"}"), 0);
  EXPECT_EQ(b.Metric("lazyrag_worker_peer_serve_total{result=\"hit\"}"), hits);
  // The kvstore was never asked for them (no get at all), and nothing came from a peer is
  // written back to it.
  EXPECT_LE(a.Metric("lazyrag_kvstore_requests_total{op=\"get\",result=\"miss\"}"), 0);
  EXPECT_LE(a.Metric("lazyrag_kvstore_requests_total{op=\"get\",result=\"hit\"}"), 0);
  EXPECT_LE(a.Metric("lazyrag_kvstore_requests_total{op=\"put\",result=\"ok\"}"), 0);

  // Equal to a fresh computation of the same request.
  WorkerProcess fresh({});
  ASSERT_TRUE(fresh.Start().ok());
  Reply ref = Generate(fresh.stub(), req);
  ASSERT_TRUE(ref.status.ok());
  EXPECT_EQ(ref.last.usage().cached_document_tokens(), 0);
  EXPECT_EQ(got.tokens, ref.tokens);
  EXPECT_EQ(got.tokens.size(), 10u);

  // A document no peer holds: the peers miss, the kvstore misses, A computes it.
  Reply other = Generate(a.stub(), Request({5}, "And the fifth?"));
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(other.last.usage().computed_tokens(), other.last.usage().prompt_tokens());
  EXPECT_GE(a.Metric("lazyrag_worker_peer_fetch_total{result=\"miss\"}"), 1);
  EXPECT_GE(a.Metric("lazyrag_kvstore_requests_total{op=\"get\",result=\"miss\"}"), 1);
  EXPECT_EQ(a.Metric("lazyrag_doc_computed_total" + kModelLabel), 1);
}

TEST(PeerProcessTest, PeerDownFallsBackToTheKvstoreThenToCompute) {
  TempDir dir;
  KvStoreProcess kv(LAZYRAG_KVSTORE_BINARY, dir.path() + "/kv", {"--sync_commits=false"});
  ASSERT_TRUE(kv.Start().ok());
  // W writes documents 3 and 4 back to the kvstore.
  Reply first;
  {
    WorkerProcess w({"--kvstore=" + kv.address()});
    ASSERT_TRUE(w.Start().ok());
    first = Generate(w.stub(), Request({3, 4}, "Where is lake four?"));
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    for (int i = 0; i < 200; ++i) {
      if (w.Metric("lazyrag_kvstore_requests_total{op=\"put\",result=\"ok\"}") >=
          first.last.document_ids_size()) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    w.Stop(SIGKILL);
  }
  // A peer that held them is gone.
  WorkerProcess dead({});
  ASSERT_TRUE(dead.Start().ok());
  ASSERT_TRUE(Generate(dead.stub(), Request({3, 4, 6}, "warm")).status.ok());
  const std::string dead_address = dead.address();
  dead.Stop(SIGKILL);

  WorkerProcess a({"--peers=" + dead_address, "--kvstore=" + kv.address()});
  ASSERT_TRUE(a.Start().ok());
  Reply got = Generate(a.stub(), Request({3, 4}, "Where is lake four?"));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.last.usage().store_document_tokens(), got.last.usage().document_tokens());
  EXPECT_EQ(got.tokens, first.tokens);
  EXPECT_EQ(a.Metric(Tier("store")), 2);
  // The gone peer was asked and served nothing: usually UNAVAILABLE; with tests running in
  // parallel another test's server may have taken its port by then (a miss, or UNIMPLEMENTED).
  const std::string metrics = a.Metrics();
  double failed_asks = 0;  // every lazyrag_worker_peer_fetch_total series but hit and lease
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, "lazyrag_worker_peer_fetch_total{") ||
        absl::StrContains(line, "\"hit\"") || absl::StrContains(line, "\"lease\"")) {
      continue;
    }
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) failed_asks += v;
  }
  EXPECT_GE(failed_asks, 1) << metrics;
  EXPECT_LE(a.Metric("lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 0);
  // Neither the dead peer nor the kvstore has document 6: computed, and the request succeeds.
  Reply six = Generate(a.stub(), Request({6}, "And six?"));
  ASSERT_TRUE(six.status.ok()) << six.status.error_message();
  EXPECT_EQ(six.last.usage().cached_document_tokens(), 0);
  EXPECT_EQ(a.Metric("lazyrag_doc_computed_total" + kModelLabel), 1);
}

TEST(PeerProcessTest, PeersOnlyWithoutKvstoreComputesOnAMiss) {
  WorkerProcess b({});
  ASSERT_TRUE(b.Start().ok());
  WorkerProcess a({"--peers=" + b.address()});
  ASSERT_TRUE(a.Start().ok());
  Reply r = Generate(a.stub(), Request({8}, "Nobody has eight"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.last.usage().cached_document_tokens(), 0);
  EXPECT_GE(a.Metric("lazyrag_worker_peer_fetch_total{result=\"miss\"}"), 1);
  // Now B asks A (a one-way --peers is enough for the direction that has it).
  WorkerProcess c({"--peers=" + a.address()});
  ASSERT_TRUE(c.Start().ok());
  Reply rc = Generate(c.stub(), Request({8}, "Nobody has eight"));
  ASSERT_TRUE(rc.status.ok());
  EXPECT_EQ(rc.last.usage().store_document_tokens(), rc.last.usage().document_tokens());
  EXPECT_EQ(rc.tokens, r.tokens);
}

TEST(PeerProcessTest, BadPeersFlagRefusesToStartAndBadCallsGetAClearStatus) {
  WorkerProcess bad({"--peers=no-port-here"});
  EXPECT_FALSE(bad.Start().ok());
  WorkerProcess w({});
  ASSERT_TRUE(w.Start().ok());
  auto stub = v1::PeerDocuments::NewStub(
      grpc::CreateChannel(w.address(), grpc::InsecureChannelCredentials()));
  auto call = [&](const v1::PeerGetRequest &req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = stub->GetDocument(&ctx, req);
    v1::PeerGetResponse m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  };
  v1::PeerGetRequest req;
  req.set_document_id(std::string(64, 'a'));
  EXPECT_EQ(call(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // no fingerprint
  req.set_model_fingerprint("some-other-model");
  grpc::Status st = call(req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("some-other-model"), std::string::npos);
  // With the worker's own fingerprint (named in that message): an id it does not hold.
  const std::string msg = st.error_message();
  const size_t from = msg.find("serves model ") + 13, to = msg.find(", not ");
  ASSERT_NE(to, std::string::npos) << msg;
  req.set_model_fingerprint(msg.substr(from, to - from));
  st = call(req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  EXPECT_EQ(w.Metric("lazyrag_worker_peer_serve_total{result=\"miss\"}"), 1);

  // The fast path's calls on a CPU worker: its pool cannot be lent.
  const std::string fingerprint = req.model_fingerprint();
  auto deadline = [](grpc::ClientContext &ctx) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  };
  auto get_pool = [&](const std::string &fp) {
    grpc::ClientContext ctx;
    deadline(ctx);
    v1::PeerPoolRequest r;
    r.set_model_fingerprint(fp);
    v1::PeerPool resp;
    return stub->GetPool(&ctx, r, &resp);
  };
  auto lease = [&](const std::string &fp, const std::string &id, uint32_t ms) {
    grpc::ClientContext ctx;
    deadline(ctx);
    v1::PeerLeaseRequest r;
    r.set_model_fingerprint(fp);
    r.set_document_id(id);
    r.set_lease_ms(ms);
    v1::PeerLease resp;
    return stub->LeaseDocument(&ctx, r, &resp);
  };
  auto release = [&](uint64_t id) {
    grpc::ClientContext ctx;
    deadline(ctx);
    v1::PeerReleaseRequest r;
    r.set_lease_id(id);
    v1::PeerReleaseResponse resp;
    return stub->ReleaseLease(&ctx, r, &resp);
  };
  st = get_pool(fingerprint);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED) << st.error_message();
  EXPECT_FALSE(st.error_message().empty());
  EXPECT_EQ(get_pool("").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(get_pool("some-other-model").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const std::string id(64, 'a');
  st = lease(fingerprint, id, 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED) << st.error_message();
  EXPECT_EQ(lease("", id, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(lease(fingerprint, "", 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(lease(fingerprint, id, 60001).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(lease("some-other-model", id, 0).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  st = release(12345);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  EXPECT_EQ(release(0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace lazyrag
