// PrepareDocuments against a real lazyrag-worker (issue 28): the work stops when the call ends
// (its deadline passes or the client cancels it), and one call's texts and bytes are capped
// (RESOURCE_EXHAUSTED beyond). On synthetic:smollm2-135m (SmolLM2's shapes, byte tokenizer):
// a hundred texts take far longer than the call's deadline on a CPU.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "tests/worker/worker_test_util.h"

namespace lazyrag {
namespace {

using worker_test::WorkerProcess;

constexpr int kTexts = 100;

v1::PrepareDocumentsRequest ManyTexts(int salt) {
  v1::PrepareDocumentsRequest r;
  for (int i = 0; i < kTexts; ++i) {
    std::string text = absl::StrCat("Text ", salt, "/", i, ":");
    while (text.size() < 300) absl::StrAppend(&text, " the mill ", i, " grinds grain by the river");
    r.add_texts(text);
  }
  return r;
}

v1::StatsResponse Stats(WorkerProcess &w) {
  grpc::ClientContext ctx;
  v1::StatsResponse s;
  EXPECT_TRUE(w.stub().Stats(&ctx, v1::StatsRequest(), &s).ok());
  return s;
}

// How long after `ended` the worker has nothing running or waiting (polled every 10 ms, up
// to 30 s).
absl::Duration IdleAfter(WorkerProcess &w, absl::Time ended) {
  for (int i = 0; i < 3000; ++i) {
    const v1::StatsResponse s = Stats(w);
    if (s.running_requests() == 0 && s.waiting_requests() == 0) return absl::Now() - ended;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::InfiniteDuration();
}

// Nothing computed any more: the documents computed stay the same for a second.
void ExpectNoMoreComputes(WorkerProcess &w) {
  const std::string label = "{model=\"synthetic:smollm2-135m\"}";
  const double computed = w.Metric("lazyrag_doc_computed_total" + label);
  const double tokens = w.Metric("lazyrag_doc_computed_tokens_total" + label);
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(w.Metric("lazyrag_doc_computed_total" + label), computed);
  EXPECT_EQ(w.Metric("lazyrag_doc_computed_tokens_total" + label), tokens);
  EXPECT_GE(computed, 0);  // the sample exists
}

class PrepareDocumentsProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(worker_.Start().ok()); }
  WorkerProcess worker_{{"--model=synthetic:smollm2-135m", "--device=cpu",
                         "--kv_pool_bytes=268435456", "--max_batch_tokens=16"}};
};

// A 2 s deadline on a hundred texts: DEADLINE_EXCEEDED, and within 1 s of the deadline the
// worker has dropped what was left: nothing running or waiting, no document computing (the
// computed counters stand still), most texts never computed. Steps of 16 tokens keep one step
// of this CPU model well under a second (cancellation acts between steps).
TEST_F(PrepareDocumentsProcessTest, WorkStopsWithinASecondOfTheDeadline) {
  grpc::ClientContext ctx;
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::PrepareDocumentsResponse resp;
  const grpc::Status st = worker_.stub().PrepareDocuments(&ctx, ManyTexts(1), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  const absl::Duration idle = IdleAfter(worker_, deadline);
  std::cout << "  idle " << absl::FormatDuration(idle) << " after the deadline\n";
  EXPECT_LE(idle, absl::Seconds(1));
  ExpectNoMoreComputes(worker_);
  EXPECT_LT(Stats(worker_).resident_document_ids_size(), kTexts / 2);
}

// The client cancelling the call after 1 s stops the work the same way.
TEST_F(PrepareDocumentsProcessTest, WorkStopsWithinASecondOfACancel) {
  grpc::ClientContext ctx;
  absl::Time cancelled_at;
  std::thread canceller([&] {
    absl::SleepFor(absl::Seconds(1));
    cancelled_at = absl::Now();
    ctx.TryCancel();
  });
  v1::PrepareDocumentsResponse resp;
  const grpc::Status st = worker_.stub().PrepareDocuments(&ctx, ManyTexts(2), &resp);
  canceller.join();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
  const absl::Duration idle = IdleAfter(worker_, cancelled_at);
  std::cout << "  idle " << absl::FormatDuration(idle) << " after the cancel\n";
  EXPECT_LE(idle, absl::Seconds(1));
  ExpectNoMoreComputes(worker_);
  EXPECT_LT(Stats(worker_).resident_document_ids_size(), kTexts / 2);
}

// More texts or more bytes than one call may carry: RESOURCE_EXHAUSTED with the numbers, before
// any work; the caps are flags.
TEST(PrepareDocumentsCapsTest, TooManyTextsOrBytesAreResourceExhausted) {
  WorkerProcess w({"--model=synthetic:tiny", "--max_prepare_texts=4", "--max_prepare_bytes=1000"});
  ASSERT_TRUE(w.Start().ok());
  {
    v1::PrepareDocumentsRequest r;
    for (int i = 0; i < 5; ++i) r.add_texts(absl::StrCat("text ", i));
    grpc::ClientContext ctx;
    v1::PrepareDocumentsResponse resp;
    const grpc::Status st = w.stub().PrepareDocuments(&ctx, r, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(st.error_message().find("too many texts in one PrepareDocuments call (5 > 4)"),
              std::string::npos)
        << st.error_message();
  }
  {
    v1::PrepareDocumentsRequest r;
    r.add_texts(std::string(600, 'a'));
    r.add_texts(std::string(600, 'b'));
    grpc::ClientContext ctx;
    v1::PrepareDocumentsResponse resp;
    const grpc::Status st = w.stub().PrepareDocuments(&ctx, r, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(st.error_message().find("too many text bytes in one PrepareDocuments call (1200 > "
                                      "1000)"),
              std::string::npos)
        << st.error_message();
  }
  {  // At the caps: served.
    v1::PrepareDocumentsRequest r;
    for (int i = 0; i < 4; ++i) r.add_texts(std::string(250, char('a' + i)));
    grpc::ClientContext ctx;
    v1::PrepareDocumentsResponse resp;
    const grpc::Status st = w.stub().PrepareDocuments(&ctx, r, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.documents_size(), 4);
  }
}

}  // namespace
}  // namespace lazyrag
