// lazyrag-loadgen: serving benchmark client of lazyrag.v1.Inference (a worker or the router).
//
//   lazyrag-loadgen --target HOST:PORT (--rate R | --concurrency C) [--num_requests N]
//     [--duration_s S] [--num_docs 100] [--doc_tokens 2048] [--docs_per_request 5]
//     [--zipf ALPHA (0 = uniform)] [--query_tokens 32] [--max_tokens 16] [--mode lazy]
//     [--seed 1] [--warmup 2] [--out FILE.json]
//
// Documents: a pool of --num_docs deterministic ASCII texts of about --doc_tokens tokens (one
// byte per token with the byte-level tokenizer of synthetic models; --calibrate rescales the
// text length from the token count the server reports for the first document). With
// --docs_by=id (default) the pool is sent once through PrepareDocuments and requests name
// documents by id, so a request is a few hundred bytes; --docs_by=text sends the texts.
//
// Arrivals: --rate > 0 is open loop (Poisson, exponential gaps, each request on its own
// thread at its scheduled time); --rate 0 is closed loop with --concurrency clients. The
// schedule and the documents of request i depend on --seed only, so every mode sees the same
// requests. --duration_s stops issuing new requests after that many seconds (0: no cap).
//
// Per request: send lag (open loop), client TTFT (send to the first token), server TTFT and
// queue time (Timings of the last message), inter-token gaps, end-to-end time, token usage.
// Prints a summary table; --out writes the configuration, the summary and every request as
// JSON. Exit status: 0 when every measured request succeeded, 3 when some failed, 1 when the
// setup (readiness, PrepareDocuments) failed, 2 on bad flags.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/json.h"
#include "lazyrag/v1/inference.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051",
          "Inference endpoint HOST:PORT (worker or router)");
ABSL_FLAG(double, rate, 0, "open loop: Poisson arrivals per second; 0: closed loop");
ABSL_FLAG(int, concurrency, 1, "closed loop: clients each sending one request at a time");
ABSL_FLAG(int, num_requests, 100, "measured requests (at most)");
ABSL_FLAG(double, duration_s, 0, "issue no new request after this many seconds; 0: no cap");
ABSL_FLAG(int, num_docs, 100, "documents in the pool");
ABSL_FLAG(int, doc_tokens, 2048, "tokens per document (approximate, see --calibrate)");
ABSL_FLAG(int, docs_per_request, 5, "distinct documents per request");
ABSL_FLAG(double, zipf, 0, "Zipf exponent of document popularity; 0: uniform");
ABSL_FLAG(int, query_tokens, 32, "tokens of the query (bytes with a byte-level tokenizer)");
ABSL_FLAG(int, max_tokens, 16, "tokens generated per request");
ABSL_FLAG(bool, ignore_eos, true, "generate max_tokens tokens even past end-of-sequence");
ABSL_FLAG(std::string, mode, "lazy", "lazy | materialize | prefix | full");
ABSL_FLAG(uint64_t, seed, 1, "seed of the arrival schedule, document draws and texts");
ABSL_FLAG(int, warmup, 2, "unmeasured requests sent one at a time before the run");
ABSL_FLAG(std::string, out, "", "JSON output file; empty: none");
ABSL_FLAG(std::string, docs_by, "id", "id (PrepareDocuments once, then ids) | text");
ABSL_FLAG(double, bytes_per_token, 1.0, "initial text bytes per token");
ABSL_FLAG(bool, calibrate, true, "rescale text length from the server's token count");
ABSL_FLAG(int, prepare_batch, 10, "documents per PrepareDocuments call");
ABSL_FLAG(double, timeout_s, 300, "deadline of each Generate call");
ABSL_FLAG(double, wait_ready_s, 60, "wait this long for the target to answer Stats");
ABSL_FLAG(int, channels, 4, "gRPC connections, requests spread round-robin");
ABSL_FLAG(int, max_inflight, 1024, "open loop: most requests outstanding at once");
ABSL_FLAG(std::string, cache_namespace, "", "cache namespace of documents and requests");
ABSL_FLAG(std::string, label, "", "free text copied into the JSON (e.g. the distribution)");
ABSL_FLAG(bool, per_request, true, "write every request's record into the JSON");
ABSL_FLAG(bool, prepare_only, false, "prepare the document pool, print its summary and exit");

