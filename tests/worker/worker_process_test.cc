// Issue 4's Must-show, against real processes on loopback: lazyrag-worker
// (synthetic:tiny, and the real model when $LAZYRAG_MODEL is set) and
// lazyrag-kvstore.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/testing/child_process.h"
#include "gtest/gtest.h"
#include "kvstore/tests/test_util.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "tests/worker/worker_test_util.h"

namespace lazyrag {
namespace {

using kvstore::testing::FetchMetrics;
using kvstore::testing::KvStoreProcess;
using kvstore::testing::MetricValue;
using kvstore::testing::ReadyProcess;
using kvstore::testing::TempDir;

using worker_test::Generate;
using worker_test::Reply;
using worker_test::WorkerProcess;

// Deterministic document texts (distinct, ~60-90 bytes: 4-6 pages of 16 tokens
// each with the byte tokenizer of synthetic models).
std::string DocText(int i) {
  return absl::StrCat("Document ", i, ": the river ", i * 7 % 13, " flows past hill ", i * 5 % 11,
                      ", and the old mill number ", i, " grinds grain.");
}

v1::GenerateRequest Request(const std::vector<int> &docs, const std::string &query,
                            int max_tokens = 8) {
  v1::GenerateRequest r;
  for (int d : docs) r.add_documents()->set_text(DocText(d));
  r.set_query(query);
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r;
}

std::string Model() {
  const char *m = std::getenv("LAZYRAG_WORKER_TEST_MODEL");
  return m != nullptr ? m : "synthetic:tiny";
}

// Must-show 1, on a given model.
void NewOrderIsFullyCached(const std::string &model) {
  SCOPED_TRACE(model);
  WorkerProcess a({"--model=" + model});
  ASSERT_TRUE(a.Start().ok());
  Reply warm = Generate(a.stub(), Request({0, 1, 2}, "Which mill grinds grain?"));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  EXPECT_EQ(warm.last.usage().cached_document_tokens(), 0);
  // Without documents: the prefix block is cached, so computed = the query
  // block alone.
  Reply nodoc = Generate(a.stub(), Request({}, "Where does the river flow?"));
  ASSERT_TRUE(nodoc.status.ok());
  const int64_t query_tokens = nodoc.last.usage().computed_tokens();
  v1::GenerateRequest reordered = Request({2, 0, 1}, "Where does the river flow?", 12);
  Reply again = Generate(a.stub(), reordered);
  ASSERT_TRUE(again.status.ok());
  const v1::Usage &u = again.last.usage();
  EXPECT_GT(u.document_tokens(), 0);
  EXPECT_EQ(u.cached_document_tokens(), u.document_tokens());
  EXPECT_EQ(u.pool_document_tokens(), u.document_tokens());
  EXPECT_EQ(u.computed_tokens(), query_tokens);
  // A fresh worker computes everything and produces the same greedy output.
  WorkerProcess b({"--model=" + model});
  ASSERT_TRUE(b.Start().ok());
  Reply fresh = Generate(b.stub(), reordered);
  ASSERT_TRUE(fresh.status.ok());
  EXPECT_EQ(fresh.last.usage().cached_document_tokens(), 0);
  EXPECT_EQ(fresh.tokens, again.tokens);
  EXPECT_EQ(fresh.text, again.text);
  EXPECT_EQ(again.tokens.size(), 12u);
}

TEST(WorkerProcessTest, SameDocumentsInANewOrderAreFullyCached) { NewOrderIsFullyCached(Model()); }

TEST(WorkerProcessTest, SameDocumentsInANewOrderAreFullyCachedRealModel) {
  const char *path = std::getenv("LAZYRAG_MODEL");
  if (path == nullptr || access(path, R_OK) != 0) GTEST_SKIP() << "LAZYRAG_MODEL not set";
  NewOrderIsFullyCached(path);
}

// 16 requests over 6 documents, 3 each, overlapping.
std::vector<v1::GenerateRequest> OverlappingRequests() {
  std::vector<v1::GenerateRequest> out;
  for (int i = 0; i < 16; ++i) {
    out.push_back(
        Request({i % 6, (i + 1) % 6, (i * 5 + 3) % 6 == i % 6 ? (i + 2) % 6 : (i * 5 + 3) % 6},
                absl::StrCat("Question ", i, "?"), 6));
  }
  return out;
}

std::vector<Reply> RunAll(WorkerProcess &w, const std::vector<v1::GenerateRequest> &reqs,
                          bool concurrent) {
  std::vector<Reply> replies(reqs.size());
  if (!concurrent) {
    for (size_t i = 0; i < reqs.size(); ++i) replies[i] = Generate(w.stub(), reqs[i]);
    return replies;
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] { replies[i] = Generate(w.stub(), reqs[i]); });
  }
  for (auto &t : threads) t.join();
  return replies;
}

