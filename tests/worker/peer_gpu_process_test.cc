// Issue 9, the peer tier's fast path on real GPUs: two lazyrag-worker processes
// on the CUDA backend, B on GPU 1 holding documents, A on GPU 0 with --peers B.
// A maps B's KV pool (CUDA IPC), leases each document and copies its pages GPU
// to GPU; nothing is computed, no kvstore, no bytes over gRPC. A's output
// equals B's (an exact copy of B's KV) and a fresh worker's; with
// --peer_device_copy=false the same documents travel as bytes (path 1) and give
// the same output.
//
// PeerGpuE2E (only when LAZYRAG_PEER_E2E_MODEL names a model, e.g.
// synthetic:llama3-8b): the time to first token on A of requests whose one
// document (LAZYRAG_PEER_E2E_TOKENS tokens, default 2048) B holds, by the fast
// path, by bytes (path 1), and computed on A; a table on stdout and JSON in
// $LAZYRAG_PEER_E2E_OUT when set.
//
// Label gpu; skips with fewer than two GPUs (or none). $LAZYRAG_WORKER_BINARY
// overrides the worker binary's path (bench/peer_run.sh sets it on the GPU
// machine).
#include <cuda_runtime.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kvstore/tests/test_util.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "tests/worker/worker_test_util.h"

namespace lazyrag {
namespace {

using kvstore::testing::FetchMetrics;
using kvstore::testing::MetricValue;
using kvstore::testing::ReadyProcess;

// The worker binary: $LAZYRAG_WORKER_BINARY when set (the binaries carried to a
// GPU machine), else the one this build made.
std::string WorkerBinary() {
  const char *env = std::getenv("LAZYRAG_WORKER_BINARY");
  return env != nullptr && *env != '\0' ? env : LAZYRAG_WORKER_BINARY;
}

int GpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

#define REQUIRE_TWO_GPUS()                                                  \
  do {                                                                      \
    const int gpus = GpuCount();                                            \
    if (gpus < 2) GTEST_SKIP() << "needs two CUDA devices, found " << gpus; \
  } while (0)

using worker_test::Reply;

Reply Generate(v1::Inference::Stub &stub, const v1::GenerateRequest &req) {
  return worker_test::Generate(stub, req, /*timeout_s=*/120);
}

// A worker on one GPU (--device cuda --cuda_device N) with extra flags; large replies allowed.
class GpuWorker : public worker_test::WorkerProcess {
 public:
  GpuWorker(const std::string &model, int device, std::vector<std::string> extra)
      : worker_test::WorkerProcess(Args(model, device, std::move(extra)), WorkerBinary(),
                                   64 << 20) {}
  void Stop() { worker_test::WorkerProcess::Stop(SIGTERM); }

