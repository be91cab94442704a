// The lazyrag-router process in front of in-process fake workers (tests/router/fake_worker.h):
// affinity, balance, retries, ejection and readmission, deadline and cancellation pass-through,
// errors, Stats aggregation, DNS worker names and the /metrics it exports.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/router/fake_worker.h"
#include "tests/router/router_test_util.h"

namespace lazyrag::router::testing {
namespace {

const char kRouter[] = LAZYRAG_ROUTER_BINARY;

using lazyrag::v1::GenerateRequest;

class RouterWithFakesTest : public ::testing::Test {
 protected:
  void StartAll(std::vector<std::string> router_args = {}) {
    for (auto& w : workers_) ASSERT_TRUE(w->Start().ok());
    router_ = std::make_unique<RouterProcess>(
        kRouter, absl::StrCat(workers_[0]->address(), ",", workers_[1]->address()),
        std::move(router_args));
    ASSERT_TRUE(router_->Start().ok());
    stub_ = router_->NewStub();
  }

  // The index of the fake worker that handled more Generate calls since `before`.
  int WorkerThatServed(const std::vector<int>& before) {
    for (int i = 0; i < 2; ++i) {
      if (workers_[i]->worker().generate_calls() > before[i]) return i;
    }
    return -1;
  }
  std::vector<int> Calls() {
    return {workers_[0]->worker().generate_calls(), workers_[1]->worker().generate_calls()};
  }
  std::string Label(int i, const std::string& outcome) {
    return absl::StrCat("lazyrag_router_requests_total{outcome=\"", outcome, "\",worker=\"",
                        workers_[i]->address(), "\"}");
  }

  std::vector<std::unique_ptr<FakeWorkerServer>> workers_ = [] {
    std::vector<std::unique_ptr<FakeWorkerServer>> w;
    w.push_back(std::make_unique<FakeWorkerServer>());
    w.push_back(std::make_unique<FakeWorkerServer>());
    return w;
  }();
  std::unique_ptr<RouterProcess> router_;
  std::unique_ptr<lazyrag::v1::Inference::Stub> stub_;
};

TEST_F(RouterWithFakesTest, RepeatedDocumentSetLandsOnTheWorkerThatHoldsIt) {
  StartAll();
  const std::vector<std::string> docs = {"doc one text", "doc two text", "doc three text"};
  std::vector<int> before = Calls();
  GenerateResult cold = CallGenerate(*stub_, RequestWithTexts(docs));
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  ASSERT_EQ(cold.messages.size(), 3u);
  EXPECT_EQ(cold.text(), "t0 t1 t2 ");
  ASSERT_EQ(cold.last().document_ids_size(), 3);
  const int holder = WorkerThatServed(before);
  ASSERT_GE(holder, 0);
  const double hits_before = router_->Metric("lazyrag_router_affinity_hits_total");

  // Same documents in other orders, by text and by the ids the worker returned.
  for (int i = 0; i < 4; ++i) {
    GenerateRequest request = RequestWithTexts({docs[(i + 1) % 3], docs[i % 3], docs[(i + 2) % 3]});
    if (i == 3) {
      request.clear_documents();
      for (const std::string& id : cold.last().document_ids()) request.add_documents()->set_id(id);
    }
    before = Calls();
    GenerateResult hot = CallGenerate(*stub_, request);
    ASSERT_TRUE(hot.status.ok()) << hot.status.error_message();
    EXPECT_EQ(WorkerThatServed(before), holder) << "request " << i;
    EXPECT_EQ(hot.last().usage().cached_document_tokens(), hot.last().usage().document_tokens());
    EXPECT_LT(hot.last().timings().ttft_ms(), cold.last().timings().ttft_ms());
  }
  EXPECT_EQ(router_->Metric("lazyrag_router_affinity_hits_total"), hits_before + 4);
  EXPECT_EQ(router_->Metric(Label(holder, "ok")), 5);
  EXPECT_GT(router_->Metric("lazyrag_router_time_to_first_token_seconds_count"), 4);
}

// Issue 27: every worker's outcome series exist at zero before its first call, and affinity
// hits never outnumber the calls to a worker (both are counted when a call ends).
TEST_F(RouterWithFakesTest, OutcomeSeriesStartAtZeroAndAffinityIsARatio) {
  StartAll();
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    for (const char* outcome : {"ok", "retried", "failed", "error", "cancelled",
                                "deadline_exceeded"}) {
      EXPECT_EQ(router_->Metric(Label(i, outcome)), 0) << i << " " << outcome;
    }
  }
  EXPECT_EQ(router_->Metric("lazyrag_router_requests_total{outcome=\"failed\",worker=\"none\"}"),
            0);
  const std::vector<std::string> docs = {"ratio doc one", "ratio doc two"};
  for (int i = 0; i < 5; ++i) {
    GenerateResult r = CallGenerate(*stub_, RequestWithTexts(docs));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }
  double calls = 0;
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    for (const char* outcome : {"ok", "retried", "failed", "error", "cancelled",
                                "deadline_exceeded"}) {
      calls += router_->Metric(Label(i, outcome));
    }
  }
  EXPECT_EQ(calls, 5);
  const double hits = router_->Metric("lazyrag_router_affinity_hits_total");
  EXPECT_EQ(hits, 4);  // all but the first call went to the holder
  EXPECT_LE(hits, calls);
}

