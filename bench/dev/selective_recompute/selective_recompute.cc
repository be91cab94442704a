// Selective recompute study (issue 25): CacheBlend-style recompute of the document tokens whose
// cached (document-alone) KV deviates most from full prefill, against first-k recompute at the
// same number of recomputed tokens per document, on the CPU backend (fp32, SmolLM2).
//
//   selective_recompute --model PATH --set bench/rag_qa/single_hop_dev.jsonl --out X.jsonl
//       [--configs LIST] [--max_questions N] [--max_tokens 32] [--check_questions N]
//
// Per question it builds the prompt exactly as rag_qa_bench does (Generator::BuildPrompt), runs
// FULL (plain causal prefill), encodes every block alone (LAZY's cached KV) and then answers
// greedily under each configuration of --configs (comma-separated):
//   full, lazy, lazy:d=1     FULL, plain LAZY, LAZY with each document's first key masked
//   firstk:B                 the first B tokens of each document recomputed at their true
//                            positions (rag_qa_bench's lazy:k=B)
//   oracle:B                 the B tokens of each document whose cached KV deviates most from
//                            FULL's (summed over layers of |K_full - K_lazy| + |V_full - V_lazy|,
//                            keys at the same positions) get FULL's KV at every layer; nothing
//                            is recomputed (the upper bound of recomputing that token set)
//   oraclesel:B              the same tokens, recomputed instead of copied from FULL
//   blend:B                  CacheBlend: the tokens selected by their deviation at layer 1 only
//                            (the KV a pass of layer 0 over every document token gives), then
//                            recomputed through all layers
//   ...:B:d=1                any selective configuration with each document's first key masked
//                            (never selected), as lazy:d=1 masks it
// B is a count per document, "P%" (ceil of P% of each document) or "all"; 0 selects nothing.
// "Recomputed" means: the selected tokens are fed at their true positions through every layer,
// their fresh K/V overwrite the cached K/V in a per-request copy of the document's KV before
// each layer's attention, and each attends causally (by position) to that mixed KV; the query
// block follows in the same forward, then greedy decoding. Every configuration decodes exactly
// as the engine does (stop tokens, --max_tokens), so full / lazy / lazy:d=1 / firstk:B must
// give rag_qa_bench's answers (compare.py checks it).
//
// --check_questions N: on the first N questions also runs oracle:all, blend:all (both must give
// FULL's first-step logits to a tolerance and, normally, its answer) and oracle:0, blend:0 (must
// give plain LAZY's logits bit for bit); the program exits 1 when a logit check fails.
//
// Output: one JSON line per question (answers, token ids, correctness, recomputed tokens,
// seconds per phase and configuration) in --out; summarize.py makes the tables.
// Threads: set LAZYRAG_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 for single-thread timings.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/rag_qa/question_set.h"
#include "common/json.h"
#include "common/native_blas.h"
#include "common/parallel.h"
#include "worker/attention/rope.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/model_source.h"
#include "worker/runtime/runtime.h"

