// lazyrag-cli generate --model PATH|synthetic:NAME --doc FILE [--doc FILE ...] --query TEXT
//   [--query TEXT ...] [--system TEXT] [--mode lazy|materialize|prefix|full] [--max_tokens N]
//   [--temperature T] [--top_p P] [--top_k K] [--seed S] [--stop STR ...] [--ignore_eos]
//   [--shuffle_docs] [--page_size N] [--kv_pool_bytes N] [--json]
// Several --query flags run several requests on one engine (documents computed once; with
// --shuffle_docs each request sees the documents in another order).
#include "cli/generate_command.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/json_writer.h"
#include "worker/engine/runtime.h"

namespace lazyrag {
namespace {

struct Args {
  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> flags;
  bool Has(const std::string& f) const {
    for (const auto& x : flags) if (x == f) return true;
    return false;
  }
  std::string Get(const std::string& k, const std::string& def) const {
    auto it = values.find(k);
    return it == values.end() ? def : it->second.back();
  }
};

constexpr const char* kUsage =
    "usage: lazyrag-cli generate --model PATH|synthetic:NAME [--doc FILE]... --query TEXT\n"
    "  [--query TEXT]... [--system TEXT] [--mode lazy|materialize|prefix|full]\n"
    "  [--max_tokens N] [--temperature T] [--top_p P] [--top_k K] [--seed S] [--stop STR]...\n"
    "  [--ignore_eos] [--shuffle_docs] [--page_size N] [--kv_pool_bytes N] [--json]\n";

bool Parse(int argc, char** argv, Args* a, std::string* err) {
  static const char* kBool[] = {"--json", "--ignore_eos", "--shuffle_docs", "--help"};
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    bool is_bool = false;
    for (const char* b : kBool) is_bool |= s == b;
    if (is_bool) {
      a->flags.push_back(s);
      continue;
    }
    if (s.rfind("--", 0) != 0) {
      *err = "unexpected argument '" + s + "'";
      return false;
    }
    std::string key = s.substr(2), val;
    if (auto eq = key.find('='); eq != std::string::npos) {
      val = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argc) {
      val = argv[++i];
    } else {
      *err = "flag " + s + " needs a value";
      return false;
    }
    a->values[key].push_back(val);
  }
  static const char* kKnown[] = {"model", "doc", "query", "system", "mode", "max_tokens",
                                 "temperature", "top_p", "top_k", "seed", "stop", "page_size",
                                 "kv_pool_bytes", "namespace"};
  for (const auto& [k, v] : a->values) {
    bool known = false;
    for (const char* n : kKnown) known |= k == n;
    if (!known) {
      *err = "unknown flag --" + k;
      return false;
    }
  }
  return true;
}

template <typename T>
bool ParseNumber(const std::string& s, T* out) {
  std::istringstream in(s);
  in >> *out;
  return !in.fail() && in.eof();
}

}  // namespace

int RunGenerateCommand(int argc, char** argv) {
  Args a;
  std::string err;
  if (!Parse(argc, argv, &a, &err) || a.Has("--help")) {
    if (!err.empty()) std::cerr << "lazyrag-cli generate: " << err << "\n";
    std::cerr << kUsage;
    return a.Has("--help") ? 0 : 2;
  }
  RuntimeOptions ro;
  ro.model = a.Get("model", "");
  if (ro.model.empty() || a.values["query"].empty()) {
    std::cerr << "lazyrag-cli generate: --model and --query are required\n" << kUsage;
    return 2;
  }
  GenerateRequest base;
  auto mode = ParseAttentionMode(a.Get("mode", "lazy"));
  bool ok = mode.ok();
  if (ok) base.mode = *mode;
  ok = ok && ParseNumber(a.Get("max_tokens", "64"), &base.max_tokens);
  ok = ok && ParseNumber(a.Get("temperature", "0"), &base.sampling.temperature);
  ok = ok && ParseNumber(a.Get("top_p", "1"), &base.sampling.top_p);
  ok = ok && ParseNumber(a.Get("top_k", "0"), &base.sampling.top_k);
  ok = ok && ParseNumber(a.Get("seed", "0"), &base.sampling.seed);
  ok = ok && ParseNumber(a.Get("page_size", "16"), &ro.page_size);
  ok = ok && ParseNumber(a.Get("kv_pool_bytes", "0"), &ro.kv_pool_bytes);
  if (!ok) {
    std::cerr << "lazyrag-cli generate: bad value: "
              << (mode.ok() ? "a numeric flag is not a number" : mode.status().ToString()) << "\n";
    return 2;
  }
  base.system_prompt = a.Get("system", "");
  base.ignore_eos = a.Has("--ignore_eos");
  base.cache_namespace = a.Get("namespace", "");
  if (a.values.count("stop")) base.stop = a.values["stop"];
  for (const std::string& path : a.values["doc"]) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::cerr << "lazyrag-cli generate: cannot read document " << path << "\n";
      return 2;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    base.documents.push_back({ss.str(), ""});
  }
  auto rt = CreateRuntime(ro);
  if (!rt.ok()) {
    std::cerr << "lazyrag-cli generate: " << rt.status() << "\n";
    return 1;
  }
  const bool json = a.Has("--json");
  std::mt19937 rng(base.sampling.seed);
  int index = 0;
  for (const std::string& query : a.values["query"]) {
    GenerateRequest r = base;
    r.query = query;
    if (a.Has("--shuffle_docs") && index > 0) std::shuffle(r.documents.begin(), r.documents.end(), rng);
    auto res = (*rt)->generator->Generate(r, [&](std::string_view delta, int32_t) {
      if (!json) {
        std::fwrite(delta.data(), 1, delta.size(), stdout);
        std::fflush(stdout);
      }
      return true;
    });
    if (!res.ok()) {
      std::cerr << "lazyrag-cli generate: " << res.status() << "\n";
      return 1;
    }
    if (json) {
      JsonWriter w;
      w.BeginObject();
      w.Key("text").String(res->text);
      w.Key("token_ids").BeginArray();
      for (int32_t t : res->token_ids) w.Int(t);
      w.EndArray();
      w.Key("finish_reason").String(std::string(FinishReasonName(res->finish_reason)));
      w.Key("mode").String(std::string(AttentionModeName(r.mode)));
      w.Key("document_ids").BeginArray();
      for (const auto& id : res->document_ids) w.String(id);
      w.EndArray();
      w.Key("usage").BeginObject();
      w.Key("prompt_tokens").Int(res->usage.prompt_tokens);
      w.Key("document_tokens").Int(res->usage.document_tokens);
      w.Key("cached_document_tokens").Int(res->usage.cached_document_tokens);
      w.Key("computed_tokens").Int(res->usage.computed_tokens);
      w.Key("completion_tokens").Int(res->usage.completion_tokens);
      w.EndObject();
      w.Key("timings").BeginObject();
      w.Key("ttft_ms").Double(res->timings.ttft_ms);
      w.Key("total_ms").Double(res->timings.total_ms);
      w.EndObject();
      w.EndObject();
      std::cout << w.str() << "\n";
    } else {
      std::printf("\n[%s] ttft %.1f ms, total %.1f ms, documents %lld tokens (%lld cached), computed %lld, generated %lld\n",
                  std::string(AttentionModeName(r.mode)).c_str(), res->timings.ttft_ms,
                  res->timings.total_ms, (long long)res->usage.document_tokens,
                  (long long)res->usage.cached_document_tokens,
                  (long long)res->usage.computed_tokens, (long long)res->usage.completion_tokens);
    }
    ++index;
  }
  return 0;
}

}  // namespace lazyrag
