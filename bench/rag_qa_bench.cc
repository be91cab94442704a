// Answer quality of the attention modes and the quality settings (issue 25) on the question
// sets of bench/rag_qa (make_quality_sets.py): contained exact match by set, by configuration
// and by the depth (in tokens) of the needed fact inside its document; LAZY and MATERIALIZE
// answers compared for every setting. Prints a table and writes JSON (--out).
//
//   rag_qa_bench --model PATH --sets A.jsonl,B.jsonl [--configs LIST] [--out FILE]
//                [--shared_prefix none|template] [--default_k K]
//                [--max_questions N] [--max_tokens N] [--device cpu|cuda] [--commit SHA]
//
// --configs: comma-separated "MODE[:k=K][:d=D][:t=T][:s=S]" (MODE full|prefix|lazy|materialize;
// K, D, T, S = the per-request recompute_first_tokens, drop_first_tokens, document_temperature,
// document_scale; unset = the server defaults: --default_k, 0, 1, 1). Default:
// "full,prefix,lazy,materialize". Every configuration runs on every question, question by
// question, so a question's documents stay resident across its LAZY / MATERIALIZE runs.
//
// Scoring: an answer counts when its normalised text (lower case, runs of other characters
// to one space) contains the normalised answer as whole words. Depth of a question: the token
// offset, inside its document, of the deepest fact it needs (single hop: one fact; multi hop:
// both), counted with the model's tokenizer on the document text before the fact's sentence.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/rag_qa/question_set.h"
#include "common/json.h"
#include "common/native_blas.h"
#include "common/parallel.h"
#include "worker/runtime/runtime.h"

namespace lazyrag {
namespace {

using rag_qa::Correct;
using rag_qa::LoadQuestions;
using rag_qa::Question;

struct Config {
  std::string name;
  AttentionMode mode = AttentionMode::kLazy;
  QualityOptions quality;
};

std::optional<Config> ParseConfig(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  Config c;
  c.name = spec;
  auto mode = ParseAttentionMode(parts[0]);
  if (!mode.ok() || parts[0].empty()) return std::nullopt;
  c.mode = *mode;
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].rfind("k=", 0) == 0) {
      c.quality.recompute_first_tokens = std::stoi(parts[i].substr(2));
    } else if (parts[i].rfind("d=", 0) == 0) {
      c.quality.drop_first_tokens = std::stoi(parts[i].substr(2));
    } else if (parts[i].rfind("t=", 0) == 0) {
      c.quality.document_temperature = std::stof(parts[i].substr(2));
    } else if (parts[i].rfind("s=", 0) == 0) {
      c.quality.document_scale = std::stof(parts[i].substr(2));
    } else {
      return std::nullopt;
    }
  }
  return c;
}

// Depth buckets, in tokens from the start of the document.
constexpr int kBuckets[] = {0, 32, 128, 256};
constexpr const char* kBucketNames[] = {"0-31", "32-127", "128-255", "256+"};
int BucketOf(int depth) {
  int b = 0;
  for (int i = 0; i < 4; ++i) {
    if (depth >= kBuckets[i]) b = i;
  }
  return b;
}