namespace lazyrag {
namespace {

constexpr int kPageSize = 16;
constexpr int kPrefillChunk = 512;     // RuntimeOptions::prefill_chunk (the engine's rows per step)
constexpr int kMaxBatchTokens = 2048;  // RuntimeOptions::max_batch_tokens
constexpr char kSystemPrompt[] =
    "Answer the question with a short phrase using only the documents.";

using rag_qa::Correct;
using rag_qa::LoadQuestions;
using rag_qa::Question;

enum class Kind { kFull, kLazy, kFirstK, kOracle, kOracleSel, kBlend };

struct Config {
  std::string name;
  Kind kind = Kind::kLazy;
  int drop = 0;         // keys masked at the start of each document (0 or 1)
  int budget = 0;       // tokens per document; -1: all
  double fraction = 0;  // > 0: ceil(fraction * document tokens) instead of budget
};

std::optional<Config> ParseConfig(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  Config c;
  c.name = spec;
  const std::map<std::string, Kind> kinds = {
      {"full", Kind::kFull},     {"lazy", Kind::kLazy},           {"firstk", Kind::kFirstK},
      {"oracle", Kind::kOracle}, {"oraclesel", Kind::kOracleSel}, {"blend", Kind::kBlend}};
  auto it = kinds.find(parts[0]);
  if (it == kinds.end()) return std::nullopt;
  c.kind = it->second;
  size_t i = 1;
  const bool selective = c.kind != Kind::kFull && c.kind != Kind::kLazy;
  if (selective) {
    if (parts.size() < 2) return std::nullopt;
    const std::string& b = parts[1];
    if (b == "all") {
      c.budget = -1;
    } else if (!b.empty() && b.back() == '%') {
      c.fraction = std::stod(b.substr(0, b.size() - 1)) / 100.0;
      if (c.fraction <= 0) return std::nullopt;
    } else {
      c.budget = std::stoi(b);
      if (c.budget < 0) return std::nullopt;
    }
    i = 2;
  }
  for (; i < parts.size(); ++i) {
    if (parts[i] == "d=1" && c.kind != Kind::kFull && c.kind != Kind::kFirstK) {
      c.drop = 1;
    } else if (parts[i] != "d=0") {
      return std::nullopt;
    }
  }
  return c;
}

// Tokens a configuration selects in a document of n tokens.
int BudgetFor(const Config& c, int n) {
  if (c.budget < 0) return n;
  if (c.fraction > 0) return std::min(n, int(std::ceil(c.fraction * n - 1e-9)));
  return std::min(n, c.budget);
}

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// KV of a page run in ExportKv's layout: for each layer, K then V, each [tokens, kv_dim].
struct RunKv {
  int tokens = 0, kv_dim = 0;
  std::string bytes;
  float* At(int layer, int kv, int t) {
    return reinterpret_cast<float*>(bytes.data()) +
           ((int64_t(layer) * 2 + kv) * tokens + t) * kv_dim;
  }
};

// A page run of the pool and the pages it holds.
std::vector<int32_t> TakePages(int* next, int limit, int tokens) {
  const int n = (tokens + kPageSize - 1) / kPageSize;
  if (*next + n > limit) {
    std::fprintf(stderr, "selective_recompute: KV pool too small (%d pages)\n", limit);
    std::exit(1);
  }
  std::vector<int32_t> pages(n);
  std::iota(pages.begin(), pages.end(), *next);
  *next += n;
  return pages;
}

int64_t SlotOf(const std::vector<int32_t>& pages, int j) {
  return int64_t(pages[j / kPageSize]) * kPageSize + j % kPageSize;
}

// A fixed KV segment of a request (segment_view.h): logical start, length, pages, masked keys.
struct FixedSegment {
  int32_t start = 0, len = 0, skip = 0;
  std::vector<int32_t> pages;
};

// One row to feed: a token written at kv_slot (key rotated at kv_pos), querying at q_pos.
// `append` rows go to the end of the request's own run (query block and generated tokens).
struct Row {
  int32_t token = 0, kv_pos = 0, q_pos = 0;
  int64_t kv_slot = 0;
  bool append = false;
};

// One request on a backend: fixed segments plus its own run, which grows as rows are appended.
// The view of each step is what StepPlanner::Build makes for the engine's requests.
class Request {
 public:
  Request(Backend* backend, std::vector<FixedSegment> fixed, int32_t own_start,
          std::vector<int32_t> own_pages)
      : backend_(backend),
        fixed_(std::move(fixed)),
        own_start_(own_start),
        own_pages_(std::move(own_pages)) {}

  // Rows appending `tokens` to the own run after what it holds (before the next Feed).
  std::vector<Row> AppendRows(const std::vector<int32_t>& tokens) const {
    std::vector<Row> rows;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int32_t local = own_len_ + int32_t(i);
      rows.push_back(Row{tokens[i], local, own_start_ + local, SlotOf(own_pages_, local), true});
    }
    return rows;
  }