// Must-show 2 and 7.
TEST(WorkerProcessTest, SixteenConcurrentClientsComputeEachDocumentOnce) {
  const auto reqs = OverlappingRequests();
  // Each request alone, each on a fresh pool (a worker per request would be
  // slow; a worker whose pool is emptied is not possible, so: alone =
  // sequentially, one at a time).
  WorkerProcess alone({"--model=" + Model()});
  ASSERT_TRUE(alone.Start().ok());
  auto ref = RunAll(alone, reqs, false);
  WorkerProcess w(
      {"--model=" + Model(), "--served_model_name=" + Model(), "--max_batch_tokens=256"});
  ASSERT_TRUE(w.Start().ok());
  auto got = RunAll(w, reqs, true);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(ref[i].status.ok()) << ref[i].status.error_message();
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
  }
  const std::string model = "{model=\"" + Model() + "\"}";
  // The running gauge is set once per scheduler iteration, after the step that finished the
  // last requests; a client can hold its last token before that. Wait for it (5 s at most).
  for (int i = 0; i < 200 && w.Metric("lazyrag_requests_running" + model) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  const std::string m = w.Metrics();
  EXPECT_EQ(MetricValue(m, "lazyrag_doc_computed_total" + model), 6);
  EXPECT_EQ(MetricValue(m, "lazyrag_doc_cache_lookups_total" + model), 48);
  EXPECT_EQ(MetricValue(m, "lazyrag_doc_cache_hits_total{model=\"" + Model() + "\",tier=\"cpu\"}"),
            42);
  EXPECT_EQ(MetricValue(m, "lazyrag_requests_running" + model), 0);
  // Must-show 7: the exposition passes Prometheus' own checker.
  if (system("command -v promtool >/dev/null 2>&1") == 0) {
    TempDir dir;
    const std::string file = dir.path() + "/metrics.txt";
    FILE *f = fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fwrite(m.data(), 1, m.size(), f);
    fclose(f);
    EXPECT_EQ(system(("promtool check metrics < " + file).c_str()), 0) << m;
  }
}

// Issue 9: `--tp 2` (two rank threads on the CPU, in-process all-reduce) serves the same
// tokens as the plain worker, documents shared and reordered included; a degree the model
// cannot split stops the worker at startup instead of serving.
TEST(WorkerProcessTest, TensorParallelWorkerServesThePlainWorkersTokens) {
  if (Model() != "synthetic:tiny") GTEST_SKIP() << "written for synthetic:tiny (2 KV heads)";
  const auto reqs = OverlappingRequests();
  WorkerProcess plain({"--model=" + Model()});
  ASSERT_TRUE(plain.Start().ok());
  WorkerProcess tp({"--model=" + Model(), "--tp=2"});
  ASSERT_TRUE(tp.Start().ok());
  auto ref = RunAll(plain, reqs, false);
  auto got = RunAll(tp, reqs, false);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(ref[i].status.ok()) << ref[i].status.error_message();
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
  }
  WorkerProcess bad({"--model=" + Model(), "--tp=3"});
  const absl::Status st = bad.Start();
  EXPECT_FALSE(st.ok()) << "a worker with --tp=3 on a model with 2 KV heads started";
}