TEST_F(RouterWithFakesTest, ResidencyReportedByWorkerStatsAttractsRequests) {
  StartAll();
  // Prepared on each worker directly (not through the router): the router learns of them
  // only from the workers' Stats.
  std::vector<std::string> ids(2);
  for (int i = 0; i < 2; ++i) {
    auto direct = lazyrag::v1::Inference::NewStub(
        grpc::CreateChannel(workers_[i]->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    lazyrag::v1::PrepareDocumentsRequest prepare;
    prepare.add_texts(absl::StrCat("only on worker ", i));
    lazyrag::v1::PrepareDocumentsResponse prepared;
    ASSERT_TRUE(direct->PrepareDocuments(&context, prepare, &prepared).ok());
    ids[i] = prepared.documents(0).id();
  }
  absl::SleepFor(absl::Milliseconds(400));  // a few Stats polls
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 2; ++i) {
      GenerateRequest request;
      request.add_documents()->set_id(ids[i]);
      request.set_query("q");
      std::vector<int> before = Calls();
      GenerateResult r = CallGenerate(*stub_, request);
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();  // the other would say NOT_FOUND
      EXPECT_EQ(WorkerThatServed(before), i);
    }
  }
}

TEST_F(RouterWithFakesTest, PrepareDocumentsGoesToTheAffinityWorker) {
  StartAll();
  const std::vector<std::string> docs = {"prepared a", "prepared b"};
  grpc::ClientContext context;
  lazyrag::v1::PrepareDocumentsRequest prepare;
  for (const auto& d : docs) prepare.add_texts(d);
  lazyrag::v1::PrepareDocumentsResponse prepared;
  ASSERT_TRUE(stub_->PrepareDocuments(&context, prepare, &prepared).ok());
  ASSERT_EQ(prepared.documents_size(), 2);
  const int holder = workers_[0]->worker().IsResident(prepared.documents(0).id()) ? 0 : 1;
  ASSERT_TRUE(workers_[holder]->worker().IsResident(prepared.documents(1).id()));
  for (int i = 0; i < 3; ++i) {
    std::vector<int> before = Calls();
    GenerateResult r = CallGenerate(*stub_, RequestWithTexts({docs[1], docs[0]}));
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(WorkerThatServed(before), holder);
  }
  grpc::ClientContext bad_context;
  lazyrag::v1::PrepareDocumentsRequest bad;
  bad.add_texts("");
  grpc::Status status = stub_->PrepareDocuments(&bad_context, bad, &prepared);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "a document text is empty");
}

TEST_F(RouterWithFakesTest, HotDocumentSpreadsWhenOneQueueGrowsPastTheThreshold) {
  StartAll({"--load_weight=0", "--imbalance_threshold=2"});
  const std::vector<std::string> hot = {"the hot document"};
  std::vector<int> before = Calls();
  ASSERT_TRUE(CallGenerate(*stub_, RequestWithTexts(hot)).status.ok());
  const int holder = WorkerThatServed(before);
  ASSERT_GE(holder, 0);
  for (auto& w : workers_) w->worker().Hold();
  constexpr int kRequests = 8;
  std::vector<std::future<GenerateResult>> results;
  for (int i = 0; i < kRequests; ++i) {
    results.push_back(std::async(std::launch::async, [&] {
      auto stub = router_->NewStub();
      return CallGenerate(*stub, RequestWithTexts(hot));
    }));
    // Sequential arrivals, so that each routing decision sees the previous ones in flight.
    ASSERT_TRUE(WaitFor(
        [&] { return workers_[0]->worker().running() + workers_[1]->worker().running() == i + 1; },
        absl::Seconds(5)));
  }
  const int on_holder = workers_[holder]->worker().running();
  const int on_other = workers_[1 - holder]->worker().running();
  // Pure affinity until the holder's queue is 3 ahead, then the two alternate: 5 and 3.
  EXPECT_EQ(on_holder, 5);
  EXPECT_EQ(on_other, 3);
  for (auto& w : workers_) w->worker().Release();
  for (auto& r : results) EXPECT_TRUE(r.get().status.ok());
}