namespace lazyrag {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(t - t0).count();
}

struct Config {
  std::string target;
  double rate = 0;
  int concurrency = 1;
  int num_requests = 0;
  double duration_s = 0;
  int num_docs = 0;
  int doc_tokens = 0;
  int docs_per_request = 0;
  double zipf = 0;
  int query_tokens = 0;
  int max_tokens = 0;
  bool ignore_eos = true;
  std::string mode;
  v1::AttentionMode mode_proto = v1::ATTENTION_MODE_LAZY;
  uint64_t seed = 0;
  int warmup = 0;
  std::string docs_by;
  double timeout_s = 0;
  int channels = 1;
  int max_inflight = 1;
  std::string cache_namespace;
  std::string label;
};

// One request of the run.
struct Record {
  int index = 0;
  std::vector<int> docs;
  double scheduled_ms = 0;  // arrival time in the schedule (open loop) or send time
  double start_ms = -1;     // when the call was made
  double first_token_ms = -1;
  double end_ms = -1;
  std::vector<double> itl_ms;  // gaps between successive tokens
  int tokens = 0;
  int code = -1;  // grpc::StatusCode; -1: not sent
  std::string error;
  double server_queue_ms = -1, server_ttft_ms = -1, server_total_ms = -1;
  int64_t prompt_tokens = 0, document_tokens = 0, cached_document_tokens = 0;
  int64_t pool_document_tokens = 0, host_document_tokens = 0, store_document_tokens = 0;
  int64_t computed_tokens = 0;
  int64_t completion_tokens = 0;
  bool ok() const { return code == 0; }
};

// Words of the synthetic texts: ASCII, so bytes == tokens with a byte-level tokenizer.
constexpr const char *kWords[] = {
    "river",  "mill",   "stone",  "harbor", "lantern", "orchard", "valley",  "copper",
    "meadow", "signal", "bridge", "winter", "garden",  "market",  "ledger",  "forest",
    "anchor", "pepper", "silver", "canyon", "timber",  "falcon",  "glacier", "thunder",
    "marble", "saddle", "quarry", "violet", "harvest", "beacon",  "archive", "compass"};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

// Deterministic text of about `bytes` bytes that starts with `head`.
std::string MakeText(const std::string &head, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s = head;
  while (s.size() < bytes) {
    s += ' ';
    s += kWords[rng() % kNumWords];
    if (rng() % 9 == 0) s += std::to_string(rng() % 1000);
    if (rng() % 13 == 0) s += '.';
  }
  s.resize(std::max<size_t>(bytes, 1));
  if (s.back() == ' ') s.back() = '.';
  return s;
}

std::string DocText(int i, size_t bytes, uint64_t seed) {
  return MakeText("Document " + std::to_string(i) + ".", bytes, seed * 1000003 + uint64_t(i));
}

std::string QueryText(int i, size_t bytes, uint64_t seed) {
  return MakeText("Question " + std::to_string(i) + ":", bytes,
                  (seed + 7919) * 2654435761u + uint64_t(i));
}

// Draws `k` distinct documents out of `n`, with weight 1/(rank+1)^alpha (alpha 0: uniform).
class DocSampler {
 public:
  DocSampler(int n, double alpha) {
    std::vector<double> w(n);
    for (int i = 0; i < n; ++i) w[i] = 1.0 / std::pow(double(i + 1), alpha);
    dist_ = std::discrete_distribution<int>(w.begin(), w.end());
    n_ = n;
  }
  std::vector<int> Draw(int k, std::mt19937_64 &rng) {
    std::vector<int> out;
    std::vector<bool> used(n_, false);
    for (int attempts = 0; int(out.size()) < k && attempts < 10000; ++attempts) {
      int d = dist_(rng);
      if (!used[d]) {
        used[d] = true;
        out.push_back(d);
      }
    }
    for (int d = 0; int(out.size()) < k && d < n_; ++d) {  // very skewed: fill by rank
      if (!used[d]) {
        used[d] = true;
        out.push_back(d);
      }
    }
    return out;
  }