  // Feeds rows in chunks of kPrefillChunk; returns the argmax of the last row's logits and, when
  // `logits` is set, those logits.
  int32_t Feed(const std::vector<Row>& rows, std::vector<float>* logits = nullptr) {
    int32_t next = -1;
    for (size_t b = 0; b < rows.size(); b += kPrefillChunk) {
      const size_t e = std::min(rows.size(), b + kPrefillChunk);
      ForwardBatch fb;
      fb.view.page_size = kPageSize;
      for (const FixedSegment& f : fixed_) fb.view.AddSegment(f.start, f.len, f.pages, f.skip);
      int appended = 0;
      for (size_t i = b; i < e; ++i) appended += rows[i].append;
      fb.view.AddSegment(own_start_, own_len_ + appended, own_pages_);
      std::vector<int32_t> q_pos;
      for (size_t i = b; i < e; ++i) {
        fb.tokens.push_back(rows[i].token);
        fb.kv_pos.push_back(rows[i].kv_pos);
        fb.kv_slot.push_back(rows[i].kv_slot);
        q_pos.push_back(rows[i].q_pos);
      }
      fb.view.EndRequest(q_pos);
      const bool last = e == rows.size();
      if (last) fb.logit_rows.push_back(int32_t(e - b) - 1);
      absl::Status st;
      std::vector<int32_t> ids;
      if (last && logits != nullptr) {
        st = backend_->Forward(fb, logits);
        if (st.ok())
          next = int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin());
      } else {
        st = backend_->ForwardArgmax(fb, &ids);
        if (st.ok() && last) next = ids[0];
      }
      if (!st.ok()) {
        std::fprintf(stderr, "selective_recompute: forward: %s\n", st.ToString().c_str());
        std::exit(1);
      }
      own_len_ += appended;
    }
    return next;
  }

  // Greedy decoding from the first token `next` (the prompt's argmax), as the engine's scheduler
  // does: a stop token ends it (not delivered), otherwise the token is delivered and fed back
  // until max_tokens are delivered.
  std::vector<int32_t> Decode(int32_t next, const std::vector<int32_t>& stop_ids, int max_tokens) {
    std::vector<int32_t> out;
    while (true) {
      if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
      out.push_back(next);
      if (int(out.size()) >= max_tokens) break;
      next = Feed(AppendRows({next}));
    }
    return out;
  }

 private:
  Backend* backend_;
  std::vector<FixedSegment> fixed_;
  int32_t own_start_;
  std::vector<int32_t> own_pages_;
  int32_t own_len_ = 0;
};