TEST_F(RouterWithFakesTest, FailureBeforeTheFirstTokenIsRetriedOnTheOtherWorker) {
  StartAll();
  const std::vector<std::string> docs = {"retry me"};
  std::vector<int> before = Calls();
  ASSERT_TRUE(CallGenerate(*stub_, RequestWithTexts(docs)).status.ok());
  const int holder = WorkerThatServed(before);
  workers_[holder]->worker().FailNext(1);
  GenerateResult r = CallGenerate(*stub_, RequestWithTexts(docs));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(workers_[1 - holder]->worker().completed(), 1);
  EXPECT_EQ(router_->Metric(Label(holder, "retried")), 1);
  EXPECT_EQ(router_->Metric(Label(1 - holder, "ok")), 1);
  // The UNAVAILABLE ejected it; its next health check readmits it.
  EXPECT_TRUE(
      WaitFor([&] { return router_->Metric(R"(lazyrag_router_workers{state="healthy"})") == 2; },
              absl::Seconds(5)));
}

TEST_F(RouterWithFakesTest, WorkerKilledMidRunIsEjectedAndLaterReadmitted) {
  StartAll({"--load_weight=0"});  // all five requests below stay with the document's holder
  const std::vector<std::string> docs = {"doc on the doomed worker"};
  std::vector<int> before = Calls();
  ASSERT_TRUE(CallGenerate(*stub_, RequestWithTexts(docs)).status.ok());
  const int doomed = WorkerThatServed(before);
  FakeWorker& victim = workers_[doomed]->worker();

  // Two requests streaming on it (hung after their first token)...
  victim.SetHangAfterFirstToken(true);
  std::vector<std::future<GenerateResult>> streaming;
  for (int i = 0; i < 2; ++i) {
    streaming.push_back(std::async(std::launch::async, [&] {
      auto stub = router_->NewStub();
      return CallGenerate(*stub, RequestWithTexts(docs), absl::Seconds(30));
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return victim.running() == 2; }, absl::Seconds(5)));
  // ... and three held before their first token.
  victim.Hold();
  std::vector<std::future<GenerateResult>> waiting;
  for (int i = 0; i < 3; ++i) {
    waiting.push_back(std::async(std::launch::async, [&] {
      auto stub = router_->NewStub();
      return CallGenerate(*stub, RequestWithTexts(docs), absl::Seconds(30));
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return victim.running() == 5; }, absl::Seconds(5)));

  const absl::Time killed = absl::Now();
  workers_[doomed]->Stop();
  for (auto& f : waiting) {
    GenerateResult r = f.get();
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();  // served by the other worker
  }
  for (auto& f : streaming) {
    GenerateResult r = f.get();
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
    EXPECT_EQ(r.messages.size(), 1u);
  }
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5)) << "a request hung";
  EXPECT_EQ(workers_[1 - doomed]->worker().completed(), 3);
  EXPECT_TRUE(
      WaitFor([&] { return router_->Metric(R"(lazyrag_router_workers{state="ejected"})") == 1; },
              absl::Seconds(5)));
  EXPECT_EQ(router_->Metric(Label(doomed, "failed")), 2);

  // While it is down, everything goes to the other worker, at once.
  for (int i = 0; i < 4; ++i) {
    GenerateResult r = CallGenerate(*stub_, RequestWithTexts({absl::StrCat("while down ", i)}));
    EXPECT_TRUE(r.status.ok());
    EXPECT_LT(r.elapsed, absl::Seconds(2));
  }

  victim.SetHangAfterFirstToken(false);
  victim.Release();
  ASSERT_TRUE(workers_[doomed]->Start().ok());  // same port
  EXPECT_TRUE(
      WaitFor([&] { return router_->Metric(R"(lazyrag_router_workers{state="healthy"})") == 2; },
              absl::Seconds(10)));
  before = Calls();
  GenerateResult back = CallGenerate(*stub_, RequestWithTexts(docs));
  EXPECT_TRUE(back.status.ok());
  EXPECT_EQ(WorkerThatServed(before), doomed);  // it still holds the documents
}

TEST_F(RouterWithFakesTest, DeadlineAndCancellationReachTheWorker) {
  StartAll();
  for (auto& w : workers_) w->worker().SetHangAfterFirstToken(true);
  auto seen = [&] {
    return workers_[0]->worker().cancellations_seen() + workers_[1]->worker().cancellations_seen();
  };
  GenerateResult r = CallGenerate(*stub_, RequestWithTexts({"slow"}), absl::Milliseconds(500));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(r.messages.size(), 1u);
  EXPECT_TRUE(WaitFor([&] { return seen() == 1; }, absl::Seconds(3)));

  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, RequestWithTexts({"cancel me"}));
  lazyrag::v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));
  context.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitFor([&] { return seen() == 2; }, absl::Seconds(3)));
  EXPECT_TRUE(WaitFor(
      [&] { return workers_[0]->worker().running() + workers_[1]->worker().running() == 0; },
      absl::Seconds(3)));
}