struct Tally {
  int correct = 0, n = 0;
  int by_bucket_correct[4] = {}, by_bucket_n[4] = {};
  int64_t computed_tokens = 0, recomputed_tokens = 0;
  double ttft_ms = 0;
};

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::map<std::string, std::string> a = {
      {"model", ""},
      {"out", ""},
      {"sets", "bench/rag_qa/single_hop_dev.jsonl,bench/rag_qa/multi_hop_dev.jsonl"},
      {"configs", "full,prefix,lazy,materialize"},
      {"max_questions", "1000"},
      {"max_tokens", "32"},
      {"device", "cpu"},
      {"default_k", "0"},
      {"shared_prefix", "none"},
      {"commit", ""}};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0 || !a.count(key.substr(2))) {
      std::fprintf(stderr, "rag_qa_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
    a[key.substr(2)] = argv[i + 1];
  }
  // --configs none: only the sets' statistics and each question's fact depth (for
  // summarize.py, which rebuilds tables from progress logs).
  std::vector<Config> configs;
  const bool depths_only = a["configs"] == "none";
  for (const std::string& spec : std::vector<std::string>(absl::StrSplit(a["configs"], ','))) {
    if (depths_only) break;
    auto c = ParseConfig(spec);
    if (!c) {
      std::fprintf(stderr, "rag_qa_bench: bad config '%s' (MODE[:k=K][:d=D][:t=T][:s=S])\n",
                   spec.c_str());
      return 2;
    }
    configs.push_back(*c);
  }
  RuntimeOptions ro;
  ro.model = a["model"];
  ro.device = a["device"];
  ro.kv_pool_bytes = int64_t(512) << 20;
  // No host tier: answers do not depend on where a document's KV waited, and the CUDA default
  // (a quarter of the machine's memory, pinned) would let only a few of these run side by side.
  ro.host_cache_bytes = 0;
  ro.quality.recompute_first_tokens = std::stoi(a["default_k"]);
  ro.shared_prefix = a["shared_prefix"];
  auto rt_or = CreateRuntime(ro);
  if (!rt_or.ok()) {
    std::fprintf(stderr, "rag_qa_bench: %s\n", rt_or.status().ToString().c_str());
    return 1;
  }
  Runtime& rt = **rt_or;
  Generator& gen = *rt.generator;
  {
    // The shared prefix moves the template's opening out of the prompt prefix: the prompt's
    // tokens must stay those of the whole prefix, or FULL would change with the setting.
    const std::string sys = "Answer the question with a short phrase using only the documents.";
    const RagTemplate& t = gen.rag_template();
    std::vector<int32_t> split =
        t.opening_shared ? rt.tokenizer->Encode(t.Opening()) : std::vector<int32_t>{};
    for (int32_t id : rt.tokenizer->Encode(t.Prefix(sys))) split.push_back(id);
    const bool same = split == rt.tokenizer->Encode(t.FullPrefix(sys));
    std::printf("shared prefix %s: prompt tokens %s those of the unsplit template\n",
                a["shared_prefix"].c_str(), same ? "equal" : "DIFFER FROM");
  }
  const int max_tokens = std::stoi(a["max_tokens"]);

  Json j;
  j = Json::object();
  j["model"] = ro.model;
  j["commit"] = a["commit"];  // --commit: what the binary was built from (not known to it)
  j["device"] = ro.device;
  j["blas_kernels"] = BlasCoreName();
  j["threads"] = NumWorkerThreads();
  j["max_tokens"] = max_tokens;
  j["default_k"] = ro.quality.recompute_first_tokens;
  j["shared_prefix"] = ro.shared_prefix;
  Json& j1 = j["sets"] = Json::array();
  for (const std::string& path : std::vector<std::string>(absl::StrSplit(a["sets"], ','))) {
    std::vector<Question> questions = LoadQuestions(path);
    questions.resize(std::min<size_t>(questions.size(), std::stoul(a["max_questions"])));
    if (questions.empty()) {
      std::fprintf(stderr, "rag_qa_bench: no questions in %s\n", path.c_str());
      return 1;
    }
    // Token depths of the needed facts, and the documents' sizes.
    int doc_min = 1 << 30, doc_max = 0;
    int64_t doc_sum = 0, docs = 0;
    int bucket_count[4] = {};
    for (Question& q : questions) {
      for (const auto& [d, c] : q.facts) {
        q.depth = std::max<int>(q.depth, rt.tokenizer->Encode(q.documents[d].substr(0, c)).size());
      }
      if (depths_only) std::printf("depth %s q%d %d\n", path.c_str(), q.id, q.depth);
      ++bucket_count[BucketOf(q.depth)];
      for (const auto& d : q.documents) {
        const int n = int(rt.tokenizer->Encode(rt.generator->rag_template().Document(d)).size());
        doc_min = std::min(doc_min, n);
        doc_max = std::max(doc_max, n);
        doc_sum += n;
        ++docs;
      }
    }
    std::printf("\n%s: %zu questions, %lld documents of %d-%d tokens (mean %.0f); fact depth",
                path.c_str(), questions.size(), (long long)docs, doc_min, doc_max,
                double(doc_sum) / docs);
    for (int b = 0; b < 4; ++b) std::printf(" %s:%d", kBucketNames[b], bucket_count[b]);
    std::printf("\n");

    std::map<std::string, Tally> tally;
    std::map<std::string, std::vector<std::string>> answers;  // config -> per question
    std::map<std::string, std::vector<std::vector<int32_t>>> ids;
    for (const Question& q : questions) {
      for (const Config& c : configs) {
        GenerateRequest g;
        for (const auto& d : q.documents) g.documents.push_back({d, ""});
        g.system_prompt = "Answer the question with a short phrase using only the documents.";
        g.query = q.question;
        g.mode = c.mode;
        g.max_tokens = max_tokens;
        g.quality = c.quality;
        auto out = gen.Generate(g);
        if (!out.ok()) {
          std::fprintf(stderr, "rag_qa_bench: %s on question %d: %s\n", c.name.c_str(), q.id,
                       out.status().ToString().c_str());
          return 1;
        }
        Tally& t = tally[c.name];
        const bool ok = Correct(out->text, q.answer);
        t.correct += ok;
        ++t.n;
        t.by_bucket_correct[BucketOf(q.depth)] += ok;
        ++t.by_bucket_n[BucketOf(q.depth)];
        t.computed_tokens += out->usage.computed_tokens;
        t.recomputed_tokens += out->usage.recomputed_document_tokens;
        t.ttft_ms += out->timings.ttft_ms;
        answers[c.name].push_back(out->text);
        ids[c.name].push_back(out->token_ids);
      }
      // Progress on stderr (a CPU run of a set takes tens of minutes).
      if (depths_only) continue;
      std::fprintf(stderr, "%s q%d:", path.c_str(), q.id);
      for (const Config& c : configs) {
        std::fprintf(stderr, " %s=%d/%d", c.name.c_str(), tally[c.name].correct, tally[c.name].n);
      }
      std::fprintf(stderr, "\n");
    }
    const int n = int(questions.size());
    std::printf("%-22s %7s %6s", "config", "EM", "EM/FULL");
    for (int b = 0; b < 4; ++b) std::printf(" %10s", kBucketNames[b]);
    std::printf(" %9s %9s %8s\n", "computed", "recomp", "ttft_ms");
    const double full_em = tally.count("full") ? double(tally["full"].correct) / n : 0;
    Json& j2 = j1.emplace_back(Json::object());
    j2["set"] = path;
    j2["questions"] = n;
    j2["document_tokens_min"] = doc_min;
    j2["document_tokens_max"] = doc_max;
    j2["document_tokens_mean"] = double(doc_sum) / docs;
    j2["documents"] = docs;
    Json& j3 = j2["depth_buckets"] = Json::object();
    for (int b = 0; b < 4; ++b) j3[kBucketNames[b]] = bucket_count[b];
    Json& j4 = j2["configs"] = Json::array();
    for (const Config& c : configs) {
      const Tally& t = tally[c.name];
      const double em = double(t.correct) / n;
      std::printf("%-22s %6.1f%% %6.0f%%", c.name.c_str(), 100 * em,
                  full_em > 0 ? 100 * em / full_em : 0.0);
      for (int b = 0; b < 4; ++b) {
        if (t.by_bucket_n[b] == 0)
          std::printf(" %10s", "-");
        else
          std::printf(" %4d/%-5d", t.by_bucket_correct[b], t.by_bucket_n[b]);
      }
      std::printf(" %9.1f %9.1f %8.1f\n", double(t.computed_tokens) / n,
                  double(t.recomputed_tokens) / n, t.ttft_ms / n);
      Json& j5 = j4.emplace_back(Json::object());
      j5["config"] = c.name;
      j5["mode"] = std::string(AttentionModeName(c.mode));
      if (c.quality.recompute_first_tokens) j5["k"] = *c.quality.recompute_first_tokens;
      if (c.quality.drop_first_tokens) j5["drop_first_tokens"] = *c.quality.drop_first_tokens;
      if (c.quality.document_temperature) {
        j5["document_temperature"] = *c.quality.document_temperature;
      }
      if (c.quality.document_scale) j5["document_scale"] = *c.quality.document_scale;
      j5["correct"] = t.correct;
      j5["exact_match"] = em;
      if (full_em > 0) j5["of_full"] = em / full_em;
      Json& j6 = j5["by_depth"] = Json::object();
      for (int b = 0; b < 4; ++b) {
        Json& j7 = j6[kBucketNames[b]] = Json::object();
        j7["correct"] = t.by_bucket_correct[b];
        j7["n"] = t.by_bucket_n[b];
      }
      j5["computed_tokens_mean"] = double(t.computed_tokens) / n;
      j5["recomputed_document_tokens_mean"] = double(t.recomputed_tokens) / n;
      j5["ttft_ms_mean"] = t.ttft_ms / n;
      Json& j8 = j5["answers"] = Json::array();
      for (const std::string& s : answers[c.name]) j8.push_back(s);
    }
    // LAZY and MATERIALIZE with the same settings compute the same function: compare the
    // generated token ids of every such pair.
    Json& j9 = j2["lazy_materialize_identical"] = Json::array();
    for (const Config& c : configs) {
      if (c.mode != AttentionMode::kLazy) continue;
      std::string twin = "materialize" + c.name.substr(4);
      if (!ids.count(twin)) continue;
      int same = 0;
      for (int i = 0; i < n; ++i) same += ids[c.name][i] == ids[twin][i];
      std::printf("  %s vs %s: identical answers %d / %d\n", c.name.c_str(), twin.c_str(), same, n);
      Json& j10 = j9.emplace_back(Json::object());
      j10["lazy"] = c.name;
      j10["materialize"] = twin;
      j10["identical"] = same;
      j10["questions"] = n;
    }
  }
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
