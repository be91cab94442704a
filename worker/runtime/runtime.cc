#include "worker/runtime/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "worker/backend/cpu/cpu_backend.h"
#ifdef LAZYRAG_WITH_CUDA
#include "worker/backend/cuda/cuda_backend.h"
#endif

namespace lazyrag {
namespace {

// The first line of a cgroup memory limit file as bytes; 0 when absent, unreadable or "max".
int64_t ReadCgroupLimit(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return 0;
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &bytes) || bytes <= 0) return 0;
  return bytes;
}

}  // namespace

int64_t DefaultHostCacheBytes(const std::string& device, int64_t memory_bytes) {
  if (device != "cuda" || memory_bytes <= 0) return 0;
  return std::min(memory_bytes / 4, kMaxDefaultHostCacheBytes);
}

int64_t MachineMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  int64_t bytes = pages > 0 && page_size > 0 ? int64_t(pages) * int64_t(page_size) : 0;
  // cgroup v1 reports "no limit" as a huge number, which the min below ignores.
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const int64_t limit = ReadCgroupLimit(path);
    if (limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;
  }
  return bytes;
}

absl::StatusOr<int64_t> ResolveHostCacheBytes(int64_t requested, const std::string& device,
                                              int64_t memory_bytes) {
  if (requested < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_cache_bytes must be -1 (sized from the machine), 0 (off) or a byte count, got ",
        requested));
  }
  return requested == -1 ? DefaultHostCacheBytes(device, memory_bytes) : requested;
}