 private:
  std::discrete_distribution<int> dist_;
  int n_ = 0;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = size_t(std::ceil(pos));
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

struct Stat {
  double mean = NAN, p50 = NAN, p90 = NAN, p99 = NAN, max = NAN;
  size_t n = 0;
};

Stat Summarize(const std::vector<double> &v) {
  Stat s;
  s.n = v.size();
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  s.p50 = Percentile(v, 50);
  s.p90 = Percentile(v, 90);
  s.p99 = Percentile(v, 99);
  s.max = *std::max_element(v.begin(), v.end());
  return s;
}

void WriteStat(Json &parent, const char *key, const Stat &s) {
  parent[key] = {{"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90},
                 {"p99", s.p99},   {"max", s.max}, {"n", int64_t(s.n)}};
}

class LoadGen {
 public:
  explicit LoadGen(Config c) : c_(std::move(c)) {
    for (int i = 0; i < std::max(1, c_.channels); ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection per channel
      args.SetInt("lazyrag.loadgen.channel", i);           // keep the channels distinct
      args.SetMaxReceiveMessageSize(64 << 20);
      auto ch = grpc::CreateCustomChannel(c_.target, grpc::InsecureChannelCredentials(), args);
      stubs_.push_back(v1::Inference::NewStub(ch));
    }
  }

  // Waits until the target answers Stats; fills the server description.
  bool WaitReady(double seconds) {
    const auto until = Clock::now() + std::chrono::milliseconds(int64_t(seconds * 1000));
    grpc::Status last;
    do {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      v1::StatsResponse r;
      last = stubs_[0]->Stats(&ctx, v1::StatsRequest(), &r);
      if (last.ok()) {
        server_model_ = r.model();
        server_pages_total_ = r.pool().pages_total();
        server_page_size_ = r.pool().page_size();
        server_host_cache_bytes_ = r.host_cache().capacity_bytes();
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    } while (Clock::now() < until);
    std::cerr << "lazyrag-loadgen: " << c_.target << " not ready after " << seconds
              << " s: " << last.error_message() << "\n";
    return false;
  }

  // Builds the document pool (and prepares it on the server with --docs_by=id).
  bool PrepareDocuments(double bytes_per_token, bool calibrate, int batch, double wait_s) {
    const auto t0 = Clock::now();
    bytes_per_token_ = bytes_per_token;
    auto bytes = [&] {
      return size_t(std::max(1.0, std::round(c_.doc_tokens * bytes_per_token_)));
    };
    if (calibrate) {
      for (int iter = 0; iter < 3; ++iter) {
        std::vector<std::string> one = {DocText(0, bytes(), c_.seed)};
        std::vector<v1::PreparedDocument> got;
        if (!Prepare(one, wait_s, &got)) return false;
        const int n = got[0].num_tokens();
        if (n <= 0 || n == c_.doc_tokens) break;
        std::cerr << "lazyrag-loadgen: calibration: " << bytes() << " bytes gave " << n
                  << " tokens; ";
        bytes_per_token_ *= double(c_.doc_tokens) / double(n);
        std::cerr << "bytes/token now " << bytes_per_token_ << "\n";
      }
    }
    texts_.clear();
    for (int i = 0; i < c_.num_docs; ++i) texts_.push_back(DocText(i, bytes(), c_.seed));
    if (c_.docs_by == "text") {
      prepare_s_ = MsSince(t0, Clock::now()) / 1000;
      return true;
    }
    ids_.clear();
    doc_num_tokens_.clear();
    for (int i = 0; i < c_.num_docs; i += batch) {
      std::vector<std::string> part(texts_.begin() + i,
                                    texts_.begin() + std::min(c_.num_docs, i + batch));
      std::vector<v1::PreparedDocument> got;
      if (!Prepare(part, wait_s, &got)) return false;
      for (const auto &d : got) {
        ids_.push_back(d.id());
        doc_num_tokens_.push_back(d.num_tokens());
        prepared_computed_ += d.computed() ? 1 : 0;
      }
    }
    prepare_s_ = MsSince(t0, Clock::now()) / 1000;
    std::cerr << "lazyrag-loadgen: prepared " << ids_.size() << " documents (" << prepared_computed_
              << " computed) in " << prepare_s_ << " s\n";
    return true;
  }

  // Precomputes the schedule: arrival times (open loop) and documents of every request.
  void Plan() {
    std::mt19937_64 arrivals(c_.seed * 31 + 1), draws(c_.seed * 31 + 2);
    DocSampler sampler(c_.num_docs, c_.zipf);
    std::exponential_distribution<double> gap(c_.rate > 0 ? c_.rate : 1.0);
    double t = 0;
    records_.resize(c_.num_requests);
    for (int i = 0; i < c_.num_requests; ++i) {
      Record &r = records_[i];
      r.index = i;
      r.docs = sampler.Draw(std::min(c_.docs_per_request, c_.num_docs), draws);
      if (c_.rate > 0) {
        if (i > 0) t += gap(arrivals);
        r.scheduled_ms = t * 1000;
      }
    }
    std::mt19937_64 wdraws(c_.seed * 31 + 3);
    for (int i = 0; i < c_.warmup; ++i) {
      warmup_docs_.push_back(sampler.Draw(std::min(c_.docs_per_request, c_.num_docs), wdraws));
    }
  }

  int Warmup() {
    int failed = 0;
    for (int i = 0; i < c_.warmup; ++i) {
      Record r;
      r.index = -1 - i;
      r.docs = warmup_docs_[i];
      Send(r, Clock::now(), 1000000 + i);
      if (!r.ok()) {
        ++failed;
        std::cerr << "lazyrag-loadgen: warm-up request failed: " << r.error << "\n";
      }
    }
    return failed;
  }

  void Run() {
    t0_ = Clock::now();
    if (c_.rate > 0) {
      RunOpenLoop();
    } else {
      RunClosedLoop();
    }
    t_end_ = Clock::now();
  }

  void Report(const std::string &out_path, bool per_request) const;
  void PrintPrepared() const {
    double sum = 0;
    for (int n : doc_num_tokens_) sum += n;
    std::printf("prepared %zu documents (%d computed, mean %.1f tokens) in %.2f s\n", ids_.size(),
                prepared_computed_, ids_.empty() ? 0.0 : sum / double(ids_.size()), prepare_s_);
    std::fflush(stdout);
  }
  int Failed() const {
    int n = 0;
    for (const Record &r : records_) n += (r.code > 0) ? 1 : 0;
    return n;
  }

 private:
  bool Prepare(const std::vector<std::string> &texts, double wait_s,
               std::vector<v1::PreparedDocument> *out) {
    const auto until = Clock::now() + std::chrono::milliseconds(int64_t(wait_s * 1000));
    for (;;) {
      v1::PrepareDocumentsRequest req;
      for (const auto &t : texts) req.add_texts(t);
      req.set_cache_namespace(c_.cache_namespace);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(600));
      v1::PrepareDocumentsResponse resp;
      grpc::Status s = stubs_[0]->PrepareDocuments(&ctx, req, &resp);
      if (s.ok() && resp.documents_size() == int(texts.size())) {
        out->assign(resp.documents().begin(), resp.documents().end());
        return true;
      }
      // UNAVAILABLE: a router that has not seen its worker healthy yet; retry a while.
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE || Clock::now() >= until) {
        std::cerr << "lazyrag-loadgen: PrepareDocuments failed: " << s.error_code() << " "
                  << s.error_message() << "\n";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }

  // Sends request r (blocking) and fills its record. `channel` picks the connection.
  void Send(Record &r, Clock::time_point t0, int channel) {
    v1::GenerateRequest req;
    req.set_request_id("lg-" + std::to_string(r.index));
    for (int d : r.docs) {
      if (c_.docs_by == "text") {
        req.add_documents()->set_text(texts_[d]);
      } else {
        req.add_documents()->set_id(ids_[d]);
      }
    }
    const size_t qbytes = size_t(std::max(1.0, std::round(c_.query_tokens * bytes_per_token_)));
    req.set_query(QueryText(r.index, qbytes, c_.seed));
    req.set_max_tokens(c_.max_tokens);
    req.set_ignore_eos(c_.ignore_eos);
    req.set_mode(c_.mode_proto);
    req.set_cache_namespace(c_.cache_namespace);

    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(int64_t(c_.timeout_s * 1000)));
    const auto start = Clock::now();
    r.start_ms = MsSince(t0, start);
    auto reader = stubs_[size_t(channel) % stubs_.size()]->Generate(&ctx, req);
    v1::GenerateResponse m;
    Clock::time_point last_token;
    bool have_last = false;
    while (reader->Read(&m)) {
      const auto now = Clock::now();
      const int k = m.token_ids_size();
      if (k > 0) {
        if (r.first_token_ms < 0) {
          r.first_token_ms = MsSince(t0, now);
          for (int j = 1; j < k; ++j) r.itl_ms.push_back(0);
        } else {
          const double gap = MsSince(last_token, now) / k;
          for (int j = 0; j < k; ++j) r.itl_ms.push_back(gap);
        }
        r.tokens += k;
        last_token = now;
        have_last = true;
      }
      if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        const v1::Usage &u = m.usage();
        r.prompt_tokens = u.prompt_tokens();
        r.document_tokens = u.document_tokens();
        r.cached_document_tokens = u.cached_document_tokens();
        r.pool_document_tokens = u.pool_document_tokens();
        r.host_document_tokens = u.host_document_tokens();
        r.store_document_tokens = u.store_document_tokens();
        r.computed_tokens = u.computed_tokens();
        r.completion_tokens = u.completion_tokens();
        if (m.has_timings()) {
          r.server_queue_ms = m.timings().queue_ms();
          r.server_ttft_ms = m.timings().ttft_ms();
          r.server_total_ms = m.timings().total_ms();
        }
      }
    }
    (void)have_last;
    grpc::Status s = reader->Finish();
    r.end_ms = MsSince(t0, Clock::now());
    r.code = int(s.error_code());
    r.error = s.error_message();
  }

  void RunOpenLoop() {
    std::vector<std::thread> threads;
    std::mutex mu;
    std::condition_variable cv;
    int inflight = 0;
    for (Record &r : records_) {
      if (c_.duration_s > 0 && r.scheduled_ms > c_.duration_s * 1000) break;
      std::this_thread::sleep_until(t0_ +
                                    std::chrono::microseconds(int64_t(r.scheduled_ms * 1000)));
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return inflight < c_.max_inflight; });
        ++inflight;
      }
      threads.emplace_back([this, &r, &mu, &cv, &inflight] {
        Send(r, t0_, r.index);
        std::lock_guard<std::mutex> l(mu);
        --inflight;
        cv.notify_all();
      });
    }
    for (auto &t : threads) t.join();
  }

  void RunClosedLoop() {
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < std::max(1, c_.concurrency); ++c) {
      threads.emplace_back([this, c, &next] {
        for (;;) {
          if (c_.duration_s > 0 && MsSince(t0_, Clock::now()) > c_.duration_s * 1000) return;
          const int i = next.fetch_add(1);
          if (i >= int(records_.size())) return;
          Record &r = records_[i];
          r.scheduled_ms = MsSince(t0_, Clock::now());
          Send(r, t0_, c);
        }
      });
    }
    for (auto &t : threads) t.join();
  }

  Config c_;
  std::vector<std::unique_ptr<v1::Inference::Stub>> stubs_;
  std::string server_model_;
  int64_t server_pages_total_ = 0;
  int server_page_size_ = 0;
  int64_t server_host_cache_bytes_ = 0;  // the host tier's capacity (0: none)
  double bytes_per_token_ = 1;
  std::vector<std::string> texts_, ids_;
  std::vector<int> doc_num_tokens_;
  int prepared_computed_ = 0;
  double prepare_s_ = 0;
  std::vector<Record> records_;
  std::vector<std::vector<int>> warmup_docs_;
  Clock::time_point t0_, t_end_;
};