// Must-show 3: a pool smaller than the working set.
TEST(WorkerProcessTest, SmallPoolEvictsWithoutFailuresOrChangedOutputs) {
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back(Request({i, (i + 5) % 12}, absl::StrCat("Q", i), 6));
  WorkerProcess big({"--model=" + Model()});
  ASSERT_TRUE(big.Start().ok());
  auto ref = RunAll(big, reqs, false);
  // 48 pages of 16 tokens (8 KiB each for synthetic:tiny): the 12 documents
  // need ~60.
  WorkerProcess small({"--model=" + Model(), "--served_model_name=" + Model(),
                       "--kv_pool_bytes=393216"});
  ASSERT_TRUE(small.Start().ok());
  auto seq = RunAll(small, reqs, false);
  auto conc = RunAll(small, reqs, true);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(ref[i].status.ok()) << ref[i].status.error_message();
    ASSERT_TRUE(seq[i].status.ok()) << i << ": " << seq[i].status.error_message();
    ASSERT_TRUE(conc[i].status.ok()) << i << ": " << conc[i].status.error_message();
    EXPECT_EQ(seq[i].tokens, ref[i].tokens) << i;
    EXPECT_EQ(conc[i].tokens, ref[i].tokens) << i;
  }
  EXPECT_GT(small.Metric("lazyrag_kv_pool_evictions_total{model=\"" + Model() + "\"}"), 0);
}

