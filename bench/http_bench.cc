// The OpenAI-compatible HTTP front door against the gRPC one (issue 26), on one live stack (a CPU
// lazyrag-worker with an embedded store behind lazyrag-router --http_listen):
//   1. TTFT of the same streaming request through gRPC (Inference/Generate) and through HTTP
//      (POST /v1/chat/completions, "stream": true), alternated, `reps` each after a warm-up that
//      caches the documents. TTFT is measured by the client: from sending the request to the
//      first message carrying text (gRPC) / the first SSE event carrying content (HTTP). Each
//      sample also records the worker's own ttft_ms, so that client TTFT - worker TTFT is what
//      the router and its front door add; the HTTP cost is the difference of the medians.
//   2. `concurrency` HTTP streams at once (one connection each): all must end with [DONE].
// Prints a table and writes JSON (--out).
//
//   build/bench/http_bench --model PATH|synthetic:tiny --reps 50 --concurrency 64 --out FILE
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_stats.h"
#include "common/testing/child_process.h"
#include "lazyrag/v1/inference.grpc.pb.h"

ABSL_FLAG(std::string, router_binary, LAZYRAG_ROUTER_BINARY, "path of lazyrag-router");
ABSL_FLAG(std::string, worker_binary, LAZYRAG_WORKER_BINARY, "path of lazyrag-worker");
ABSL_FLAG(std::string, model, "",
          "model of the worker; default $LAZYRAG_MODEL, else the bundled SmolLM2 in "
          "~/.cache/lazyrag, else synthetic:tiny");
ABSL_FLAG(int, reps, 50, "TTFT samples per path (alternated)");
ABSL_FLAG(int, max_tokens, 4, "tokens generated per TTFT sample");
ABSL_FLAG(int, concurrency, 64, "concurrent HTTP streams in the load part");
ABSL_FLAG(int, concurrent_max_tokens, 16, "tokens generated per concurrent stream");
ABSL_FLAG(std::string, out, "", "write the results as JSON here");
ABSL_FLAG(std::string, commit, "", "source revision to record in the JSON");

namespace {

using Clock = std::chrono::steady_clock;
using lazyrag::bench::Stats;
using lazyrag::testing::ChildProcess;
using json = nlohmann::json;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

const std::vector<std::string> kDocs = {
    "Mira Ostrova invented the folding telescope in 1788 in the harbour town of Kestrel Bay.",
    "The Vantor river freezes every January and thaws in early April, flooding the lowlands.",
    "The Glass Archive of Pellorin was founded by the weaver Tamsin Reale to keep old maps.",
};
constexpr char kQuery[] = "Who invented the folding telescope?";

std::string DefaultModel() {
  if (const char* m = std::getenv("LAZYRAG_MODEL"); m != nullptr && *m) return m;
  const char* home = std::getenv("HOME");
  const std::string bundled =
      std::string(home ? home : "/root") + "/.cache/lazyrag/SmolLM2-135M-Instruct.Q4_1.gguf";
  return std::filesystem::exists(bundled) ? bundled : "synthetic:tiny";
}

// One sample: client TTFT, the worker's ttft_ms, and whether it went right.
struct Sample {
  double client_ms = 0;
  double server_ms = 0;
  bool ok = false;
  std::string error;  // when !ok
};

Sample GrpcTtft(lazyrag::v1::Inference::Stub& stub, int max_tokens) {
  lazyrag::v1::GenerateRequest req;
  for (const std::string& d : kDocs) req.add_documents()->set_text(d);
  req.set_query(kQuery);
  req.set_max_tokens(max_tokens);
  req.set_ignore_eos(true);
  Sample s;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  const Clock::time_point start = Clock::now();
  auto reader = stub.Generate(&context, req);
  lazyrag::v1::GenerateResponse m;
  bool first = true;
  while (reader->Read(&m)) {
    if (first && !m.text().empty()) {
      s.client_ms = MsSince(start);
      first = false;
    }
    if (m.finish_reason() != lazyrag::v1::FINISH_REASON_UNSPECIFIED) {
      s.server_ms = m.timings().ttft_ms();
    }
  }
  s.ok = reader->Finish().ok() && !first;
  return s;
}

std::string ChatBody(int max_tokens) {
  json docs = json::array();
  for (const std::string& d : kDocs) docs.push_back({{"text", d}});
  return json{{"model", "bench"},
              {"messages", {{{"role", "user"}, {"content", kQuery}}}},
              {"documents", docs},
              {"max_tokens", max_tokens},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}},
              {"lazyrag", {{"ignore_eos", true}}}}
      .dump();
}