const char *CodeName(int code) {
  static const char *kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "NOT_SENT";
}

void LoadGen::Report(const std::string &out_path, bool per_request) const {
  std::vector<double> ttft, sttft, queue, itl, e2e, tpot, lag;
  int64_t ok = 0, sent = 0, out_tokens = 0, doc_tokens = 0, cached = 0, pool = 0, host = 0,
          store = 0;
  int64_t computed = 0, prompt = 0;
  double first_start = -1, last_end = 0;
  std::map<std::string, int> errors;
  for (const Record &r : records_) {
    if (r.code < 0) continue;
    ++sent;
    if (first_start < 0 || r.start_ms < first_start) first_start = r.start_ms;
    last_end = std::max(last_end, r.end_ms);
    if (!r.ok()) {
      errors[CodeName(r.code)]++;
      continue;
    }
    ++ok;
    if (r.first_token_ms >= 0) ttft.push_back(r.first_token_ms - r.start_ms);
    if (r.server_ttft_ms >= 0) sttft.push_back(r.server_ttft_ms);
    if (r.server_queue_ms >= 0) queue.push_back(r.server_queue_ms);
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    e2e.push_back(r.end_ms - r.start_ms);
    if (r.tokens > 1) tpot.push_back((r.end_ms - r.first_token_ms) / (r.tokens - 1));
    if (c_.rate > 0) lag.push_back(r.start_ms - r.scheduled_ms);
    out_tokens += r.tokens;
    doc_tokens += r.document_tokens;
    cached += r.cached_document_tokens;
    pool += r.pool_document_tokens;
    host += r.host_document_tokens;
    store += r.store_document_tokens;
    computed += r.computed_tokens;
    prompt += r.prompt_tokens;
  }
  // Throughput over the measured window: from the first send to the last completion.
  const double window_s = sent > 0 ? std::max(1e-9, (last_end - first_start) / 1000) : NAN;
  const Stat s_ttft = Summarize(ttft), s_sttft = Summarize(sttft), s_queue = Summarize(queue),
             s_itl = Summarize(itl), s_e2e = Summarize(e2e), s_tpot = Summarize(tpot),
             s_lag = Summarize(lag);
  const double hit = doc_tokens > 0 ? double(cached) / double(doc_tokens) : NAN;
  const double pool_hit = doc_tokens > 0 ? double(pool) / double(doc_tokens) : NAN;
  const double host_hit = doc_tokens > 0 ? double(host) / double(doc_tokens) : NAN;
  const double store_hit = doc_tokens > 0 ? double(store) / double(doc_tokens) : NAN;

  char loop[64];
  if (c_.rate > 0) {
    std::snprintf(loop, sizeof(loop), "rate=%g/s", c_.rate);
  } else {
    std::snprintf(loop, sizeof(loop), "concurrency=%d", c_.concurrency);
  }
  std::printf(
      "lazyrag-loadgen target=%s mode=%s %s docs=%dx%d per_req=%d zipf=%g query=%d out=%d\n",
      c_.target.c_str(), c_.mode.c_str(), loop, c_.num_docs, c_.doc_tokens, c_.docs_per_request,
      c_.zipf, c_.query_tokens, c_.max_tokens);
  std::printf("requests: %lld sent, %lld ok, %lld failed, window %.2f s\n", (long long)sent,
              (long long)ok, (long long)(sent - ok), window_s);
  std::printf("%-18s %10s %10s %10s %10s %10s\n", "metric (ms)", "mean", "p50", "p90", "p99",
              "max");
  auto row = [](const char *name, const Stat &s) {
    std::printf("%-18s %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, s.mean, s.p50, s.p90, s.p99,
                s.max);
  };
  row("TTFT (client)", s_ttft);
  row("TTFT (server)", s_sttft);
  row("queue (server)", s_queue);
  row("ITL", s_itl);
  row("TPOT", s_tpot);
  row("end-to-end", s_e2e);
  if (c_.rate > 0) row("send lag", s_lag);
  std::printf(
      "throughput: %.3f req/s, %.1f output tok/s; doc hit ratio %.3f (pool %.3f, host %.3f, "
      "store %.3f)\n",
      double(ok) / window_s, double(out_tokens) / window_s, hit, pool_hit, host_hit, store_hit);
  for (const auto &[name, n] : errors) std::printf("errors: %s x%d\n", name.c_str(), n);
  std::fflush(stdout);

  if (out_path.empty()) return;
  Json j;
  j = Json::object();
  Json &j1 = j["config"] = Json::object();
  j1["target"] = c_.target;
  j1["mode"] = c_.mode;
  j1["label"] = c_.label;
  j1["loop"] = c_.rate > 0 ? "open" : "closed";
  j1["rate"] = c_.rate;
  j1["concurrency"] = c_.rate > 0 ? 0 : c_.concurrency;
  j1["num_requests"] = c_.num_requests;
  j1["duration_s"] = c_.duration_s;
  j1["num_docs"] = c_.num_docs;
  j1["doc_tokens"] = c_.doc_tokens;
  j1["docs_per_request"] = c_.docs_per_request;
  j1["zipf"] = c_.zipf;
  j1["distribution"] = c_.zipf > 0 ? "zipf" : "uniform";
  j1["query_tokens"] = c_.query_tokens;
  j1["max_tokens"] = c_.max_tokens;
  j1["ignore_eos"] = c_.ignore_eos;
  j1["seed"] = int64_t(c_.seed);
  j1["warmup"] = c_.warmup;
  j1["docs_by"] = c_.docs_by;
  j1["timeout_s"] = c_.timeout_s;
  j1["channels"] = c_.channels;
  j1["cache_namespace"] = c_.cache_namespace;
  Json &j2 = j["server"] = Json::object();
  j2["model"] = server_model_;
  j2["pages_total"] = server_pages_total_;
  j2["page_size"] = server_page_size_;
  j2["host_cache_bytes"] = server_host_cache_bytes_;
  Json &j3 = j["prepare"] = Json::object();
  j3["seconds"] = prepare_s_;
  j3["documents"] = int64_t(ids_.size());
  j3["computed"] = prepared_computed_;
  j3["bytes_per_token"] = bytes_per_token_;
  double doc_tok_mean = NAN;
  if (!doc_num_tokens_.empty()) {
    double sum = 0;
    for (int n : doc_num_tokens_) sum += n;
    doc_tok_mean = sum / double(doc_num_tokens_.size());
  }
  j3["doc_tokens_mean"] = doc_tok_mean;
  Json &j4 = j["summary"] = Json::object();
  j4["requests"] = int64_t(records_.size());
  j4["sent"] = sent;
  j4["ok"] = ok;
  j4["failed"] = sent - ok;
  j4["window_s"] = window_s;
  j4["request_throughput"] = double(ok) / window_s;
  j4["output_throughput"] = double(out_tokens) / window_s;
  j4["output_tokens"] = out_tokens;
  j4["prompt_tokens"] = prompt;
  j4["document_tokens"] = doc_tokens;
  j4["cached_document_tokens"] = cached;
  j4["pool_document_tokens"] = pool;
  j4["host_document_tokens"] = host;
  j4["store_document_tokens"] = store;
  j4["computed_tokens"] = computed;
  j4["doc_hit_ratio"] = hit;
  j4["pool_hit_ratio"] = pool_hit;
  j4["host_hit_ratio"] = host_hit;
  j4["store_hit_ratio"] = store_hit;
  WriteStat(j4, "ttft_ms", s_ttft);
  WriteStat(j4, "server_ttft_ms", s_sttft);
  WriteStat(j4, "queue_ms", s_queue);
  WriteStat(j4, "itl_ms", s_itl);
  WriteStat(j4, "tpot_ms", s_tpot);
  WriteStat(j4, "e2e_ms", s_e2e);
  WriteStat(j4, "send_lag_ms", s_lag);
  Json &j5 = j4["errors"] = Json::object();
  for (const auto &[name, n] : errors) j5[name] = n;
  if (per_request) {
    Json &j6 = j["requests"] = Json::array();
    for (const Record &r : records_) {
      if (r.code < 0) continue;
      Json &j7 = j6.emplace_back(Json::object());
      j7["i"] = r.index;
      Json &j8 = j7["docs"] = Json::array();
      for (int d : r.docs) j8.push_back(d);
      j7["scheduled_ms"] = r.scheduled_ms;
      j7["start_ms"] = r.start_ms;
      j7["ttft_ms"] = r.first_token_ms >= 0 ? r.first_token_ms - r.start_ms : NAN;
      j7["e2e_ms"] = r.end_ms - r.start_ms;
      j7["server_queue_ms"] = r.server_queue_ms;
      j7["server_ttft_ms"] = r.server_ttft_ms;
      j7["server_total_ms"] = r.server_total_ms;
      Json &j9 = j7["itl_ms"] = Json::array();
      for (double x : r.itl_ms) j9.push_back(x);
      j7["tokens"] = r.tokens;
      j7["prompt_tokens"] = r.prompt_tokens;
      j7["document_tokens"] = r.document_tokens;
      j7["cached_document_tokens"] = r.cached_document_tokens;
      j7["pool_document_tokens"] = r.pool_document_tokens;
      j7["host_document_tokens"] = r.host_document_tokens;
      j7["store_document_tokens"] = r.store_document_tokens;
      j7["computed_tokens"] = r.computed_tokens;
      j7["code"] = CodeName(r.code);
      if (!r.ok()) j7["error"] = r.error;
    }
  }
  std::ofstream f(out_path);
  f << JsonDump(j) << "\n";
  if (!f) std::cerr << "lazyrag-loadgen: cannot write " << out_path << "\n";
}

