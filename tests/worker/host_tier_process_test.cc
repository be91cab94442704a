// Issue 23, against a real lazyrag-worker on loopback: the host-memory tier (--host_cache_bytes)
// serves a document the KV pool evicted, with the same answer, and reports it in the usage, the
// Stats response and /metrics; a bad --host_cache_bytes stops the worker at startup with a
// clear message. On synthetic:tiny, and on the real model when $LAZYRAG_MODEL is set (the pool
// sizes are per model: a few pages' worth).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/testing/child_process.h"
#include "gtest/gtest.h"
#include "kvstore/tests/test_util.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "tests/worker/worker_test_util.h"

namespace lazyrag {
namespace {

using kvstore::testing::TempDir;
using worker_test::Generate;
using worker_test::Reply;
using worker_test::WorkerProcess;

std::string Model() {
  const char *m = std::getenv("LAZYRAG_WORKER_TEST_MODEL");
  return m != nullptr ? m : "synthetic:tiny";
}

// Distinct documents of ~80 bytes: 5-6 pages of 16 tokens each with a byte tokenizer.
std::string DocText(int i) {
  return absl::StrCat("Document ", i, ": the ferry ", i * 7 % 13, " crosses lake ", i * 5 % 11,
                      ", and the lighthouse number ", i, " turns all night.");
}

v1::GenerateRequest OneDocument(int doc) {
  v1::GenerateRequest r;
  r.add_documents()->set_text(DocText(doc));
  r.set_query(absl::StrCat("What does lighthouse ", doc, " do?"));
  r.set_max_tokens(8);
  r.set_ignore_eos(true);
  return r;
}

v1::StatsResponse Stats(WorkerProcess &w) {
  grpc::ClientContext ctx;
  v1::StatsResponse s;
  EXPECT_TRUE(w.stub().Stats(&ctx, v1::StatsRequest(), &s).ok());
  return s;
}

bool Resident(const v1::StatsResponse &s, const std::string &id) {
  for (const std::string &r : s.resident_document_ids()) {
    if (r == id) return true;
  }
  return false;
}

// A pool with room for the prefix block, a request and about two documents, and a host tier
// with room for about 25 documents: document 0, pushed out of the pool by six others, comes
// back from host memory.
void EvictedDocumentComesFromTheHostTier(const std::string &model, int64_t pool_bytes,
                                         int64_t host_bytes) {
  SCOPED_TRACE(model);
  WorkerProcess w({"--model=" + model, "--served_model_name=" + model, "--device=cpu",
                    absl::StrCat("--kv_pool_bytes=", pool_bytes),
                   absl::StrCat("--host_cache_bytes=", host_bytes)});
  ASSERT_TRUE(w.Start().ok());
  const v1::StatsResponse empty = Stats(w);
  EXPECT_GT(empty.host_cache().capacity_bytes(), 0);
  EXPECT_LE(empty.host_cache().capacity_bytes(), host_bytes);

  Reply first = Generate(w.stub(), OneDocument(0));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_EQ(first.last.document_ids_size(), 1);
  EXPECT_EQ(first.last.usage().cached_document_tokens(), 0);
  EXPECT_EQ(first.last.usage().host_document_tokens(), 0);
  const std::string id = first.last.document_ids(0);
  for (int doc = 1; doc <= 6; ++doc) {
    Reply other = Generate(w.stub(), OneDocument(doc));
    ASSERT_TRUE(other.status.ok()) << doc << ": " << other.status.error_message();
  }
  const v1::StatsResponse before = Stats(w);
  ASSERT_FALSE(Resident(before, id)) << "document 0 is still in the pool: the test proves nothing";
  const std::string m = "{model=\"" + model + "\"}";
  EXPECT_GT(w.Metric("lazyrag_kv_pool_evictions_total" + m), 0);
  EXPECT_GE(before.host_cache().entries(), 1);
  EXPECT_GT(before.host_cache().used_bytes(), 0);
  EXPECT_LE(before.host_cache().used_bytes(), before.host_cache().capacity_bytes());

  Reply again = Generate(w.stub(), OneDocument(0));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  const v1::Usage &u = again.last.usage();
  EXPECT_GT(u.host_document_tokens(), 0);
  EXPECT_EQ(u.host_document_tokens(), u.document_tokens());
  EXPECT_EQ(u.cached_document_tokens(),
            u.pool_document_tokens() + u.host_document_tokens() + u.store_document_tokens());
  EXPECT_EQ(u.store_document_tokens(), 0);
  EXPECT_EQ(again.text, first.text);
  EXPECT_EQ(again.tokens, first.tokens);

  EXPECT_GE(w.Metric("lazyrag_host_cache_promotions_total" + m), 1);
  EXPECT_GE(w.Metric("lazyrag_doc_cache_hits_total{model=\"" + model + "\",tier=\"host\"}"), 1);
  EXPECT_GE(w.Metric("lazyrag_host_cache_entries" + m), 1);
}

// synthetic:tiny: 8 KiB pages of 16 tokens, documents of 5-6 pages; 24 pages, 1 MiB.
TEST(HostTierProcessTest, DocumentEvictedFromThePoolIsServedFromTheHostTier) {
  EvictedDocumentComesFromTheHostTier(Model(), 196608, 1 << 20);
}

// SmolLM2-135M on the CPU: 720 KiB pages of 16 tokens (fp32), documents of 2 pages; 12 pages,
// 64 MiB.
TEST(HostTierProcessTest, DocumentEvictedFromThePoolIsServedFromTheHostTierRealModel) {
  const char *path = std::getenv("LAZYRAG_MODEL");
  if (path == nullptr || access(path, R_OK) != 0) GTEST_SKIP() << "LAZYRAG_MODEL not set";
  EvictedDocumentComesFromTheHostTier(path, 12 * 737280, 64 << 20);
}

// The same worker without a host tier recomputes document 0 (the comparison the test above
// stands on): 0 is off, and -1 is off on the CPU device.
TEST(HostTierProcessTest, WithoutAHostTierTheEvictedDocumentIsRecomputed) {
  for (const char *flag : {"--host_cache_bytes=0", "--host_cache_bytes=-1"}) {
    SCOPED_TRACE(flag);
    WorkerProcess w({"--model=" + Model(), "--device=cpu", "--kv_pool_bytes=196608", flag});
    ASSERT_TRUE(w.Start().ok());
    EXPECT_EQ(Stats(w).host_cache().capacity_bytes(), 0);
    Reply first = Generate(w.stub(), OneDocument(0));
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    for (int doc = 1; doc <= 6; ++doc)
      ASSERT_TRUE(Generate(w.stub(), OneDocument(doc)).status.ok());
    Reply again = Generate(w.stub(), OneDocument(0));
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_EQ(again.last.usage().host_document_tokens(), 0);
    EXPECT_EQ(again.last.usage().cached_document_tokens(), 0);
    EXPECT_EQ(again.tokens, first.tokens);
  }
}

std::string ReadFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A bad size stops the worker before it loads the model: exit code 2 (INVALID_ARGUMENT, see
// common/server_main.h), the flag's name and the value on stderr, no ready line; the harness's
// error for the missing line names the exit code.
TEST(HostTierProcessTest, NegativeHostCacheBytesStopsTheWorkerWithAMessage) {
  TempDir dir;
  const std::string err = dir.path() + "/stderr.txt";
  lazyrag::testing::ChildProcess p({LAZYRAG_WORKER_BINARY, "--listen=127.0.0.1:0",
                                    "--metrics_port=-1", "--model=" + Model(),
                                    "--host_cache_bytes=-5"});
  p.SetOutputFiles("", err);
  ASSERT_TRUE(p.Start().ok());
  const auto line = p.WaitForLine("lazyrag-worker ready", absl::Seconds(30));
  ASSERT_FALSE(line.ok());
  // ChildProcess says how the child ended, and still leaves the exit code to Wait.
  EXPECT_NE(line.status().message().find("exit code 2"), std::string::npos) << line.status();
  EXPECT_EQ(p.Wait(absl::Seconds(30)), 2);
  const std::string message = ReadFile(err);
  EXPECT_NE(message.find("host_cache_bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("-5"), std::string::npos) << message;
  EXPECT_NE(message.find("INVALID_ARGUMENT"), std::string::npos) << message;
}

}  // namespace
}  // namespace lazyrag