// A streaming chat completion on `client`'s connection; client TTFT = first SSE chunk with content.
Sample HttpTtft(httplib::Client& client, const std::string& body) {
  Sample s;
  std::string buffer;
  bool first = true, done = false;
  const Clock::time_point start = Clock::now();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    if (first && buffer.find("\"content\":\"") != std::string::npos &&
        buffer.find("\"content\":\"\"") == std::string::npos) {
      s.client_ms = MsSince(start);
      first = false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  if (!client.send(req, res, error)) {
    s.error = absl::StrCat("transport: ", httplib::to_string(error));
    return s;
  }
  if (res.status != 200) {
    s.error = absl::StrCat("HTTP ", res.status, ": ", buffer.substr(0, 300));
    return s;
  }
  // The usage chunk carries the worker's ttft_ms.
  size_t at = 0;
  while ((at = buffer.find("data: ", at)) != std::string::npos) {
    const size_t end = buffer.find("\n\n", at);
    const std::string payload = buffer.substr(at + 6, end - at - 6);
    at = end;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    json chunk = json::parse(payload, nullptr, false);
    if (chunk.contains("lazyrag"))
      s.server_ms = chunk["lazyrag"]["timings"]["ttft_ms"].get<double>();
  }
  s.ok = done && !first;
  if (!s.ok)
    s.error = "stream incomplete: " + buffer.substr(buffer.size() > 300 ? buffer.size() - 300 : 0);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string loadavg;  // the machine's load when the run started (noise on a shared VM)
  std::getline(std::ifstream("/proc/loadavg"), loadavg);
  const std::string model =
      absl::GetFlag(FLAGS_model).empty() ? DefaultModel() : absl::GetFlag(FLAGS_model);
  const std::string tmp =
      std::filesystem::temp_directory_path() / absl::StrCat("lazyrag_http_bench_", getpid());
  std::filesystem::create_directories(tmp);

  ChildProcess worker({absl::GetFlag(FLAGS_worker_binary), "--listen=127.0.0.1:0",
                       "--model=" + model, "--device=cpu", "--kvstore=embedded:" + tmp + "/kv",
                       "--metrics_port=-1", "--shutdown_grace_s=1"});
  worker.SetOutputFiles("", tmp + "/worker.log");
  if (!worker.Start().ok()) return 1;
  absl::StatusOr<lazyrag::testing::ReadyLine> w =
      lazyrag::testing::WaitForReady(worker, absl::Seconds(120));
  if (!w.ok()) {
    std::fprintf(stderr, "worker: %s\n", w.status().ToString().c_str());
    return 1;
  }
  ChildProcess router({absl::GetFlag(FLAGS_router_binary), "--listen=127.0.0.1:0",
                       "--workers=" + w->address, "--http_listen=127.0.0.1:0", "--metrics_port=-1",
                       "--poll_interval_s=0.2", "--shutdown_grace_s=1"});
  router.SetOutputFiles("", tmp + "/router.log");
  if (!router.Start().ok()) return 1;
  absl::StatusOr<std::string> line = router.WaitForLine("", absl::Seconds(30));
  if (!line.ok()) {
    std::fprintf(stderr, "router: %s\n", line.status().ToString().c_str());
    return 1;
  }
  const std::string grpc_target = lazyrag::testing::FieldOf(*line, "grpc");
  const int http_port = std::atoi(lazyrag::testing::FieldOf(*line, "http").c_str());
  absl::SleepFor(absl::Milliseconds(600));  // the router's first health poll

  auto stub = lazyrag::v1::Inference::NewStub(
      grpc::CreateChannel(grpc_target, grpc::InsecureChannelCredentials()));
  httplib::Client http("127.0.0.1", http_port);
  http.set_keep_alive(true);
  http.set_read_timeout(120, 0);
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  const std::string body = ChatBody(max_tokens);

  // Warm-up: documents computed once; both paths' connections open.
  for (int i = 0; i < 3; ++i) {
    if (!GrpcTtft(*stub, max_tokens).ok || !HttpTtft(http, body).ok) {
      std::fprintf(stderr, "warm-up request failed; logs in %s\n", tmp.c_str());
      return 1;
    }
  }
  Stats grpc_client, grpc_server, grpc_overhead, http_client, http_server, http_overhead;
  int failures = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_reps); ++i) {
    // Alternated, the order flipped every rep, so that drift hits both paths alike.
    for (int k = 0; k < 2; ++k) {
      const bool use_http = (k == 0) == (i % 2 == 0);
      Sample s = use_http ? HttpTtft(http, body) : GrpcTtft(*stub, max_tokens);
      if (!s.ok) {
        ++failures;
        continue;
      }
      (use_http ? http_client : grpc_client).ms.push_back(s.client_ms);
      (use_http ? http_server : grpc_server).ms.push_back(s.server_ms);
      (use_http ? http_overhead : grpc_overhead).ms.push_back(s.client_ms - s.server_ms);
    }
  }

  // Concurrent HTTP streams, one connection each, started together.
  const int concurrency = absl::GetFlag(FLAGS_concurrency);
  const std::string concurrent_body = ChatBody(absl::GetFlag(FLAGS_concurrent_max_tokens));
  std::vector<Sample> results(concurrency);
  std::atomic<int> ready{0};
  const Clock::time_point load_start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", http_port);
      client.set_read_timeout(300, 0);
      client.set_connection_timeout(30, 0);
      ready.fetch_add(1);
      while (ready.load() < concurrency) std::this_thread::yield();
      results[c] = HttpTtft(client, concurrent_body);
    });
  }
  for (std::thread& t : threads) t.join();
  const double load_ms = MsSince(load_start);
  Stats concurrent_ttft;
  int concurrent_errors = 0;
  for (const Sample& s : results) {
    if (s.ok) {
      concurrent_ttft.ms.push_back(s.client_ms);
    } else {
      ++concurrent_errors;
      std::fprintf(stderr, "concurrent stream failed: %s\n", s.error.c_str());
    }
  }
  router.Stop(SIGTERM);
  worker.Stop(SIGTERM);

  const double added = http_client.Median() - grpc_client.Median();
  const double added_overhead = http_overhead.Median() - grpc_overhead.Median();
  std::printf("model %s, %d samples per path, %d tokens, documents cached\n", model.c_str(),
              static_cast<int>(grpc_client.ms.size()), max_tokens);
  std::printf("%-6s | %16s | %16s | %26s\n", "path", "client TTFT ms", "worker TTFT ms",
              "client - worker (median) ms");
  std::printf("%-6s | %16.3f | %16.3f | %26.3f\n", "gRPC", grpc_client.Median(),
              grpc_server.Median(), grpc_overhead.Median());
  std::printf("%-6s | %16.3f | %16.3f | %26.3f\n", "HTTP", http_client.Median(),
              http_server.Median(), http_overhead.Median());
  std::printf(
      "HTTP adds %.3f ms to the median client TTFT (%.3f ms beyond the worker's TTFT); "
      "failures %d\n",
      added, added_overhead, failures);
  std::printf(
      "%d concurrent HTTP streams: %d errors, TTFT median %.1f ms, max %.1f ms, all done "
      "in %.1f ms\n",
      concurrency, concurrent_errors, concurrent_ttft.Median(), concurrent_ttft.Max(), load_ms);

  if (!absl::GetFlag(FLAGS_out).empty()) {
    std::ofstream f(absl::GetFlag(FLAGS_out));
    f << "{\"bench\": \"http_bench\", \"commit\": \"" << absl::GetFlag(FLAGS_commit)
      << "\", \"date\": \"" << absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())
      << "\", \"cpus\": " << std::thread::hardware_concurrency()
      << ", \"loadavg_at_start\": " << json(loadavg).dump()
      << ", \"model\": " << json(model).dump() << ", \"reps\": " << absl::GetFlag(FLAGS_reps)
      << ", \"max_tokens\": " << max_tokens << ", \"failures\": " << failures
      << ",\n \"grpc\": {\"client_ttft_ms\": " << grpc_client.Json()
      << ", \"worker_ttft_ms\": " << grpc_server.Json()
      << ", \"client_minus_worker_ms\": " << grpc_overhead.Json()
      << "},\n \"http\": {\"client_ttft_ms\": " << http_client.Json()
      << ", \"worker_ttft_ms\": " << http_server.Json()
      << ", \"client_minus_worker_ms\": " << http_overhead.Json()
      << "},\n \"http_added_ttft_ms\": " << added
      << ", \"http_added_beyond_worker_ms\": " << added_overhead
      << ",\n \"concurrent\": {\"streams\": " << concurrency
      << ", \"errors\": " << concurrent_errors
      << ", \"max_tokens\": " << absl::GetFlag(FLAGS_concurrent_max_tokens)
      << ", \"wall_ms\": " << load_ms << ", \"ttft_ms\": " << concurrent_ttft.Json() << "}}\n";
  }
  if (failures == 0 && concurrent_errors == 0) {
    std::filesystem::remove_all(tmp);
    return 0;
  }
  std::fprintf(stderr, "logs kept in %s\n", tmp.c_str());
  return 1;
}
