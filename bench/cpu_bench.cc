// CPU benchmark of the foundation (issue 2), one run, one process:
//   1. prefill and decode tokens/s of the model (FULL mode),
//   2. TTFT of a request with 5 cached documents in LAZY against MATERIALIZE, PREFIX and FULL,
//   3. quality: contained exact match on bench/rag_qa/questions.jsonl in FULL, LAZY and
//      MATERIALIZE (LAZY and MATERIALIZE must answer identically).
// Prints tables and writes JSON (--out). Usage:
//   cpu_bench --model PATH [--out FILE] [--questions FILE] [--max_questions N] [--doc_tokens N]
//             [--device cpu|cuda]
// --device cuda runs the same three parts on the GPU backend (bf16), e.g. the quality part on
// the H200 beside the CPU's.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/json.h"
#include "common/native_blas.h"
#include "common/parallel.h"
#include "worker/runtime/runtime.h"

namespace lazyrag {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string Normalise(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c))
      out += char(std::tolower(c));
    else if (!out.empty() && out.back() != ' ')
      out += ' ';
  }
  return out;
}

struct Question {
  std::vector<std::string> documents;
  std::string question, answer;
};

std::vector<Question> LoadQuestions(const std::string& path) {
  std::vector<Question> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto v = ParseJson(line);
    if (!v.ok()) continue;
    Question q;
    if (!v->is_object() || JsonMember(*v, "documents") == nullptr) continue;
    for (const auto& d : v->at("documents")) q.documents.push_back(d.get<std::string>());
    q.question = v->value("question", "");
    q.answer = v->value("answer", "");
    out.push_back(q);
  }
  return out;
}

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::map<std::string, std::string> a = {
      {"model", ""},           {"out", ""},           {"questions", "bench/rag_qa/questions.jsonl"},
      {"max_questions", "60"}, {"doc_tokens", "400"}, {"device", "cpu"}};
  for (int i = 1; i + 1 < argc; i += 2) a[std::string(argv[i]).substr(2)] = argv[i + 1];
  RuntimeOptions ro;
  ro.model = a["model"];
  ro.device = a["device"];
  ro.kv_pool_bytes = int64_t(512) << 20;
  auto rt_or = CreateRuntime(ro);
  if (!rt_or.ok()) {
    std::fprintf(stderr, "cpu_bench: %s\n", rt_or.status().ToString().c_str());
    return 1;
  }
  Runtime& rt = **rt_or;
  Generator& gen = *rt.generator;
  // Documents for the throughput and TTFT parts come from every question; --max_questions
  // limits only the quality part.
  const std::vector<Question> all_questions = LoadQuestions(a["questions"]);
  std::vector<Question> questions = all_questions;
  questions.resize(std::min<size_t>(questions.size(), std::stoul(a["max_questions"])));
  if (questions.empty()) {
    std::fprintf(stderr, "cpu_bench: no questions in %s\n", a["questions"].c_str());
    return 1;
  }
  Json j;
  j = Json::object();
  j["model"] = ro.model;
  j["device"] = ro.device;
  j["blas_kernels"] = BlasCoreName();
  j["threads"] = NumWorkerThreads();

  // 1. Throughput: a FULL prefill of ~512 tokens, then 64 decode steps.
  std::string filler;
  for (const Question& q : all_questions)
    for (const auto& d : q.documents) filler += d + " ";
  GenerateRequest r;
  r.documents.push_back({filler.substr(0, 2400), ""});
  r.query = "Summarise.";
  r.mode = AttentionMode::kFull;
  r.max_tokens = 64;
  r.ignore_eos = true;
  if (!gen.Generate(r).ok()) return 1;  // warm-up
  auto res = gen.Generate(r);
  const double prefill_tps = res->usage.computed_tokens / (res->timings.ttft_ms / 1e3);
  const double decode_tps =
      (res->usage.completion_tokens - 1) / ((res->timings.total_ms - res->timings.ttft_ms) / 1e3);
  std::printf("throughput: prefill %lld tokens in %.1f ms = %.0f tokens/s; decode %.1f tokens/s\n",
              (long long)res->usage.computed_tokens, res->timings.ttft_ms, prefill_tps, decode_tps);
  j["prefill_tokens"] = res->usage.computed_tokens;
  j["prefill_tokens_per_s"] = prefill_tps;
  j["decode_tokens_per_s"] = decode_tps;

  // 2. TTFT with 5 cached documents of about doc_tokens tokens each.
  const int doc_tokens = std::stoi(a["doc_tokens"]);
  std::vector<std::string> docs;
  size_t qi = 0;
  for (int d = 0; d < 5; ++d) {
    std::string text;
    while (int(rt.tokenizer->Encode(text).size()) < doc_tokens) {
      const Question& q = all_questions[qi++ % all_questions.size()];
      text += q.documents[0] + " ";
    }
    docs.push_back(text);
  }
  std::mt19937 rng(1);
  std::map<std::string, double> ttft;
  std::printf("\nTTFT, one request, 5 documents x ~%d tokens, 16 output tokens:\n", doc_tokens);
  std::printf("%-12s %10s %10s %12s\n", "mode", "ttft_ms", "computed", "cached_docs");
  Json& j1 = j["ttft"] = Json::array();
  for (AttentionMode mode : {AttentionMode::kLazy, AttentionMode::kMaterialize,
                             AttentionMode::kPrefix, AttentionMode::kFull}) {
    std::vector<double> t;
    Usage usage;
    for (int rep = 0; rep < 4; ++rep) {
      GenerateRequest q;
      for (const auto& d : docs) q.documents.push_back({d, ""});
      std::shuffle(q.documents.begin(), q.documents.end(), rng);  // a new order every time
      q.query = "Which buildings are described?";
      q.mode = mode;
      q.max_tokens = 16;
      q.ignore_eos = true;
      auto out = gen.Generate(q);
      if (!out.ok()) return 1;
      if (rep > 0) {  // the first run of each mode fills the caches it uses
        t.push_back(out->timings.ttft_ms);
        usage = out->usage;
      }
    }
    ttft[std::string(AttentionModeName(mode))] = Median(t);
    std::printf("%-12s %10.1f %10lld %12lld\n", std::string(AttentionModeName(mode)).c_str(),
                Median(t), (long long)usage.computed_tokens,
                (long long)usage.cached_document_tokens);
    Json& j2 = j1.emplace_back(Json::object());
    j2["mode"] = std::string(AttentionModeName(mode));
    j2["ttft_ms_median"] = Median(t);
    j2["computed_tokens"] = usage.computed_tokens;
    j2["cached_document_tokens"] = usage.cached_document_tokens;
    j2["document_tokens"] = usage.document_tokens;
  }
  std::printf("FULL / LAZY TTFT ratio: %.1fx\n", ttft["full"] / ttft["lazy"]);
  j["full_over_lazy_ttft"] = ttft["full"] / ttft["lazy"];

  // 3. Quality.
  std::map<std::string, int> correct;
  int same_lazy_mat = 0;
  for (const Question& q : questions) {
    std::map<std::string, std::string> answers;
    for (AttentionMode mode :
         {AttentionMode::kFull, AttentionMode::kLazy, AttentionMode::kMaterialize}) {
      GenerateRequest g;
      for (const auto& d : q.documents) g.documents.push_back({d, ""});
      g.system_prompt = "Answer the question with a short phrase using only the documents.";
      g.query = q.question;
      g.mode = mode;
      g.max_tokens = 24;
      auto out = gen.Generate(g);
      if (!out.ok()) return 1;
      const std::string name(AttentionModeName(mode));
      answers[name] = out->text;
      if (Normalise(out->text).find(Normalise(q.answer)) != std::string::npos) ++correct[name];
    }
    same_lazy_mat += answers["lazy"] == answers["materialize"];
  }
  const int n = int(questions.size());
  std::printf("\nquality, %d questions (contained exact match):\n", n);
  j["questions"] = n;
  Json& j3 = j["exact_match"] = Json::object();
  for (const char* m : {"full", "lazy", "materialize"}) {
    std::printf("  %-12s %3d / %d = %.1f%%\n", m, correct[m], n, 100.0 * correct[m] / n);
    j3[m] = double(correct[m]) / n;
  }
  std::printf("  lazy and materialize answers identical: %d / %d\n", same_lazy_mat, n);
  j["lazy_materialize_identical"] = same_lazy_mat;
  if (!a["out"].empty()) {
    std::ofstream(a["out"]) << JsonDump(j) << "\n";
    std::printf("wrote %s\n", a["out"].c_str());
  }
  return 0;
}

}  // namespace
}  // namespace lazyrag

int main(int argc, char** argv) {
  lazyrag::PreferNativeBlasKernels(argv);
  return lazyrag::Main(argc, argv);
}
