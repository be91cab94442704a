// Tensor parallelism on the GPU (issue 9, must-show 2): for each (model, TP degree) — by default
// synthetic:llama3-8b at TP=1 and TP=2 and synthetic:llama3-70b at TP=2 (141 GB = 131 GiB of
// bf16 weights: they fit one H200 but leave no room for a useful KV pool, which the bench
// shows by asking for the 70B at TP=1 last) —
//   * prefill throughput: one request of --prefill tokens in one forward step (tokens/s);
//   * decode step latency at batch 1 and 64, each request over --decode_ctx cached tokens
//     (backend Forward: upload, every layer, logits of every request to the host);
//   * TTFT of the RAG request of ttft_bench (--docs x --doc_len cached documents, --query-token
//     query, LAZY, documents already in the pool), through the Engine;
// and, with NCCL and two or more GPUs, the time of one fp32 all-reduce of [T, hidden] (the
// residual stream) for T = 1, 64 and --prefill, times 2 x layers = its share of a step.
// Median over --runs after --warmup; CUDA synchronizes inside Forward (logits to the host).
//
// Usage: tp_bench [--configs synthetic:llama3-8b:1,synthetic:llama3-8b:2,...] [--runs N]
//                 [--warmup N] [--prefill N] [--decode_ctx N] [--docs N] [--doc_len N]
//                 [--query N] [--out PATH]
#include <cuda_runtime.h>
#ifdef LAZYRAG_HAVE_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_stats.h"
#include "common/native_blas.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/engine/engine.h"
#include "worker/model/model_source.h"

namespace lazyrag {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string configs =
      "synthetic:llama3-8b:1,synthetic:llama3-8b:2,synthetic:llama3-70b:2,synthetic:llama3-70b:1";
  int runs = 5;
  int warmup = 1;
  int prefill = 2048;
  int decode_ctx = 1024;
  int docs = 5;
  int doc_len = 2048;
  int query = 32;
  int page_size = 16;
  std::string out;
};

using bench::Stats;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Decode batch: `batch` requests, request b over pages [b * per, (b + 1) * per) holding `ctx`
// cached tokens, its new token at position ctx.
ForwardBatch DecodeBatch(int batch, int ctx, int page_size, int vocab, std::mt19937& rng) {
  ForwardBatch fb;
  fb.view.page_size = page_size;
  const int per = (ctx + 1 + page_size - 1) / page_size;
  std::uniform_int_distribution<int> tok(3, vocab - 1);
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> pages(per);
    for (int i = 0; i < per; ++i) pages[i] = b * per + i;
    fb.tokens.push_back(tok(rng));
    fb.kv_pos.push_back(ctx);
    fb.kv_slot.push_back(int64_t(pages[ctx / page_size]) * page_size + ctx % page_size);
    fb.view.AddSegment(0, ctx + 1, pages);
    fb.view.EndRequest({ctx});
    fb.logit_rows.push_back(b);
  }
  return fb;
}

ForwardBatch PrefillBatch(int n, int page_size, int vocab, std::mt19937& rng) {
  ForwardBatch fb;
  fb.view.page_size = page_size;
  std::uniform_int_distribution<int> tok(3, vocab - 1);
  std::vector<int32_t> pages((n + page_size - 1) / page_size), pos(n);
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = int32_t(i);
  for (int j = 0; j < n; ++j) {
    fb.tokens.push_back(tok(rng));
    fb.kv_pos.push_back(j);
    fb.kv_slot.push_back(int64_t(pages[j / page_size]) * page_size + j % page_size);
    pos[j] = j;
  }
  fb.view.AddSegment(0, n, pages);
  fb.view.EndRequest(pos);
  fb.logit_rows = {n - 1};
  return fb;
}

struct AllReduceRow {
  int tokens;
  int hidden;
  double ms;
};

