// lazyrag-cli generate --model PATH|synthetic:NAME --doc FILE [--doc FILE ...]
// --query TEXT
//   [--query TEXT ...] [--system TEXT] [--mode lazy|materialize|prefix|full]
//   [--max_tokens N]
//   [--temperature T] [--top_p P] [--top_k K] [--seed S] [--stop STR ...]
//   [--ignore_eos]
//   [--shuffle_docs] [--page_size N] [--kv_pool_bytes N] [--host_cache_bytes N] [--tp N]
//   [--json]
// Several --query flags run several requests on one engine (documents computed
// once; with
// --shuffle_docs each request sees the documents in another order).
// With --server HOST:PORT the requests go to a lazyrag-worker (or router) over
// gRPC instead
// (--model, --page_size, --kv_pool_bytes and --host_cache_bytes are then ignored); output and
// --json are the same.
// --timeout_s S sets the call deadline in server mode.
#include "cli/generate_command.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/auth_flags.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "common/json.h"
#include "common/tls.h"
#include "lazyrag/v1/inference.grpc.pb.h"
#include "worker/runtime/runtime.h"

namespace lazyrag {
namespace {

struct Args {
  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> flags;
  bool Has(const std::string &f) const {
    for (const auto &x : flags)
      if (x == f) return true;
    return false;
  }
  std::string Get(const std::string &k, const std::string &def) const {
    auto it = values.find(k);
    return it == values.end() ? def : it->second.back();
  }
};

constexpr const char *kUsage =
    "usage: lazyrag-cli generate --model PATH|synthetic:NAME [--doc FILE]... "
    "--query TEXT\n"
    "  [--query TEXT]... [--system TEXT] [--mode "
    "lazy|materialize|prefix|full]\n"
    "  [--max_tokens N] [--temperature T] [--top_p P] [--top_k K] [--seed S] "
    "[--stop STR]...\n"
    "  [--ignore_eos] [--shuffle_docs] [--page_size N] [--kv_pool_bytes N] [--tp N] "
    "[--json]\n"
    "  [--host_cache_bytes N]  (host-memory tier: 0 off (default), -1 sized from the machine "
    "as the worker's, N bytes)\n"
    "  [--server HOST:PORT [--timeout_s S] [--tls_cert F --tls_key F --tls_ca F]\n"
    "   [--auth_token_file F]]\n"
    "      (send to a worker or router instead of running locally; over TLS with the "
    "three files;\n"
    "       with the bearer token in file F for a server with --auth_tokens_file)\n";

bool Parse(int argc, char **argv, Args *a, std::string *err) {
  static const char *kBool[] = {"--json", "--ignore_eos", "--shuffle_docs", "--help"};
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    bool is_bool = false;
    for (const char *b : kBool) is_bool |= s == b;
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
  static const char *kKnown[] = {"model",          "doc",       "query",
                                 "system",         "mode",      "max_tokens",
                                 "temperature",    "top_p",     "top_k",
                                 "seed",           "stop",      "page_size",
                                 "kv_pool_bytes",  "namespace", "server",
                                 "timeout_s",      "tp",        "tls_cert",
                                 "tls_key",        "tls_ca",    "host_cache_bytes",
                                 "auth_token_file"};
  for (const auto &[k, v] : a->values) {
    bool known = false;
    for (const char *n : kKnown) known |= k == n;
    if (!known) {
      *err = "unknown flag --" + k;
      return false;
    }
  }
  return true;
}

template <typename T>
bool ParseNumber(const std::string &s, T *out) {
  std::istringstream in(s);
  in >> *out;
  return !in.fail() && in.eof();
}

v1::AttentionMode ModeToProto(AttentionMode m) {
  switch (m) {
    case AttentionMode::kLazy:
      return v1::ATTENTION_MODE_LAZY;
    case AttentionMode::kMaterialize:
      return v1::ATTENTION_MODE_MATERIALIZE;
    case AttentionMode::kPrefix:
      return v1::ATTENTION_MODE_PREFIX;
    case AttentionMode::kFull:
      return v1::ATTENTION_MODE_FULL;
  }
  return v1::ATTENTION_MODE_LAZY;
}

FinishReason FinishFromProto(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP:
      return FinishReason::kStop;
    case v1::FINISH_REASON_EOS:
      return FinishReason::kEos;
    case v1::FINISH_REASON_CANCELLED:
      return FinishReason::kCancelled;
    default:
      return FinishReason::kLength;
  }
}

// Runs one request on a server, streaming deltas to `on_delta`; same result
// shape as local. `token`: sent on the call (null: none).
absl::StatusOr<GenerateResult> GenerateRemote(
    v1::Inference::Stub &stub, BearerToken *token, const GenerateRequest &r, double timeout_s,
    const std::function<void(std::string_view)> &on_delta) {
  v1::GenerateRequest req;
  req.set_request_id(r.request_id);
  req.set_system_prompt(r.system_prompt);
  for (const DocumentInput &d : r.documents) {
    if (!d.id.empty()) {
      req.add_documents()->set_id(d.id);
    } else {
      req.add_documents()->set_text(d.text);
    }
  }
  req.set_query(r.query);
  req.mutable_sampling()->set_temperature(r.sampling.temperature);
  req.mutable_sampling()->set_top_p(r.sampling.top_p);
  req.mutable_sampling()->set_top_k(r.sampling.top_k);
  req.mutable_sampling()->set_seed(r.sampling.seed);
  req.set_max_tokens(r.max_tokens);
  for (const auto &s : r.stop) req.add_stop(s);
  req.set_ignore_eos(r.ignore_eos);
  req.set_mode(ModeToProto(r.mode));
  req.set_cache_namespace(r.cache_namespace);
  grpc::ClientContext ctx;
  if (timeout_s > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(int64_t(timeout_s * 1e6)));
  }
  AddBearerToken(ctx, token);
  auto reader = stub.Generate(&ctx, req);
  GenerateResult res;
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    res.text += m.text();
    if (on_delta && !m.text().empty()) on_delta(m.text());
    res.token_ids.insert(res.token_ids.end(), m.token_ids().begin(), m.token_ids().end());
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      res.finish_reason = FinishFromProto(m.finish_reason());
      const v1::Usage &u = m.usage();
      res.usage.prompt_tokens = u.prompt_tokens();
      res.usage.document_tokens = u.document_tokens();
      res.usage.cached_document_tokens = u.cached_document_tokens();
      res.usage.pool_document_tokens = u.pool_document_tokens();
      res.usage.store_document_tokens = u.store_document_tokens();
      res.usage.host_document_tokens = u.host_document_tokens();
      res.usage.computed_tokens = u.computed_tokens();
      res.usage.completion_tokens = u.completion_tokens();
      res.timings.queue_ms = m.timings().queue_ms();
      res.timings.ttft_ms = m.timings().ttft_ms();
      res.timings.total_ms = m.timings().total_ms();
      res.document_ids.assign(m.document_ids().begin(), m.document_ids().end());
    }
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) return FromGrpcStatus(st);
  return res;
}

}  // namespace