 private:
  static std::vector<std::string> Args(const std::string &model, int device,
                                       std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model=" + model, "--device=cuda",
                                     absl::StrCat("--cuda_device=", device)};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
};

std::string DocText(int i) {
  return absl::StrCat("GPU peer document ", i, ": the barge ", i * 5 % 9, " leaves dock ",
                      i * 7 % 11, " at dawn with ", i + 3, " crates of pears.");
}

v1::GenerateRequest Request(const std::vector<std::string> &docs, const std::string &query,
                            int max_tokens) {
  v1::GenerateRequest r;
  for (const std::string &d : docs) r.add_documents()->set_text(d);
  r.set_query(query);
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r;
}

const char kModel[] = "synthetic:tiny";
const std::string kPool = "--kv_pool_bytes=268435456";  // 256 MiB

std::string Tier(const std::string &model, const char *tier) {
  return absl::StrCat("lazyrag_doc_cache_hits_total{model=\"", model, "\",tier=\"", tier, "\"}");
}

TEST(PeerGpuProcessTest, DocumentsMoveGpuToGpuByTheFastPath) {
  REQUIRE_TWO_GPUS();
  GpuWorker b(kModel, 1, {kPool});
  ASSERT_TRUE(b.Start().ok());
  std::vector<std::string> docs = {DocText(0), DocText(1), DocText(2)};
  Reply warm = Generate(b.stub(), Request(docs, "Which barge carries pears?", 10));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();

  GpuWorker a(kModel, 0, {kPool, "--peers=" + b.address()});
  ASSERT_TRUE(a.Start().ok());
  const v1::GenerateRequest req =
      Request({docs[2], docs[0], docs[1]}, "When does the barge leave?", 10);
  Reply got = Generate(a.stub(), req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const v1::Usage &u = got.last.usage();
  EXPECT_GT(u.document_tokens(), 0);
  EXPECT_EQ(u.store_document_tokens(), u.document_tokens());
  EXPECT_EQ(u.cached_document_tokens(), u.document_tokens());
  const std::string model_label = absl::StrCat("{model=\"", kModel, "\"}");
  EXPECT_EQ(a.Metric("lazyrag_doc_computed_total" + model_label), 0);
  EXPECT_EQ(a.Metric(Tier(kModel, "peer")), 3);
  // Three documents, plus the system-prompt block when the template has one:
  // all by lease and device copy, none as bytes.
  const double leases = a.Metric("lazyrag_worker_peer_fetch_total{result=\"lease\"}");
  EXPECT_GE(leases, 3);
  EXPECT_EQ(a.Metric("lazyrag_worker_peer_device_copy_total{result=\"ok\"}"), leases);
  EXPECT_GT(a.Metric("lazyrag_worker_peer_device_copy_bytes_total"), 0);
  EXPECT_EQ(a.Metric("lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 0);
  EXPECT_EQ(b.Metric("lazyrag_worker_peer_serve_total{result=\"hit\"}"), 0);
  EXPECT_EQ(b.Metric("lazyrag_worker_peer_leases_total{result=\"granted\"}"), leases);
  // The leases come back (released from a background thread).
  for (int i = 0; i < 200 && b.Metric("lazyrag_worker_peer_leases_outstanding") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(b.Metric("lazyrag_worker_peer_leases_outstanding"), 0);
  EXPECT_EQ(b.Metric("lazyrag_worker_peer_leases_total{result=\"released\"}"), leases);

  // A holds an exact copy of B's KV: B answers the same request with the same
  // tokens; so does a fresh worker that computes everything.
  Reply on_b = Generate(b.stub(), req);
  ASSERT_TRUE(on_b.status.ok());
  EXPECT_EQ(got.tokens, on_b.tokens);
  EXPECT_EQ(got.tokens.size(), 10u);
  {
    GpuWorker fresh(kModel, 0, {kPool});
    ASSERT_TRUE(fresh.Start().ok());
    Reply ref = Generate(fresh.stub(), req);
    ASSERT_TRUE(ref.status.ok());
    EXPECT_EQ(ref.last.usage().cached_document_tokens(), 0);
    EXPECT_EQ(got.tokens, ref.tokens);
  }
  // Path 1 between the same GPUs (--peer_device_copy=false): bytes, the same
  // answer.
  GpuWorker bytes(kModel, 0, {kPool, "--peers=" + b.address(), "--peer_device_copy=false"});
  ASSERT_TRUE(bytes.Start().ok());
  Reply by_bytes = Generate(bytes.stub(), req);
  ASSERT_TRUE(by_bytes.status.ok()) << by_bytes.status.error_message();
  EXPECT_EQ(by_bytes.last.usage().store_document_tokens(), u.document_tokens());
  EXPECT_EQ(bytes.Metric("lazyrag_worker_peer_fetch_total{result=\"lease\"}"), 0);
  EXPECT_GE(bytes.Metric("lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 3);
  EXPECT_EQ(by_bytes.tokens, got.tokens);
}

// --- End-to-end timing: one large document moved from B (GPU 1) to A (GPU 0).
// ---

std::string LongText(int seed, int bytes) {
  // The synthetic models' tokenizer is byte-level: one token per byte.
  std::mt19937 rng(seed);
  static const char kLetters[] = "abcdefghijklmnopqrstuvwxyz     ";
  std::string s(size_t(bytes), ' ');
  for (char &c : s) c = kLetters[rng() % (sizeof(kLetters) - 1)];
  s[0] = 'D';
  return s;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(PeerGpuE2E, LargeDocumentFastPathVsBytesVsCompute) {
  const char *model_env = std::getenv("LAZYRAG_PEER_E2E_MODEL");
  if (model_env == nullptr || *model_env == '\0') {
    GTEST_SKIP() << "set LAZYRAG_PEER_E2E_MODEL (e.g. synthetic:llama3-8b) to run";
  }
  REQUIRE_TWO_GPUS();
  const std::string model = model_env;
  const char *tokens_env = std::getenv("LAZYRAG_PEER_E2E_TOKENS");
  const int doc_tokens = tokens_env != nullptr ? std::atoi(tokens_env) : 2048;
  const int kDocs = 5;
  const std::string pool = "--kv_pool_bytes=8589934592";  // 8 GiB
  std::vector<std::string> docs;
  for (int i = 0; i < kDocs; ++i) docs.push_back(LongText(100 + i, doc_tokens));

  GpuWorker b(model, 1, {pool});
  ASSERT_TRUE(b.Start().ok());
  // B holds every document (computed once each, in one request).
  Reply warm = Generate(b.stub(), Request(docs, "warm", 1));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();

  struct Mode {
    const char *name;
    std::vector<std::string> flags;
  };
  const std::vector<Mode> modes = {
      {"fast_path", {pool, "--peers=" + b.address()}},
      {"bytes", {pool, "--peers=" + b.address(), "--peer_device_copy=false"}},
      {"compute", {pool}},
  };
  std::string json = absl::StrCat("{\"model\": \"", model, "\", \"doc_tokens\": ", doc_tokens,
                                  ", \"docs\": ", kDocs, ", \"modes\": {");
  std::printf("\n%-10s %12s %12s %12s %14s\n", "mode", "ttft_med_ms", "ttft_min_ms", "wall_med_ms",
              "doc_tokens");
  for (size_t m = 0; m < modes.size(); ++m) {
    GpuWorker a(model, 0, modes[m].flags);
    ASSERT_TRUE(a.Start().ok()) << modes[m].name;
    // Warm-up: cuBLAS, kernels and the system-prompt block, with a short
    // document B lacks.
    Reply w = Generate(a.stub(), Request({"a short warm-up document"}, "warm", 1));
    ASSERT_TRUE(w.status.ok()) << w.status.error_message();
    std::vector<double> ttft, wall;
    int64_t doc_tok = 0;
    for (int i = 0; i < kDocs; ++i) {
      Reply r = Generate(a.stub(), Request({docs[i]}, "What is the first word?", 1));
      ASSERT_TRUE(r.status.ok()) << modes[m].name << ": " << r.status.error_message();
      const v1::Usage &u = r.last.usage();
      doc_tok = u.document_tokens();
      if (m == 2) {
        EXPECT_EQ(u.cached_document_tokens(), 0);
      } else {
        EXPECT_EQ(u.store_document_tokens(), u.document_tokens()) << modes[m].name;
      }
      ttft.push_back(r.last.timings().ttft_ms());
      wall.push_back(r.wall_ms);
    }
    if (m == 0) {
      EXPECT_GE(a.Metric("lazyrag_worker_peer_device_copy_total{result=\"ok\"}"), kDocs);
      EXPECT_EQ(a.Metric("lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 0);
    } else if (m == 1) {
      EXPECT_GE(a.Metric("lazyrag_worker_peer_fetch_total{result=\"hit\"}"), kDocs);
    }
    std::printf("%-10s %12.2f %12.2f %12.2f %14lld\n", modes[m].name, Median(ttft),
                *std::min_element(ttft.begin(), ttft.end()), Median(wall),
                static_cast<long long>(doc_tok));
    std::vector<std::string> t;
    for (double x : ttft) t.push_back(absl::StrCat(x));
    absl::StrAppend(&json, m ? ", " : "", "\"", modes[m].name, "\": {\"ttft_ms\": [",
                    absl::StrJoin(t, ", "), "], \"ttft_median_ms\": ", Median(ttft),
                    ", \"wall_median_ms\": ", Median(wall), ", \"document_tokens\": ", doc_tok,
                    "}");
    a.Stop();
  }
  absl::StrAppend(&json, "}}\n");
  std::printf("%s", json.c_str());
  if (const char *out = std::getenv("LAZYRAG_PEER_E2E_OUT"); out != nullptr && *out != '\0') {
    std::ofstream(out) << json;
  }
}

}  // namespace
}  // namespace lazyrag