// Median time of one in-place fp32 all-reduce of [tokens, hidden] over GPUs 0..n-1.
std::vector<AllReduceRow> MeasureAllReduce(int n, const std::vector<int>& hiddens,
                                           const std::vector<int>& tokens, int runs) {
  std::vector<AllReduceRow> rows;
#ifdef LAZYRAG_HAVE_NCCL
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::vector<int> devs(n);
  for (int i = 0; i < n; ++i) devs[i] = i;
  std::vector<ncclComm_t> comms(n);
  if (ncclCommInitAll(comms.data(), n, devs.data()) != ncclSuccess) return rows;
  std::vector<cudaStream_t> streams(n);
  std::vector<float*> bufs(n);
  size_t max_elems = 0;
  for (int h : hiddens) {
    for (int t : tokens) max_elems = std::max(max_elems, size_t(h) * t);
  }
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(i);
    cudaStreamCreate(&streams[i]);
    cudaMalloc(&bufs[i], max_elems * sizeof(float));
    cudaMemset(bufs[i], 0, max_elems * sizeof(float));
  }
  for (int h : hiddens) {
    for (int t : tokens) {
      const size_t count = size_t(h) * t;
      Stats s;
      for (int r = 0; r < runs + 3; ++r) {
        for (int i = 0; i < n; ++i) {
          cudaSetDevice(i);
          cudaStreamSynchronize(streams[i]);
        }
        const auto t0 = Clock::now();
        ncclGroupStart();
        for (int i = 0; i < n; ++i) {
          ncclAllReduce(bufs[i], bufs[i], count, ncclFloat, ncclSum, comms[i], streams[i]);
        }
        ncclGroupEnd();
        for (int i = 0; i < n; ++i) {
          cudaSetDevice(i);
          cudaStreamSynchronize(streams[i]);
        }
        if (r >= 3) s.ms.push_back(Ms(t0, Clock::now()));
      }
      rows.push_back({t, h, s.Median()});
    }
  }
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(i);
    cudaFree(bufs[i]);
    cudaStreamDestroy(streams[i]);
    ncclCommDestroy(comms[i]);
  }
#else
  (void)n;
  (void)hiddens;
  (void)tokens;
  (void)runs;
#endif
  return rows;
}

struct ConfigResult {
  std::string model;
  int tp = 1;
  std::string error;  // non-empty: the config did not run (e.g. does not fit)
  double init_s = 0;
  double weights_gib_per_gpu = 0;
  Stats prefill, decode1, decode64, ttft, cold_ttft;
  int layers = 0, hidden = 0;
};

std::vector<double> UsedGiB(int n) {
  std::vector<double> used(n);
  for (int i = 0; i < n; ++i) {
    size_t free_b = 0, total_b = 0;
    cudaSetDevice(i);
    cudaMemGetInfo(&free_b, &total_b);
    used[i] = double(total_b - free_b) / double(1 << 30);
  }
  return used;
}

// Progress on stderr with seconds since the config started (a run cut short still shows where
// its time went).
void Phase(Clock::time_point t0, const char* what) {
  std::fprintf(stderr, "  [%7.2f s] %s\n", std::chrono::duration<double>(Clock::now() - t0).count(),
               what);
  std::fflush(stderr);
}