int RunGenerateCommand(int argc, char **argv) {
  Args a;
  std::string err;
  if (!Parse(argc, argv, &a, &err) || a.Has("--help")) {
    if (!err.empty()) std::cerr << "lazyrag-cli generate: " << err << "\n";
    std::cerr << kUsage;
    return a.Has("--help") ? 0 : 2;
  }
  RuntimeOptions ro;
  ro.model = a.Get("model", "");
  const std::string server = a.Get("server", "");
  if ((ro.model.empty() && server.empty()) || a.values["query"].empty()) {
    std::cerr << "lazyrag-cli generate: --model (or --server) and --query are "
                 "required\n"
              << kUsage;
    return 2;
  }
  double timeout_s = 0;
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
  // Off unless asked: one offline run rarely overflows the pool, and a machine-sized pinned
  // allocation would cost more than it saves (the worker's default is -1).
  ok = ok && ParseNumber(a.Get("host_cache_bytes", "0"), &ro.host_cache_bytes);
  ok = ok && ParseNumber(a.Get("tp", "1"), &ro.tensor_parallel);
  ok = ok && ParseNumber(a.Get("timeout_s", "0"), &timeout_s);
  if (!ok) {
    std::cerr << "lazyrag-cli generate: bad value: "
              << (mode.ok() ? "a numeric flag is not a number" : mode.status().ToString()) << "\n";
    return 2;
  }
  base.system_prompt = a.Get("system", "");
  base.ignore_eos = a.Has("--ignore_eos");
  base.cache_namespace = a.Get("namespace", "");
  if (a.values.count("stop")) base.stop = a.values["stop"];
  for (const std::string &path : a.values["doc"]) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::cerr << "lazyrag-cli generate: cannot read document " << path << "\n";
      return 2;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    base.documents.push_back({ss.str(), ""});
  }
  std::unique_ptr<Runtime> runtime;
  std::unique_ptr<v1::Inference::Stub> stub;
  std::shared_ptr<BearerToken> token;  // null without --auth_token_file
  if (!server.empty()) {
    auto credentials =
        ChannelCredentialsFor({a.Get("tls_cert", ""), a.Get("tls_key", ""), a.Get("tls_ca", "")});
    if (!credentials.ok()) {
      std::cerr << "lazyrag-cli generate: " << credentials.status() << "\n";
      return 2;
    }
    auto opened = OpenBearerToken(a.Get("auth_token_file", ""));
    if (!opened.ok()) {
      std::cerr << "lazyrag-cli generate: " << opened.status() << "\n";
      return 2;
    }
    token = *std::move(opened);
    stub = v1::Inference::NewStub(
        grpc::CreateCustomChannel(server, *credentials, grpc::ChannelArguments()));
  } else {
    auto rt = CreateRuntime(ro);
    if (!rt.ok()) {
      std::cerr << "lazyrag-cli generate: " << rt.status() << "\n";
      return rt.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    runtime = std::move(*rt);
  }
  const bool json = a.Has("--json");
  std::mt19937 rng(base.sampling.seed);
  int index = 0;
  for (const std::string &query : a.values["query"]) {
    GenerateRequest r = base;
    r.query = query;
    if (a.Has("--shuffle_docs") && index > 0)
      std::shuffle(r.documents.begin(), r.documents.end(), rng);
    auto print = [&](std::string_view delta) {
      if (!json) {
        std::fwrite(delta.data(), 1, delta.size(), stdout);
        std::fflush(stdout);
      }
    };
    absl::StatusOr<GenerateResult> res =
        stub ? GenerateRemote(*stub, token.get(), r, timeout_s, print)
             : runtime->generator->Generate(r, [&](std::string_view delta, int32_t) {
                 print(delta);
                 return true;
               });
    if (!res.ok()) {
      std::cerr << "lazyrag-cli generate: " << res.status() << "\n";
      return 1;
    }
    if (json) {
      const Usage &u = res->usage;
      Json out = {
          {"text", res->text},
          {"token_ids", res->token_ids},
          {"finish_reason", std::string(FinishReasonName(res->finish_reason))},
          {"mode", std::string(AttentionModeName(r.mode))},
          {"document_ids", res->document_ids},
          {"usage",
           {{"prompt_tokens", u.prompt_tokens},
            {"document_tokens", u.document_tokens},
            {"cached_document_tokens", u.cached_document_tokens},
            {"pool_document_tokens", u.pool_document_tokens},
            {"host_document_tokens", u.host_document_tokens},
            {"store_document_tokens", u.store_document_tokens},
            {"computed_tokens", u.computed_tokens},
            {"completion_tokens", u.completion_tokens}}},
          {"timings", {{"ttft_ms", res->timings.ttft_ms}, {"total_ms", res->timings.total_ms}}}};
      std::cout << JsonDump(out) << "\n";
    } else {
      const Usage &u = res->usage;
      std::printf(
          "\n[%s] ttft %.1f ms, total %.1f ms, documents %lld tokens "
          "(%lld cached: pool %lld, host %lld, store %lld), computed %lld, generated %lld\n",
          std::string(AttentionModeName(r.mode)).c_str(), res->timings.ttft_ms,
          res->timings.total_ms, (long long)u.document_tokens, (long long)u.cached_document_tokens,
          (long long)u.pool_document_tokens, (long long)u.host_document_tokens,
          (long long)u.store_document_tokens, (long long)u.computed_tokens,
          (long long)u.completion_tokens);
    }
    ++index;
  }
  return 0;
}

}  // namespace lazyrag