bool ParseMode(const std::string &m, v1::AttentionMode *out) {
  if (m == "lazy")
    *out = v1::ATTENTION_MODE_LAZY;
  else if (m == "materialize")
    *out = v1::ATTENTION_MODE_MATERIALIZE;
  else if (m == "prefix")
    *out = v1::ATTENTION_MODE_PREFIX;
  else if (m == "full")
    *out = v1::ATTENTION_MODE_FULL;
  else
    return false;
  return true;
}

int Main(int argc, char **argv) {
  absl::SetProgramUsageMessage(
      "lazyrag-loadgen --target HOST:PORT (--rate R | --concurrency C) --num_requests N "
      "--mode lazy|materialize|prefix|full [--zipf A] [--out FILE]");
  absl::ParseCommandLine(argc, argv);
  Config c;
  c.target = absl::GetFlag(FLAGS_target);
  c.rate = absl::GetFlag(FLAGS_rate);
  c.concurrency = absl::GetFlag(FLAGS_concurrency);
  c.num_requests = absl::GetFlag(FLAGS_num_requests);
  c.duration_s = absl::GetFlag(FLAGS_duration_s);
  c.num_docs = absl::GetFlag(FLAGS_num_docs);
  c.doc_tokens = absl::GetFlag(FLAGS_doc_tokens);
  c.docs_per_request = absl::GetFlag(FLAGS_docs_per_request);
  c.zipf = absl::GetFlag(FLAGS_zipf);
  c.query_tokens = absl::GetFlag(FLAGS_query_tokens);
  c.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  c.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  c.mode = absl::GetFlag(FLAGS_mode);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.warmup = absl::GetFlag(FLAGS_warmup);
  c.docs_by = absl::GetFlag(FLAGS_docs_by);
  c.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  c.channels = absl::GetFlag(FLAGS_channels);
  c.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  c.cache_namespace = absl::GetFlag(FLAGS_cache_namespace);
  c.label = absl::GetFlag(FLAGS_label);
  std::string err;
  if (!ParseMode(c.mode, &c.mode_proto)) err = "--mode must be lazy, materialize, prefix or full";
  if (c.docs_by != "id" && c.docs_by != "text") err = "--docs_by must be id or text";
  if (c.rate < 0 || !std::isfinite(c.rate)) err = "--rate must be >= 0";
  if (c.num_requests < 1 || c.num_docs < 1 || c.doc_tokens < 1 || c.query_tokens < 1 ||
      c.max_tokens < 1 || c.docs_per_request < 0 || c.concurrency < 1 || c.max_inflight < 1) {
    err = "counts must be positive";
  }
  if (c.zipf < 0) err = "--zipf must be >= 0";
  if (!err.empty()) {
    std::cerr << "lazyrag-loadgen: " << err << "\n";
    return 2;
  }
  LoadGen lg(c);
  if (!lg.WaitReady(absl::GetFlag(FLAGS_wait_ready_s))) return 1;
  if (!lg.PrepareDocuments(absl::GetFlag(FLAGS_bytes_per_token), absl::GetFlag(FLAGS_calibrate),
                           std::max(1, absl::GetFlag(FLAGS_prepare_batch)),
                           absl::GetFlag(FLAGS_wait_ready_s))) {
    return 1;
  }
  if (absl::GetFlag(FLAGS_prepare_only)) {
    lg.PrintPrepared();
    return 0;
  }
  lg.Plan();
  if (lg.Warmup() > 0) std::cerr << "lazyrag-loadgen: warm-up had failures (continuing)\n";
  lg.Run();
  lg.Report(absl::GetFlag(FLAGS_out), absl::GetFlag(FLAGS_per_request));
  return lg.Failed() > 0 ? 3 : 0;
}

}  // namespace
}  // namespace lazyrag

int main(int argc, char **argv) { return lazyrag::Main(argc, argv); }