absl::StatusOr<std::unique_ptr<Runtime>> CreateRuntime(const RuntimeOptions& o) {
#ifdef LAZYRAG_WITH_CUDA
  const bool cuda_built = true;
#else
  const bool cuda_built = false;
#endif
  if (o.device != "cpu" && !(o.device == "cuda" && cuda_built)) {
    return absl::InvalidArgumentError(absl::StrCat("device '", o.device,
                                                   "' is not available in this build (",
                                                   cuda_built ? "cpu, cuda" : "cpu", ")"));
  }
  if (o.page_size < 1 || o.page_size > 1024)
    return absl::InvalidArgumentError("page_size must be in [1, 1024]");
  if (o.tensor_parallel < 1 || o.tensor_parallel > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor_parallel must be in [1, 64], got ", o.tensor_parallel));
  }
  absl::StatusOr<int64_t> host_cache_bytes =
      ResolveHostCacheBytes(o.host_cache_bytes, o.device, MachineMemoryBytes());
  if (!host_cache_bytes.ok()) return host_cache_bytes.status();
  const int tp = o.tensor_parallel;
  if (o.cuda_device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_device must be >= 0, got ", o.cuda_device));
  }
  LoadOptions lo;
  // On the GPU, synthetic weights are generated in device memory: no host copy.
  lo.synthetic_host_weights = o.device == "cpu";
  auto loaded = LoadModel(o.model, lo);
  if (!loaded.ok()) return loaded.status();
  auto rt = std::make_unique<Runtime>();
  rt->config = loaded->config;
  rt->fingerprint = loaded->fingerprint;
  rt->model_name = !o.served_model_name.empty() ? o.served_model_name
                   : !loaded->name.empty()      ? loaded->name
                                                : o.model;
  auto tok = Tokenizer::Create(loaded->tokenizer, loaded->config.vocab_size);
  if (!tok.ok()) return tok.status();
  rt->tokenizer = std::move(*tok);
  RagTemplate tmpl = RagTemplate::ForSpec(loaded->tokenizer);
  tmpl.parse_special_in_text = o.parse_special_tokens_in_text;
  LOG_INFO << "prompt layout: "
           << (tmpl.kind == RagTemplate::Kind::kJinja    ? "the model's chat template"
               : tmpl.kind == RagTemplate::Kind::kChatML ? "built-in ChatML"
               : tmpl.kind == RagTemplate::Kind::kLlama3 ? "built-in Llama-3"
                                                         : "built-in plain")
           << "; control tokens in documents and queries are "
           << (tmpl.parse_special_in_text ? "parsed (--parse_special_tokens_in_text)"
                                          : "literal text");
  absl::StatusOr<std::unique_ptr<Backend>> backend = absl::InvalidArgumentError("no backend");
#ifdef LAZYRAG_WITH_CUDA
  if (o.device == "cuda") {
    CudaBackendOptions co;
    co.cuda_graphs = o.cuda_graphs;
    co.device = o.cuda_device;
    backend =
        tp == 1 ? CreateCudaBackend(*loaded, co) : CreateCudaTensorParallelBackend(*loaded, tp, co);
  }
#endif
  if (o.device == "cpu") {
    CpuBackendOptions co;
    co.reference_attention = o.reference_attention;
    backend = tp == 1 ? CreateCpuBackend(std::move(loaded->weights), co)
                      : CreateCpuTensorParallelBackend(std::move(loaded->weights), tp, co);
  }
  if (!backend.ok()) return backend.status();
  EngineOptions eo;
  eo.page_size = o.page_size;
  eo.prefill_chunk = o.prefill_chunk;
  eo.fingerprint = rt->fingerprint;
  eo.model_name = rt->model_name;
  eo.pool_tier = o.device == "cuda" ? "gpu" : "cpu";
  eo.max_batch_tokens = o.max_batch_tokens;
  eo.max_running = o.max_running;
  eo.max_waiting = o.max_waiting;
  eo.max_writeback_bytes = o.max_writeback_bytes;
  eo.kv_mac_key = o.kv_mac_key;
  eo.host_cache_bytes = *host_cache_bytes;
  // Without a host tier, store fetches on the GPU still land in pinned memory (1 GiB: a few
  // documents in flight; a fetch that finds no room goes through pageable memory).
  eo.fetch_staging_bytes = o.device == "cuda" && *host_cache_bytes == 0 ? int64_t(1) << 30 : 0;
  eo.registry = o.registry;
  eo.quality = o.quality;
  if (eo.quality.recompute_first_tokens == -1) {  // "measured" (RuntimeOptions::quality)
    eo.quality.recompute_first_tokens =
        (*backend)->SupportsQualityViews() ? kMeasuredRecomputeFirstTokens : 0;
  }
  if (eo.quality.drop_first_tokens == -1) {  // "measured", unless first-k runs
    eo.quality.drop_first_tokens =
        (*backend)->SupportsQualityViews() && eo.quality.recompute_first_tokens == 0
            ? kMeasuredDropFirstTokens
            : 0;
  }
  if (o.shared_prefix == "template") {
    if (tmpl.Opening().empty()) {
      return absl::InvalidArgumentError(
          "shared_prefix=template: this model's prompt layout has no fixed opening");
    }
    tmpl.opening_shared = true;
    eo.shared_prefix = rt->tokenizer->Encode(tmpl.Opening());
  } else if (o.shared_prefix != "none" && !o.shared_prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared_prefix '", o.shared_prefix, "' is not one of none, template"));
  }
  if (o.store_factory) {
    auto store = o.store_factory(rt->fingerprint);
    if (!store.ok()) return store.status();
    rt->store = std::move(*store);
    eo.store = rt->store.get();
  }
  // Default pool: 256 MiB on the CPU, 16 GiB per GPU. BytesPerPage counts all ranks.
  const int64_t pool = o.kv_pool_bytes > 0  ? o.kv_pool_bytes
                       : o.device == "cuda" ? (int64_t(16) << 30) * tp
                                            : int64_t(256) << 20;
  const int64_t per_page =
      (*backend)->BytesPerPage() / std::max(1, (*backend)->page_size()) * o.page_size;
  eo.num_pages = int(std::min<int64_t>(pool / per_page, 1 << 24));
  rt->page_bytes = per_page;
  if (eo.num_pages < 4) return absl::InvalidArgumentError("kv_pool_bytes holds fewer than 4 pages");
  auto engine = Engine::Create(std::move(*backend), eo);
  if (!engine.ok()) return engine.status();
  rt->engine = std::move(*engine);
  rt->generator = std::make_unique<Generator>(rt->engine.get(), rt->tokenizer.get(), tmpl);
  return rt;
}

}  // namespace lazyrag