TEST_F(RouterWithFakesTest, BadRequestsAreAnsweredNotRetried) {
  StartAll();
  GenerateRequest no_source = RequestWithTexts({"x"});
  no_source.add_documents();  // neither text nor id
  GenerateResult r = CallGenerate(*stub_, no_source);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(r.status.error_message(), "documents[1] has neither text nor id");
  EXPECT_EQ(Calls(), (std::vector<int>{0, 0}));

  r = CallGenerate(*stub_, RequestWithTexts({"x"}, /*query=*/""));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(r.status.error_message(), "query is empty");  // the worker's own words

  // Not UTF-8 in a string field: the router's own parser refuses it (lazyrag_wire_traits.h),
  // clearly and without calling a worker.
  const std::vector<int> calls_before = Calls();
  r = CallGenerate(*stub_, RequestWithTexts({"x"}, /*query=*/"caf\xe9"));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("lazyrag.v1.GenerateRequest"), std::string::npos)
      << r.status.error_message();
  EXPECT_EQ(Calls(), calls_before) << "a request that does not parse reached a worker";

  GenerateRequest unknown;
  unknown.add_documents()->set_id(std::string(64, 'a'));
  unknown.set_query("q");
  r = CallGenerate(*stub_, unknown);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Calls()[0] + Calls()[1], 2) << "an answered error was retried";
}

TEST_F(RouterWithFakesTest, StatsAggregateTheWorkers) {
  StartAll();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(
        CallGenerate(*stub_, RequestWithTexts({absl::StrCat("stats doc ", i)})).status.ok());
  }
  grpc::ClientContext context;
  lazyrag::v1::StatsResponse stats;
  ASSERT_TRUE(stub_->Stats(&context, {}, &stats).ok());
  EXPECT_EQ(stats.resident_document_ids_size(), 6);
  EXPECT_EQ(stats.pool().pages_total(), 200);
  EXPECT_EQ(stats.pool().page_size(), 16);
  EXPECT_EQ(stats.host_cache().capacity_bytes(), 2000);  // summed over the two workers
  EXPECT_EQ(stats.host_cache().used_bytes(), 512);
  EXPECT_EQ(stats.host_cache().entries(), 2);
  EXPECT_EQ(stats.model(), "fake");
  EXPECT_EQ(stats.model_fingerprint(), "fake-fingerprint");
}

TEST(RouterProcessTest, NoReachableWorkerIsUnavailableQuickly) {
  RouterProcess router(kRouter, absl::StrCat("127.0.0.1:", PickFreePort()));
  ASSERT_TRUE(router.Start().ok());
  auto stub = router.NewStub();
  GenerateResult r = CallGenerate(*stub, RequestWithTexts({"x"}), absl::Seconds(10));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_LT(r.elapsed, absl::Seconds(3));
  grpc::ClientContext context;
  lazyrag::v1::StatsResponse stats;
  EXPECT_EQ(stub->Stats(&context, {}, &stats).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(RouterProcessTest, WorkersFromADnsName) {
  FakeWorkerServer worker;
  ASSERT_TRUE(worker.Start().ok());
  const std::string port = worker.address().substr(worker.address().rfind(':') + 1);
  RouterProcess router(kRouter, "dns:///localhost:" + port, {"--resolve_interval_s=0.2"});
  ASSERT_TRUE(router.Start().ok());
  auto stub = router.NewStub();
  for (int i = 0; i < 3; ++i) {
    GenerateResult r = CallGenerate(*stub, RequestWithTexts({absl::StrCat("dns ", i)}));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
  EXPECT_EQ(worker.worker().completed(), 3);
}

TEST(RouterProcessTest, BadFlagsExitWithUsageError) {
  for (std::vector<std::string> argv :
       std::vector<std::vector<std::string>>{{kRouter},
                                             {kRouter, "--workers=nohost"},
                                             {kRouter, "--workers=a:1", "--max_attempts=0"}}) {
    ChildProcess router(argv, /*capture_stdout=*/false);
    ASSERT_TRUE(router.Start().ok());
    EXPECT_EQ(router.Wait(absl::Seconds(10)), 2) << argv.back();
  }
}

}  // namespace
}  // namespace lazyrag::router::testing