ConfigResult RunConfig(const BenchOptions& o, const std::string& model_name, int tp) {
  ConfigResult res;
  res.model = model_name;
  res.tp = tp;
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < tp) {
    res.error = absl::StrCat("needs ", tp, " GPUs, ", devices, " present");
    return res;
  }
  const std::vector<double> before = UsedGiB(tp);
  const auto t0 = Clock::now();
  LoadOptions lo;
  lo.synthetic_host_weights = false;
  auto model = LoadModel(model_name, lo);
  if (!model.ok()) {
    res.error = std::string(model.status().ToString());
    return res;
  }
  res.layers = model->config.num_layers;
  res.hidden = model->config.hidden_size;
  auto backend = tp == 1 ? CreateCudaBackend(*model) : CreateCudaTensorParallelBackend(*model, tp);
  if (!backend.ok()) {
    res.error = std::string(backend.status().ToString());
    return res;
  }
  res.init_s = std::chrono::duration<double>(Clock::now() - t0).count();
  Phase(t0, "weights ready");
  const std::vector<double> after = UsedGiB(tp);
  res.weights_gib_per_gpu = after[0] - before[0];

  const ModelConfig& c = model->config;
  const int prompt_tokens = o.docs * o.doc_len + o.query;
  const int decode_pages = 64 * ((o.decode_ctx + 1 + o.page_size - 1) / o.page_size);
  const int request_pages = (prompt_tokens + 64) / o.page_size + o.docs + 2;
  EngineOptions eo;
  eo.page_size = o.page_size;
  eo.prefill_chunk = 2048;
  eo.num_pages = std::max(decode_pages, 4 * request_pages);
  eo.fingerprint = model->fingerprint;
  auto engine_or = Engine::Create(std::move(*backend), eo);
  if (!engine_or.ok()) {
    res.error = std::string(engine_or.status().ToString());
    return res;
  }
  Engine& engine = **engine_or;
  Backend& b = engine.backend();
  Phase(t0, "pool ready");
  std::mt19937 rng(2026);
  std::vector<float> logits;

  // Backend-level steps first, on pages the engine has not handed out yet.
  auto time_forward = [&](const ForwardBatch& fb, Stats* s) -> bool {
    for (int r = 0; r < o.warmup + o.runs; ++r) {
      const auto a = Clock::now();
      if (auto st = b.Forward(fb, &logits); !st.ok()) {
        res.error = std::string(st.ToString());
        return false;
      }
      if (r >= o.warmup) s->ms.push_back(Ms(a, Clock::now()));
    }
    return true;
  };
  if (!time_forward(PrefillBatch(o.prefill, o.page_size, c.vocab_size, rng), &res.prefill))
    return res;
  Phase(t0, "prefill timed");
  if (!time_forward(DecodeBatch(1, o.decode_ctx, o.page_size, c.vocab_size, rng), &res.decode1))
    return res;
  if (!time_forward(DecodeBatch(64, o.decode_ctx, o.page_size, c.vocab_size, rng), &res.decode64))
    return res;
  Phase(t0, "decode timed");

  // TTFT through the Engine (ttft_bench's request).
  std::uniform_int_distribution<int> tok(3, c.vocab_size - 1);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = tok(rng);
    return t;
  };
  TokenPrompt prompt;
  for (int d = 0; d < o.docs; ++d) prompt.documents.push_back(random_tokens(o.doc_len));
  prompt.suffix = random_tokens(o.query);
  auto run = [&](const std::string& ns, Stats* s) -> bool {
    TokenRunOptions ro;
    ro.mode = AttentionMode::kLazy;
    ro.max_tokens = 1;
    ro.ignore_eos = true;
    ro.cache_namespace = ns;
    auto r = engine.RunTokens(prompt, ro);
    if (!r.ok()) {
      res.error = std::string(r.status().ToString());
      return false;
    }
    if (s != nullptr) s->ms.push_back(r->timings.ttft_ms);
    return true;
  };
  for (int w = 0; w < o.warmup; ++w) {
    if (!run("warm", nullptr)) return res;
  }
  Phase(t0, "documents cached");
  for (int r = 0; r < o.runs; ++r) {
    if (!run("warm", &res.ttft)) return res;
  }
  for (int r = 0; r < 2; ++r) {
    if (!run(absl::StrCat("cold-", r), &res.cold_ttft)) return res;
  }
  Phase(t0, "TTFT timed");
  return res;
}