// Encodes each block alone from local position 0, packed as the engine packs document jobs:
// up to kPrefillChunk tokens of a block and kMaxBatchTokens per step.
void EncodeAlone(Backend* backend, const std::vector<const std::vector<int32_t>*>& blocks,
                 const std::vector<std::vector<int32_t>>& pages) {
  std::vector<int> fed(blocks.size(), 0);
  while (true) {
    ForwardBatch fb;
    fb.view.page_size = kPageSize;
    int budget = kMaxBatchTokens;
    for (size_t b = 0; b < blocks.size() && budget > 0; ++b) {
      const int n = std::min({int(blocks[b]->size()) - fed[b], kPrefillChunk, budget});
      if (n <= 0) continue;
      fb.view.AddSegment(0, fed[b] + n, pages[b]);
      std::vector<int32_t> q_pos;
      for (int t = 0; t < n; ++t) {
        const int local = fed[b] + t;
        fb.tokens.push_back((*blocks[b])[local]);
        fb.kv_pos.push_back(local);
        fb.kv_slot.push_back(SlotOf(pages[b], local));
        q_pos.push_back(local);
      }
      fb.view.EndRequest(q_pos);
      fed[b] += n;
      budget -= n;
    }
    if (fb.tokens.empty()) return;
    std::vector<float> logits;
    if (absl::Status st = backend->Forward(fb, &logits); !st.ok()) {
      std::fprintf(stderr, "selective_recompute: encode: %s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
}

RunKv Export(Backend* backend, const std::vector<int32_t>& pages, int tokens) {
  RunKv kv;
  kv.tokens = tokens;
  kv.kv_dim = backend->config().kv_dim();
  if (absl::Status st = backend->ExportKv(pages, tokens, &kv.bytes); !st.ok()) {
    std::fprintf(stderr, "selective_recompute: export: %s\n", st.ToString().c_str());
    std::exit(1);
  }
  return kv;
}

// Deviation of each token of a document (logical start `start`) between its cached KV `lazy`
// (keys rotated at local positions) and `full`'s (keys at logical positions, offset `full_off`
// = the document's first row in `full`), over `layers`: sum of L2 norms of the K and V
// differences, the cached key turned to the full key's position first.
std::vector<double> Deviation(RunKv& lazy, RunKv& full, int start, int full_off,
                              const std::vector<int>& layers, const ModelConfig& c,
                              const float* inv_freq) {
  std::vector<double> dev(lazy.tokens, 0.0);
  std::vector<float> k(c.kv_dim());
  for (int l : layers) {
    for (int j = 0; j < lazy.tokens; ++j) {
      std::memcpy(k.data(), lazy.At(l, 0, j), sizeof(float) * c.kv_dim());
      for (int h = 0; h < c.num_kv_heads; ++h) {
        RopeRotate(k.data() + h * c.head_dim, c.head_dim, inv_freq, start);
      }
      const float* kf = full.At(l, 0, full_off + j);
      const float* vf = full.At(l, 1, full_off + j);
      const float* vl = lazy.At(l, 1, j);
      double dk = 0, dv = 0;
      for (int i = 0; i < c.kv_dim(); ++i) {
        dk += double(kf[i] - k[i]) * (kf[i] - k[i]);
        dv += double(vf[i] - vl[i]) * (vf[i] - vl[i]);
      }
      dev[j] += std::sqrt(dk) + std::sqrt(dv);
    }
  }
  return dev;
}

// The `count` tokens of largest deviation, from token `first` on, in position order.
std::vector<int> TopTokens(const std::vector<double>& dev, int count, int first) {
  std::vector<int> idx;
  for (int j = first; j < int(dev.size()); ++j) idx.push_back(j);
  count = std::min<int>(count, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + count, idx.end(),
                    [&](int a, int b) { return dev[a] > dev[b] || (dev[a] == dev[b] && a < b); });
  idx.resize(count);
  std::sort(idx.begin(), idx.end());
  return idx;
}

struct Outcome {
  std::vector<int32_t> ids;
  std::string text;
  std::vector<float> first_logits;  // only when asked for (checks)
  int recomputed = 0;               // document tokens fed (recomputed) or copied from FULL
  double prefill_s = 0, decode_s = 0;
};

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::map<std::string, std::string> a = {
      {"model", ""},
      {"set", "bench/rag_qa/single_hop_dev.jsonl"},
      {"out", ""},
      {"configs",
       "full,lazy,lazy:d=1,firstk:8,oracle:8,oraclesel:8,blend:8,firstk:16,oracle:16,"
       "oraclesel:16,blend:16,firstk:32,oracle:32,oraclesel:32,blend:32,firstk:15%,oracle:15%,"
       "oraclesel:15%,blend:15%,blend:32:d=1"},
      {"max_questions", "1000"},
      {"first_question", "0"},
      {"max_tokens", "32"},
      {"check_questions", "0"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0 || !a.count(key.substr(2))) {
      std::fprintf(stderr, "selective_recompute: unknown flag %s\n", argv[i]);
      return 2;
    }
    a[key.substr(2)] = argv[i + 1];
  }
  std::vector<Config> configs;
  for (const std::string& spec : std::vector<std::string>(absl::StrSplit(a["configs"], ','))) {
    auto c = ParseConfig(spec);
    if (!c) {
      std::fprintf(stderr, "selective_recompute: bad config '%s'\n", spec.c_str());
      return 2;
    }
    configs.push_back(*c);
  }
  const int max_tokens = std::stoi(a["max_tokens"]);
  const int check_questions = std::stoi(a["check_questions"]);

  // The runtime gives the tokenizer, the prompt layout and the stop tokens, exactly as
  // rag_qa_bench's requests get them; its own engine and backend are not used.
  RuntimeOptions ro;
  ro.model = a["model"];
  ro.kv_pool_bytes = int64_t(16) << 20;
  ro.host_cache_bytes = 0;
  auto rt_or = CreateRuntime(ro);
  if (!rt_or.ok()) {
    std::fprintf(stderr, "selective_recompute: %s\n", rt_or.status().ToString().c_str());
    return 1;
  }
  Runtime& rt = **rt_or;
  Generator& gen = *rt.generator;
  std::vector<int32_t> stop_ids = gen.rag_template().stop_token_ids;
  if (rt.tokenizer->eos_id() >= 0 &&
      std::find(stop_ids.begin(), stop_ids.end(), rt.tokenizer->eos_id()) == stop_ids.end()) {
    stop_ids.push_back(rt.tokenizer->eos_id());
  }

  // The model twice on the CPU backend: all layers, and its first two layers only (whose pool
  // after a FULL prefill holds layer 1's K/V as full prefill makes them: CacheBlend's selection
  // signal; layer 0's K/V equal the cached ones up to the rotation).
  auto loaded = LoadModel(a["model"]);
  if (!loaded.ok() || loaded->weights == nullptr) {
    std::fprintf(stderr, "selective_recompute: cannot load %s\n", a["model"].c_str());
    return 1;
  }
  auto head_weights = std::make_unique<ModelWeights>();
  {
    const ModelWeights& w = *loaded->weights;
    head_weights->config = w.config;
    head_weights->config.num_layers = 2;
    head_weights->token_embedding = w.token_embedding;
    head_weights->layers = {w.layers[0], w.layers[1]};
    head_weights->final_norm = w.final_norm;
    head_weights->lm_head = w.lm_head;
  }
  auto model_or = CreateCpuBackend(std::move(loaded->weights));
  auto head_or = CreateCpuBackend(std::move(head_weights));
  if (!model_or.ok() || !head_or.ok()) {
    std::fprintf(stderr, "selective_recompute: backend: %s %s\n",
                 model_or.status().ToString().c_str(), head_or.status().ToString().c_str());
    return 1;
  }
  Backend* model = model_or->get();
  Backend* head = head_or->get();
  const ModelConfig& mc = model->config();
  const std::vector<float> inv_freq = RopeInvFreq(mc);
  constexpr int kPages = 1200;
  if (!model->InitPool(kPages, kPageSize).ok() || !head->InitPool(400, kPageSize).ok()) {
    std::fprintf(stderr, "selective_recompute: cannot allocate the KV pools\n");
    return 1;
  }
  std::vector<int> all_layers(mc.num_layers);
  std::iota(all_layers.begin(), all_layers.end(), 0);

  std::vector<Question> questions = LoadQuestions(a["set"]);
  const size_t first = std::min<size_t>(questions.size(), std::stoul(a["first_question"]));
  questions.erase(questions.begin(), questions.begin() + first);
  questions.resize(std::min<size_t>(questions.size(), std::stoul(a["max_questions"])));
  if (questions.empty()) {
    std::fprintf(stderr, "selective_recompute: no questions in %s\n", a["set"].c_str());
    return 1;
  }
  std::ofstream out;
  if (!a["out"].empty()) out.open(a["out"]);
  std::map<std::string, int> correct;
  bool checks_ok = true;
  int asked = 0;
  for (const Question& q : questions) {
    GenerateRequest g;
    for (const auto& d : q.documents) g.documents.push_back({d, ""});
    g.system_prompt = kSystemPrompt;
    g.query = q.question;
    auto prompt_or = gen.BuildPrompt(g, nullptr);
    if (!prompt_or.ok() || !prompt_or->sink.empty()) {
      std::fprintf(stderr, "selective_recompute: prompt of question %d\n", q.id);
      return 1;
    }
    const TokenPrompt& p = *prompt_or;
    int depth = 0;
    for (const auto& [d, c] : q.facts) {
      depth = std::max<int>(depth, rt.tokenizer->Encode(q.documents[d].substr(0, c)).size());
    }
    // Blocks: the prefix, then each document, back to back from position 0.
    std::vector<const std::vector<int32_t>*> blocks = {&p.prefix};
    for (const auto& d : p.documents) blocks.push_back(&d);
    std::vector<int32_t> starts;
    int32_t blocks_tokens = 0;
    for (const auto* b : blocks) {
      starts.push_back(blocks_tokens);
      blocks_tokens += int32_t(b->size());
    }
    const int num_docs = int(p.documents.size());
    int next_page = 0;
    Json rec = Json::object();
    rec["set"] = a["set"];
    rec["id"] = q.id;
    rec["answer"] = q.answer;
    rec["depth"] = depth;
    Json doc_tokens = Json::array();
    for (const auto& d : p.documents) doc_tokens.push_back(int(d.size()));
    rec["document_tokens"] = doc_tokens;
    rec["prompt_tokens"] = int(p.total_tokens());
    // Built apart and put into `rec` at the end: references into an ordered_json object do not
    // survive later insertions.
    Json timing = Json::object(), overlap = Json::object(), results = Json::object(),
         checks = Json::object();

    // FULL: the concatenated prompt from position 0 in one own run.
    std::vector<int32_t> all_tokens;
    for (const auto* b : blocks) all_tokens.insert(all_tokens.end(), b->begin(), b->end());
    all_tokens.insert(all_tokens.end(), p.suffix.begin(), p.suffix.end());
    const int prompt_len = int(all_tokens.size());
    auto t0 = Clock::now();
    const std::vector<int32_t> full_pages = TakePages(&next_page, kPages, prompt_len + max_tokens);
    Request full_req(model, {}, 0, full_pages);
    std::vector<float> full_logits;
    const int32_t full_first = full_req.Feed(full_req.AppendRows(all_tokens), &full_logits);
    timing["full_prefill"] = Seconds(t0);
    RunKv full_kv = Export(model, full_pages, prompt_len);
    Outcome full;
    {
      auto t1 = Clock::now();
      full.ids = full_req.Decode(full_first, stop_ids, max_tokens);
      full.decode_s = Seconds(t1);
      full.prefill_s = timing["full_prefill"].get<double>();
      full.recomputed = blocks_tokens - int(p.prefix.size());
    }

    // LAZY's cached KV: each block alone.
    t0 = Clock::now();
    std::vector<std::vector<int32_t>> block_pages;
    for (const auto* b : blocks)
      block_pages.push_back(TakePages(&next_page, kPages, int(b->size())));
    EncodeAlone(model, blocks, block_pages);
    timing["encode_alone"] = Seconds(t0);
    std::vector<RunKv> lazy_kv;
    for (size_t b = 0; b < blocks.size(); ++b) {
      lazy_kv.push_back(Export(model, block_pages[b], int(blocks[b]->size())));
    }
    // Layer 1's K/V as full prefill makes them: two layers over the whole prompt.
    t0 = Clock::now();
    {
      const std::vector<int32_t> head_pages = [&] {
        int next = 0;
        return TakePages(&next, 400, prompt_len);
      }();
      Request head_req(head, {}, 0, head_pages);
      head_req.Feed(head_req.AppendRows(
          std::vector<int32_t>(all_tokens.begin(), all_tokens.begin() + blocks_tokens)));
      timing["layer01_pass"] = Seconds(t0);
      RunKv head_kv = Export(head, head_pages, blocks_tokens);
      // Per-document deviations: layer 1 only (CacheBlend), and all layers (the oracle).
      std::vector<std::vector<double>> dev_l1, dev_all;
      t0 = Clock::now();
      for (int d = 0; d < num_docs; ++d) {
        dev_l1.push_back(Deviation(lazy_kv[d + 1], head_kv, starts[d + 1], starts[d + 1], {1}, mc,
                                   inv_freq.data()));
        dev_all.push_back(Deviation(lazy_kv[d + 1], full_kv, starts[d + 1], starts[d + 1],
                                    all_layers, mc, inv_freq.data()));
      }
      timing["deviations"] = Seconds(t0);
      // Scratch copies of the documents' KV, rewritten by each selective configuration.
      std::vector<std::vector<int32_t>> scratch;
      for (int d = 0; d < num_docs; ++d) {
        scratch.push_back(TakePages(&next_page, kPages, int(p.documents[d].size())));
      }
      const std::vector<int32_t> own_pages =
          TakePages(&next_page, kPages, int(p.suffix.size()) + max_tokens);

      auto run = [&](const Config& c, bool want_logits) {
        Outcome o;
        auto ts = Clock::now();
        if (c.kind == Kind::kFull) return full;
        const bool selective = c.kind != Kind::kLazy;
        std::vector<FixedSegment> fixed = {
            FixedSegment{0, int32_t(p.prefix.size()), 0, block_pages[0]}};
        std::vector<Row> rows;
        int sel_oracle_same = 0, sel_first_same = 0, sel_total = 0;
        for (int d = 0; d < num_docs; ++d) {
          const int n = int(p.documents[d].size());
          const int32_t start = starts[d + 1];
          if (!selective) {
            fixed.push_back(FixedSegment{start, n, std::min(c.drop, n), block_pages[d + 1]});
            continue;
          }
          const int count = std::min(BudgetFor(c, n), n - c.drop);
          std::vector<int> sel;
          if (c.kind == Kind::kFirstK) {
            for (int j = 0; j < count; ++j) sel.push_back(j);
          } else {
            sel = TopTokens(c.kind == Kind::kBlend ? dev_l1[d] : dev_all[d], count, c.drop);
          }
          {
            const std::vector<int> best = TopTokens(dev_all[d], count, c.drop);
            for (int j : sel) {
              sel_oracle_same += std::binary_search(best.begin(), best.end(), j);
              sel_first_same += j < count + c.drop;
            }
            sel_total += int(sel.size());
          }
          RunKv mixed = lazy_kv[d + 1];
          if (c.kind == Kind::kOracle) {
            for (int l = 0; l < mc.num_layers; ++l) {
              for (int j : sel) {
                float* k = mixed.At(l, 0, j);
                std::memcpy(k, full_kv.At(l, 0, start + j), sizeof(float) * mc.kv_dim());
                for (int h = 0; h < mc.num_kv_heads; ++h) {
                  RopeRotate(k + h * mc.head_dim, mc.head_dim, inv_freq.data(), -double(start));
                }
                std::memcpy(mixed.At(l, 1, j), full_kv.At(l, 1, start + j),
                            sizeof(float) * mc.kv_dim());
              }
            }
          } else {
            for (int j : sel) {
              rows.push_back(Row{p.documents[d][j], j, start + j, SlotOf(scratch[d], j), false});
            }
          }
          if (absl::Status st = model->ImportKv(scratch[d], n, mixed.bytes); !st.ok()) {
            std::fprintf(stderr, "selective_recompute: import: %s\n", st.ToString().c_str());
            std::exit(1);
          }
          fixed.push_back(FixedSegment{start, n, std::min(c.drop, n), scratch[d]});
          o.recomputed += int(sel.size());
        }
        if (selective && c.budget >= 0) {
          Json& ov = overlap[c.name] = Json::object();
          ov["with_oracle"] = sel_oracle_same;
          ov["within_first"] = sel_first_same;
          ov["selected"] = sel_total;
        }
        // The selected tokens (position order), then the query block in the own run.
        Request req(model, std::move(fixed), blocks_tokens, own_pages);
        for (const Row& r : req.AppendRows(p.suffix)) rows.push_back(r);
        const int32_t first_id = req.Feed(rows, want_logits ? &o.first_logits : nullptr);
        o.prefill_s = Seconds(ts);
        auto td = Clock::now();
        o.ids = req.Decode(first_id, stop_ids, max_tokens);
        o.decode_s = Seconds(td);
        return o;
      };

      std::vector<std::pair<Config, bool>> todo;
      for (const Config& c : configs) todo.push_back({c, false});
      const bool check = asked < check_questions;
      if (check) {
        for (const char* spec : {"lazy", "oracle:all", "blend:all", "oracle:0", "blend:0"}) {
          todo.push_back({*ParseConfig(spec), true});
        }
      }
      std::map<std::string, Outcome> done;
      for (const auto& [c, is_check] : todo) {
        Outcome o = run(c, is_check);
        o.text.clear();
        for (int32_t id : o.ids) o.text += rt.tokenizer->TokenBytes(id);
        if (!is_check) {
          const bool ok = Correct(o.text, q.answer);
          correct[c.name] += ok;
          Json& r = results[c.name] = Json::object();
          r["text"] = o.text;
          r["ids"] = o.ids;
          r["correct"] = ok;
          r["recomputed_document_tokens"] = o.recomputed;
          r["prefill_s"] = o.prefill_s;
          r["decode_s"] = o.decode_s;
        }
        done[c.name + (is_check ? "#check" : "")] = std::move(o);
      }
      if (check) {
        // B = all: FULL's function (up to rounding); B = 0: plain LAZY's, bit for bit.
        auto max_abs = [](const std::vector<float>& x, const std::vector<float>& y) {
          double m = 0;
          for (size_t i = 0; i < x.size(); ++i) m = std::max(m, double(std::fabs(x[i] - y[i])));
          return m;
        };
        double scale = 0;
        for (float v : full_logits) scale = std::max(scale, double(std::fabs(v)));
        const std::vector<float>& lazy_logits = done["lazy#check"].first_logits;
        for (const char* name : {"oracle:all", "blend:all"}) {
          const Outcome& o = done[std::string(name) + "#check"];
          const double diff = max_abs(o.first_logits, full_logits) / scale;
          const bool ok = diff < 1e-3;
          checks_ok = checks_ok && ok;
          checks[name] = {{"max_rel_logit_diff_vs_full", diff},
                          {"same_answer_as_full", o.ids == full.ids},
                          {"pass", ok}};
          std::fprintf(stderr, "check q%d %s: logits vs FULL %.2e (%s), answer %s\n", q.id, name,
                       diff, ok ? "ok" : "FAIL", o.ids == full.ids ? "same" : "differs");
        }
        for (const char* name : {"oracle:0", "blend:0"}) {
          const Outcome& o = done[std::string(name) + "#check"];
          const double diff = max_abs(o.first_logits, lazy_logits);
          const bool ok = diff == 0 && o.ids == done["lazy#check"].ids;
          checks_ok = checks_ok && ok;
          checks[name] = {{"max_abs_logit_diff_vs_lazy", diff}, {"pass", ok}};
          std::fprintf(stderr, "check q%d %s: logits vs LAZY %.2e, answer %s (%s)\n", q.id, name,
                       diff, o.ids == done["lazy#check"].ids ? "same" : "differs",
                       ok ? "ok" : "FAIL");
        }
      }
    }
    rec["phase_s"] = timing;
    rec["selection_overlap"] = overlap;
    rec["configs"] = results;
    if (!checks.empty()) rec["checks"] = checks;
    ++asked;
    if (out.is_open()) out << JsonDump(rec) << "\n" << std::flush;
    std::fprintf(stderr, "q%d depth %d:", q.id, depth);
    for (const Config& c : configs) std::fprintf(stderr, " %s=%d", c.name.c_str(), correct[c.name]);
    std::fprintf(stderr, " /%d (full %.1fs, alone %.1fs)\n", asked,
                 timing["full_prefill"].get<double>(), timing["encode_alone"].get<double>());
  }
  std::printf("%d questions of %s\n", asked, a["set"].c_str());
  for (const Config& c : configs) std::printf("%-16s %3d\n", c.name.c_str(), correct[c.name]);
  if (check_questions > 0) std::printf("checks: %s\n", checks_ok ? "pass" : "FAIL");
  return checks_ok ? 0 : 1;
}

}  // namespace
}  // namespace lazyrag

int main(int argc, char** argv) {
  lazyrag::PreferNativeBlasKernels(argv);
  return lazyrag::Main(argc, argv);
}