void WaitForPuts(WorkerProcess &w, double n) {
  for (int i = 0; i < 200; ++i) {
    if (w.Metric("lazyrag_kvstore_requests_total{op=\"put\",result=\"ok\"}") >= n) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ADD_FAILURE() << "write-backs did not complete";
}

// Must-show 4, with the kvstore service and with the embedded store.
void RestartComesBackFromStore(const std::string &kvstore_flag, int stop_signal) {
  SCOPED_TRACE(kvstore_flag);
  const v1::GenerateRequest req = Request({3, 4}, "What does the mill do?", 8);
  std::vector<std::string> ids;
  Reply first;
  {
    WorkerProcess w1(
        {"--model=" + Model(), "--served_model_name=" + Model(), "--kvstore=" + kvstore_flag});
    ASSERT_TRUE(w1.Start().ok());
    first = Generate(w1.stub(), req);
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    EXPECT_EQ(first.last.usage().store_document_tokens(), 0);
    // Two documents (plus the prefix block when the template has one).
    WaitForPuts(w1, double(first.last.document_ids_size()));
    w1.Stop(stop_signal);
  }
  WorkerProcess w2(
      {"--model=" + Model(), "--served_model_name=" + Model(), "--kvstore=" + kvstore_flag});
  ASSERT_TRUE(w2.Start().ok());
  Reply second = Generate(w2.stub(), req);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  const v1::Usage &u = second.last.usage();
  EXPECT_EQ(u.store_document_tokens(), u.document_tokens());
  EXPECT_EQ(u.cached_document_tokens(), u.document_tokens());
  EXPECT_EQ(second.tokens, first.tokens);
  const std::string model = "{model=\"" + Model() + "\"}";
  EXPECT_EQ(w2.Metric("lazyrag_doc_computed_total" + model), 0);
  EXPECT_EQ(w2.Metric("lazyrag_doc_cache_hits_total{model=\"" + Model() + "\",tier=\"store\"}"), 2);
  w2.Stop(SIGKILL);  // an embedded store is locked by one process at a time
  // Documents named by id survive the restart too (their tokens are stored with
  // the KV).
  WorkerProcess w3({"--model=" + Model(), "--kvstore=" + kvstore_flag});
  ASSERT_TRUE(w3.Start().ok());
  v1::GenerateRequest by_id = req;
  by_id.clear_documents();
  for (const auto &id : first.last.document_ids()) by_id.add_documents()->set_id(id);
  Reply third = Generate(w3.stub(), by_id);
  ASSERT_TRUE(third.status.ok()) << third.status.error_message();
  EXPECT_EQ(third.tokens, first.tokens);
  EXPECT_EQ(third.last.usage().store_document_tokens(), third.last.usage().document_tokens());
}

TEST(WorkerProcessTest, RestartedWorkerGetsDocumentsFromTheKvstore) {
  TempDir dir;
  KvStoreProcess kv(LAZYRAG_KVSTORE_BINARY, dir.path() + "/kv", {"--sync_commits=false"});
  ASSERT_TRUE(kv.Start().ok());
  // Graceful stop once, then kills: what was written back must survive a crash
  // as well.
  RestartComesBackFromStore(kv.address(), SIGTERM);
  RestartComesBackFromStore("embedded:" + dir.path() + "/embedded", SIGKILL);
}

// --kvstore_replication reaches the kvstore client: more copies than shards stops the worker at
// startup; one copy on one shard serves and writes back.
TEST(WorkerProcessTest, KvstoreReplicationFlagIsChecked) {
  TempDir dir;
  KvStoreProcess kv(LAZYRAG_KVSTORE_BINARY, dir.path() + "/kv", {"--sync_commits=false"});
  ASSERT_TRUE(kv.Start().ok());
  WorkerProcess two({"--model=" + Model(), "--kvstore=" + kv.address(), "--kvstore_replication=2"});
  EXPECT_FALSE(two.Start().ok()) << "2 replicas on 1 shard accepted";
  WorkerProcess one({"--model=" + Model(), "--kvstore=" + kv.address(), "--kvstore_replication=1"});
  ASSERT_TRUE(one.Start().ok());
  Reply r = Generate(one.stub(), Request({3}, "One copy?"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  for (int i = 0; i < 100 && one.Metric("lazyrag_kvstore_requests_total{op=\"put\",result=\"ok\"}") < 1;
       ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(one.Metric("lazyrag_kvstore_requests_total{op=\"put\",result=\"ok\"}"), 1);
}

// Must-show 5.
TEST(WorkerProcessTest, KvstoreDownMeansRecompute) {
  TempDir dir;
  KvStoreProcess kv(LAZYRAG_KVSTORE_BINARY, dir.path() + "/kv", {"--sync_commits=false"});
  ASSERT_TRUE(kv.Start().ok());
  WorkerProcess w({"--model=" + Model(), "--kvstore=" + kv.address()});
  ASSERT_TRUE(w.Start().ok());
  Reply warm = Generate(w.stub(), Request({7}, "warm up"));
  ASSERT_TRUE(warm.status.ok());
  kv.Kill();
  Reply r = Generate(w.stub(), Request({8, 9}, "Is the store down?"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.last.usage().store_document_tokens(), 0);
  EXPECT_EQ(r.last.usage().cached_document_tokens(), 0);
  const std::string m = w.Metrics();
  const double failed =
      MetricValue(m, "lazyrag_kvstore_requests_total{op=\"get\",result=\"unavailable\"}") +
      std::max(0.0, MetricValue(m,
                                "lazyrag_kvstore_requests_total{op=\"get\","
                                "result=\"skipped\"}")) +
      std::max(0.0, MetricValue(m,
                                "lazyrag_kvstore_requests_total{op=\"get\","
                                "result=\"deadline_exceeded\"}"));
  EXPECT_GE(failed, 2) << m;
  EXPECT_EQ(MetricValue(m, "lazyrag_doc_computed_total{model=\"" + Model() + "\"}"), 3);
}

// Must-show 6.
TEST(WorkerProcessTest, BadInputGetsAClearStatus) {
  WorkerProcess w({"--model=" + Model(), "--max_running=1", "--max_waiting=1"});
  ASSERT_TRUE(w.Start().ok());
  auto expect = [&](const v1::GenerateRequest &req, grpc::StatusCode code, const std::string &what,
                    double timeout_s = 30) {
    Reply r = Generate(w.stub(), req, timeout_s);
    EXPECT_EQ(r.status.error_code(), code) << what << ": " << r.status.error_message();
    EXPECT_FALSE(r.status.error_message().empty()) << what;
    EXPECT_EQ(r.messages, 0) << what;
  };
  v1::GenerateRequest good = Request({1}, "fine?");
  v1::GenerateRequest r = good;
  r.set_query("");
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "empty query");
  r = good;
  r.set_query(std::string(3000, 'x'));
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "longer than the context");
  r = good;
  r.clear_documents();
  r.add_documents()->set_id(std::string(64, 'a'));
  expect(r, grpc::StatusCode::NOT_FOUND, "unknown document id");
  r = good;
  r.set_max_tokens(0);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "max_tokens 0");
  r.set_max_tokens(1000000000);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "max_tokens absurd");
  r = good;
  r.mutable_sampling()->set_temperature(NAN);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "NaN temperature");
  r.mutable_sampling()->set_temperature(-0.5f);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "negative temperature");
  r = good;
  r.set_mode(static_cast<v1::AttentionMode>(17));
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "unknown mode");
  r = good;
  r.set_system_prompt("\xc3\x28 broken");
  r.set_query("ok");
  // proto3 strings must be UTF-8: protobuf refuses the message before the service sees it
  // (the client's protobuf sends it anyway, logging an error); lazyrag_wire_traits.h turns
  // gRPC's INTERNAL with an empty message into INVALID_ARGUMENT naming the message.
  {
    Reply bad = Generate(w.stub(), r);
    EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(bad.status.error_message().find("lazyrag.v1.GenerateRequest"), std::string::npos)
        << bad.status.error_message();
    EXPECT_NE(bad.status.error_message().find("UTF-8"), std::string::npos);
    EXPECT_EQ(bad.messages, 0);
  }
  {
    v1::PrepareDocumentsRequest prep;
    prep.add_texts("fine");
    prep.add_texts("caf\xe9 in Latin-1");
    v1::PrepareDocumentsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status st = w.stub().PrepareDocuments(&ctx, prep, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("lazyrag.v1.PrepareDocumentsRequest"), std::string::npos)
        << st.error_message();
  }
  expect(good, grpc::StatusCode::DEADLINE_EXCEEDED, "deadline already past", -1);
  // A full waiting queue: one running, one waiting, the rest refused.
  v1::GenerateRequest longreq = Request({2}, "long", 400);
  std::vector<Reply> replies(6);
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] { replies[i] = Generate(w.stub(), longreq); });
  }
  for (auto &t : threads) t.join();
  int exhausted = 0, ok = 0;
  for (const Reply &rep : replies) {
    if (rep.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
    if (rep.status.ok()) ++ok;
  }
  EXPECT_GE(exhausted, 1);
  EXPECT_GE(ok, 1);
}