int Main(int argc, char** argv) {
  BenchOptions o;
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* name) { return !std::strcmp(argv[i], name) && i + 1 < argc; };
    if (arg("--configs"))
      o.configs = argv[++i];
    else if (arg("--runs"))
      o.runs = std::max(1, std::atoi(argv[++i]));
    else if (arg("--warmup"))
      o.warmup = std::max(0, std::atoi(argv[++i]));
    else if (arg("--prefill"))
      o.prefill = std::max(1, std::atoi(argv[++i]));
    else if (arg("--decode_ctx"))
      o.decode_ctx = std::max(1, std::atoi(argv[++i]));
    else if (arg("--docs"))
      o.docs = std::max(1, std::atoi(argv[++i]));
    else if (arg("--doc_len"))
      o.doc_len = std::max(1, std::atoi(argv[++i]));
    else if (arg("--query"))
      o.query = std::max(1, std::atoi(argv[++i]));
    else if (arg("--out"))
      o.out = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--configs MODEL:TP,...] [--runs N] [--warmup N] [--prefill N] "
                   "[--decode_ctx N] [--docs N] [--doc_len N] [--query N] [--out PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  int devices = 0;
  cudaGetDeviceCount(&devices);
  std::printf("tp_bench: %d CUDA device(s), NCCL %s\n", devices,
              CudaBackendHasNccl() ? "yes" : "no");

  std::vector<AllReduceRow> ar;
  if (devices >= 2) ar = MeasureAllReduce(2, {4096, 8192}, {1, 64, o.prefill}, 20);

  if (!ar.empty()) {
    std::printf(
        "\nNCCL all-reduce, 2 GPUs, fp32 [T, hidden] in place (one per O / down projection):\n");
    std::printf("%8s %8s %10s %22s %22s\n", "hidden", "T", "ms", "x 2 x 32 layers (8B)",
                "x 2 x 80 layers (70B)");
    for (const AllReduceRow& a : ar) {
      std::printf("%8d %8d %10.4f %22.3f %22.3f\n", a.hidden, a.tokens, a.ms, a.ms * 64,
                  a.ms * 160);
    }
    std::fflush(stdout);
  }

  std::vector<ConfigResult> results;
  auto write_json = [&]() -> bool {
    if (o.out.empty()) return true;
    std::ostringstream f;
    f << "{\n  \"bench\": \"tp_bench\",\n  \"devices\": " << devices
      << ", \"prefill_tokens\": " << o.prefill << ", \"decode_ctx\": " << o.decode_ctx
      << ", \"docs\": " << o.docs << ", \"doc_len\": " << o.doc_len << ", \"query\": " << o.query
      << ", \"runs\": " << o.runs << ", \"warmup\": " << o.warmup << ",\n  \"configs\": [";
    for (size_t i = 0; i < results.size(); ++i) {
      const ConfigResult& r = results[i];
      f << (i ? ",\n" : "\n") << "    {\"model\": \"" << r.model << "\", \"tp\": " << r.tp;
      if (!r.error.empty()) {
        std::string e = r.error;
        for (char& ch : e) {
          if (ch == '"' || ch == '\\' || ch == '\n') ch = '\'';
        }
        f << ", \"error\": \"" << e << "\"}";
        continue;
      }
      f << ", \"layers\": " << r.layers << ", \"hidden\": " << r.hidden
        << ", \"weights_gib_per_gpu\": " << r.weights_gib_per_gpu << ", \"init_s\": " << r.init_s
        << ",\n     \"prefill_tokens_per_s\": " << o.prefill / (r.prefill.Median() / 1e3)
        << ", \"prefill_ms\": " << r.prefill.Json()
        << ",\n     \"decode_b1_ms\": " << r.decode1.Json()
        << ",\n     \"decode_b64_ms\": " << r.decode64.Json()
        << ",\n     \"ttft_lazy_ms\": " << r.ttft.Json()
        << ",\n     \"ttft_lazy_cold_ms\": " << r.cold_ttft.Json() << "}";
    }
    f << "\n  ],\n  \"allreduce_2gpu_fp32_ms\": [";
    for (size_t i = 0; i < ar.size(); ++i) {
      f << (i ? ", " : "") << "{\"hidden\": " << ar[i].hidden << ", \"tokens\": " << ar[i].tokens
        << ", \"ms\": " << ar[i].ms << "}";
    }
    f << "]\n}\n";
    std::ofstream out(o.out);
    out << f.str();
    return bool(out);
  };

  std::printf("\n%-22s %3s %9s %8s %12s %10s %10s %10s %10s\n", "model", "TP", "GiB/GPU", "init s",
              "prefill t/s", "dec b1 ms", "dec b64 ms", "TTFT ms", "cold ms");
  std::fflush(stdout);
  for (absl::string_view spec : absl::StrSplit(o.configs, ',')) {
    const size_t colon = spec.rfind(':');
    const std::string model(spec.substr(0, colon));
    const int tp = std::atoi(std::string(spec.substr(colon + 1)).c_str());
    std::fprintf(stderr, "running %s at TP=%d\n", model.c_str(), tp);
    results.push_back(RunConfig(o, model, tp));
    const ConfigResult& r = results.back();
    if (!r.error.empty()) {
      std::printf("%-22s %3d  not run: %s\n", r.model.c_str(), r.tp, r.error.c_str());
    } else {
      std::printf("%-22s %3d %9.1f %8.1f %12.0f %10.3f %10.3f %10.2f %10.2f\n", r.model.c_str(),
                  r.tp, r.weights_gib_per_gpu, r.init_s, o.prefill / (r.prefill.Median() / 1e3),
                  r.decode1.Median(), r.decode64.Median(), r.ttft.Median(), r.cold_ttft.Median());
    }
    std::fflush(stdout);
    if (!write_json()) {
      std::fprintf(stderr, "tp_bench: cannot write %s\n", o.out.c_str());
      return 1;
    }
  }
  if (!o.out.empty()) std::printf("wrote %s\n", o.out.c_str());
  return 0;
}

}  // namespace
}  // namespace lazyrag

int main(int argc, char** argv) {
  lazyrag::PreferNativeBlasKernels(argv);
  return lazyrag::Main(argc, argv);
}