// Must-show 6, second half: a client cancelling mid-stream returns the pool to
// its baseline.
TEST(WorkerProcessTest, CancellingMidStreamReturnsThePoolToBaseline) {
  WorkerProcess w({"--model=" + Model()});
  ASSERT_TRUE(w.Start().ok());
  v1::GenerateRequest req = Request({5, 6}, "Tell me everything.", 4);
  ASSERT_TRUE(Generate(w.stub(), req).status.ok());  // documents now resident
  auto stats = [&] {
    grpc::ClientContext ctx;
    v1::StatsResponse s;
    EXPECT_TRUE(w.stub().Stats(&ctx, v1::StatsRequest(), &s).ok());
    return s;
  };
  const v1::StatsResponse baseline = stats();
  EXPECT_EQ(baseline.pool().pages_pinned(), 0);
  EXPECT_GE(baseline.resident_document_ids_size(), 2);
  req.set_max_tokens(1500);
  grpc::ClientContext ctx;
  auto reader = w.stub().Generate(&ctx, req);
  v1::GenerateResponse m;
  int got = 0;
  while (got < 5 && reader->Read(&m)) ++got;
  ASSERT_EQ(got, 5);
  const v1::StatsResponse during = stats();
  EXPECT_GT(during.pool().pages_used(), baseline.pool().pages_used());
  EXPECT_GT(during.pool().pages_pinned(), 0);
  ctx.TryCancel();
  reader->Finish();
  v1::StatsResponse after;
  for (int i = 0; i < 100; ++i) {
    after = stats();
    if (after.pool().pages_used() == baseline.pool().pages_used() &&
        after.running_requests() == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(after.pool().pages_used(), baseline.pool().pages_used());
  EXPECT_EQ(after.pool().pages_pinned(), 0);
  EXPECT_EQ(after.running_requests(), 0);
}

std::string ReadFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The stderr line of `log` that holds `needle` ("" when none).
std::string LineWith(const std::string &log, const std::string &needle) {
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(needle) != std::string::npos) return line;
  }
  return "";
}

// The worker logs its configuration once at start-up and one line per finished request (with
// the request's id, or one it makes up), rejected requests included.
TEST(WorkerProcessTest, LogsTheStartUpAndOneLinePerFinishedRequest) {
  TempDir dir;
  const std::string err = dir.path() + "/stderr.txt";
  lazyrag::testing::ChildProcess p({LAZYRAG_WORKER_BINARY, "--listen=127.0.0.1:0",
                                    "--metrics_port=-1", "--model=" + Model(), "--page_size=16",
                                    "--kv_pool_bytes=" + std::to_string(64 << 20)});
  p.SetOutputFiles("", err);
  ASSERT_TRUE(p.Start().ok());
  auto ready = lazyrag::testing::WaitForReady(p, absl::Seconds(120));
  ASSERT_TRUE(ready.ok()) << ready.status();
  auto stub = v1::Inference::NewStub(
      grpc::CreateChannel(ready->address, grpc::InsecureChannelCredentials()));

  v1::GenerateRequest req = Request({0, 1}, "Which mill grinds grain?", 5);
  req.set_request_id("req-42");
  Reply first = Generate(*stub, req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  Reply again = Generate(*stub, req);  // same documents: from the pool
  ASSERT_TRUE(again.status.ok());
  v1::GenerateRequest anonymous = Request({}, "No id?", 2);
  anonymous.set_mode(v1::ATTENTION_MODE_FULL);
  ASSERT_TRUE(Generate(*stub, anonymous).status.ok());
  v1::GenerateRequest bad = Request({}, "", 2);
  bad.set_request_id("req-bad");
  EXPECT_EQ(Generate(*stub, bad).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(p.Stop(SIGTERM), 0);
  const std::string log = ReadFile(err);

  const std::string start = LineWith(log, "lazyrag-worker: serving");
  EXPECT_NE(start.find("grpc=" + ready->address), std::string::npos) << start;
  EXPECT_NE(start.find(" model=" + Model()), std::string::npos) << start;
  EXPECT_NE(start.find(" device=cpu"), std::string::npos) << start;
  EXPECT_NE(start.find(" pool_bytes="), std::string::npos) << start;
  EXPECT_NE(start.find(" page_size=16"), std::string::npos) << start;
  EXPECT_NE(start.find(" host_cache_bytes=0"), std::string::npos) << start;
  EXPECT_NE(start.find(" kvstore=none peers=0"), std::string::npos) << start;
  EXPECT_GT(std::stoll(lazyrag::testing::FieldOf(start, "pool_pages")), 0) << start;

  std::vector<std::string> finished;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("] request finished ") != std::string::npos) finished.push_back(line);
  }
  ASSERT_EQ(finished.size(), 4u) << log;
  // The first request computed its documents, the second found them in the pool.
  const v1::Usage &u1 = first.last.usage();
  const std::string expected1 = absl::StrCat(
      "] request finished request_id=req-42 mode=lazy documents=2 prompt_tokens=",
      u1.prompt_tokens(), " document_tokens=", u1.document_tokens(),
      " cached_pool_tokens=0 cached_host_tokens=0 cached_store_tokens=0 computed_tokens=",
      u1.computed_tokens(), " completion_tokens=5 queue_ms=");
  EXPECT_NE(finished[0].find(expected1), std::string::npos) << finished[0];
  EXPECT_NE(finished[0].find(" finish=length "), std::string::npos) << finished[0];
  EXPECT_NE(finished[0].find(" status=OK"), std::string::npos) << finished[0];
  EXPECT_EQ(finished[0].rfind("I ", 0), 0u) << finished[0];
  const v1::Usage &u2 = again.last.usage();
  EXPECT_GT(u2.pool_document_tokens(), 0);
  EXPECT_NE(finished[1].find(absl::StrCat("cached_pool_tokens=", u2.pool_document_tokens(),
                                          " cached_host_tokens=0 cached_store_tokens=0")),
            std::string::npos)
      << finished[1];
  for (const std::string &line : {finished[0], finished[1]}) {
    const double ttft = std::stod(lazyrag::testing::FieldOf(line, "ttft_ms"));
    const double total = std::stod(lazyrag::testing::FieldOf(line, "total_ms"));
    EXPECT_GT(ttft, 0) << line;
    EXPECT_GE(total, ttft) << line;
  }
  // Without an id the worker makes one up: 16 hex digits.
  const std::string id = lazyrag::testing::FieldOf(finished[2], "request_id");
  EXPECT_EQ(id.size(), 16u) << finished[2];
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << finished[2];
  EXPECT_NE(finished[2].find(" mode=full documents=0 "), std::string::npos) << finished[2];
  // A rejected request: a warning with the status and the reason, no engine numbers.
  EXPECT_EQ(finished[3].rfind("W ", 0), 0u) << finished[3];
  EXPECT_NE(finished[3].find("request_id=req-bad"), std::string::npos) << finished[3];
  EXPECT_NE(finished[3].find("status=INVALID_ARGUMENT error=\"query is empty\""), std::string::npos)
      << finished[3];
  EXPECT_EQ(finished[3].find("ttft_ms"), std::string::npos) << finished[3];
}

}  // namespace
}  // namespace lazyrag
